"""FP8 inside If branches (INT8's pipeline: calibration on a copy with the taken branch inlined): FP8 Q/DQ inside the
branch the data takes, the other branch float, checker and strict shape inference, numerics in ONNX Runtime against
the float model; a branch of GEMVs stays float by TensorRT's rule unless named in nodes_to_quantize."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

from onnxprec._ort import create_session
from onnxprec._testing import F, make_model, tensor_info
from onnxprec.quantization.fp8 import quantize_file

FP8 = onnx.TensorProto.FLOAT8E4M3FN
_RNG = np.random.default_rng(11)
_DIM = 32


def _weight(name: str) -> onnx.TensorProto:
    values = (_RNG.standard_normal((_DIM, _DIM)) / np.sqrt(_DIM)).astype(np.float32)
    return helper.make_tensor(f"{name}_w", F, [_DIM, _DIM], values.reshape(-1))


def _branch(name: str) -> onnx.GraphProto:
    """``Relu(Gemm(h))`` reading the main graph's ``h`` (outer scope)."""
    nodes = [
        helper.make_node("Gemm", ["h", f"{name}_w"], [f"{name}_g"], transB=1, name=f"{name}/Gemm"),
        helper.make_node("Relu", [f"{name}_g"], [f"{name}_y"], name=f"{name}/Relu"),
    ]
    return helper.make_graph(nodes, name, [], [tensor_info(f"{name}_y", F, None)], [_weight(name)])


def _model(rows: int) -> onnx.ModelProto:
    """Gemm -> Relu (main) -> If on a boolean input, each branch a Gemm reading the main Relu's output."""
    nodes = [
        helper.make_node("Gemm", ["x", "main_w"], ["g"], transB=1, name="main/Gemm"),
        helper.make_node("Relu", ["g"], ["h"], name="main/Relu"),
        helper.make_node("If", ["flag"], ["y"], name="If_0", then_branch=_branch("then"),
                         else_branch=_branch("else")),
    ]  # fmt: skip
    inits = {"main_w": onnx.numpy_helper.to_array(_weight("main"))}
    inputs = [tensor_info("x", F, [rows, _DIM]), tensor_info("flag", onnx.TensorProto.BOOL, [])]
    return make_model(nodes, inputs, [tensor_info("y", F, [rows, _DIM])], inits)


def _data(flag: bool, rows: int, n: int = 4, seed: int = 0) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((rows, _DIM)).astype(np.float32), "flag": np.array(flag)} for _ in range(n)]


def _run(path: Path, feeds: dict[str, np.ndarray]) -> np.ndarray:
    """The Q/DQ graph as written (no ONNX Runtime rewrites), FP32 out."""
    return np.asarray(create_session(str(path), optimization="none").run(feeds)[0], dtype=np.float32)


def _branches(graph: onnx.GraphProto) -> dict[str, onnx.GraphProto]:
    node = next(n for n in graph.node if n.op_type == "If")
    return {a.name: a.g for a in node.attribute}


def _producers(graph: onnx.GraphProto) -> dict[str, onnx.NodeProto]:
    return {o: n for n in graph.node for o in n.output}


def _fp8_weights(graph: onnx.GraphProto) -> list[str]:
    """The FP8 initializers a DequantizeLinear reads as its levels."""
    fp8 = {i.name for i in graph.initializer if i.data_type == FP8}
    return [n.input[0] for n in graph.node if n.op_type == "DequantizeLinear" and n.input[0] in fp8]


def _fp8_zero_point(graph: onnx.GraphProto, node: onnx.NodeProto) -> bool:
    return any(i.name == node.input[2] and i.data_type == FP8 for i in graph.initializer)


@pytest.mark.slow
@pytest.mark.parametrize("flag", [True, False])
def test_the_gemm_of_the_branch_the_data_takes_gets_fp8_qdq(tmp_path: Path, flag: bool) -> None:
    source, output = tmp_path / "if.onnx", tmp_path / "fp8.onnx"
    onnx.save(_model(rows=4), source)
    report = quantize_file(source, output, calibration_data=_data(flag, rows=4))
    taken, other = ("then", "else") if flag else ("else", "then")
    assert report.in_branches == 1 and report.in_subgraphs == {"If": 1}
    assert [name for name, _ in report.skipped] == [f"{other}/Gemm"]
    assert report.summary.startswith("FP8 for trt: 2/2 layers quantized") and report.check["passed"]
    model = onnx.load(output)
    onnx.checker.check_model(model, full_check=True)
    onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True, data_prop=True)
    branches = _branches(model.graph)
    # the taken branch's Gemm reads its FP8 weight and the FP8 Q/DQ of the main graph's activation
    gemm = next(n for n in branches[f"{taken}_branch"].node if n.op_type == "Gemm")
    inner, outer = _producers(branches[f"{taken}_branch"]), _producers(model.graph)
    assert inner[gemm.input[1]].op_type == "DequantizeLinear"
    assert _fp8_weights(branches[f"{taken}_branch"]) == [inner[gemm.input[1]].input[0]]
    assert outer[gemm.input[0]].op_type == "DequantizeLinear"
    quantize = outer[outer[gemm.input[0]].input[0]]
    assert quantize.op_type == "QuantizeLinear" and _fp8_zero_point(model.graph, quantize)
    other_gemm = next(n for n in branches[f"{other}_branch"].node if n.op_type == "Gemm")
    assert other_gemm.input[1] == f"{other}_w" and not _fp8_weights(branches[f"{other}_branch"])
    for batch in _data(flag, rows=4, n=3, seed=1):
        ref, got = _run(source, batch), _run(output, batch)
        assert np.linalg.norm(ref - got) / np.linalg.norm(ref) < 0.08


@pytest.mark.slow
def test_gemvs_in_a_branch_stay_float_unless_named(tmp_path: Path) -> None:
    """One row per run: every Gemm is a GEMV, which TensorRT runs better in float (ModelOpt's GEMV rule)."""
    source = tmp_path / "gemv.onnx"
    onnx.save(_model(rows=1), source)
    unquantized = tmp_path / "fp16.onnx"  # as ModelOpt: no FP8 layer, the model written with its FP16 remainder
    report = quantize_file(source, unquantized, calibration_data=_data(True, rows=1))
    assert "none quantized: the placement rules skipped all 3 candidates" in report.summary
    assert not any(_fp8_weights(branch) for branch in _branches(onnx.load(unquantized).graph).values())
    output = tmp_path / "fp8.onnx"
    data = _data(True, rows=1, n=32)  # one row a run: enough runs for the activation ranges
    report = quantize_file(source, output, calibration_data=data, nodes_to_quantize=[".*/Gemm"])
    assert report.in_branches == 1 and [name for name, _ in report.skipped] == ["else/Gemm"]
    assert _fp8_weights(_branches(onnx.load(output).graph)["then_branch"]) == ["then_w_fp8"]
    batches = _data(True, rows=1, n=8, seed=2)
    ref = np.concatenate([_run(source, batch) for batch in batches])
    got = np.concatenate([_run(output, batch) for batch in batches])
    assert np.linalg.norm(ref - got) / np.linalg.norm(ref) < 0.08
