"""Property-based tests of AutoCast (issue 9): random float graphs built from common ops.

Whatever the graph, the weights and the data, a conversion either refuses with one clear line (an
``OnnxprecError``) or returns a model that passes ``onnx.checker`` with full type inference, keeps the I/O
contract, runs, and, calibrated on the data it is then run on, stays within a tolerance of FP32.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

hypothesis = pytest.importorskip("hypothesis", reason="hypothesis is not installed (pip install -e '.[test]')")
st = pytest.importorskip("hypothesis.strategies")

from onnxprec._testing import F, run, tensor_info  # noqa: E402
from onnxprec.autocast import convert_to_mixed_precision  # noqa: E402
from onnxprec.errors import OnnxprecError  # noqa: E402

ROWS, WIDTH = 2, 8
UNARY = ("Relu", "Sigmoid", "Tanh", "Neg", "Abs", "Softplus", "Erf", "SafeExp", "SafeSqrt", "Softmax", "LayerNorm")
BINARY = ("Add", "Sub", "Mul", "SafeDiv", "MatMul", "Gemm", "AddBias", "ScaleBy", "Max")
EPS = {"fp16": 2.0**-10, "bf16": 2.0**-7}


class _Builder:
    """Appends ONNX nodes for one op of the strategy; every value has shape [ROWS, WIDTH]."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.count = 0

    def name(self, base: str) -> str:
        self.count += 1
        return f"{base}_{self.count}"

    def const(self, array: np.ndarray) -> str:
        name = self.name("c")
        self.inits.append(numpy_helper.from_array(np.asarray(array, np.float32), name))
        return name

    def node(self, op: str, inputs: list[str], **attrs: object) -> str:
        out = self.name(op.lower())
        self.nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    def unary(self, op: str, x: str) -> str:
        if op == "SafeExp":  # exp of a bounded value: finite in FP32 whatever the data
            return self.node("Exp", [self.node("Mul", [self.node("Tanh", [x]), self.const(np.float32(4))])])
        if op == "SafeSqrt":
            return self.node("Sqrt", [self.node("Abs", [x])])
        if op == "Softmax":
            return self.node("Softmax", [x], axis=-1)
        if op == "LayerNorm":
            scale, bias = self.const(self.rng.uniform(0.5, 1.5, WIDTH)), self.const(self.rng.normal(0, 0.1, WIDTH))
            return self.node("LayerNormalization", [x, scale, bias], axis=-1)
        return self.node(op, [x])

    def binary(self, op: str, x: str, y: str, magnitude: float) -> str:
        if op == "SafeDiv":
            return self.node("Div", [x, self.node("Add", [self.node("Abs", [y]), self.const(np.float32(1))])])
        if op == "MatMul":
            return self.node("MatMul", [x, self.const(self.rng.normal(0, WIDTH**-0.5, (WIDTH, WIDTH)))])
        if op == "Gemm":
            w, b = self.rng.normal(0, WIDTH**-0.5, (WIDTH, WIDTH)), self.rng.normal(0, 1, WIDTH)
            return self.node("Gemm", [x, self.const(w), self.const(b)], transB=1)
        if op == "AddBias":  # a weight whose magnitude may exceed FP16 (init_max keeps its node FP32)
            return self.node("Add", [x, self.const(self.rng.normal(0, 1, WIDTH) * magnitude)])
        if op == "ScaleBy":
            return self.node("Mul", [x, self.const(np.float32(magnitude))])
        return self.node(op, [x, y])


