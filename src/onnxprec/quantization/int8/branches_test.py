"""INT8 inside If branches: calibration on a copy with the branch the data takes inlined, Q/DQ inside the branch,
outer-scope values kept, numerics against ONNX Runtime, checker and strict shape inference on the result."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import helper

from onnxprec._testing import F, make_model, run, tensor_info
from onnxprec.passes.inline_taken_branches import InlineTakenBranchesPass
from onnxprec.quantization.int8 import quantize_file

_RNG = np.random.default_rng(7)


def _conv(name: str, x: str, y: str) -> tuple[onnx.NodeProto, onnx.TensorProto]:
    weight = helper.make_tensor(f"{name}_w", F, [4, 4, 3, 3], (_RNG.standard_normal(144) * 0.3).astype(np.float32))
    return helper.make_node("Conv", [x, f"{name}_w"], [y], pads=[1, 1, 1, 1], name=f"{name}/Conv"), weight


def _branch(name: str, nested: onnx.NodeProto | None = None) -> onnx.GraphProto:
    """``Conv(h) + Transpose(h)``, both reading the main graph's ``h`` (outer scope); ``nested``: an If after it."""
    conv, weight = _conv(name, "h", f"{name}_c")
    nodes = [conv, helper.make_node("Relu", [f"{name}_c"], [f"{name}_r"], name=f"{name}/Relu"),
             helper.make_node("Add", [f"{name}_r", "t"], [f"{name}_y"], name=f"{name}/Add")]  # fmt: skip
    out = f"{name}_y"
    if nested is not None:
        nodes.append(nested)
        out = nested.output[0]
    return helper.make_graph(nodes, name, [], [tensor_info(out, F, None)], [weight])


def _model(nested: bool = False) -> onnx.ModelProto:
    """Relu -> Conv (main) -> If on a boolean input, each branch a Conv reading the main Conv's output and the
    Transpose of it from the outer scope (the pattern that aborted ONNX Runtime's QDQ propagation); ``nested``: the
    then-branch holds another If on the same flag."""
    inner = None
    if nested:
        inner = helper.make_node("If", ["flag"], ["inner_y"], name="If_inner",
                                 then_branch=_branch("inner_then"), else_branch=_branch("inner_else"))  # fmt: skip
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        _conv("main", "r", "h")[0],
        helper.make_node("Transpose", ["h"], ["t"], perm=[0, 1, 3, 2], name="transpose"),
        helper.make_node("If", ["flag"], ["y"], name="If_0", then_branch=_branch("then", inner),
                         else_branch=_branch("else")),
    ]  # fmt: skip
    inits = {"main_w": (_RNG.standard_normal((4, 4, 3, 3)) * 0.3).astype(np.float32)}
    inputs = [tensor_info("x", F, [1, 4, 8, 8]), tensor_info("flag", onnx.TensorProto.BOOL, [])]
    return make_model(nodes, inputs, [tensor_info("y", F, [1, 4, 8, 8])], inits)


def _data(flag: bool, n: int = 4, seed: int = 0) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((1, 4, 8, 8)).astype(np.float32), "flag": np.array(flag)} for _ in range(n)]


def _ops(graph: onnx.GraphProto) -> list[str]:
    return [node.op_type for node in graph.node]


def _branches(graph: onnx.GraphProto, name: str = "If_0") -> dict[str, onnx.GraphProto]:
    node = next(n for n in graph.node if n.name == name)
    return {a.name: a.g for a in node.attribute}


def _strictly_checked(path: Path) -> onnx.ModelProto:
    model = onnx.load(path)
    onnx.checker.check_model(model, full_check=True)
    onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True, data_prop=True)
    return model


@pytest.mark.slow
@pytest.mark.parametrize("flag", [True, False])
def test_the_branch_the_data_takes_gets_qdq_inside_and_matches_onnx_runtime(tmp_path: Path, flag: bool) -> None:
    source, output = tmp_path / "if.onnx", tmp_path / "q.onnx"
    onnx.save(_model(), source)
    report = quantize_file(source, output, calibration_data=_data(flag))
    taken, other = ("then", "else") if flag else ("else", "then")
    assert report.in_branches == 1 and report.in_subgraphs == {"If": 1}
    assert {name for name, _ in report.skipped} == {f"{other}/Conv"}
    assert report.check["passed"]
    model = _strictly_checked(output)
    branches = _branches(model.graph)
    inside = _ops(branches[f"{taken}_branch"])
    assert "QuantizeLinear" in inside and "DequantizeLinear" in inside
    assert "QuantizeLinear" not in _ops(branches[f"{other}_branch"])
    # the Transpose the branch reads from the outer scope reads the float value: no DequantizeLinear before it
    transpose = next(n for n in model.graph.node if n.op_type == "Transpose")
    assert transpose.input == ["h"]
    for data in (_data(flag, 3, seed=1), _data(not flag, 3, seed=1)):
        for batch in data:
            (ref,), (got,) = run(source, batch), run(output, batch)
            error = np.linalg.norm(ref - got) / np.linalg.norm(ref)
            # the quantized branch is close; the other branch reads the quantized main Conv and is otherwise float
            assert error < 0.05, (bool(batch["flag"]), error)


