"""AWQ input scaling: folding into a parent is exact, an explicit Mul is the same function, quantized parents stay."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import helper

from onnxprec._graph import NameAllocator
from onnxprec._testing import F, make_model, run, tensor_info
from onnxprec.quantization.scaling import apply_input_scales, foldable_parent
from onnxprec.quantization.select import select_layers

K, N = 16, 8
RNG = np.random.default_rng(0)
W = RNG.standard_normal((K, N)).astype(np.float32)
GAMMA = RNG.uniform(0.5, 2, K).astype(np.float32)
SCALES = RNG.uniform(0.2, 5, K).astype(np.float32)
X = RNG.standard_normal((2, 3, K)).astype(np.float32)


def _model(parent: onnx.NodeProto, inits: dict[str, np.ndarray], extra: list[onnx.NodeProto] = ()) -> onnx.ModelProto:
    nodes = [parent, helper.make_node("MatMul", ["xn", "W"], ["Y"], name="mm"), *extra]
    outputs = [tensor_info("Y", F, [2, 3, N])] + [
        tensor_info(n.output[0], onnx.TensorProto.INT64, [3])
        if n.op_type == "Shape"
        else tensor_info(n.output[0], F, [2, 3, K])
        for n in extra
    ]
    return make_model(nodes, [tensor_info("X", F, [2, 3, K])], outputs, {"W": W, **inits}, opset=17)


def _scaled(proto: onnx.ModelProto) -> tuple[onnx.ModelProto, str]:
    """Multiplies the weight's rows by SCALES and divides the MatMul's input by them; returns the model and how."""
    model = ir.serde.deserialize_model(proto)
    (group,) = select_layers(model).groups()
    weight = group.layers[0].weight
    weight.const_value = ir.Tensor(W * SCALES[:, None])
    how = apply_input_scales(model.graph, group, SCALES, NameAllocator(model))
    return ir.serde.serialize_model(model), how


def _check_same_function(proto: onnx.ModelProto) -> str:
    scaled, how = _scaled(proto)
    onnx.checker.check_model(scaled, full_check=True)
    expected = run(proto, {"X": X})
    for got, want in zip(run(scaled, {"X": X}), expected):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    return how


def test_mul_parent_is_folded_and_exact() -> None:
    proto = _model(helper.make_node("Mul", ["X", "gamma"], ["xn"], name="norm"), {"gamma": GAMMA})
    how = _check_same_function(proto)
    assert how == "folded into Mul 'norm'"
    scaled, _ = _scaled(proto)
    assert [n.op_type for n in scaled.graph.node] == ["Mul", "MatMul"]


def test_folded_and_explicit_mul_give_the_same_outputs() -> None:
    folded = _model(helper.make_node("Mul", ["X", "gamma"], ["xn"], name="norm"), {"gamma": GAMMA})
    # the same graph whose normalized input is also a graph output: folding would change that output -> a Mul
    explicit = _model(
        helper.make_node("Mul", ["X", "gamma"], ["xn"], name="norm"),
        {"gamma": GAMMA},
        [helper.make_node("Identity", ["xn"], ["xn_out"], name="tap")],
    )
    assert _check_same_function(explicit) == "Mul"
    assert _check_same_function(folded).startswith("folded")
    (a,) = run(_scaled(folded)[0], {"X": X})
    b = run(_scaled(explicit)[0], {"X": X})[0]
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_shape_consumers_do_not_prevent_folding() -> None:
    proto = _model(
        helper.make_node("Mul", ["X", "gamma"], ["xn"], name="norm"),
        {"gamma": GAMMA},
        [helper.make_node("Shape", ["xn"], ["shape"], name="shape")],
    )
    assert _check_same_function(proto).startswith("folded")


def test_scalar_mul_parent_becomes_per_channel() -> None:
    # ModelOpt crashes here ("cannot reshape array of size 1024 into shape ()")
    proto = _model(
        helper.make_node("Mul", ["X", "half"], ["xn"], name="gelu_tail"), {"half": np.array(0.5, np.float32)}
    )
    assert _check_same_function(proto) == "folded into Mul 'gelu_tail'"


@pytest.mark.parametrize("with_bias", [True, False])
def test_layer_normalization_parent(with_bias: bool) -> None:
    inputs = ["X", "scale", "bias"] if with_bias else ["X", "scale"]
    inits = {"scale": GAMMA, "bias": RNG.standard_normal(K).astype(np.float32)} if with_bias else {"scale": GAMMA}
    proto = _model(helper.make_node("LayerNormalization", inputs, ["xn"], name="ln", axis=-1), inits)
    assert _check_same_function(proto) == "folded into LayerNormalization 'ln'"


def test_shared_parameter_is_copied_not_changed() -> None:
    proto = _model(
        helper.make_node("Mul", ["X", "gamma"], ["xn"], name="norm"),
        {"gamma": GAMMA},
        [helper.make_node("Mul", ["X", "gamma"], ["other"], name="other")],
    )
    scaled, how = _scaled(proto)
    assert how.startswith("folded")
    other = next(n for n in scaled.graph.node if n.name == "other")
    assert other.input[1] == "gamma"
    norm = next(n for n in scaled.graph.node if n.name == "norm")
    assert norm.input[1] != "gamma"
    _check_same_function(proto)


def test_quantized_parent_is_never_folded_into() -> None:
    # ModelOpt folds 1/s into a parent MatMul's weight, then quantizes that weight: the correction is lost
    nodes = [helper.make_node("MatMul", ["X", "W0"], ["xn"], name="parent")]
    proto = _model(nodes[0], {"W0": RNG.standard_normal((K, K)).astype(np.float32)})
    model = ir.serde.deserialize_model(proto)
    groups = select_layers(model).groups()
    second = next(g for g in groups if g.layers[0].node.name == "mm")
    parent, _, why = foldable_parent(second)
    assert parent is None and "not a Mul or a normalization" in why
    assert _check_same_function_chain(proto) == "Mul"


def _check_same_function_chain(proto: onnx.ModelProto) -> str:
    model = ir.serde.deserialize_model(proto)
    second = next(g for g in select_layers(model).groups() if g.layers[0].node.name == "mm")
    second.layers[0].weight.const_value = ir.Tensor(W * SCALES[:, None])
    how = apply_input_scales(model.graph, second, SCALES, NameAllocator(model))
    scaled = ir.serde.serialize_model(model)
    np.testing.assert_allclose(run(scaled, {"X": X})[0], run(proto, {"X": X})[0], rtol=1e-5, atol=1e-5)
    return how
