"""FoldAffineIntoWeightsPass: per-channel chains fold into Conv/Gemm/MatMul, numerically as ONNX Runtime runs them."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import helper

from onnxprec._testing import F, make_model, run, tensor_info
from onnxprec.passes.fold_affine_into_weights import FoldAffineIntoWeightsPass

RNG = np.random.default_rng(0)


Chain = list[tuple[str, Any, bool]]  # (op, constant, constant first)


def _chain(first: str, chain: Chain) -> tuple[list[onnx.NodeProto], dict[str, np.ndarray]]:
    nodes: list[onnx.NodeProto] = []
    inits: dict[str, np.ndarray] = {}
    current = first
    for i, (op, const, const_first) in enumerate(chain):
        inits[f"c{i}"] = np.asarray(const, np.float32)
        inputs = [f"c{i}", current] if const_first else [current, f"c{i}"]
        nodes.append(helper.make_node(op, inputs, [f"t{i}"], name=f"{op}_{i}"))
        current = f"t{i}"
    nodes.append(helper.make_node("Relu", [current], ["y"], name="relu"))
    return nodes, inits


def _conv_model(chain: Chain, bias: bool = False, reader: bool = False) -> onnx.ModelProto:
    inits = {"w": RNG.standard_normal((8, 4, 3, 3)).astype(np.float32)}
    conv_inputs = ["x", "w"] + (["b"] if bias else [])
    if bias:
        inits["b"] = RNG.standard_normal(8).astype(np.float32)
    nodes = [helper.make_node("Conv", conv_inputs, ["conv"], pads=[1, 1, 1, 1], name="conv")]
    more, consts = _chain("conv", chain)
    nodes += more
    outputs = [tensor_info("y", F, None)]
    if reader:  # another reader of the Conv output: nothing may fold
        nodes.append(helper.make_node("Sigmoid", ["conv"], ["z"], name="other"))
        outputs.append(tensor_info("z", F, None))
    return make_model(nodes, [tensor_info("x", F, [2, 4, 9, 9])], outputs, inits | consts)


def _check(proto: onnx.ModelProto, feeds: dict[str, np.ndarray], remaining: list[str]) -> ir.Model:
    expected = run(proto, feeds)
    model = ir.serde.deserialize_model(proto)
    assert FoldAffineIntoWeightsPass()(model).modified
    assert [n.op_type for n in model.graph] == remaining
    got = run(ir.serde.serialize_model(model), feeds)
    for a, b in zip(got, expected):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    assert not FoldAffineIntoWeightsPass()(model).modified  # idempotent
    return model


def _per_channel(shape: tuple[int, ...], positive: bool = False) -> np.ndarray:
    values = RNG.standard_normal(shape).astype(np.float32)
    return np.abs(values) + 0.5 if positive else values


@pytest.mark.parametrize("bias", [False, True])
def test_batchnorm_as_sub_mul_add_folds_into_conv(bias: bool) -> None:
    chain: Chain = [
        ("Add", _per_channel((1, 8, 1, 1)), False),  # the Conv bias, written apart
        ("Sub", _per_channel((8, 1, 1)), False),  # mean
        ("Mul", _per_channel((1, 8, 1, 1), positive=True), False),  # gamma / sqrt(var + eps)
        ("Div", _per_channel((8, 1, 1), positive=True), False),
        ("Add", 0.25, False),  # a scalar broadcasts on every channel
        ("Sub", _per_channel((8, 1, 1)), True),  # c - y
    ]
    x = RNG.standard_normal((2, 4, 9, 9)).astype(np.float32)
    model = _check(_conv_model(chain, bias), {"x": x}, ["Conv", "Relu"])
    assert next(iter(model.graph)).name == "conv"  # the layer keeps its name (exclusion patterns)
    assert set(model.graph.initializers) == {str(v.name) for v in next(iter(model.graph)).inputs[1:] if v is not None}


def test_nothing_folds_where_the_conv_output_has_another_reader_or_the_constant_is_not_per_channel() -> None:
    for proto in (
        _conv_model([("Mul", _per_channel((1, 8, 1, 1)), False)], reader=True),
        _conv_model([("Mul", _per_channel((1, 1, 9, 1)), False)]),  # along a spatial axis
        _conv_model([("Add", _per_channel((2, 8, 1, 1)), False)]),  # along the batch axis
        _conv_model([("Div", np.zeros((8, 1, 1)), False)]),
        _conv_model([("Div", _per_channel((8, 1, 1)), True)]),  # c / y is not affine
    ):
        model = ir.serde.deserialize_model(proto)
        assert not FoldAffineIntoWeightsPass()(model).modified


def test_gemm_and_matmul_chains_fold() -> None:
    w = RNG.standard_normal((6, 5)).astype(np.float32)
    inits = {
        "w": w, "wt": np.ascontiguousarray(w.T), "c": RNG.standard_normal(5).astype(np.float32),
        "s": _per_channel((1, 5), positive=True), "m": _per_channel((5,)), "b": _per_channel((5,)),
    }  # fmt: skip
    nodes = [
        helper.make_node("Gemm", ["x", "wt", "c"], ["g"], transB=1, beta=0.5, name="gemm"),
        helper.make_node("Sub", ["g", "m"], ["g1"], name="sub"),
        helper.make_node("Mul", ["g1", "s"], ["g2"], name="mul"),
        helper.make_node("MatMul", ["x", "w"], ["mm"], name="matmul"),
        helper.make_node("Add", ["mm", "b"], ["mb"], name="bias"),
        helper.make_node("Mul", ["s", "mb"], ["m1"], name="mul2"),  # constant first: commuted
        helper.make_node("Sub", ["m1", "m"], ["m2"], name="sub2"),
        helper.make_node("Div", ["m2", "s"], ["m3"], name="div"),
    ]
    proto = make_model(
        nodes, [tensor_info("x", F, [3, 6])], [tensor_info("g2", F, None), tensor_info("m3", F, None)], inits
    )
    x = RNG.standard_normal((3, 6)).astype(np.float32)
    model = _check(proto, {"x": x}, ["Gemm", "MatMul", "Add"])
    assert [node.name for node in model.graph] == ["gemm", "matmul", "bias"]


def test_a_conv_output_that_is_also_a_graph_output_keeps_its_chain() -> None:
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], name="conv"), helper.make_node("Mul", ["y", "s"], ["z"])]
    inits = {"w": np.ones((3, 2, 1, 1), np.float32), "s": np.full((1, 3, 1, 1), 2.0, np.float32)}
    outputs = [tensor_info("y", F, None), tensor_info("z", F, None)]
    model = ir.serde.deserialize_model(make_model(nodes, [tensor_info("x", F, [1, 2, 4, 4])], outputs, inits))
    assert not FoldAffineIntoWeightsPass()(model).modified
