"""Tests of the runtime layer: providers, sessions from every source, feeds and fetches of every float type."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper

from onnxprec import _ort
from onnxprec._io import load_model
from onnxprec._testing import make_model, tensor_info
from onnxprec.errors import InvalidArgumentError, UnsupportedModelError


def _identity(elem_type: int, opset: int = 22) -> onnx.ModelProto:
    node = helper.make_node("Identity", ["x"], ["y"])
    return make_model([node], [tensor_info("x", elem_type, [3])], [tensor_info("y", elem_type, [3])], opset=opset)


def test_providers_map_modelopt_names_and_append_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _ort.resolve_providers(["cpu"]) == ["CPUExecutionProvider"]
    assert _ort.resolve_providers(None) == ["CPUExecutionProvider"]
    with pytest.raises(InvalidArgumentError, match="Unknown provider 'gpu'"):
        _ort.resolve_providers(["gpu"])
    # A CPU build has no CUDA provider; pretend to be one so the test also holds on a GPU machine.
    ort = _ort.import_onnxruntime()
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CPUExecutionProvider"])
    with pytest.raises(InvalidArgumentError, match="not available in this onnxruntime build"):
        _ort.resolve_providers(["cuda:0"])
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    assert _ort.resolve_providers(["cuda:0"]) == [("CUDAExecutionProvider", {"device_id": "0"}), "CPUExecutionProvider"]


def test_trt_plugins_reach_the_tensorrt_provider(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    ort = _ort.import_onnxruntime()
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["TensorrtExecutionProvider", "CPUExecutionProvider"])
    plugin = tmp_path / "libplugin.so"
    plugin.write_bytes(b"")
    result = _ort.resolve_providers(["trt:1"], trt_plugins=[str(plugin)])
    assert result[0] == (
        "TensorrtExecutionProvider",
        {"device_id": "1", "trt_extra_plugin_lib_paths": str(plugin.resolve())},
    )
    assert result[1] == "CPUExecutionProvider"


@pytest.mark.parametrize(
    ("elem_type", "dtype"),
    [
        (TensorProto.BFLOAT16, ml_dtypes.bfloat16),
        (TensorProto.FLOAT8E4M3FN, ml_dtypes.float8_e4m3fn),
        (TensorProto.FLOAT8E5M2, ml_dtypes.float8_e5m2),
        (TensorProto.FLOAT16, np.float16),
    ],
)
def test_feeds_and_fetches_every_float_type(elem_type: int, dtype: type) -> None:
    session = _ort.create_session(_identity(elem_type, opset=21 if elem_type != TensorProto.BFLOAT16 else 22))
    x = np.array([1.5, -2.0, 0.25], dtype=np.float32)
    (y,) = session.run({"x": x})  # FP32 data is cast to the declared input type
    assert y.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(y.astype(np.float32), x.astype(dtype).astype(np.float32))


def test_session_from_ir_model_maps_external_weights(tmp_path: Path) -> None:
    w = np.arange(64 * 32, dtype=np.float32).reshape(64, 32)
    proto = make_model(
        [helper.make_node("MatMul", ["x", "W"], ["y"])],
        [tensor_info("x", TensorProto.FLOAT, [1, 64])],
        [tensor_info("y", TensorProto.FLOAT, [1, 32])],
        {"W": w},
    )
    path = tmp_path / "m.onnx"
    onnx.save(proto, path, save_as_external_data=True, location="m.data", size_threshold=0)
    model = load_model(path)
    assert isinstance(model.graph.initializers["W"].const_value, ir.ExternalTensor)
    with _ort.ort_model(model) as (payload, folder):
        assert isinstance(payload, bytes) and folder == tmp_path.resolve()
        assert len(payload) < 1024  # the weight travels by file reference, not by value
    session = _ort.create_session(model, optimization="none")
    (y,) = session.run({"x": np.ones((1, 64), np.float32)})
    np.testing.assert_array_equal(y, np.ones((1, 64), np.float32) @ w)


def test_large_in_memory_weights_go_through_a_temp_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_ort, "_INLINE_LIMIT", 1)
    w = np.full((3, 4), 2.0, np.float32)
    proto = make_model(
        [helper.make_node("MatMul", ["x", "W"], ["y"])],
        [tensor_info("x", TensorProto.FLOAT, [1, 3])],
        [tensor_info("y", TensorProto.FLOAT, [1, 4])],
        {"W": w},
    )
    model = ir.serde.deserialize_model(proto)
    with _ort.ort_model(model) as (payload, folder):
        assert isinstance(payload, str) and Path(payload + ".data").is_file() and folder is None
    assert not Path(payload).exists()  # removed afterwards
    (y,) = _ort.create_session(model).run({"x": np.ones((1, 3), np.float32)})
    np.testing.assert_array_equal(y, np.full((1, 4), 6.0, np.float32))


def test_spinning_turned_off() -> None:  # (conftest.py turns it off for every test session: the default is not seen)
    assert _ort.session_options(spinning=False).get_session_config_entry("session.intra_op.allow_spinning") == "0"
    session = _ort.create_session(_identity(TensorProto.FLOAT), spinning=False)  # same results without spinning
    np.testing.assert_array_equal(session.run({"x": np.arange(3, dtype=np.float32)})[0], [0, 1, 2])


def test_load_failure_is_one_clear_line() -> None:
    bad = _identity(TensorProto.FLOAT)
    bad.graph.node[0].op_type = "NoSuchOp"
    with pytest.raises(UnsupportedModelError, match=r"^ONNX Runtime cannot load the model: ") as info:
        _ort.create_session(bad)
    assert "\n" not in str(info.value)


def test_first_line() -> None:
    assert _ort.first_line(RuntimeError("\n  first\nsecond")) == "first"
    assert _ort.first_line(RuntimeError("")) == "RuntimeError"


def test_custom_op_library_must_exist() -> None:
    with pytest.raises(InvalidArgumentError, match="--custom_op_lib"):
        _ort.session_options(custom_op_libraries=["/nonexistent/libops.so"])


def test_two_runtime_builds_are_named_with_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib
    import importlib.metadata
    import types

    versions = {"onnxruntime": "1.32.0", "onnxruntime-gpu": "1.31.1"}

    def version(dist: str) -> str:
        if dist not in versions:
            raise importlib.metadata.PackageNotFoundError(dist)
        return versions[dist]

    monkeypatch.setattr(importlib.metadata, "version", version)
    monkeypatch.delattr(_ort.import_onnxruntime, "checked", raising=False)  # checked once per process: again
    broken = types.ModuleType("onnxruntime")  # what remains when one wheel overwrote the other's files
    monkeypatch.setattr(importlib, "import_module", lambda name: broken)
    with pytest.raises(UnsupportedModelError, match=r"onnxruntime==1\.32\.0, onnxruntime-gpu==1\.31\.1.*exactly one"):
        _ort.import_onnxruntime()


def test_lacks_kernels_probes_each_op_signature_once() -> None:
    """ORT's CPU provider has BF16 Reshape but no BF16 Less or MatMul (why BF16 models are for GPUs); a slot that
    stays FP32 is probed in FP32 (Less with both inputs kept), and FP16 Less runs on the CPU."""
    nodes = [
        helper.make_node("Less", ["x", "y"], ["b"], name="less"),
        helper.make_node("Reshape", ["x", "shape"], ["r"], name="reshape"),
        helper.make_node("MatMul", ["r", "w"], ["m"], name="mm"),
        helper.make_node("Less", ["m", "y"], ["b2"], name="less2"),
    ]
    proto = make_model(
        nodes,
        [tensor_info("x", TensorProto.FLOAT, [2, 2]), tensor_info("y", TensorProto.FLOAT, [2, 2])],
        [tensor_info("b", TensorProto.BOOL, [2, 2]), tensor_info("b2", TensorProto.BOOL, [2, 2])],
        {"shape": np.array([2, 2], np.int64), "w": np.eye(2, dtype=np.float32)},
        opset=22,
    )
    model = ir.from_proto(onnx.shape_inference.infer_shapes(proto))
    by_name = {n.name: n for n in model.graph}
    none: frozenset[int] = frozenset()
    entries = [(n, none, none) for n in model.graph]
    opsets = dict(model.opset_imports)
    bf16 = _ort.lacks_kernels(entries, opsets, ir.DataType.BFLOAT16, "cpu")
    assert {n.name for n in bf16} == {"less", "mm", "less2"}
    kept = [(by_name["less"], frozenset({0, 1}), none)]
    assert not _ort.lacks_kernels(kept, opsets, ir.DataType.BFLOAT16, "cpu")
    assert "less" not in {n.name for n in _ort.lacks_kernels(entries, opsets, ir.DataType.FLOAT16, "cpu")}


def test_float_to_fp16_is_numpys_rounding_for_finite_values() -> None:
    rng = np.random.default_rng(0)
    x = np.clip(
        (rng.standard_normal(1 << 16) * np.exp(rng.uniform(-25, 11, 1 << 16))).astype(np.float32), -65504, 65504
    )
    x[:6] = [65519.0, 6e-8, -2.98e-8, 2.99e-8, -0.0, 1e-45]  # the largest that rounds down, ties, subnormals, zeros
    out = np.empty(x.shape, np.float16)
    _ort.float_to_fp16(x, out)
    assert out.tobytes() == x.astype(np.float16).tobytes()
    with pytest.raises(ValueError, match="float32 into float16"):
        _ort.float_to_fp16(x.astype(np.float64), out)
