"""``onnxprec dump`` / ``onnxprec.debug.dump_model``: what is dumped, file formats, names, index, memory, errors."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxprec._ort import create_session
from onnxprec._testing import F, make_model, run_cli, tensor_info
from onnxprec.debug import dump_model
from onnxprec.debug.dump import dequantize
from onnxprec.errors import CalibrationDataError, InvalidArgumentError, ModelLoadError

K, N, BLOCK = 32, 8, 16


def _qdq_model() -> onnx.ModelProto:
    """x -> Q/DQ (int8) -> MatMul with an INT4 block-quantized weight (DQ) -> MatMul with an int8 per-axis weight
    (DQ) -> MatMulNBits -> y."""
    rng = np.random.default_rng(0)
    w4 = rng.integers(-8, 8, size=(K, N))
    w8 = rng.integers(-128, 128, size=(N, K)).astype(np.int8)
    b = rng.integers(0, 256, size=(N, K // BLOCK, BLOCK // 2)).astype(np.uint8)
    inits = [
        helper.make_tensor("w4", TensorProto.INT4, (K, N), w4.reshape(-1).tolist()),
        numpy_helper.from_array((rng.random((K // BLOCK, N)) * 0.1 + 0.01).astype(np.float32), "w4_scale"),
        numpy_helper.from_array(w8, "w8"),
        numpy_helper.from_array((rng.random(K) * 0.01 + 0.001).astype(np.float32), "w8_scale"),
        numpy_helper.from_array(np.array(0.05, np.float32), "x_scale"),
        numpy_helper.from_array(np.array(0, np.int8), "x_zero"),
        numpy_helper.from_array(b, "nbits_b"),
        numpy_helper.from_array((rng.random(N * (K // BLOCK)) * 0.05).astype(np.float32), "nbits_scales"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "x_scale", "x_zero"], ["x_q"], name="/in/QuantizeLinear"),
        helper.make_node("DequantizeLinear", ["x_q", "x_scale", "x_zero"], ["x_dq"], name="/in/DequantizeLinear"),
        helper.make_node("DequantizeLinear", ["w4", "w4_scale"], ["w4_dq"], name="/fc1/w/DQ", axis=0, block_size=BLOCK),
        helper.make_node("MatMul", ["x_dq", "w4_dq"], ["h"], name="/fc1/MatMul"),
        helper.make_node("DequantizeLinear", ["w8", "w8_scale"], ["w8_dq"], name="/fc2/w/DQ", axis=1),
        helper.make_node("MatMul", ["h", "w8_dq"], ["h2"], name="/fc2/MatMul"),
        helper.make_node(
            "MatMulNBits",
            ["h2", "nbits_b", "nbits_scales"],
            ["y"],
            name="/fc3/MatMulNBits",
            domain="com.microsoft",
            K=K,
            N=N,
            bits=4,
            block_size=BLOCK,
        ),
    ]
    graph = helper.make_graph(nodes, "qdq", [tensor_info("x", F, [1, K])], [tensor_info("y", F, [1, N])], inits)
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    )
    model.ir_version = 10
    return model


def _float_model() -> onnx.ModelProto:
    """Float chain with exporter-style names: '/', ':' and two names that sanitise to the same file name."""
    rng = np.random.default_rng(1)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["/block/mm:0"], name="/block/MatMul"),
        helper.make_node("Relu", ["/block/mm:0"], ["/block/mm_0"], name="/block/Relu"),
        helper.make_node("Tanh", ["/block/mm_0"], ["t"], name="tanh"),
        helper.make_node("Shape", ["t"], ["shape"], name="shape"),  # an integer output: never in a float dump
        helper.make_node("Add", ["t", "b"], ["y"], name="add"),
    ]
    return make_model(
        nodes,
        [tensor_info("x", F, ["batch", 16])],
        [tensor_info("y", F, ["batch", 16]), tensor_info("shape", TensorProto.INT64, [2])],
        {"w": rng.standard_normal((16, 16)).astype(np.float32), "b": rng.standard_normal(16).astype(np.float32)},
    )


def _all_outputs(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every node output of ``model`` on ``feeds`` (marked as graph outputs), from one plain ORT run."""
    full = onnx.ModelProto()
    full.CopyFrom(model)
    known = {o.name for o in full.graph.output}
    for node in full.graph.node:
        for out in node.output:
            if out not in known:
                full.graph.output.append(onnx.ValueInfoProto(name=out))
    session = create_session(full, optimization="none")
    return dict(zip(session.output_names, session.run(feeds)))


