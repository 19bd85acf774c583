"""ONNX Runtime's ``quantize_dynamic``, as onnxprec takes it: ORT's signature, MatMul/Gemm quantized at every run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from onnxprec._testing import run
from onnxprec.errors import InvalidArgumentError
from onnxprec.quantization import QuantType, quantize_dynamic
from onnxprec.quantization._testing import correlated, mlp, parameters


def test_quantize_dynamic_has_onnx_runtimes_signature() -> None:
    ort_quantization = pytest.importorskip("onnxruntime.quantization")
    assert parameters(quantize_dynamic) == parameters(ort_quantization.quantize_dynamic)


def test_quantize_dynamic_matches_onnx_runtimes_own(tmp_path: Path) -> None:
    """Both quantize the MLP's MatMuls at every run; ours is at least as close to FP32 as ONNX Runtime's."""
    ort_quantization = pytest.importorskip("onnxruntime.quantization")
    source = tmp_path / "mlp.onnx"
    onnx.save(mlp(), source)
    ours, theirs = tmp_path / "ours.onnx", tmp_path / "ort.onnx"
    report = quantize_dynamic(str(source), str(ours), per_channel=True, weight_type=QuantType.QInt8)
    ort_quantization.quantize_dynamic(str(source), str(theirs), per_channel=True)
    assert report.count("dynamic") == 4 and report.count("static") == 0
    ops = [n.op_type for n in onnx.load(str(ours)).graph.node]
    assert "DynamicQuantizeLinear" in ops and "MatMulInteger" in ops and "QuantizeLinear" not in ops
    x = {"X": correlated(32, 64, seed=7).reshape(2, 16, 64)}
    (ref,), (got,), (ort,) = run(source, x), run(ours, x), run(theirs, x)

    def rel(a: np.ndarray) -> float:
        return float(np.linalg.norm(a - ref) / np.linalg.norm(ref))

    assert rel(got) < 0.05 and rel(got) <= rel(ort) * 1.1


def test_quantize_dynamic_refusals(tmp_path: Path) -> None:
    source = tmp_path / "mlp.onnx"
    onnx.save(mlp(), source)
    with pytest.raises(InvalidArgumentError, match="reduce_range"):
        quantize_dynamic(source, tmp_path / "o.onnx", reduce_range=True)
    with pytest.raises(InvalidArgumentError, match="no MatMul or Gemm"):
        quantize_dynamic(source, tmp_path / "o.onnx", op_types_to_quantize=["Conv"])


def test_quantize_dynamic_writes_a_result_that_misses_the_guard_and_warns_as_onnx_runtime_does(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Regression: quantize_dynamic ran INT8's accuracy guard, so ORT's API raised AccuracyGuardError (quantize_static
    turns the guard off: ONNX Runtime writes the result)."""
    proto = mlp()
    for init in proto.graph.initializer:  # two huge input channels that no weight reads: the rest lose their levels
        array = numpy_helper.to_array(init).copy()
        if init.name == "gamma":
            array[:2] = (1e5, -1e5)
        elif init.name in ("Wq", "Wk"):
            array[:2] = 0
        init.CopyFrom(numpy_helper.from_array(array, init.name))
    source, output = tmp_path / "mlp.onnx", tmp_path / "o.onnx"
    onnx.save(proto, source)
    report = quantize_dynamic(str(source), str(output))
    assert output.exists() and report.count("dynamic") == 4
    assert report.check["guard"] == "off" and not report.check["passed"]
    assert any("misses the accuracy guard" in r.getMessage() for r in caplog.records if r.levelname == "WARNING")


@pytest.mark.slow
@pytest.mark.parametrize("activation_type", ["QInt16", "QUInt16"])
def test_quantize_static_16_bit_activations_as_onnx_runtimes_own(tmp_path: Path, activation_type: str) -> None:
    """``activation_type=QuantType.QInt16`` (or ``QUInt16``) gives 16-bit activations with INT8 weights, as ONNX
    Runtime's own ``quantize_static``: every activation QuantizeLinear writes that type (opset 21), and the result
    is at least as close to FP32 as ONNX Runtime's and closer than with 8-bit activations."""
    ort_quantization = pytest.importorskip("onnxruntime.quantization")
    from onnxprec.quantization import quantize_static
    from onnxprec.quantization._testing import tiny_cnn

    source = tmp_path / "cnn.onnx"
    onnx.save(tiny_cnn(channels=16), source)
    rng = np.random.default_rng(0)
    batches = [{"x": rng.standard_normal((2, 3, 16, 16)).astype(np.float32)} for _ in range(4)]

    class Reader(ort_quantization.CalibrationDataReader):  # type: ignore[misc]
        def __init__(self) -> None:
            self.batches = iter(batches)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.batches, None)

    ours, eight, theirs = tmp_path / "ours.onnx", tmp_path / "eight.onnx", tmp_path / "ort.onnx"
    quantize_static(str(source), str(ours), Reader(), activation_type=getattr(QuantType, activation_type))
    quantize_static(str(source), str(eight), Reader(), activation_type=QuantType.QUInt8)
    ort_type = getattr(ort_quantization.QuantType, activation_type)
    ort_quantization.quantize_static(str(source), str(theirs), Reader(), activation_type=ort_type, per_channel=True)
    expected = onnx.TensorProto.INT16 if activation_type == "QInt16" else onnx.TensorProto.UINT16
    for path in (ours, theirs):
        model = onnx.load(str(path))
        onnx.checker.check_model(model, full_check=True)
        inits = {i.name: i for i in model.graph.initializer}
        quantize = [n for n in model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] not in inits]
        assert quantize and {inits[n.input[2]].data_type for n in quantize} == {expected}, path.name
    model = onnx.load(str(ours))
    onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    assert next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) >= 21
    x = {"x": rng.standard_normal((2, 3, 16, 16)).astype(np.float32)}
    (ref,), (got,), (low,), (ort,) = run(source, x), run(ours, x), run(eight, x), run(theirs, x)

    def rel(a: np.ndarray) -> float:
        return float(np.linalg.norm(a - ref) / np.linalg.norm(ref))

    assert rel(got) <= rel(ort) * 1.1 and rel(got) < rel(low)  # INT8 weights' rounding is the rest
