"""CancelTransposesPass: NHWC Transposes around element-wise regions go where that is exact and pays."""

from __future__ import annotations

import collections
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import helper

from onnxprec._ort import create_session
from onnxprec._testing import F, make_model, run, tensor_info, tf2onnx_block
from onnxprec.passes.cancel_transposes import CancelTransposesPass, CancelTransposesResult
from onnxprec.passes.fold_affine_into_weights import FoldAffineIntoWeightsPass

RNG = np.random.default_rng(0)
TO_NHWC = [0, 2, 3, 1]


def _plain(proto: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Without ONNX Runtime's fusions (which round a Conv + Add differently from the two apart)."""
    return create_session(proto, optimization="none").run(feeds)


def _ops(model: ir.Model) -> collections.Counter[str]:
    return collections.Counter(node.op_type for node in model.graph)


def test_tf2onnx_block_becomes_conv_relu_chains_exactly() -> None:
    proto = tf2onnx_block()
    x = RNG.standard_normal((1, 8, 8, 6)).astype(np.float32)
    (expected,) = _plain(proto, {"x": x})
    model = ir.serde.deserialize_model(proto)
    assert CancelTransposesPass()(model).modified
    # the stem's input Transpose stays (it reads the graph input), one is inserted before the ReduceMean
    assert _ops(model)["Transpose"] == 2
    (moved,) = _plain(ir.serde.serialize_model(model), {"x": x})
    np.testing.assert_array_equal(moved, expected)  # element-wise ops in another layout: bit-exact
    assert FoldAffineIntoWeightsPass()(model).modified
    assert _ops(model) == {"Transpose": 2, "Conv": 3, "Relu": 3, "Add": 1, "ReduceMean": 1}
    (folded,) = run(ir.serde.serialize_model(model), {"x": x})
    np.testing.assert_allclose(folded, expected, rtol=1e-5, atol=1e-5)
    assert not CancelTransposesPass()(model).modified


def test_a_region_that_would_insert_as_many_transposes_as_it_removes_stays() -> None:
    nodes = [
        helper.make_node("Transpose", ["x"], ["t"], perm=TO_NHWC, name="t"),
        helper.make_node("Relu", ["t"], ["r"], name="relu"),
        helper.make_node("Softmax", ["r"], ["y"], axis=-1, name="softmax"),  # reads the NHWC layout
    ]
    proto = make_model(nodes, [tensor_info("x", F, [1, 3, 4, 5])], [tensor_info("y", F, [1, 4, 5, 3])])
    model = ir.serde.deserialize_model(proto)
    assert not CancelTransposesPass()(model).modified


def test_a_region_reaching_a_graph_output_stays() -> None:
    nodes = [
        helper.make_node("Transpose", ["x"], ["t"], perm=TO_NHWC, name="t"),
        helper.make_node("Relu", ["t"], ["y"], name="relu"),
    ]
    proto = make_model(nodes, [tensor_info("x", F, [1, 3, 4, 5])], [tensor_info("y", F, [1, 4, 5, 3])])
    assert not CancelTransposesPass()(ir.serde.deserialize_model(proto)).modified


def _separated_regions(blocks: int, c: int = 4) -> onnx.ModelProto:
    """``blocks`` NHWC-wrapped 1x1 Convs (Add bias, Relu); a Softmax over the channels after every second block
    keeps the regions apart: each pair's middle region cancels, the region before each Softmax stays."""
    inits: dict[str, np.ndarray] = {}
    nodes = []
    source = "x"
    for i in range(blocks):
        inits[f"w{i}"] = RNG.standard_normal((c, c, 1, 1)).astype(np.float32)
        inits[f"b{i}"] = RNG.standard_normal(c).astype(np.float32)
        nodes += [
            helper.make_node("Transpose", [source], [f"nchw{i}"], perm=[0, 3, 1, 2], name=f"t_in{i}"),
            helper.make_node("Conv", [f"nchw{i}", f"w{i}"], [f"y{i}"], name=f"conv{i}"),
            helper.make_node("Transpose", [f"y{i}"], [f"nhwc{i}"], perm=TO_NHWC, name=f"t_out{i}"),
            helper.make_node("Add", [f"nhwc{i}", f"b{i}"], [f"a{i}"], name=f"add{i}"),
            helper.make_node("Relu", [f"a{i}"], [f"r{i}"], name=f"relu{i}"),
        ]
        source = f"r{i}"
        if i % 2:
            nodes.append(helper.make_node("Softmax", [source], [f"s{i}"], axis=-1, name=f"softmax{i}"))
            source = f"s{i}"
    nodes.append(helper.make_node("ReduceMean", [source], ["y"], axes=[1, 2], keepdims=0, name="pool"))
    return make_model(nodes, [tensor_info("x", F, [1, 8, 8, c])], [tensor_info("y", F, [1, c])], inits)


def test_many_separate_regions_are_grown_a_bounded_number_of_times_each(monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: the pass restarted its scan after every region, growing every Transpose again (quadratic)."""
    from onnxprec.passes import cancel_transposes

    seeds: list[ir.Node] = []
    grow = cancel_transposes._grow

    def counted(seed: ir.Node, perm: list[int]) -> Any:
        seeds.append(seed)
        return grow(seed, perm)

    monkeypatch.setattr(cancel_transposes, "_grow", counted)
    blocks = 40
    proto = _separated_regions(blocks)
    x = RNG.standard_normal((1, 8, 8, 4)).astype(np.float32)
    (expected,) = _plain(proto, {"x": x})
    model = ir.serde.deserialize_model(proto)
    result = CancelTransposesPass()(model)
    assert isinstance(result, CancelTransposesResult)
    assert (result.removed, result.inserted) == (blocks, 0)
    transposes = 2 * blocks  # each Transpose is grown from at most once a sweep, in at most two sweeps
    assert len(seeds) <= 2 * transposes
    (moved,) = _plain(ir.serde.serialize_model(model), {"x": x})
    np.testing.assert_array_equal(moved, expected)
