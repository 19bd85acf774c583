"""Models whose weights are stored inside the .onnx file, large enough to be memory-mapped (onnxprec._io maps
single files from _MAP_FILE_BYTES up, and their tensors from 1 KiB up become references into the input file): every
tool and method writes an output that owns its data and never names the input file as external data.

The cheap tests force the mapping on a small model (the mapping threshold is a module constant); the slow one runs a
real 1.1 GB inline model."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import onnxprec._io as io_module
from onnxprec._testing import F, run, tensor_info

HIDDEN = 64


def _inline_model(path: Path, hidden: int = HIDDEN, layers: int = 2, ffn: int = 256) -> dict[str, np.ndarray]:
    """MatMul -> Add(bias) -> Relu -> MatMul blocks, weights inline. Each bias has ``ffn`` floats: 256 make exactly
    1 KiB, the size the mapper maps and the structure copies embedded (the off-by-one behind the bug)."""
    rng = np.random.default_rng(0)
    nodes, inits, prev = [], [], "X"
    for i in range(layers):
        up = (rng.standard_normal((hidden, ffn)) * np.sqrt(2 / hidden)).astype(np.float32)  # keeps the scale
        down = (rng.standard_normal((ffn, hidden)) / np.sqrt(ffn)).astype(np.float32)
        bias = rng.uniform(-0.1, 0.1, ffn).astype(np.float32)
        inits += [numpy_helper.from_array(a, n) for a, n in ((up, f"up{i}"), (down, f"down{i}"), (bias, f"b{i}"))]
        nodes += [
            helper.make_node("MatMul", [prev, f"up{i}"], [f"u{i}"], name=f"up_proj{i}"),
            helper.make_node("Add", [f"u{i}", f"b{i}"], [f"a{i}"], name=f"bias{i}"),
            helper.make_node("Relu", [f"a{i}"], [f"r{i}"], name=f"act{i}"),
            helper.make_node("MatMul", [f"r{i}", f"down{i}"], [f"d{i}"], name=f"down_proj{i}"),
        ]
        prev = f"d{i}"
    graph = helper.make_graph(
        nodes, "inline", [tensor_info("X", F, ["batch", hidden])], [tensor_info(prev, F, ["batch", hidden])], inits
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    onnx.save(model, path)  # one file, weights inside
    x = np.random.default_rng(1).standard_normal((4, hidden)).astype(np.float32)
    return {"X": x}


def _owns_its_data(output: Path, source: Path, feeds: dict[str, np.ndarray], elsewhere: Path) -> None:
    """The output passes the checker from its path, names no external file, and runs alone in another folder."""
    onnx.checker.check_model(str(output), full_check=True)
    proto = onnx.load(output, load_external_data=False)
    locations = {e.value for t in proto.graph.initializer for e in t.external_data if e.key == "location"}
    assert source.name not in locations
    elsewhere.mkdir()
    moved = elsewhere / output.name
    shutil.copy(output, moved)
    for location in locations:  # its own data file, if any, travels with it
        shutil.copy(output.parent / location, elsewhere / location)
    outputs = run(moved, feeds)
    assert all(np.isfinite(np.asarray(o, np.float32)).all() for o in outputs)


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


@pytest.mark.slow
def test_a_real_inline_model_above_1_gib(tmp_path: Path) -> None:
    """~1.1 GB of weights inside one .onnx file (136 blocks of 4096 x 256 and 256 x 4096 MatMuls, each with a 1 KiB
    bias): AutoCast and INT4 RTN in both formats write outputs that own their data."""
    src = tmp_path / "model.onnx"
    feeds = _inline_model(src, hidden=4096, layers=136)
    assert src.stat().st_size > 2**30 and src.stat().st_size >= io_module._MAP_FILE_BYTES
    for tool in ("autocast", "int4_rtn_qdq", "int4_rtn_matmulnbits"):
        out_dir = tmp_path / tool
        out_dir.mkdir()
        TOOLS[tool](src, out_dir / "model.onnx", feeds)
        _owns_its_data(out_dir / "model.onnx", src, feeds, tmp_path / f"{tool}_elsewhere")
