"""Loading: what no runtime can run is refused; ONNX Runtime's contrib ops, in com.microsoft or in the ONNX domain,
are accepted."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from onnxprec._io import load_model
from onnxprec.errors import ModelLoadError


def _model(node: onnx.NodeProto, opset: int, initializers: tuple[onnx.TensorProto, ...] = ()) -> onnx.ModelProto:
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
        initializer=list(initializers),
    )
    imports = [helper.make_opsetid("", opset), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=imports, ir_version=8)


_SCALE = onnx.numpy_helper.from_array(np.linspace(0.5, 1.5, 4, dtype=np.float32), "scale")


@pytest.mark.parametrize(
    ("node", "opset"),
    [
        (helper.make_node("SimplifiedLayerNormalization", ["X", "scale"], ["Y"], epsilon=1e-5), 22),
        (helper.make_node("LayerNormalization", ["X", "scale"], ["Y"]), 16),  # ORT's before ONNX's (opset 17)
        (helper.make_node("SkipSimplifiedLayerNormalization", ["X", "X", "scale"], ["Y"], domain="com.microsoft"), 22),
    ],
    ids=["SimplifiedLayerNormalization", "LayerNormalization@16", "com.microsoft"],
)
def test_onnx_runtime_contrib_ops_load_and_run(tmp_path: Path, node: onnx.NodeProto, opset: int) -> None:
    path = tmp_path / "m.onnx"
    onnx.save(_model(node, opset, (_SCALE,)), path)
    model = load_model(path)
    assert [n.op_type for n in model.graph] == [node.op_type]
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime is not installed")
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    (y,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"X": x})
    assert y.shape == (2, 4) and np.isfinite(y).all()


def test_ops_no_runtime_knows_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "m.onnx"
    onnx.save(_model(helper.make_node("Frobnicate", ["X"], ["Y"], name="frob"), 22), path)
    with pytest.raises(ModelLoadError, match=r"^Node 'frob' is 'Frobnicate', which is no ONNX op at opset 22: fix"):
        load_model(path)
    # A name ORT registers in com.microsoft only is no op of the ONNX domain.
    onnx.save(_model(helper.make_node("SkipSimplifiedLayerNormalization", ["X", "X"], ["Y"], name="s"), 22), path)
    with pytest.raises(ModelLoadError, match=r"^Node 's' is 'SkipSimplifiedLayerNormalization', which is no ONNX op"):
        load_model(path)


@pytest.mark.parametrize("external_data", [False, True])
def test_a_failed_check_leaves_no_output(tmp_path: Path, external_data: bool) -> None:
    """save_model's check sees the complete file (weights beside it) before the rename; if it raises, nothing stays."""
    from onnxprec._io import WrittenModel, save_model

    model = load_model(_model(helper.make_node("Mul", ["X", "scale"], ["Y"]), 22, (_SCALE,)))
    seen: list[int] = []

    def check(written: WrittenModel) -> None:
        loaded = onnx.load(written.path)  # external data resolves beside it, under the final name
        seen.append(len(loaded.graph.initializer[0].float_data or loaded.graph.initializer[0].raw_data))
        # in one file, the check is also told what was written (as load_mapped reads it)
        assert (written.message is None) == external_data and written.message in (None, loaded)
        raise ValueError("rejected")

    with pytest.raises(ValueError, match="rejected"):
        save_model(model, tmp_path / "out.onnx", external_data=external_data, check=check)
    assert seen and sorted(p.name for p in tmp_path.iterdir()) == []
    save_model(model, tmp_path / "out.onnx", external_data=external_data, check=lambda path: None)
    assert (tmp_path / "out.onnx").exists()


def test_a_map_typed_output_is_refused_in_one_line(tmp_path: Path) -> None:
    """sklearn-onnx's ZipMap writes a sequence of maps, which onnx-ir cannot represent: one clear error."""
    from onnxprec.errors import UnsupportedModelError

    zipmap = helper.make_node("ZipMap", ["X"], ["Y"], domain="ai.onnx.ml", classlabels_int64s=[0, 1, 2, 3])
    map_type = helper.make_map_type_proto(TensorProto.INT64, helper.make_tensor_type_proto(TensorProto.FLOAT, []))
    graph = helper.make_graph(
        [zipmap],
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 4])],
        [helper.make_value_info("Y", helper.make_sequence_type_proto(map_type))],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)], ir_version=8
    )
    path = tmp_path / "zipmap.onnx"

    def refusal() -> str:
        onnx.checker.check_model(model)
        onnx.save(model, path)
        with pytest.raises(UnsupportedModelError, match="map type") as raised:
            load_model(path)
        return str(raised.value)

    assert refusal().endswith(
        "its ai.onnx.ml nodes (ZipMap) compute in float32 or float64 only (no FP16, BF16 or INT8 form) and it has no "
        "other node: nothing in it has a lower-precision form."
    )
    # With ai.onnx nodes before it (a scaler as sklearn-onnx writes it: Mul, Add), the line says how many.
    model.graph.node.insert(0, helper.make_node("Add", ["m", "X"], ["s"]))
    model.graph.node.insert(0, helper.make_node("Mul", ["X", "X"], ["m"]))
    model.graph.node[2].input[0] = "s"
    assert refusal().endswith(
        "its ai.onnx.ml nodes (ZipMap) compute in float32 or float64 only (no FP16, BF16 or INT8 form), so only 2 of "
        "its 3 nodes (the ai.onnx ones) could be converted: convert it without the map (sklearn-onnx: "
        "options={'zipmap': False})."
    )


def _anonymous_rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1])
    raise AssertionError("no RssAnon")


@pytest.mark.slow
def test_trim_heap_returns_freed_small_blocks_to_the_system() -> None:
    from onnxprec import _io

    if _io._libc_trim() is None or not Path("/proc/self/status").is_file():
        pytest.skip("no glibc malloc_trim (or no /proc) here")
    blocks = [bytearray(64 * 1024) for _ in range(3200)]  # 200 MiB in blocks the heap serves (under its mmap size)
    for block in blocks:
        block[::4096] = b"x" * len(block[::4096])
    pinned = bytearray(64 * 1024)  # a live block above them: free() alone cannot give their pages back
    del blocks
    before = _anonymous_rss_kib()
    assert _io.trim_heap()
    assert _anonymous_rss_kib() < before - 150 * 1024
    del pinned
