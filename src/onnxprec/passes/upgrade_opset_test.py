"""UpgradeOpsetPass: raises the default opset (never lowers it), subgraphs included, IR version only as needed."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnx import TensorProto, helper

from onnxprec._testing import F, make_model, run, tensor_info
from onnxprec.passes import UpgradeOpsetPass


def _squeeze_model(opset: int) -> ir.Model:
    nodes = [helper.make_node("Squeeze", ["X"], ["Y"], axes=[0], name="squeeze")]
    proto = make_model(nodes, [tensor_info("X", F, [1, 3])], [tensor_info("Y", F, [3])], opset=opset, ir_version=6)
    return ir.from_proto(proto)


def test_upgrades_once_and_raises_ir_version_only_as_needed() -> None:
    model = _squeeze_model(11)
    upgrade = UpgradeOpsetPass(13)
    assert upgrade(model).modified
    assert model.opset_imports[""] == 13 and model.ir_version == 7
    (squeeze,) = (n for n in model.graph if n.op_type == "Squeeze")
    assert "axes" not in squeeze.attributes and len(squeeze.inputs) == 2  # opset 13: axes is an input
    assert not upgrade(model).modified
    assert model.opset_imports[""] == 13


def test_never_lowers_the_opset() -> None:
    model = _squeeze_model(17)
    assert not UpgradeOpsetPass(13)(model).modified
    assert model.opset_imports[""] == 17 and model.ir_version == 6


def test_converts_ops_inside_if_branches() -> None:
    branches = {
        name: helper.make_graph(
            [helper.make_node("Squeeze", ["X"], [out], axes=[0], name=f"squeeze_{out}")],
            name,
            [],
            [tensor_info(out, F, [3])],
        )
        for name, out in (("then_branch", "t"), ("else_branch", "e"))
    }
    nodes = [helper.make_node("If", ["C"], ["Y"], name="if", **branches)]
    inputs = [tensor_info("X", F, [1, 3]), tensor_info("C", TensorProto.BOOL, [])]
    model = ir.from_proto(make_model(nodes, inputs, [tensor_info("Y", F, [3])], opset=11, ir_version=6))
    assert UpgradeOpsetPass(13)(model).modified
    squeezes = [n for n in model.graph.all_nodes() if n.op_type == "Squeeze"]
    assert len(squeezes) == 2
    assert all("axes" not in n.attributes and len(n.inputs) == 2 for n in squeezes)
    assert not UpgradeOpsetPass(13)(model).modified


def test_onnx_runtime_ops_of_the_onnx_domain_survive_the_upgrade() -> None:
    """SimplifiedLayerNormalization is no ONNX op (the converter would fail on it): it keeps its domain, and the
    Squeeze beside it is converted."""
    nodes = [
        helper.make_node("SimplifiedLayerNormalization", ["X", "scale"], ["h"], name="norm", epsilon=1e-5),
        helper.make_node("Squeeze", ["h"], ["Y"], axes=[0], name="squeeze"),
    ]
    scale = {"scale": np.ones(3, np.float32)}
    proto = make_model(nodes, [tensor_info("X", F, [1, 3])], [tensor_info("Y", F, [3])], scale, opset=11, ir_version=6)
    model = ir.from_proto(proto)
    assert UpgradeOpsetPass(21)(model).modified
    assert dict(model.opset_imports) == {"": 21}
    norm, squeeze = (n for n in model.graph if n.op_type in ("SimplifiedLayerNormalization", "Squeeze"))
    assert norm.domain == "" and len(squeeze.inputs) == 2
    x = np.array([[1.0, -2.0, 3.0]], np.float32)
    (y,) = run(ir.to_proto(model), {"X": x})
    np.testing.assert_allclose(y, x[0] / np.sqrt(np.mean(x**2) + 1e-5), rtol=1e-5)


def test_a_declared_shape_the_conversion_only_refined_is_given_back() -> None:
    """ONNX's converter (opset 21 goes through it) infers shapes and writes them into the graph outputs: a symbolic
    width of a Concat became static in paraphrase-MiniLM's pooled output, which refused INT4 as an interface change."""
    nodes = [
        helper.make_node("MatMul", ["X", "W"], ["h"], name="/fc"),
        helper.make_node("Concat", ["h", "h"], ["Y"], name="/concat", axis=1),
    ]
    weights = {"W": np.ones((8, 4), np.float32)}
    proto = make_model(nodes, [tensor_info("X", F, ["N", 8])], [tensor_info("Y", F, ["N", "D"])], weights, opset=17)
    model = ir.from_proto(proto)
    assert UpgradeOpsetPass(21)(model).modified and model.opset_imports[""] == 21
    assert model.graph.outputs[0].shape == ir.Shape(["N", "D"])
    x = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)
    (y,) = run(ir.to_proto(model), {"X": x})
    np.testing.assert_allclose(y, np.concatenate([x @ weights["W"]] * 2, axis=1), rtol=1e-6)
