"""The output formats on a model written in ONNX text: QDQ and MatMulNBits give the dequantized weight's product
in ONNX Runtime, and each weight is quantized once, when the first of its pieces is read."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.parser
import onnx_ir as ir
import pytest

from onnxprec._graph import NameAllocator
from onnxprec._ort import create_session
from onnxprec.quantization.formats import rewrite_matmulnbits, rewrite_qdq
from onnxprec.quantization.formats.quantized_weight import LazyQuantizedWeight
from onnxprec.quantization.methods import Recipe
from onnxprec.quantization.select import select_layers

RNG = np.random.default_rng(0)
W = RNG.standard_normal((64, 16)).astype(np.float32)
WT = RNG.standard_normal((16, 64)).astype(np.float32)  # Gemm transB=1: stored [N, K]


def _model() -> ir.Model:
    proto = onnx.parser.parse_model("""
        <ir_version: 10, opset_import: ["" : 21]>
        main (float[3, 64] x) => (float[3, 16] y, float[3, 16] z) {
            y = MatMul (x, w)
            z = Gemm <transB = 1> (x, wt)
        }
    """)
    proto.graph.initializer.extend([onnx.numpy_helper.from_array(W, "w"), onnx.numpy_helper.from_array(WT, "wt")])
    return ir.serde.deserialize_model(proto)


@pytest.mark.parametrize("output_format", ["qdq", "matmulnbits"])
@pytest.mark.parametrize("symmetric", [True, False])
def test_rewritten_model_computes_with_the_dequantized_weights(output_format: str, symmetric: bool) -> None:
    model = _model()
    selection = select_layers(model)
    assert [t.weight.name for t in selection.targets] == ["w", "wt"]
    names = NameAllocator(model)
    recipe = Recipe("rtn", block_size=32, symmetric=symmetric)
    quantized: list[str] = []
    expected = {}
    for target in selection.targets:
        lazy = LazyQuantizedWeight(
            target.weight.const_value,  # type: ignore[arg-type]
            recipe,
            transposed=target.transposed,
            on_done=lambda w, qw, s, name=str(target.weight.name): quantized.append(name),
        )
        expected[str(target.weight.name)] = recipe.dequantized(recipe.quantize(lazy.weight()))
        if output_format == "qdq":
            rewrite_qdq(model.graph, target, lazy, names)
        else:
            rewrite_matmulnbits(model.graph, target, lazy, names, accuracy_level=1)
        for value in (target.weight, *target.duplicates):
            if not value.uses():
                model.graph.initializers.pop(str(value.name))
    assert quantized == []  # nothing quantized until the pieces are read
    proto = ir.serde.serialize_model(model)
    assert sorted(quantized) == ["w", "wt"]  # once each, while the model was written
    ops = {n.op_type for n in proto.graph.node}
    assert ops >= ({"DequantizeLinear"} if output_format == "qdq" else {"MatMulNBits"})
    if output_format == "qdq":
        onnx.checker.check_model(proto, full_check=True)
    x = RNG.standard_normal((3, 64)).astype(np.float32)
    # The graph's meaning, without ONNX Runtime's fusions (at level "all" it fuses DequantizeLinear(INT4) -> Gemm
    # into a kernel that rounds the activations: 0.15 abs error here where DequantizeLinear -> MatMul stays exact).
    y, z = create_session(proto, optimization="basic").run({"x": x})
    np.testing.assert_allclose(y, x @ expected["w"], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(z, x @ expected["wt"], rtol=1e-4, atol=1e-4)
    assert not np.allclose(y, x @ W, atol=1e-3)  # the weights really are quantized


def test_a_piece_that_the_packer_does_not_make_is_an_error() -> None:
    lazy = LazyQuantizedWeight(ir.Tensor(W), Recipe("rtn", block_size=32))
    lazy.set_packer(lambda qw: {"data": qw.q}, ["data"])
    with pytest.raises(KeyError, match="unknown piece 'scales'"):
        lazy.piece("scales", ir.DataType.FLOAT, (2, 16), "s")
