"""Models whose weights are stored inside the .onnx file, large enough to be memory-mapped (onnxprec._io maps
single files from _MAP_FILE_BYTES up, and their tensors from 1 KiB up become references into the input file): every
tool and method writes an output that owns its data and never names the input file as external data.

The cheap tests force the mapping on a small model (the mapping threshold is a module constant); the slow one runs a
real 0.54 GB inline model, written one tensor at a time, through each tool in a process of its own whose peak memory
it measures."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import onnxprec._io as io_module
from onnxprec._ort import create_session
from onnxprec._testing import F, run, tensor_info

HIDDEN = 64


def _weights(hidden: int, layers: int, ffn: int) -> Iterator[tuple[str, np.ndarray]]:
    """The initializers of :func:`_graph`, one at a time."""
    rng = np.random.default_rng(0)
    for i in range(layers):
        yield f"up{i}", rng.standard_normal((hidden, ffn), np.float32) * np.float32(np.sqrt(2 / hidden))  # scale kept
        yield f"down{i}", rng.standard_normal((ffn, hidden), np.float32) / np.float32(np.sqrt(ffn))
        yield f"b{i}", rng.uniform(-0.1, 0.1, ffn).astype(np.float32)


def _graph(hidden: int, layers: int) -> onnx.ModelProto:
    """MatMul -> Add(bias) -> Relu -> MatMul blocks, without their weights (:func:`_weights`)."""
    nodes, prev = [], "X"
    for i in range(layers):
        nodes += [
            helper.make_node("MatMul", [prev, f"up{i}"], [f"u{i}"], name=f"up_proj{i}"),
            helper.make_node("Add", [f"u{i}", f"b{i}"], [f"a{i}"], name=f"bias{i}"),
            helper.make_node("Relu", [f"a{i}"], [f"r{i}"], name=f"act{i}"),
            helper.make_node("MatMul", [f"r{i}", f"down{i}"], [f"d{i}"], name=f"down_proj{i}"),
        ]
        prev = f"d{i}"
    graph = helper.make_graph(
        nodes, "inline", [tensor_info("X", F, ["batch", hidden])], [tensor_info(prev, F, ["batch", hidden])]
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def _feeds(hidden: int) -> dict[str, np.ndarray]:
    return {"X": np.random.default_rng(1).standard_normal((4, hidden)).astype(np.float32)}


def _inline_model(path: Path, hidden: int = HIDDEN, layers: int = 2, ffn: int = 256) -> dict[str, np.ndarray]:
    """MatMul -> Add(bias) -> Relu -> MatMul blocks, weights inline (onnx.save). Each bias has ``ffn`` floats: 256
    make exactly 1 KiB, the size the mapper maps and the structure copies embedded (the off-by-one behind the bug)."""
    model = _graph(hidden, layers)
    model.graph.initializer.extend(numpy_helper.from_array(a, name) for name, a in _weights(hidden, layers, ffn))
    onnx.save(model, path)  # one file, weights inside
    return _feeds(hidden)


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    return bytes([*out, value])


def _write_inline_model_streaming(path: Path, hidden: int, layers: int, ffn: int = 256) -> dict[str, np.ndarray]:
    """The model of :func:`_inline_model` with its weights inside one .onnx file, written one initializer at a time
    (the protobuf wire format by hand: graph field 7 with a length known in advance), so that a model above 1 GiB
    is made without being held in memory. The bytes are those ``onnx.save`` writes."""
    model = _graph(hidden, layers)
    # The graph's fields in onnx's order: nodes and name (1, 2), the initializers (5), inputs and outputs (11, 12).
    head = onnx.GraphProto(node=model.graph.node, name=model.graph.name).SerializeToString()
    tail = onnx.GraphProto(input=model.graph.input, output=model.graph.output).SerializeToString()
    opsets = onnx.ModelProto(opset_import=model.opset_import).SerializeToString()  # field 8, after the graph
    model.ClearField("graph")
    model.ClearField("opset_import")

    def header(name: str, dims: tuple[int, ...]) -> bytes:  # a float32 TensorProto up to its raw_data (field 9)
        proto = onnx.TensorProto(name=name, dims=dims, data_type=onnx.TensorProto.FLOAT).SerializeToString()
        return proto + b"\x4a" + _varint(4 * int(np.prod(dims)))

    def initializer(name: str, dims: tuple[int, ...]) -> bytes:  # graph field 5, up to the tensor's bytes
        body = header(name, dims)
        return b"\x2a" + _varint(len(body) + 4 * int(np.prod(dims))) + body

    shapes = [(n, s) for i in range(layers) for n, s in ((f"up{i}", (hidden, ffn)), (f"down{i}", (ffn, hidden)),
                                                         (f"b{i}", (ffn,)))]  # fmt: skip
    length = len(head) + sum(len(initializer(n, s)) + 4 * int(np.prod(s)) for n, s in shapes) + len(tail)
    with open(path, "wb") as f:
        f.write(model.SerializeToString() + b"\x3a" + _varint(length))  # model field 7: the graph
        f.write(head)
        for name, array in _weights(hidden, layers, ffn):
            f.write(initializer(name, array.shape))
            array.tofile(f)
        f.write(tail + opsets)
    return _feeds(hidden)


def _external_locations(path: Path) -> set[str]:
    proto = onnx.load(path, load_external_data=False)
    return {e.value for t in proto.graph.initializer for e in t.external_data if e.key == "location"}


def _owns_its_data(
    output: Path,
    source: Path,
    feeds: dict[str, np.ndarray],
    elsewhere: Path,
    runner: Callable[[Path, dict[str, np.ndarray]], list[np.ndarray]] = run,
) -> None:
    """The output passes the checker from its path, names no external file, and runs alone in another folder (on
    ``runner``; each step frees its copy of the model before the next)."""
    onnx.checker.check_model(str(output), full_check=True)
    locations = _external_locations(output)
    assert source.name not in locations
    elsewhere.mkdir()
    moved = elsewhere / output.name
    shutil.copy(output, moved)
    for location in locations:  # its own data file, if any, travels with it
        shutil.copy(output.parent / location, elsewhere / location)
    outputs = runner(moved, feeds)
    assert all(np.isfinite(np.asarray(o, np.float32)).all() for o in outputs)


def _run_in_little_memory(path: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """ONNX Runtime without graph rewrites and weight pre-packing, which copy weights (FP16 ones to float32)."""
    return create_session(path, optimization="none", low_memory=True, what="the output").run(feeds)


def _autocast(src: Path, out: Path, feeds: dict[str, np.ndarray]) -> None:
    from onnxprec.autocast import convert_file

    convert_file(src, out, calibration_data=feeds)


def _int4(method: str, fmt: str) -> Callable[[Path, Path, dict[str, np.ndarray]], None]:
    def quantize(src: Path, out: Path, feeds: dict[str, np.ndarray]) -> None:
        from onnxprec.quantization.int4 import quantize_file

        quantize_file(
            src, out, calibration_method=method, output_format=fmt, block_size=32, calibration_data_reader=[feeds]
        )

    return quantize


def _preprocess(src: Path, out: Path, feeds: dict[str, np.ndarray]) -> None:
    from onnxprec.preprocess import PreprocessOptions, preprocess_file

    preprocess_file(src, out, PreprocessOptions())


TOOLS: dict[str, Callable[[Path, Path, dict[str, np.ndarray]], None]] = {
    "autocast": _autocast,
    **{f"int4_{m}_{f}": _int4(m, f) for m in ("rtn", "awq_lite", "gptq") for f in ("qdq", "matmulnbits")},
    "preprocess": _preprocess,
}


@pytest.mark.slow
@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_outputs_of_mapped_inline_models_own_their_data(
    tool: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(io_module, "_MAP_FILE_BYTES", 0)  # map this small file as a >1 GiB one would be
    src = tmp_path / "model.onnx"
    feeds = _inline_model(src)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    output = out_dir / "model.onnx"
    TOOLS[tool](src, output, feeds)
    _owns_its_data(output, src, feeds, tmp_path / "elsewhere")


def test_dump_compare_and_evaluate_run_on_mapped_inline_models(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from onnxprec.debug import compare_models, dump_model
    from onnxprec.evaluate import evaluate_models
    from onnxprec.quantization.int4 import quantize_file

    monkeypatch.setattr(io_module, "_MAP_FILE_BYTES", 0)
    src = tmp_path / "model.onnx"
    feeds = _inline_model(src)
    quantized = tmp_path / "q.onnx"
    quantize_file(src, quantized, calibration_method="rtn", block_size=32)
    dumped = dump_model(quantized, [feeds], output_dir=str(tmp_path / "dump"))
    assert dumped.tensors and (tmp_path / "dump" / "index.json").exists()
    compared = compare_models(src, quantized, [feeds])
    errors = [o.rel_l2 for o in compared.outputs.values()]
    assert errors and all(e is not None and e < 0.5 for e in errors)  # INT4 of random weights: ~0.1 a layer
    evaluated = evaluate_models([src, quantized], [feeds])
    assert len(evaluated.models) == 2


def test_the_streamed_model_is_the_one_onnx_save_writes(tmp_path: Path) -> None:
    _inline_model(tmp_path / "saved.onnx", hidden=96, layers=3)
    _write_inline_model_streaming(tmp_path / "streamed.onnx", hidden=96, layers=3)
    assert (tmp_path / "saved.onnx").read_bytes() == (tmp_path / "streamed.onnx").read_bytes()


def _tools_in_a_process(tools: list[str], source: Path, data: Path, work: Path) -> dict[str, int]:
    """Runs ``python <this file> <tools> ...``: each tool in turn, then the check that its output owns its data (from a
    copy in another folder, ONNX Runtime in little memory). Returns each tool's peak resident memory in bytes (Linux:
    the process's high-water mark, reset before the tool and read when it has written its output, before the check;
    what the process still holds from before counts too)."""
    args = [",".join(tools), str(source), str(data), str(work)]
    process = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, check=False)
    assert process.returncode == 0, process.stderr[-3000:]
    peaks = [line.split() for line in process.stdout.splitlines() if line.startswith("peak ")]
    return {tool: int(peak) for _, tool, peak in peaks}


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="peak memory is read from Linux's /proc")
def test_a_real_inline_model_above_half_a_gib(tmp_path: Path) -> None:
    """~0.54 GB of weights inside one .onnx file (64 blocks of 4096 x 256 and 256 x 4096 MatMuls, each with a 1 KiB
    bias): AutoCast and INT4 RTN in both formats, one after another in a process of their own, write outputs that
    own their data (checked by that process once each tool is done, from a copy in another folder), and none holds
    the model twice (a process's own ~0.25 GiB is well below one more copy). The file is written one tensor at a
    time, so this process never holds it either. INT4 runs as for a model above the accuracy guard's 1 GiB (its
    check on the first batch, no second pipeline run)."""
    src = tmp_path / "model.onnx"
    feeds = _write_inline_model_streaming(src, hidden=4096, layers=64)
    size = src.stat().st_size
    assert size > 2**29 and size >= io_module._MAP_FILE_BYTES
    np.savez(tmp_path / "feeds.npz", **feeds)
    tools = ["autocast", "int4_rtn_qdq", "int4_rtn_matmulnbits"]
    peaks = _tools_in_a_process(tools, src, tmp_path / "feeds.npz", tmp_path)
    assert list(peaks) == tools
    for tool, peak in peaks.items():
        assert peak < 2 * size, f"{tool} held {peak / 2**30:.2f} GiB for a {size / 2**30:.2f} GiB model"
    src.unlink()  # pytest keeps the folders of its last runs: not 0.54 GB each


def _high_water_mark(reset: bool = False) -> int:
    """This process's peak resident memory in bytes since the last reset (``reset``: set it to the current)."""
    if reset:
        Path("/proc/self/clear_refs").write_text("5")
    status = Path("/proc/self/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmHWM:")).split()[1]) * 1024


if __name__ == "__main__":  # the process of test_a_real_inline_model_above_half_a_gib
    from onnxprec._io import trim_heap
    from onnxprec.quantization.int4 import _guard

    _guard.MAX_GUARD_BYTES = 0  # the model stands for one above the guard's 1 GiB, as its mapping does
    names, source, data, work = sys.argv[1:]
    feeds = dict(np.load(data))
    for tool in names.split(","):
        out_dir, elsewhere = Path(work) / tool, Path(work) / f"{tool}_elsewhere"
        out_dir.mkdir()
        trim_heap()
        _high_water_mark(reset=True)
        TOOLS[tool](Path(source), out_dir / "model.onnx", feeds)
        print("peak", tool, _high_water_mark(), flush=True)
        trim_heap()
        _owns_its_data(out_dir / "model.onnx", Path(source), feeds, elsewhere, _run_in_little_memory)
        shutil.rmtree(out_dir)
        shutil.rmtree(elsewhere)
