"""Random graph inputs that their consumers accept: parameters (shapes, axes, indices...) and float domains."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.parser
import onnx_ir as ir
import pytest

from onnxprec._input_contracts import contract_array, is_parameter
from onnxprec._testing import run

_MODEL = """
<ir_version: 8, opset_import: ["" : 17]>
main (float[2,6] x, int64[2] shape, int64[3] idx, float[4] pos, int64[1] axes, int64[1] starts, int64[1] ends)
    => (float[a, b] r, float[3, 6] g, float[4] l, float[1, 2, 6] u, float[c, d] s, float[2, 6] plain) {
    r = Reshape (x, shape)
    g = Gather <axis = 0> (x, idx)
    l = Log (pos)
    u = Unsqueeze (x, axes)
    s = Slice (x, starts, ends)
    plain = Relu (x)
}
"""


def _inputs() -> tuple[onnx.ModelProto, dict[str, ir.Value]]:
    proto = onnx.parser.parse_model(_MODEL)
    model = ir.serde.deserialize_model(proto)
    return proto, {str(v.name): v for v in model.graph.inputs}


def _make(value: ir.Value, shape: tuple[int, ...], dtype: type, rng: np.random.Generator) -> np.ndarray | None:
    dims = tuple(d if isinstance(d, int) else None for d in value.shape or ())
    return contract_array(value, dims, shape, np.dtype(dtype), {"x": (2, 6)}, rng)


def test_parameters_are_recognised_and_data_is_not() -> None:
    _, inputs = _inputs()
    assert [name for name, v in inputs.items() if is_parameter(v)] == ["shape", "idx", "axes", "starts", "ends"]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_generated_parameters_and_domains_run_in_onnxruntime(seed: int) -> None:
    proto, inputs = _inputs()
    rng = np.random.default_rng(seed)
    feeds = {"x": rng.standard_normal((2, 6)).astype(np.float32)}
    for name, shape, dtype in [
        ("shape", (2,), np.int64),
        ("idx", (3,), np.int64),
        ("pos", (4,), np.float32),
        ("axes", (1,), np.int64),
        ("starts", (1,), np.int64),
        ("ends", (1,), np.int64),
    ]:
        array = _make(inputs[name], shape, dtype, rng)
        assert array is not None and array.dtype == dtype and array.shape == shape, name
        feeds[name] = array  # fmt: skip
    assert np.all((feeds["idx"] >= 0) & (feeds["idx"] < 2))  # valid rows of x
    assert np.all(feeds["pos"] > 0)  # Log's domain
    r, g, log, u, s, relu = run(proto, feeds)
    assert r.size == 12 and g.shape == (3, 6) and np.all(np.isfinite(log)) and u.shape == (1, 2, 6)
    assert s.shape == (2, 6) and np.array_equal(relu, np.maximum(feeds["x"], 0))  # Slice: the whole axis


def test_unconstrained_float_data_gets_no_contract() -> None:
    _, inputs = _inputs()
    assert _make(inputs["x"], (2, 6), np.float32, np.random.default_rng(0)) is None
