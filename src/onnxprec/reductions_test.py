"""Tests of the range-reduction pass: the scalars ONNX Runtime computes match numpy's, on a clone, model checked."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir

from onnxprec import _ort
from onnxprec.reductions import AddRangeReductionsPass, RangeReductionsResult, remove_range_reductions

_MODEL = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[2, 8] x) => (float[2, 8] y) {
    a = Mul(x, x)
    b = Sub(a, x)
    y = Relu(b)
}
"""


def _run(model: ir.Model, feeds: dict[str, np.ndarray], fetch: list[str]) -> dict[str, np.ndarray]:
    proto = ir.serde.serialize_model(model)
    onnx.checker.check_model(proto, full_check=True)
    session = _ort.create_session(proto.SerializeToString(), optimization="none")
    return dict(zip(fetch, session.run(feeds, fetch)))


def test_reductions_match_numpy_and_leave_the_model_unchanged() -> None:
    model = ir.from_onnx_text(_MODEL)
    before = ir.serde.serialize_model(model).SerializeToString()
    clone = model.clone()
    result = AddRangeReductionsPass(["a", "b"], sentinels={"b": 0.5})(clone)
    assert isinstance(result, RangeReductionsResult)
    assert ir.serde.serialize_model(model).SerializeToString() == before
    assert len(result.reductions["a"]) == 4 and len(result.reductions["b"]) == 5
    x = np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)
    x[0, 0] = -0.3  # b = 0.09 + 0.3 = 0.39 <= 0.5: a sentinel
    names = [name for outs in result.reductions.values() for name in outs]
    got = _run(clone, {"x": x}, names)
    a, b = x * x, x * x - x
    for name, array in (("a", a), ("b", b)):
        lo, hi, total, shape = result.reductions[name][:4]
        assert got[lo] == np.float32(array.min()) and got[hi] == np.float32(array.max())
        np.testing.assert_allclose(got[total], array.sum(), rtol=1e-6)
        assert tuple(got[shape]) == (2, 8)
    above = np.abs(np.where(b <= 0.5, 0.0, b))
    assert got[result.reductions["b"][4]] == np.float32(above.max())


def test_a_nan_shows_in_the_sum() -> None:
    model = ir.from_onnx_text(_MODEL)
    result = AddRangeReductionsPass(["a"])(model)
    assert isinstance(result, RangeReductionsResult)
    x = np.ones((2, 8), np.float32)
    x[1, 3] = np.nan
    total = result.reductions["a"][2]
    assert np.isnan(_run(model, {"x": x}, [total])[total])


def test_removing_the_reductions_restores_the_model() -> None:
    model = ir.from_onnx_text(_MODEL)
    before = ir.serde.serialize_model(model).SerializeToString()
    result = AddRangeReductionsPass(["a", "b"], sentinels={"a": 0.0})(model)
    assert isinstance(result, RangeReductionsResult)
    assert len(model.graph) == 3 + (4 + 6) + 4 and len(model.graph.outputs) == 1 + 5 + 4
    remove_range_reductions(result)
    assert ir.serde.serialize_model(model).SerializeToString() == before
    assert [len(v.uses()) for v in (model.graph.node(0).outputs[0], model.graph.node(1).outputs[0])] == [1, 1]