@st.composite
def graphs(draw: st.DrawFn) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    builder = _Builder(rng)
    values = ["X"]
    for _ in range(draw(st.integers(1, 8))):
        if draw(st.booleans()):
            out = builder.unary(draw(st.sampled_from(UNARY)), draw(st.sampled_from(values)))
        else:
            x, y = draw(st.sampled_from(values)), draw(st.sampled_from(values))
            magnitude = draw(st.sampled_from((0.5, 4.0, 300.0, 1e5)))
            out = builder.binary(draw(st.sampled_from(BINARY)), x, y, magnitude)
        values.append(out)
    outputs = [values[-1]] + ([draw(st.sampled_from(values[1:-1]))] if len(values) > 2 and draw(st.booleans()) else [])
    graph = helper.make_graph(
        builder.nodes,
        "random",
        [tensor_info("X", F, [ROWS, WIDTH])],
        [tensor_info(o, F, [ROWS, WIDTH]) for o in dict.fromkeys(outputs)],
        builder.inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    scale = draw(st.sampled_from((1.0, 30.0)))
    feeds = {"X": (rng.standard_normal((ROWS, WIDTH)) * scale).astype(np.float32)}
    return model, feeds


def _within(converted: list[np.ndarray], reference: list[np.ndarray], tol: float) -> None:
    for got, want in zip(converted, reference):
        got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
        finite = np.isfinite(want)
        assert np.array_equal(np.isfinite(got), finite), "non-finite values where FP32 has none (or the reverse)"
        scale = float(np.sqrt(np.mean(np.square(want[finite])))) if finite.any() else 0.0
        err = np.abs(got - want)[finite]
        bound = (tol * (np.abs(want) + scale))[finite]
        assert (err <= bound).all(), f"max error {err.max():.3g} over a bound of {bound[np.argmax(err - bound)]:.3g}"


def _run_low(model: onnx.ModelProto, feeds: dict[str, np.ndarray], low: str) -> list[np.ndarray]:
    if low == "fp16":
        return run(model, feeds)
    from onnx.reference import ReferenceEvaluator  # ONNX Runtime's CPU provider has almost no BF16 kernels

    types = {i.name: helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type) for i in model.graph.input}
    return list(ReferenceEvaluator(model).run(None, {k: v.astype(types[k]) for k, v in feeds.items()}))


SETTINGS = hypothesis.settings(max_examples=40, deadline=None, derandomize=True, print_blob=True)


@pytest.mark.slow
@SETTINGS
@hypothesis.given(case=graphs(), low=st.sampled_from(("fp16", "bf16")), keep_io=st.booleans())
def test_calibrated_conversion_is_valid_and_close_or_refused(
    case: tuple[onnx.ModelProto, dict[str, np.ndarray]], low: str, keep_io: bool
) -> None:
    model, feeds = case
    try:
        converted = convert_to_mixed_precision(
            model, low_precision_type=low, keep_io_types=keep_io, calibration_data=feeds
        )
    except OnnxprecError as e:
        assert len(str(e).splitlines()) == 1  # a refusal is one clear line
        return
    onnx.checker.check_model(converted, full_check=True)
    assert [i.name for i in converted.graph.input] == ["X"]
    assert [o.name for o in converted.graph.output] == [o.name for o in model.graph.output]
    if keep_io:
        assert all(v.type.tensor_type.elem_type == F for v in (*converted.graph.input, *converted.graph.output))
    # 30 units in the last place of the low type: a few per op over chains of up to eight ops (and Exp, which
    # multiplies the relative error by its input)
    _within(_run_low(converted, feeds, low), run(model, feeds), 30 * EPS[low])


@pytest.mark.slow
@SETTINGS
@hypothesis.given(case=graphs())
def test_conversion_on_random_data_is_valid_and_runs(case: tuple[onnx.ModelProto, dict[str, np.ndarray]]) -> None:
    model, feeds = case
    try:
        converted = convert_to_mixed_precision(model, keep_io_types=True)
    except OnnxprecError as e:
        assert len(str(e).splitlines()) == 1
        return
    onnx.checker.check_model(converted, full_check=True)
    outputs = run(converted, feeds)
    assert [np.asarray(o).shape for o in outputs] == [(ROWS, WIDTH)] * len(model.graph.output)
    assert all(np.asarray(o).dtype == np.float32 for o in outputs)


@pytest.mark.slow
def test_the_strategy_builds_valid_models() -> None:
    @SETTINGS
    @hypothesis.given(case=graphs())
    def check(case: tuple[onnx.ModelProto, dict[str, np.ndarray]]) -> None:
        model, feeds = case
        onnx.checker.check_model(model, full_check=True)
        assert all(np.isfinite(o).all() for o in run(model, feeds))

    check()
