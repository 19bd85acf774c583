"""Streaming protobuf I/O: the mapped loader and the streaming writer agree with onnx.load / onnx.save."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import helper, numpy_helper

from onnxprec import _ort
from onnxprec._io import load_model, save_model
from onnxprec._protobuf import load_mapped, write_streaming
from onnxprec._testing import F, make_model, run, tensor_info
from onnxprec.errors import ModelLoadError


def _model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    inits = {
        "W": rng.standard_normal((64, 64)).astype(np.float32),
        "b": np.arange(4, dtype=np.float32),
        "shape": np.array([1, 64], np.int64),
    }
    nodes = [helper.make_node("MatMul", ["X", "W"], ["m"]), helper.make_node("Reshape", ["m", "shape"], ["Y"])]
    model = make_model(nodes, [tensor_info("X", F, [1, 64])], [tensor_info("Y", F, [1, 64])], inits)
    model.doc_string = "kept"
    return model


def test_mapped_load_references_the_file_and_keeps_everything_else(tmp_path: Path) -> None:
    path = tmp_path / "m.onnx"
    onnx.save(_model(), path)
    proto = load_mapped(path)
    weights = {t.name: t for t in proto.graph.initializer}
    assert weights["W"].data_location == onnx.TensorProto.EXTERNAL  # 16 KB: mapped
    assert weights["b"].data_location == onnx.TensorProto.DEFAULT  # 16 bytes: copied
    assert proto.doc_string == "kept" and len(proto.graph.node) == 2
    model = ir.serde.deserialize_model(proto)
    ir.external_data.set_base_dir(model.graph, str(tmp_path))
    np.testing.assert_array_equal(model.graph.initializers["W"].const_value.numpy(), _model_weight())


def _model_weight() -> np.ndarray:
    return numpy_helper.to_array(next(t for t in _model().graph.initializer if t.name == "W"))


def test_streaming_writer_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "m.onnx"
    onnx.save(_model(), path)
    model = ir.serde.deserialize_model(load_mapped(path))
    ir.external_data.set_base_dir(model.graph, str(tmp_path))
    buffer = io.BytesIO()
    write_streaming(model, buffer)
    again = onnx.load_model_from_string(buffer.getvalue())
    onnx.checker.check_model(again, full_check=True)
    assert all(t.data_location == onnx.TensorProto.DEFAULT for t in again.graph.initializer)
    x = np.ones((1, 64), np.float32)
    np.testing.assert_array_equal(run(again, {"X": x})[0], run(_model(), {"X": x})[0])


def test_streaming_writer_describes_what_it_wrote(tmp_path: Path) -> None:
    model = ir.serde.deserialize_model(_model())
    path = tmp_path / "out.onnx"
    with open(path, "wb") as stream:
        message = write_streaming(model, stream, location=path.name)
    assert message is not None
    written = onnx.load(path)
    assert message.graph.node == written.graph.node and message.graph.output == written.graph.output
    data = path.read_bytes()
    assert message == load_mapped(path)  # what reading the file back gives, but for the location
    for ref, tensor in zip(message.graph.initializer, written.graph.initializer, strict=True):
        assert ref.name == tensor.name
        if len(tensor.raw_data) < 1024:  # small ones in the message: ONNX Runtime's shape inference reads them
            assert ref.raw_data == tensor.raw_data and ref.data_location == onnx.TensorProto.DEFAULT
            continue
        entries = {e.key: e.value for e in ref.external_data}
        assert ref.data_location == onnx.TensorProto.EXTERNAL and not ref.raw_data
        assert entries["location"] == "out.onnx"
        offset, length = int(entries["offset"]), int(entries["length"])
        assert data[offset : offset + length] == tensor.raw_data
    x = np.ones((1, 64), np.float32)
    session = _ort.create_session(message.SerializeToString(), external_data_folder=tmp_path)
    np.testing.assert_array_equal(session.run({"X": x})[0], run(_model(), {"X": x})[0])
    buffer = io.BytesIO()
    assert write_streaming(model, buffer) is None and buffer.getvalue() == data


def test_truncated_big_file_is_a_clean_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import onnxprec._io as io_module

    monkeypatch.setattr(io_module, "_MAP_FILE_BYTES", 0)  # force the mapped path on a small file
    path = tmp_path / "t.onnx"
    path.write_bytes(_model().SerializeToString()[:-100])
    with pytest.raises(ModelLoadError, match="truncated"):
        load_model(path)


def test_save_with_external_data_never_touches_the_input_data(tmp_path: Path) -> None:
    src = tmp_path / "in.onnx"
    onnx.save(_model(), src, save_as_external_data=True, location="in.onnx.data", size_threshold=0)
    before = (tmp_path / "in.onnx.data").read_bytes()
    model = load_model(src)
    out = tmp_path / "out.onnx"
    save_model(model, out, external_data=True, protected={src.resolve(), (tmp_path / "in.onnx.data").resolve()})
    assert (tmp_path / "in.onnx.data").read_bytes() == before
    assert (tmp_path / "out.onnx.data").exists()
    x = np.ones((1, 64), np.float32)
    np.testing.assert_array_equal(run(out, {"X": x})[0], run(_model(), {"X": x})[0])
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]
    assert leftovers == []  # the temporary file was renamed, not left behind


def test_streaming_save_keeps_initializer_metadata(tmp_path: Path) -> None:
    """The original name a conversion records on an initializer survives the single-file streaming save."""
    from onnxprec._graph import ORIGINAL_NAME

    proto = make_model(
        [helper.make_node("Add", ["x", "w16"], ["y"])],
        [tensor_info("x", F, [4])],
        [tensor_info("y", F, [4])],
        {"w16": np.arange(4, dtype=np.float32)},
    )
    model = ir.serde.deserialize_model(proto)
    model.graph.initializers["w16"].metadata_props[ORIGINAL_NAME] = "W"
    save_model(model, tmp_path / "m.onnx", external_data=False)
    loaded = load_model(tmp_path / "m.onnx")
    assert loaded.graph.initializers["w16"].metadata_props[ORIGINAL_NAME] == "W"


def test_proto_graphs_walks_nested_subgraphs_parents_first() -> None:
    import onnx.parser

    from onnxprec._protobuf import proto_graphs

    model = onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 17]>
        outer (bool c, float[2] x) => (float[2] y) {
            y = If <
                then_branch = then_g () => (float[2] t) {
                    t = If <
                        then_branch = inner_then () => (float[2] a) { a = Neg (x) },
                        else_branch = inner_else () => (float[2] b) { b = Abs (x) }
                    > (c)
                },
                else_branch = else_g () => (float[2] e) { e = Relu (x) }
            > (c)
        }
    """)
    assert [g.name for g in proto_graphs(model.graph)] == ["outer", "then_g", "inner_then", "inner_else", "else_g"]
