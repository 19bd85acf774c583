"""Embedding Gathers and tied lm_heads: quantized once, run in ONNX Runtime exactly as the numpy reference."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest

from onnxprec._graph import NameAllocator
from onnxprec.quantization._testing import TIED_FORMS, run_fp32_compute, tiny_lm
from onnxprec.quantization.algorithms import quantize_rtn
from onnxprec.quantization.formats.qdq import _gather_columns
from onnxprec.quantization.int4 import quantize, quantize_file
from onnxprec.quantization.select import Layer


def _ids(form: str) -> np.ndarray:
    return np.array([3, 7, 79, 0, -1]) if form == "gemm" else np.array([[3, 7, 79, 0, -1], [1, 2, 3, 4, 5]])


def _reference(weights: dict[str, np.ndarray], ids: np.ndarray, quantized: dict[str, np.ndarray]) -> np.ndarray:
    table = quantized.get("embedding", weights["embedding"]).T
    hidden = np.maximum(table[ids] @ quantized.get("w1", weights["w1"]), 0)
    return hidden @ quantized.get("head", weights["head"])


@pytest.mark.parametrize("output_format", ["qdq", "matmulnbits"])
@pytest.mark.parametrize("form", TIED_FORMS)
@pytest.mark.parametrize(
    ("block_size", "symmetric", "eight"), [(16, True, False), (32, False, False), (32, True, True)]
)
@pytest.mark.slow
def test_embedding_and_lm_head_match_numpy(
    form: str, output_format: str, block_size: int, symmetric: bool, eight: bool
) -> None:
    """H = 48: block 32 leaves a partial block (MatMulNBits pads it; GatherBlockQuantized's rows are sliced)."""
    model, weights = tiny_lm(form)
    result = quantize(
        model, calibration_method="rtn", block_size=block_size, use_zero_point=not symmetric, nodes_to_exclude=[],
        quantize_embeddings=True, output_format=output_format, accuracy_level=0,
        layers_8bit=[".*embed", ".*lm_head"] if eight else None, block_size_8bit=block_size,
    )  # fmt: skip
    onnx.checker.check_model(result, full_check=True)
    bits = {"embedding": 8 if eight else 4, "head": 8 if eight else 4, "w1": 4}
    quantized = {
        key: quantize_rtn(w, block_size, symmetric=symmetric, bits=bits[key]).dequantize() for key, w in weights.items()
    }
    if form != "untied":
        quantized["embedding"] = quantized["head"]  # one matrix
    ids = _ids(form)
    (y,) = run_fp32_compute(result, {"ids": ids})
    np.testing.assert_allclose(y, _reference(weights, ids, quantized), rtol=1e-5, atol=1e-5)
    ops = [node.op_type for node in result.graph.node]
    inits = {init.name: init for init in result.graph.initializer}
    float_inits = [n for n, i in inits.items() if i.data_type == onnx.TensorProto.FLOAT and not n.endswith("_scales")]
    assert float_inits == []  # neither the table nor the head stays in float, nor a copy of either
    tied = form != "untied"
    level_tensors = [n for n in inits if n.endswith(("_q4", "_Q4", "_q8", "_Q8"))]
    assert len(level_tensors) == (2 if tied else 3)  # W1 and the tied weight stored once, or three weights
    if output_format == "matmulnbits":
        assert ops.count("GatherBlockQuantized") == 1 and ops.count("MatMulNBits") == 2
        gbq = next(n for n in result.graph.node if n.op_type == "GatherBlockQuantized")
        head = next(n for n in result.graph.node if n.op_type == "MatMulNBits" and "lm_head" in n.name)
        if tied:  # the Gather reads the lm_head's B (reshaped), scales and zero points
            reshape = next(n for n in result.graph.node if n.op_type == "Reshape")
            assert reshape.input[0] == head.input[1] and list(gbq.input[2:]) == list(head.input[2:])
    else:
        assert "Gather" in ops and ops.count("DequantizeLinear") == 3
        assert ("Transpose" in ops) == tied  # a tied table is stored in the lm_head's [H, V] form


@pytest.mark.parametrize("output_format", ["qdq", "matmulnbits"])
def test_default_exclusion_keeps_a_shared_table_in_float_without_a_copy(output_format: str) -> None:
    """The lm_head excluded (default): a table in the same initializer stays float; a separate copy is quantized."""
    model, _ = tiny_lm("transpose")
    result = quantize(
        model, calibration_method="rtn", block_size=16, output_format=output_format, quantize_embeddings=True
    )
    inits = {init.name: init for init in result.graph.initializer}
    assert inits["lm_head.weight"].data_type == onnx.TensorProto.FLOAT
    assert not any(name.startswith("lm_head.weight_") for name in inits)
    assert "Gather" in [n.op_type for n in result.graph.node]
    model, weights = tiny_lm("copies")
    result = quantize(
        model,
        calibration_method="rtn",
        block_size=16,
        output_format=output_format,
        accuracy_level=0,
        quantize_embeddings=True,
    )
    inits = {init.name: init for init in result.graph.initializer}
    assert inits["lm_head.weight"].data_type == onnx.TensorProto.FLOAT and "embed.weight" not in inits
    quantized = {key: quantize_rtn(weights[key], 16).dequantize() for key in ("embedding", "w1")}
    ids = _ids("copies")
    (y,) = run_fp32_compute(result, {"ids": ids})
    np.testing.assert_allclose(y, _reference(weights, ids, quantized), rtol=1e-5, atol=1e-5)


def test_nearly_equal_copies_are_not_merged() -> None:
    model, _ = tiny_lm("copies")
    head = next(i for i in model.graph.initializer if i.name == "lm_head.weight")
    array = onnx.numpy_helper.to_array(head).copy()
    array[5, 40] += 1e-3  # not a column the fingerprint reads
    head.CopyFrom(onnx.numpy_helper.from_array(array, "lm_head.weight"))
    result = quantize(model, calibration_method="rtn", block_size=16, nodes_to_exclude=[], quantize_embeddings=True)
    inits = {init.name for init in result.graph.initializer}
    assert {"embed.weight_q4", "lm_head.weight_q4"} <= inits


def test_report_and_file_sizes(tmp_path: Path) -> None:
    model, _ = tiny_lm("copies", v=512, h=64)
    source = tmp_path / "lm.onnx"
    onnx.save(model, source)
    report = quantize_file(
        source,
        tmp_path / "q.onnx",
        calibration_method="rtn",
        block_size=32,
        nodes_to_exclude=[],
        quantize_embeddings=True,
    )
    assert report.float_bytes == (2 * 512 * 64 + 64 * 64) * 4  # both copies of the tied matrix counted
    (entry,) = [e for e in report.layers if len(e.layers) == 2]
    assert entry.layers == ["/lm_head/MatMul", "/embed/Gather"] and entry.method == "rtn"
    size = (tmp_path / "q.onnx").stat().st_size
    assert size < report.quantized_bytes + 4000 and report.quantized_bytes == (512 * 64 // 2 + 512 * 2 * 4) + (
        64 * 64 // 2 + 2 * 64 * 4
    )


@pytest.mark.parametrize("known_rank", [True, False])
def test_gather_of_columns_matches_gather_of_rows(known_rank: bool) -> None:
    """A tied QDQ table gathers columns of the [H, V] weight and transposes them (or, rank unknown, the table)."""
    model, weights = tiny_lm("transpose")
    ir_model = ir.serde.deserialize_model(model)
    graph = ir_model.graph
    gather = next(node for node in graph if node.op_type == "Gather")
    ids = gather.inputs[1]
    assert ids is not None
    if not known_rank:
        ids.shape = None
    layer = Layer(gather, graph.initializers["lm_head.weight"], ids)
    _gather_columns(graph, layer, graph.initializers["lm_head.weight"], NameAllocator(ir_model))
    graph.remove(next(node for node in graph if node.name == "/embed/Transpose"), safe=True)
    ops = [node.op_type for node in graph]
    assert ops[:2] == (["Gather", "Transpose"] if known_rank else ["Transpose", "Gather"])
    result = ir.serde.serialize_model(ir_model)
    ids_value = _ids("transpose")
    (y,) = run_fp32_compute(result, {"ids": ids_value})
    np.testing.assert_allclose(y, _reference(weights, ids_value, {}), rtol=1e-5, atol=1e-5)


def _level_types(proto: onnx.ModelProto) -> dict[str, int]:
    """The data type of each QDQ-quantized weight's levels, by the DequantizeLinear that reads them."""
    inits = {init.name: init.data_type for init in proto.graph.initializer}
    return {node.name: inits[node.input[0]] for node in proto.graph.node if node.op_type == "DequantizeLinear"
            and node.input[0] in inits}  # fmt: skip


def test_llm_default_quantizes_embedding_and_head_with_the_head_at_8_bits() -> None:
    """An LLM without layer options: every MatMul and the embedding table quantized, as MatMulNBits and
    GatherBlockQuantized, the logits' MatMul at 8 bits; --nodes_to_exclude gives ModelOpt's default back (QDQ, head
    and embedding in float)."""
    from onnxprec._testing import tiny_decoder

    model = tiny_decoder(vocab=64, head_size=16)
    result = quantize(model, calibration_method="rtn")
    bits = {
        node.name: next(a.i for a in node.attribute if a.name == "bits")
        for node in result.graph.node
        if node.op_type in ("MatMulNBits", "GatherBlockQuantized")
    }
    assert [b for name, b in bits.items() if "lm_head" in name] == [8]
    assert len(bits) > 2 and all(b == 4 for name, b in bits.items() if "lm_head" not in name)
    assert any(node.op_type == "GatherBlockQuantized" for node in result.graph.node)
    assert not [node for node in result.graph.node if node.op_type in ("DequantizeLinear", "MatMul")]
    modelopt = quantize(model, calibration_method="rtn", nodes_to_exclude=["lm_head"])  # builder: /lm_head/MatMul
    kept = _level_types(modelopt)
    assert not [name for name in kept if "lm_head" in name] and all(t == onnx.TensorProto.INT4 for t in kept.values())
    gathers = [node for node in modelopt.graph.node if node.op_type == "Gather"]
    inits = {i.name for i in modelopt.graph.initializer}
    assert any(node.input[0] in inits for node in gathers)  # the float table is read directly


def test_llm_default_keeps_a_tied_head_at_4_bits() -> None:
    """A head tied to the embedding (equal content) is one table: at 8 bits it would take twice the builder's INT4
    bytes, so it stays at 4 bits, read by the head's MatMulNBits and the GatherBlockQuantized."""
    from onnx import numpy_helper

    from onnxprec._testing import tiny_decoder

    model = tiny_decoder(vocab=64, head_size=16)
    inits = {init.name: init for init in model.graph.initializer}
    table = numpy_helper.to_array(inits["embed"])
    inits["lm_head"].CopyFrom(numpy_helper.from_array(np.ascontiguousarray(table.T), "lm_head"))
    result = quantize(model, calibration_method="rtn")
    bits = [next(a.i for a in n.attribute if a.name == "bits") for n in result.graph.node
            if n.op_type in ("MatMulNBits", "GatherBlockQuantized")]  # fmt: skip
    assert len(bits) == 6 and set(bits) == {4}  # 4 layers + the head, and the Gather of the same table
    quantized = [i for i in result.graph.initializer if i.data_type == onnx.TensorProto.UINT8]
    assert len(quantized) == 5  # the table is stored once