def test_a_nested_if_is_inlined_in_a_second_round_and_quantized(tmp_path: Path) -> None:
    source, output = tmp_path / "nested.onnx", tmp_path / "q.onnx"
    onnx.save(_model(nested=True), source)
    report = quantize_file(source, output, calibration_data=_data(True))
    assert report.in_branches == 2
    assert sorted(name for name, _ in report.skipped) == ["else/Conv", "inner_else/Conv"]
    model = _strictly_checked(output)
    inner = _branches(_branches(model.graph)["then_branch"], "If_inner")
    assert "QuantizeLinear" in _ops(inner["then_branch"])
    batch = _data(True, 1, seed=2)[0]
    (ref,), (got,) = run(source, batch), run(output, batch)
    assert np.linalg.norm(ref - got) / np.linalg.norm(ref) < 0.05


def test_a_condition_that_changes_across_the_data_keeps_both_branches_float(tmp_path: Path) -> None:
    source = tmp_path / "if.onnx"
    onnx.save(_model(), source)
    data = [*_data(True, 2), *_data(False, 2, seed=1)]
    report = quantize_file(source, tmp_path / "q.onnx", calibration_data=data)
    assert report.in_branches == 0 and report.in_subgraphs == {"If": 2}
    assert all("changes from batch to batch" in reason for _, reason in report.skipped)
    assert report.count("static") == 1


def test_inlining_the_taken_branch_keeps_inputs_outputs_and_values(tmp_path: Path) -> None:
    source = tmp_path / "if.onnx"
    onnx.save(_model(nested=True), source)
    model = ir.load(source)
    result = InlineTakenBranchesPass({"If_0": True, "If_inner": True})(model)
    assert result.modified and not any(node.op_type == "If" for node in model.graph)
    assert [v.name for v in model.graph.outputs] == ["y"] and [v.name for v in model.graph.inputs] == ["x", "flag"]
    assert {"then_c", "inner_then_c"} <= {str(v.name) for node in model.graph for v in node.outputs}
    ir.save(model, tmp_path / "inlined.onnx")
    _strictly_checked(tmp_path / "inlined.onnx")
    batch = _data(True, 1)[0]
    (ref,), (got,) = run(source, batch), run(tmp_path / "inlined.onnx", batch)
    np.testing.assert_array_equal(ref, got)


def test_a_conv_reading_the_model_input_through_an_if_that_only_relays_it_stays_float(tmp_path: Path) -> None:
    """Silero VAD v4 squeezes its audio in one branch of an If and passes it on in the other, then its STFT Conv
    reads it: the rule that keeps a layer reading the model input float sees through that If."""
    identity = {name: helper.make_node("Identity", ["x"], [f"{name}_x"], name=f"{name}/Identity") for name in "ab"}
    relay = [
        helper.make_graph([node], name, [], [tensor_info(f"{name}_x", F, None)]) for name, node in identity.items()
    ]
    conv, weight = _conv("first", "xr", "h")
    nodes = [
        helper.make_node("If", ["flag"], ["xr"], name="If_relay", then_branch=relay[0], else_branch=relay[1]),
        conv,
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        _conv("second", "r", "y")[0],
    ]
    inits = {"first_w": onnx.numpy_helper.to_array(weight),
             "second_w": (_RNG.standard_normal((4, 4, 3, 3)) * 0.3).astype(np.float32)}  # fmt: skip
    inputs = [tensor_info("x", F, [1, 4, 8, 8]), tensor_info("flag", onnx.TensorProto.BOOL, [])]
    source = tmp_path / "relay.onnx"
    onnx.save(make_model(nodes, inputs, [tensor_info("y", F, [1, 4, 8, 8])], inits), source)
    report = quantize_file(source, tmp_path / "q.onnx", calibration_data=_data(True))
    assert ("first/Conv", "reads the model input 'x': kept float (name it in nodes_to_quantize)") in report.skipped
    assert report.count("static") == 1
