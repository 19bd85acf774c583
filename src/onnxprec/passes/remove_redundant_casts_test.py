"""RemoveRedundantCastsPass: no-op casts go, exact chains shorten, casts of initializers fold (clamped)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
from onnx import TensorProto, helper

from onnxprec._graph import ORIGINAL_NAME
from onnxprec._testing import F16, F, make_model, tensor_info
from onnxprec.passes import InferTypesPass, RemoveRedundantCastsPass, RemoveRedundantCastsResult


def _typed(proto: onnx.ModelProto) -> ir.Model:
    model = ir.from_proto(proto)
    InferTypesPass()(model)
    return model


def _casts(graph: ir.Graph) -> list[ir.Node]:
    return [n for n in graph if n.op_type == "Cast"]


def _run(model: ir.Model, fold_max_bytes: int | None = None) -> RemoveRedundantCastsResult:
    result = RemoveRedundantCastsPass(fold_max_bytes)(model)
    assert isinstance(result, RemoveRedundantCastsResult)
    return result


def test_removes_exact_round_trips_and_keeps_lossy_ones() -> None:
    nodes = [
        helper.make_node("Cast", ["H"], ["h32"], to=F, name="up"),  # fp16 -> fp32 -> fp16: exact, both go
        helper.make_node("Cast", ["h32"], ["h16"], to=F16, name="down"),
        helper.make_node("Cast", ["X"], ["x16"], to=F16, name="lossy"),  # fp32 -> fp16 -> fp32: both stay
        helper.make_node("Cast", ["x16"], ["x32"], to=F, name="back"),
        helper.make_node("Cast", ["X"], ["same"], to=F, name="noop"),  # fp32 -> fp32: goes
        helper.make_node("Add", ["x32", "same"], ["s"], name="add"),
        helper.make_node("Cast", ["s"], ["Y"], to=F, name="output_noop"),  # graph output: kept, with its name
        helper.make_node("Relu", ["h16"], ["Z"], name="relu"),
    ]
    inputs = [tensor_info("H", F16, [2]), tensor_info("X", F, [2])]
    outputs = [tensor_info("Y", F, [2]), tensor_info("Z", F16, [2])]
    model = _typed(make_model(nodes, inputs, outputs))
    remove = RemoveRedundantCastsPass()
    result = remove(model)
    assert isinstance(result, RemoveRedundantCastsResult)
    assert result.modified and (result.removed, result.folded, result.shortened) == (3, 0, 1)
    assert [n.name for n in _casts(model.graph)] == ["lossy", "back", "output_noop"]
    relu = next(n for n in model.graph if n.op_type == "Relu")
    assert relu.inputs[0] is model.graph.inputs[0]
    assert [v.name for v in model.graph.outputs] == ["Y", "Z"]
    again = remove(model)  # the same instance: it holds no state of the first run
    assert isinstance(again, RemoveRedundantCastsResult)
    assert not again.modified and again.removed == 0


def test_folds_a_cast_initializer_clamped_with_its_old_name_recorded(tmp_path: Path) -> None:
    w = np.array([1e6, -1e6, -1e-9, 0.5], np.float32)
    nodes = [
        helper.make_node("Cast", ["W"], ["w16"], to=F16, name="cast_w"),
        helper.make_node("Add", ["X", "w16"], ["Y"], name="add"),
    ]
    proto = make_model(nodes, [tensor_info("X", F16, [4])], [tensor_info("Y", F16, [4])], {"W": w})
    model = _typed(proto)
    assert not _run(model, fold_max_bytes=8).modified  # W is 16 bytes: cast at run time
    result = _run(model)
    assert result.modified and result.removed == result.folded == 1
    assert not _casts(model.graph) and list(model.graph.initializers) == ["w16"]
    folded = model.graph.initializers["w16"]
    assert folded.dtype == ir.DataType.FLOAT16 and folded.metadata_props[ORIGINAL_NAME] == "W"
    assert folded.const_value is not None
    got = folded.const_value.numpy()
    assert got.dtype == np.float16 and list(got[:2]) == [65504, -65504] and np.signbit(got[2]) and got[3] == 0.5
    assert not _run(model).modified

    ir.save(model, tmp_path / "folded.onnx")
    loaded = ir.load(tmp_path / "folded.onnx")
    assert loaded.graph.initializers["w16"].metadata_props[ORIGINAL_NAME] == "W"


def test_removes_casts_inside_if_branches() -> None:
    branches = {
        name: helper.make_graph(
            [
                helper.make_node("Cast", ["X"], [f"{out}_c"], to=F, name=f"noop_{out}"),
                helper.make_node("Neg", [f"{out}_c"], [out], name=f"neg_{out}"),
            ],
            name,
            [],
            [tensor_info(out, F, [2])],
        )
        for name, out in (("then_branch", "t"), ("else_branch", "e"))
    }
    nodes = [helper.make_node("If", ["C"], ["Y"], name="if", **branches)]
    inputs = [tensor_info("X", F, [2]), tensor_info("C", TensorProto.BOOL, [])]
    model = _typed(make_model(nodes, inputs, [tensor_info("Y", F, [2])]))
    result = _run(model)
    assert result.modified and result.removed == 2
    assert not any(n.op_type == "Cast" for n in model.graph.all_nodes())
    assert not _run(model).modified
