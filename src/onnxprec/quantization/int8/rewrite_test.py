"""Rewrites on a layer whose output is a graph output: the output keeps its name, however many terms are added."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
from onnx import helper

from onnxprec._graph import NameAllocator
from onnxprec._testing import F, make_model, run, tensor_info
from onnxprec.quantization.int8.rewrite import add_bias, gather_channels, insert_split


def test_bias_correction_and_outlier_split_on_a_graph_output() -> None:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 5)).astype(np.float32)
    proto = make_model([helper.make_node("MatMul", ["x", "w"], ["logits"], name="head")],
                       [tensor_info("x", F, [3, 8])], [tensor_info("logits", F, [3, 5])], {"w": w})  # fmt: skip
    model = ir.serde.deserialize_model(proto)
    names = NameAllocator(model)
    node = next(iter(model.graph))
    bias = rng.standard_normal(5).astype(np.float32)
    rows = rng.standard_normal((2, 5)).astype(np.float32)
    add_bias(model.graph, node, bias, names)
    gathered = gather_channels(model.graph, model.graph.inputs[0], np.array([1, 6]), names)
    insert_split(model.graph, node, gathered, rows, names)
    out = ir.serde.serialize_model(model)
    onnx.checker.check_model(out, full_check=True)
    assert [o.name for o in out.graph.output] == ["logits"]
    x = rng.standard_normal((3, 8)).astype(np.float32)
    (got,) = run(out, {"x": x})
    assert np.allclose(got, x @ w + bias + x[:, [1, 6]] @ rows, atol=1e-5)