def _read(folder: Path, entry: dict, kind: str = "") -> tuple[np.ndarray, np.ndarray]:
    dtype = np.dtype(getattr(ml_dtypes, entry["dtype"], None) or entry["dtype"])
    binary = np.fromfile(folder / entry["files"][f"{kind}bin"], dtype=dtype).reshape(entry["shape"])
    text = np.loadtxt(folder / entry["files"][f"{kind}txt"], dtype=np.float64, ndmin=1).astype(dtype)
    return binary, text.reshape(entry["shape"])


@pytest.fixture
def qdq_path(tmp_path: Path) -> Path:
    path = tmp_path / "qdq.onnx"
    onnx.save(_qdq_model(), path)
    return path


@pytest.fixture
def x() -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(2).standard_normal((1, K)).astype(np.float32)}


def test_qdq_dump_writes_every_quantized_output(qdq_path: Path, x: dict[str, np.ndarray], tmp_path: Path) -> None:
    out = tmp_path / "dump"
    result = dump_model(str(qdq_path), x, output_dir=str(out))
    index = json.loads((out / "index.json").read_text())
    assert index == result.index
    by_name = {e["name"]: e for e in index["tensors"]}
    # The int8 QuantizeLinear output, the activation's DQ, both dequantized weights, the MatMulNBits output;
    # no float MatMul output without --dump_float.
    assert set(by_name) == {"x_q", "x_dq", "w4_dq", "w8_dq", "y"}
    expected = _all_outputs(_qdq_model(), x)
    for name, entry in by_name.items():
        binary, text = _read(out, entry)
        np.testing.assert_array_equal(text, binary)
        if name == "y":  # MatMulNBits: the low-memory session (no pre-packing) may round differently
            np.testing.assert_allclose(binary, expected[name], rtol=1e-5)
        else:
            np.testing.assert_array_equal(binary, expected[name])
        assert set(entry["files"]) == {"bin", "txt"}
    assert by_name["x_q"]["dtype"] == "int8" and by_name["x_dq"]["dtype"] == "float32"
    assert by_name["w4_dq"]["shape"] == [K, N] and by_name["w4_dq"]["op_type"] == "DequantizeLinear"
    assert by_name["w4_dq"]["node"] == "/fc1/w/DQ"
    assert (by_name["y"]["op_type"], by_name["y"]["domain"]) == ("MatMulNBits", "com.microsoft")
    stats = by_name["w8_dq"]["stats"]
    w8 = expected["w8_dq"].astype(np.float64)
    assert stats["min"] == pytest.approx(w8.min()) and stats["max"] == pytest.approx(w8.max())
    assert stats["mean"] == pytest.approx(w8.mean()) and stats["std"] == pytest.approx(w8.std())
    assert stats["nonfinite"] == 0
    assert index["inputs"] == {"x": {"dtype": "float32", "shape": [1, K]}}
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["index.json", *(f for e in index["tensors"] for f in e["files"].values())]
    )


def test_constant_dequantize_in_numpy_matches_onnx_runtime(x: dict[str, np.ndarray]) -> None:
    """The fallback for DQ outputs ORT folds away: per tensor, per axis and INT4 blocks, like ORT."""
    expected = _all_outputs(_qdq_model(), x)
    inits = {t.name: numpy_helper.to_array(t) for t in _qdq_model().graph.initializer}
    np.testing.assert_array_equal(
        dequantize(inits["w4"], inits["w4_scale"], axis=0, block_size=BLOCK), expected["w4_dq"]
    )
    np.testing.assert_array_equal(dequantize(inits["w8"], inits["w8_scale"], axis=1), expected["w8_dq"])
    np.testing.assert_array_equal(dequantize(expected["x_q"], inits["x_scale"], inits["x_zero"]), expected["x_dq"])


def test_dump_float_writes_every_float_node_output_with_safe_unique_names(tmp_path: Path) -> None:
    path = tmp_path / "f.onnx"
    onnx.save(_float_model(), path)
    feeds = {"x": np.random.default_rng(3).standard_normal((3, 16)).astype(np.float32)}
    out = tmp_path / "dump"
    result = dump_model(path, [feeds], dump_float=True, output_dir=str(out))
    entries = {e["name"]: e for e in result.tensors}
    assert set(entries) == {"/block/mm:0", "/block/mm_0", "t", "y"}  # every float output, no int Shape
    stems = {name: e["files"]["float_bin"] for name, e in entries.items()}
    # '/' and ':' become '_'; the two names that sanitise alike get distinct files.
    assert stems["/block/mm:0"] == "_block_mm_0_float.bin"
    assert stems["/block/mm_0"] == "_block_mm_0_float_1.bin"
    assert all("/" not in f and ":" not in f for e in entries.values() for f in e["files"].values())
    expected = _all_outputs(_float_model(), feeds)
    for name, entry in entries.items():
        assert set(entry["files"]) == {"float_bin", "float_txt"}
        binary, text = _read(out, entry, "float_")
        np.testing.assert_array_equal(binary, expected[name])
        np.testing.assert_array_equal(text, expected[name])  # 9 significant digits round-trip float32
    assert entries["t"]["node"] == "tanh" and entries["t"]["op_type"] == "Tanh"


def test_dump_float_on_a_qdq_model_writes_both_kinds(qdq_path: Path, x: dict[str, np.ndarray], tmp_path: Path) -> None:
    result = dump_model(qdq_path, x, dump_float=True, output_dir=str(tmp_path / "d"))
    entries = {e["name"]: e for e in result.tensors}
    assert set(entries) == {"x_q", "x_dq", "w4_dq", "w8_dq", "h", "h2", "y"}
    assert set(entries["x_dq"]["files"]) == {"bin", "txt", "float_bin", "float_txt"}  # quantized and float
    assert set(entries["h"]["files"]) == {"float_bin", "float_txt"}
    assert set(entries["x_q"]["files"]) == {"bin", "txt"}  # int8: not a float output


def test_small_budget_dumps_everything_in_several_runs(tmp_path: Path) -> None:
    path = tmp_path / "f.onnx"
    onnx.save(_float_model(), path)
    feeds = {"x": np.random.default_rng(4).standard_normal((64, 16)).astype(np.float32)}
    whole = dump_model(path, feeds, dump_float=True, output_dir=str(tmp_path / "whole"))
    small = dump_model(path, feeds, dump_float=True, output_dir=str(tmp_path / "small"), budget_bytes=64 * 16 * 4)
    assert whole.chunks == 1 and small.chunks >= 3  # one 4 KiB tensor per run
    assert [e["name"] for e in small.tensors] == [e["name"] for e in whole.tensors]
    for a, b in zip(whole.tensors, small.tensors):
        assert (tmp_path / "whole" / a["files"]["float_bin"]).read_bytes() == (
            tmp_path / "small" / b["files"]["float_bin"]
        ).read_bytes()


def test_random_inputs_of_the_given_shapes_and_first_batch_only(tmp_path: Path) -> None:
    path = tmp_path / "f.onnx"
    onnx.save(_float_model(), path)
    result = dump_model(
        path, random_data_reader_input_shape={"x": [5, 16]}, dump_float=True, output_dir=str(tmp_path / "r")
    )
    assert result.index["inputs"] == {"x": {"dtype": "float32", "shape": [5, 16]}}
    assert {e["name"]: e["shape"] for e in result.tensors}["y"] == [5, 16]
    result = dump_model(path, random_data_reader_input_shape=[[2, 16]], dump_float=True, output_dir=str(tmp_path / "l"))
    assert result.index["inputs"]["x"]["shape"] == [2, 16]
    batches = [{"x": np.ones((2, 16), np.float32)}, {"x": np.ones((7, 16), np.float32)}]
    result = dump_model(path, iter(batches), dump_float=True, output_dir=str(tmp_path / "b"))
    assert result.index["inputs"]["x"]["shape"] == [2, 16]  # the first batch of a one-shot reader


def test_a_folder_with_files_is_refused_unless_overwrite(
    qdq_path: Path, x: dict[str, np.ndarray], tmp_path: Path
) -> None:
    out = tmp_path / "dump"
    out.mkdir()
    dump_model(qdq_path, x, output_dir=str(out))  # an empty folder is filled
    (out / "notes.txt").write_text("mine")
    before = sorted(p.name for p in out.iterdir())
    with pytest.raises(InvalidArgumentError, match="is not empty: choose a new or empty folder, or pass --overwrite"):
        dump_model(qdq_path, x, dump_float=True, output_dir=str(out))
    assert sorted(p.name for p in out.iterdir()) == before  # nothing written
    floats = dump_model(qdq_path, x, dump_float=True, output_dir=str(out), overwrite=True)
    assert (out / "notes.txt").read_text() == "mine" and (out / "h_float.bin").is_file()
    again = dump_model(qdq_path, x, output_dir=str(out), overwrite=True)  # the earlier dump's files go
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["index.json", "notes.txt", *(f for e in again.tensors for f in e["files"].values())]
    )
    assert len(floats.tensors) > len(again.tensors)
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # no staging folder left
    bad = run_cli("dump", "--onnx_path", str(qdq_path), "--output_dir", str(out))
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--overwrite" in bad.stderr


def test_text_holds_the_first_values_and_the_binary_all(tmp_path: Path) -> None:
    path = tmp_path / "f.onnx"
    onnx.save(_float_model(), path)
    feeds = {"x": np.random.default_rng(5).standard_normal((80, 16)).astype(np.float32)}  # 1280 values a tensor
    expected = _all_outputs(_float_model(), feeds)["y"].reshape(-1)
    for text_values, kept in ((None, 1024), (100, 100), (0, expected.size)):
        out = tmp_path / f"t{text_values}"
        more = {} if text_values is None else {"text_values": text_values}
        entry = {e["name"]: e for e in dump_model(path, feeds, dump_float=True, output_dir=str(out), **more).tensors}
        files = entry["y"]["files"]
        np.testing.assert_array_equal(np.fromfile(out / files["float_bin"], np.float32), expected)
        np.testing.assert_array_equal(np.loadtxt(out / files["float_txt"], dtype=np.float32), expected[:kept])
        last = (out / files["float_txt"]).read_text().splitlines()[-1]
        cut = f"# the first {kept} of {expected.size} values; all in {Path(files['float_bin']).stem}.bin"
        assert (last == cut) == (kept < expected.size)
    with pytest.raises(InvalidArgumentError, match="text_values must be an integer >= 0"):
        dump_model(path, feeds, output_dir=str(tmp_path / "bad"), text_values=-1)


def _int4_activation_model() -> onnx.ModelProto:
    """x -> QuantizeLinear to INT4 (ONNX Runtime cannot hand it back) -> DequantizeLinear -> y."""
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["x_q4"], name="q4"),
        helper.make_node("DequantizeLinear", ["x_q4", "s", "z"], ["y"], name="dq4"),
    ]
    inits = [
        numpy_helper.from_array(np.array(0.1, np.float32), "s"),
        helper.make_tensor("z", TensorProto.INT4, (), [0]),
    ]
    graph = helper.make_graph(nodes, "q4", [tensor_info("x", F, [1, 8])], [tensor_info("y", F, [1, 8])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model


def test_the_summary_says_what_was_skipped_and_how_to_dump_floats(tmp_path: Path) -> None:
    path = tmp_path / "f.onnx"
    onnx.save(_float_model(), path)
    plain = dump_model(path, output_dir=str(tmp_path / "plain"))
    assert plain.tensors == []
    assert plain.summary.endswith(
        "; the model has no quantized node output to dump: --dump_float dumps every float node output"
    )
    assert "--dump_float dumps" not in dump_model(path, dump_float=True, output_dir=str(tmp_path / "f")).summary
    onnx.save(_int4_activation_model(), tmp_path / "q4.onnx")
    int4 = dump_model(tmp_path / "q4.onnx", output_dir=str(tmp_path / "q4"))
    assert [e["name"] for e in int4.tensors] == ["y"]
    assert "; skipped 1 (4-bit tensors cannot be fetched from ONNX Runtime)" in int4.summary
    assert "--dump_float dumps" not in int4.summary


def test_errors_leave_nothing_behind(qdq_path: Path, x: dict[str, np.ndarray], tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="does not exist"):
        dump_model(tmp_path / "missing.onnx", output_dir=str(tmp_path / "d1"))
    afile = tmp_path / "file"
    afile.write_text("")
    with pytest.raises(InvalidArgumentError, match="is a file"):
        dump_model(qdq_path, x, output_dir=str(afile))
    with pytest.raises(InvalidArgumentError, match="does not exist"):
        dump_model(qdq_path, x, output_dir=str(tmp_path / "no" / "such" / "dir"))
    with pytest.raises(CalibrationDataError, match="missing"):
        dump_model(qdq_path, {"wrong": x["x"]}, output_dir=str(tmp_path / "d2"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "qdq.onnx"]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args)  # in this process: same code path, no interpreter start per call


def test_cli_dump_and_one_line_errors(qdq_path: Path, x: dict[str, np.ndarray], tmp_path: Path) -> None:
    np.savez(tmp_path / "x.npz", **x)
    out = tmp_path / "dump"
    ok = _cli(
        "dump", "--onnx_path", str(qdq_path), "-d", str(tmp_path / "x.npz"), "--dump_float", "--output_dir", str(out)
    )
    assert ok.returncode == 0, ok.stderr
    assert "Dumped 7 tensors (5 quantized outputs, 6 float outputs)" in ok.stdout
    assert (out / "x_dq_float.txt").is_file()
    for args, words in (
        (["--onnx_path", str(tmp_path / "nope.onnx"), "--output_dir", str(tmp_path / "e1")], "does not exist"),
        (["--onnx_path", str(qdq_path), "--output_dir", str(qdq_path)], "is a file"),
        (["--onnx_path", str(qdq_path), "--input_shapes", "x:1xK"], "Invalid --input_shapes"),
    ):
        bad = _cli("dump", *args)
        assert bad.returncode == 2, bad.stderr
        lines = bad.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0], bad.stderr
    assert not (tmp_path / "e1").exists()
    helptext = _cli("dump", "--help")
    assert helptext.returncode == 0 and "examples:" in helptext.stdout
