"""Bad input to ``python -m onnxprec.autocast``: one exact line on stderr, exit code 2, no traceback, no output file,
the input untouched (issue 9).

Each case builds its input in a fresh folder; ``{dir}`` in the expected message is that folder. All cases run as
separate processes in parallel once per session (a module fixture), forked from one process that has imported the
tools (``run_forked``: no interpreter start and imports per case), so the whole corpus takes a few seconds of wall
time; each case is then checked on its own.
"""

from __future__ import annotations

import concurrent.futures
import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxprec._testing import F, make_genai_folder, make_model, run_forked, tensor_info, tiny_decoder

# Every case is a process of its own (the corpus checks the real exit, stderr and files): the slow suite.
pytestmark = pytest.mark.slow

I64 = TensorProto.INT64


def _good() -> onnx.ModelProto:
    w = np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["X", "W"], ["m"], name="mm"),
        helper.make_node("Relu", ["m"], ["Y"], name="relu"),
    ]
    return make_model(nodes, [tensor_info("X", F, ["batch", 4])], [tensor_info("Y", F, ["batch", 4])], {"W": w})


def _save(model: onnx.ModelProto, path: Path) -> Path:
    path.write_bytes(model.SerializeToString())
    return path


def _graph(nodes: list[onnx.NodeProto], inputs=None, outputs=None, inits=None, **kw) -> onnx.ModelProto:  # type: ignore[no-untyped-def]
    return make_model(
        nodes,
        inputs if inputs is not None else [tensor_info("X", F, [2, 4])],
        outputs if outputs is not None else [tensor_info("Y", F, [2, 4])],
        inits,
        **kw,
    )


# --------------------------------------------------------------------------------------------------
# Each builder writes what it needs into the folder and returns the CLI arguments (after --onnx_path).


def _model_file(d: Path, data: bytes, name: str = "model.onnx") -> list[str]:
    (d / name).write_bytes(data)
    return ["--onnx_path", str(d / name)]


def _external(d: Path, cut: int | None) -> list[str]:
    model = _good()
    onnx.save(model, d / "model.onnx", save_as_external_data=True, location="model.onnx.data", size_threshold=0)
    data = d / "model.onnx.data"
    if cut is None:
        data.unlink()
    else:
        data.write_bytes(data.read_bytes()[:cut])
    return ["--onnx_path", str(d / "model.onnx")]


def _escaping_external(d: Path) -> list[str]:
    """External data at ``../escape.data``: outside the model's folder (onnx.save refuses to write that)."""
    _external(d, 10**6)
    (d.parent / f"{d.name}.escape.data").write_bytes((d / "model.onnx.data").read_bytes())
    (d / "model.onnx.data").unlink()
    model = onnx.load(d / "model.onnx", load_external_data=False)
    for entry in model.graph.initializer[0].external_data:
        if entry.key == "location":
            entry.value = f"../{d.name}.escape.data"
    _save(model, d / "model.onnx")
    return ["--onnx_path", str(d / "model.onnx")]


def _with_model(model: onnx.ModelProto, *extra: str) -> Callable[[Path], list[str]]:
    def build(d: Path) -> list[str]:
        _save(model, d / "model.onnx")
        return ["--onnx_path", str(d / "model.onnx"), *extra]

    return build


def _good_with(*extra: str) -> Callable[[Path], list[str]]:
    return _with_model(_good(), *extra)


def _calibration(write: Callable[[Path], Path]) -> Callable[[Path], list[str]]:
    def build(d: Path) -> list[str]:
        _save(_good(), d / "model.onnx")
        return ["--onnx_path", str(d / "model.onnx"), "--calibration_data", str(write(d))]

    return build


def _npz(**arrays: np.ndarray) -> Callable[[Path], Path]:
    def write(d: Path) -> Path:
        np.savez(d / "inputs.npz", **arrays)  # type: ignore[arg-type]
        return d / "inputs.npz"

    return write


def _kv_model_with(**arrays: np.ndarray) -> Callable[[Path], list[str]]:
    """A tiny decoder with a KV cache (GroupQueryAttention, 8 rotary positions) and an .npz of ``arrays``."""

    def build(d: Path) -> list[str]:
        _save(tiny_decoder("gqa", max_positions=8), d / "model.onnx")
        np.savez(d / "inputs.npz", **arrays)  # type: ignore[arg-type]
        return ["--onnx_path", str(d / "model.onnx"), "--calibration_data", str(d / "inputs.npz")]

    return build


def _text(name: str, text: str) -> Callable[[Path], Path]:
    def write(d: Path) -> Path:
        (d / name).write_text(text)
        return d / name

    return write


def _empty_folder(d: Path) -> Path:
    (d / "batches").mkdir()
    return d / "batches"


def _read_only_output(d: Path) -> list[str]:
    _save(_good(), d / "model.onnx")
    (d / "ro").mkdir()
    (d / "ro").chmod(0o555)
    return ["--onnx_path", str(d / "model.onnx"), "--output_path", str(d / "ro" / "out.onnx")]


def _corrupt_genai_config(d: Path) -> list[str]:
    (d / "genai_config.json").write_text("{not json")
    (d / "out").mkdir()
    return _good_with()(d)


def _cyclic() -> onnx.ModelProto:
    nodes = [
        helper.make_node("Add", ["X", "b"], ["a"], name="add"),
        helper.make_node("Relu", ["a"], ["b"], name="relu"),
        helper.make_node("Identity", ["a"], ["Y"], name="out"),
    ]
    return _graph(nodes)


def _duplicate_outputs() -> onnx.ModelProto:
    nodes = [
        helper.make_node("Relu", ["X"], ["a"], name="relu"),
        helper.make_node("Neg", ["X"], ["a"], name="neg"),
        helper.make_node("Identity", ["a"], ["Y"], name="out"),
    ]
    return _graph(nodes)


def _subgraph_missing_data(d: Path) -> list[str]:
    then = helper.make_graph(
        [helper.make_node("Add", ["X", "K"], ["t"], name="add")],
        "then",
        [],
        [tensor_info("t", F, [2, 4])],
        [numpy_helper.from_array(np.ones((2, 4), np.float32), "K")],
    )
    other = helper.make_graph(
        [helper.make_node("Neg", ["X"], ["e"], name="neg")], "else", [], [tensor_info("e", F, [2, 4])]
    )
    model = _graph(
        [helper.make_node("If", ["C"], ["Y"], then_branch=then, else_branch=other, name="if")],
        [tensor_info("X", F, [2, 4]), tensor_info("C", TensorProto.BOOL, [])],
    )
    onnx.save(model, d / "model.onnx", save_as_external_data=True, location="w.bin", size_threshold=0)
    (d / "w.bin").unlink()
    return ["--onnx_path", str(d / "model.onnx")]


@dataclass
class Case:
    """A bad input, the exact error line (a regular expression where ORT's own words vary: ``re:...``)."""

    build: Callable[[Path], list[str]]
    message: str
    output: str = "out.onnx"  # relative to the folder; None-like "" when the default path is meant
    extra: list[str] = field(default_factory=list)
    as_user: bool = False  # root ignores permissions: run as an unprivileged user
    tool: str = "onnxprec.autocast"  # the module run with ``python -m``


NO_FP32 = "The model has no floating-point tensors to convert: AutoCast changes float precision only."
CASES: dict[str, Case] = {
    # --- the model file
    "missing file": Case(
        lambda d: ["--onnx_path", str(d / "nope.onnx")],
        "Model file '{dir}/nope.onnx' does not exist: check the path (--onnx_path).",
    ),
    "directory": Case(
        lambda d: (d / "dir.onnx").mkdir() or ["--onnx_path", str(d / "dir.onnx")],
        "'{dir}/dir.onnx' is a directory, not an ONNX file: pass the path of a .onnx file.",
    ),
    "empty file": Case(
        lambda d: _model_file(d, b""),
        "'{dir}/model.onnx' is not an ONNX model (no IR version, graph or opset import): "
        "pass a model saved by onnx.save or an exporter.",
    ),
    "text file": Case(
        lambda d: _model_file(d, b"not a model at all"),
        "re:'{dir}/model.onnx' is not a readable ONNX model \\(it may be truncated or corrupt: .*\\); "
        "re-export or re-download it\\.",
    ),
    "wrong magic (PNG)": Case(
        lambda d: _model_file(d, b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4),
        "re:'{dir}/model.onnx' is not a readable ONNX model \\(it may be truncated or corrupt: .*\\); "
        "re-export or re-download it\\.",
    ),
    "wrong magic (zip)": Case(
        lambda d: _model_file(d, b"PK\x03\x04" + b"\x00" * 200),
        "re:'{dir}/model.onnx' is not (a readable ONNX model \\(.*\\); re-export or re-download it|an ONNX model "
        "\\(no IR version, graph or opset import\\): pass a model saved by onnx.save or an exporter)\\.",
    ),
    "truncated file": Case(
        lambda d: _model_file(d, _good().SerializeToString()[:60]),
        "re:'{dir}/model.onnx' is not a readable ONNX model \\(it may be truncated or corrupt: .*\\); "
        "re-export or re-download it\\.",
    ),
    "truncated inside a weight": Case(
        lambda d: _model_file(d, _good().SerializeToString()[:-40]),
        "re:'{dir}/model.onnx' is not a readable ONNX model \\(it may be truncated or corrupt: .*\\); "
        "re-export or re-download it\\.",
    ),
    "a tensor, not a model": Case(
        lambda d: _model_file(d, numpy_helper.from_array(np.ones(3, np.float32), "t").SerializeToString()),
        "re:'{dir}/model.onnx' is not (a readable ONNX model \\(.*\\); re-export or re-download it|an ONNX model "
        "\\(no IR version, graph or opset import\\): pass a model saved by onnx.save or an exporter)\\.",
    ),
    "empty graph": Case(
        _with_model(_graph([], outputs=[tensor_info("X", F, [2, 4])])),
        "'{dir}/model.onnx' has an empty graph: there is nothing to convert.",
    ),
    "missing external data": Case(
        lambda d: _external(d, None),
        "External data file 'model.onnx.data' (needed by tensor 'W') is missing next to '{dir}/model.onnx': "
        "copy it into '{dir}' beside the model.",
    ),
    "short external data": Case(
        lambda d: _external(d, 10),
        "External data file '{dir}/model.onnx.data' is truncated: tensor 'W' needs 64 bytes, the file has 10; "
        "copy the complete file again.",
    ),
    "missing external data of a subgraph": Case(
        _subgraph_missing_data,
        "External data file 'w.bin' (needed by tensor 'K') is missing next to '{dir}/model.onnx': "
        "copy it into '{dir}' beside the model.",
    ),
    "external data outside the model folder": Case(
        _escaping_external,
        "re:External data file '\\.\\./\\w+\\.escape\\.data' \\(needed by tensor 'W'\\) is outside the model's folder "
        "'{dir}': move it beside the model and fix its location\\.",
    ),
    # --- the graph
    "cyclic graph": Case(
        _with_model(_cyclic()),
        "The graph is not a valid ONNX graph (node 'add' reads 'b', which depends on the node's own output (a "
        "cycle)): fix the model (onnx.checker.check_model names the problem).",
    ),
    "dangling input": Case(
        _with_model(_graph([helper.make_node("Add", ["X", "ghost"], ["Y"], name="add")])),
        "The graph is not a valid ONNX graph (node 'add' reads 'ghost', which no node, input or initializer "
        "makes): fix the model (onnx.checker.check_model names the problem).",
    ),
    "duplicate output names": Case(
        _with_model(_duplicate_outputs()),
        "The graph is not a valid ONNX graph (value 'a' is made twice, by node 'relu' and by node 'neg'): fix the "
        "model (onnx.checker.check_model names the problem).",
    ),
    "duplicate input names": Case(
        _with_model(
            _graph(
                [helper.make_node("Add", ["X", "X"], ["Y"], name="add")],
                [tensor_info("X", F, [2, 4]), tensor_info("X", F, [2, 4])],
            )
        ),
        "The graph is not a valid ONNX graph (graph input 'X' is declared twice): fix the model "
        "(onnx.checker.check_model names the problem).",
    ),
    "unknown op in the default domain": Case(
        _with_model(_graph([helper.make_node("Frobnicate", ["X"], ["Y"], name="frob")])),
        "Node 'frob' is 'Frobnicate', which is no ONNX op at opset 17: fix the model, or give the op its "
        "custom domain.",
    ),
    "custom domain without an import": Case(
        _with_model(_graph([helper.make_node("Fused", ["X"], ["Y"], domain="my.ops", name="fused")])),
        "Node 'fused' uses domain 'my.ops', which the model does not import: add it to the model's opset_import.",
    ),
    "opset from the future": Case(
        _with_model(_graph([helper.make_node("Relu", ["X"], ["Y"], name="relu")], opset=99)),
        "re:The model imports opset 99 of the default domain; this onnx knows up to \\d+: upgrade onnx and "
        "onnxruntime, or export the model at an older opset\\.",
    ),
    "no IR version": Case(
        _with_model(_graph([helper.make_node("Relu", ["X"], ["Y"], name="relu")], ir_version=0)),
        "'{dir}/model.onnx' is not an ONNX model (no IR version, graph or opset import): "
        "pass a model saved by onnx.save or an exporter.",
    ),
    "input without a type": Case(
        _with_model(
            _graph([helper.make_node("Relu", ["X"], ["Y"], name="relu")], [helper.make_empty_tensor_value_info("X")])
        ),
        "Graph input 'X' has no element type; fix the model's inputs.",
    ),
    "integers only": Case(
        _with_model(
            _graph(
                [helper.make_node("Add", ["X", "X"], ["Y"], name="add")],
                [tensor_info("X", I64, [2, 4])],
                [tensor_info("Y", I64, [2, 4])],
            )
        ),
        NO_FP32,
    ),
    "huge static dims": Case(
        _with_model(
            _graph(
                [helper.make_node("Relu", ["X"], ["Y"], name="relu")],
                [tensor_info("X", F, [100000, 100000, 1000])],
                [tensor_info("Y", F, [100000, 100000, 1000])],
            )
        ),
        "Random data for input 'X' (float32 [100000x100000x1000]) would take 40000.0 GB: pass real inputs "
        "with --calibration_data, or skip the reference run with --data_max inf.",
    ),
    "huge dims from --input_shapes": Case(
        _with_model(
            _graph(
                [helper.make_node("Relu", ["X"], ["Y"], name="relu")],
                [tensor_info("X", F, ["a", "b"])],
                [tensor_info("Y", F, ["a", "b"])],
            ),
            "--input_shapes",
            "X:1000000x1000000",
        ),
        "Random data for input 'X' (float32 [1000000x1000000]) would take 4000.0 GB: pass real inputs with "
        "--calibration_data, or skip the reference run with --data_max inf.",
    ),
    "shape mismatch in the graph": Case(
        _with_model(
            make_model(
                [helper.make_node("MatMul", ["X", "W"], ["Y"], name="mm")],
                [tensor_info("X", F, [2, 4])],
                [tensor_info("Y", F, [2, 4])],
                {"W": np.ones((3, 4), np.float32)},
            )
        ),
        "re:ONNX Runtime cannot load the model for the reference run: .*Incompatible dimensions for matrix "
        "multiplication; the model is not valid: fix it \\(onnx.checker.check_model\\(model, full_check=True\\) names "
        "the problem\\)\\.",
    ),
    # --- calibration data
    "calibration: missing file": Case(
        lambda d: _good_with("--calibration_data", str(d / "none.npz"))(d),
        "Calibration data '{dir}/none.npz' does not exist: check --calibration_data.",
    ),
    "calibration: wrong input names": Case(
        _calibration(_npz(wrong=np.ones((1, 4), np.float32))),
        "Calibration input names do not match the model's inputs (batch 0): missing ['X'], unexpected ['wrong']; "
        "the model expects ['X: float32 [batchx4]'].",
    ),
    "calibration: wrong dtype": Case(
        _calibration(_npz(X=np.ones((1, 4), np.float64))),
        "Calibration input 'X' has dtype float64, the model expects float32 (batch 0): convert it with "
        ".astype(np.float32).",
    ),
    "calibration: wrong rank": Case(
        _calibration(_npz(X=np.ones((1, 4, 1), np.float32))),
        "Calibration input 'X' has rank 3 (shape [1, 4, 1]), the model expects X: float32 [batchx4] (batch 0).",
    ),
    "calibration: wrong static size": Case(
        _calibration(_npz(X=np.ones((1, 5), np.float32))),
        "Calibration input 'X' has size 5 on axis 1, the model expects X: float32 [batchx4] (batch 0).",
    ),
    "calibration: corrupt npz": Case(
        _calibration(lambda d: (d / "bad.npz").write_bytes(b"PK\x03\x04junk") and d / "bad.npz"),
        "re:Invalid input file '{dir}/bad.npz': not a readable .npz \\(\\w+\\); write it with numpy.savez\\.",
    ),
    "calibration: empty folder": Case(
        _calibration(_empty_folder),
        "No NPZ files found in folder '{dir}/batches': put one .npz per batch there.",
    ),
    "calibration: text file": Case(
        _calibration(_text("inputs.txt", "1 2 3")),
        "Unsupported calibration file 'inputs.txt': supported input types are .npz, a folder of .npz, Polygraphy "
        ".json, an .npy for a model with one input, and for a causal LM (an input_ids input) an .npy of token "
        "windows.",
    ),
    "calibration: invalid JSON": Case(
        _calibration(_text("inputs.json", "{not json")),
        "Invalid input file '{dir}/inputs.json': not a Polygraphy JSON input file (JSONDecodeError); write it "
        "with `polygraphy run --save-inputs` or polygraphy.json.save_json.",
    ),
    "calibration: JSON of the wrong shape": Case(
        _calibration(_text("inputs.json", json.dumps([1, 2, 3]))),
        "Invalid input file '{dir}/inputs.json': expected a list of {input name: array} objects.",
    ),
    "calibration: pickled objects": Case(
        _calibration(_npz(X=np.array([{"a": 1}], dtype=object))),
        "Invalid input file '{dir}/inputs.npz': not a readable .npz (ValueError); write it with numpy.savez.",
    ),
    "calibration: token ids longer than the context": Case(
        _kv_model_with(input_ids=np.zeros((2, 9), np.int64)),
        "Windows of 9 tokens are longer than the model's context of 8 tokens (the rows of GroupQueryAttention's cos "
        "cache 'cos_cache'): cut the token ids into windows of at most 8 tokens.",
    ),
    "calibration: a KV model's feeds missing a past input": Case(
        _kv_model_with(
            input_ids=np.zeros((1, 4), np.int64),
            attention_mask=np.ones((1, 4), np.int64),
            **{
                f"past_key_values.{i}.{kind}": np.zeros((1, 1, 0, 16), np.float32)
                for i, kind in ((0, "key"), (0, "value"), (1, "key"))
            },
        ),
        "The data gives 3 of the model's 4 past key/value inputs and lacks past_key_values.1.value: give every past "
        "input, or none (then they are built from input_ids).",
    ),
    # --- the output
    "output equals input": Case(
        _good_with(),
        "--output_path '{dir}/model.onnx' would overwrite the input '{dir}/model.onnx': choose another path.",
        output="model.onnx",
    ),
    "output over the input's external data": Case(
        lambda d: _external(d, 10**6),
        "--output_path '{dir}/model.onnx.data' would overwrite the input '{dir}/model.onnx.data': choose another path.",
        output="model.onnx.data",
    ),
    "output folder missing": Case(
        _good_with(),
        "Folder '{dir}/no/such' of --output_path does not exist: create it or choose another path.",
        output="no/such/out.onnx",
    ),
    "output is a directory": Case(
        lambda d: (d / "outdir").mkdir() or _good_with()(d),
        "--output_path '{dir}/outdir' is a folder: give the path of the file to write.",
        output="outdir",
    ),
    "read-only output folder": Case(
        _read_only_output,
        "Folder '{dir}/ro' of --output_path is not writable: choose another path or fix its permissions.",
        output="",
        as_user=True,
    ),
    # --- onnxruntime-genai folders
    "genai: generation on a folder without genai_config.json": Case(
        lambda d: [*_good_with()(d)[1:], "--generate", "--report_json", str(d / "eval.json")],
        "'{dir}' has no genai_config.json: onnxruntime-genai loads the folder its model builder wrote "
        "(genai_config.json, the model and its tokenizer); pass a model in such a folder.",
        output="",
        tool="onnxprec.evaluate",
    ),
    "genai: text prompts for a folder without a tokenizer": Case(
        lambda d: [
            str(make_genai_folder(d, tokenizer=False)),
            "--generate",
            "--prompts",
            "Hello",
            "--report_json",
            str(d / "eval.json"),
        ],
        "'{dir}' has no tokenizer files (tokenizer.json or tokenizer.model), so text prompts cannot be encoded: "
        "copy the tokenizer files beside genai_config.json, or give token ids with --data ids.npy.",
        output="",
        tool="onnxprec.evaluate",
    ),
    "genai: a corrupt genai_config.json beside the model": Case(
        _corrupt_genai_config,
        "re:'{dir}/genai_config.json' is not readable JSON \\(JSONDecodeError: .*\\): fix it or regenerate the "
        "folder with onnxruntime_genai.models.builder\\.",
        output="out/model.onnx",
    ),
    # --- flags
    "invalid regex": Case(
        _good_with("--nodes_to_exclude", "(unclosed"),
        "Invalid regular expression '(unclosed' in nodes_to_exclude: missing ), unterminated subpattern at position 0.",
    ),
    "unknown op type": Case(
        _good_with("--op_types_to_exclude", "Cnov"),
        "Unknown op type 'Cnov' in op_types_to_exclude: it is neither an ONNX op nor in the model. "
        "Did you mean 'Conv'?",
    ),
    "negative data_max": Case(_good_with("--data_max", "-1"), "data_max must be a positive number or inf, got -1.0."),
    "NaN init_max": Case(_good_with("--init_max", "nan"), "init_max must be a positive number or inf, got nan."),
    "opset out of range": Case(
        _good_with("--opset", "999"), "re:opset 999 is out of range: this onnx supports up to \\d+\\."
    ),
    "bad --input_shapes": Case(
        _good_with("--input_shapes", "X=1x4"),
        "Invalid --input_shapes entry 'X=1x4': write name:DIMxDIM..., e.g. input:1x3x224x224.",
    ),
    "--input_shapes of an unknown input": Case(
        _good_with("--input_shapes", "ids:1x4"),
        "--input_shapes names unknown inputs ['ids']; the model's inputs are ['X'].",
    ),
    "--input_shapes of the wrong rank": Case(
        _good_with("--input_shapes", "X:1x4x4"),
        "--input_shapes gives X rank 3, the model expects X: float32 [batchx4].",
    ),
    "unknown provider": Case(
        _good_with("--providers", "tpu"),
        "Unknown provider 'tpu': use cpu, cuda[:N], trt[:N] or dml[:N] (e.g. --providers cuda:0 cpu).",
    ),
    "missing TensorRT plugin": Case(
        lambda d: _good_with("--trt_plugins", str(d / "libnope.so"))(d),
        "TensorRT plugin library '{dir}/libnope.so' does not exist: check --trt_plugins.",
    ),
    "bad plugin precision": Case(
        _good_with("--trt_plugins_precision", "Op:int3"),
        "Invalid --trt_plugins_precision 'Op:int3': write op:fp16, op:fp32 or op:[fp16,fp32]:[fp16].",
    ),
    "report into a missing folder": Case(
        lambda d: _good_with("--report_json", str(d / "no" / "r.json"))(d),
        "Folder '{dir}/no' of --report_json does not exist: create it or choose another path.",
    ),
    "report over the input": Case(
        lambda d: _good_with("--report_json", str(d / "model.onnx"))(d),
        "--report_json '{dir}/model.onnx' would overwrite the input '{dir}/model.onnx': choose another path.",
    ),
    # --- issue 24: a model the chosen provider cannot load is never written with success
    "BF16 with only the CPU provider": Case(
        _good_with("-t", "bf16"),
        "BF16 with only the CPU provider: ONNX Runtime has no CPU BF16 kernel for 2 of the 2 nodes (MatMul x1, "
        "Relu x1), so it could not load the result: pass --providers cuda (the GPU the model is meant for), "
        "--keep_unsupported_fp32 to keep those nodes in FP32 (0/2 would be converted), or --no_validate to write it "
        "unchecked for another runtime.",
    ),
}


def _cnn_named(prefix: str) -> onnx.ModelProto:
    """A Transpose (NHWC input) before a Conv, a Relu and a Gemm head, their names under ``prefix``."""
    rng = np.random.default_rng(0)
    inits = {
        "w": (rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32),
        "wfc": (rng.standard_normal((10, 8 * 6 * 6)) * 0.1).astype(np.float32),
        "shape": np.array([0, -1], np.int64),
    }
    nodes = [
        helper.make_node("Transpose", ["x"], ["t"], name=f"{prefix}/Transpose_2", perm=[0, 3, 1, 2]),
        helper.make_node("Conv", ["t", "w"], ["c"], name=f"{prefix}/Conv_5", kernel_shape=[3, 3]),
        helper.make_node("Relu", ["c"], ["r"], name=f"{prefix}/Relu"),
        helper.make_node("Reshape", ["r", "shape"], ["f"], name=f"{prefix}/Reshape"),
        helper.make_node("Gemm", ["f", "wfc"], ["logits"], name=f"{prefix}/fc/Gemm", transB=1),
    ]
    return make_model(nodes, [tensor_info("x", F, [2, 8, 8, 3])], [tensor_info("logits", F, [2, 10])], inits)


INT8 = "onnxprec.quantization.int8"
INT4 = "onnxprec.quantization.int4"
# Accepted input that used to be silent (issue 24): exit 0 and this exact line on stderr (a WARNING) or, for ``stdout``
# cases, the summary line on stdout.
WARNINGS: dict[str, Case] = {
    "autocast: a name pattern that matches nothing": Case(
        _with_model(_cnn_named("/layer1"), "-ne", "NoSuchNode"),
        "nodes_to_exclude pattern 'NoSuchNode' matches no node; closest: '/layer1/Relu', '/layer1/Conv_5', "
        "'/layer1/fc/Gemm'.",
    ),
    "autocast: a pattern that matches inside a name only": Case(
        _with_model(_cnn_named("/layer1"), "-ne", "Conv_5"),
        "nodes_to_exclude pattern 'Conv_5' matches no node (names match from their start: re.match, as ModelOpt); "
        "anywhere in a name (re.search, INT4 and INT8's rule before) it would match '/layer1/Conv_5': write "
        "'.*Conv_5'.",
    ),
    "autocast: an op type the model lacks": Case(
        _with_model(_cnn_named("/layer1"), "-ope", "LSTM"),
        "op_types_to_exclude op type 'LSTM' matches no node of the model; closest: 'Transpose', 'Reshape', 'Relu'.",
    ),
    "int8: a name pattern that matches nothing": Case(
        _with_model(_cnn_named("/layer1"), "--nodes_to_exclude", "NoSuchNode", "--random_calibration_data"),
        "nodes_to_exclude pattern 'NoSuchNode' matches no layer this tool quantizes (Conv, MatMul, Gemm); closest: "
        "'/layer1/Conv_5', '/layer1/fc/Gemm'.",
        tool=INT8,
    ),
    "int8: compare's old advice names a Transpose before a Conv": Case(
        _with_model(_cnn_named(""), "--nodes_to_exclude", "^/Transpose_2$", "--random_calibration_data"),
        "nodes_to_exclude pattern '^/Transpose_2$' matches no layer this tool quantizes (Conv, MatMul, Gemm); it "
        "matches '/Transpose_2' (Transpose), which this tool does not select; closest: '/Conv_5', '/fc/Gemm'.",
        tool=INT8,
    ),
    "int4: a pattern written for re.search": Case(
        _with_model(_cnn_named("/layer1"), "--nodes_to_exclude", "fc/Gemm", "--calibration_method", "rtn"),
        "nodes_to_exclude pattern 'fc/Gemm' matches no layer this tool quantizes (MatMul, Gemm, Gather) (names match "
        "from their start: re.match, as ModelOpt); anywhere in a name (re.search, INT4 and INT8's rule before) it "
        "would match '/layer1/fc/Gemm': write '.*fc/Gemm'.",
        tool=INT4,
    ),
    "BF16 on the CPU, unsupported nodes kept in FP32": Case(
        _good_with("-t", "bf16", "--keep_unsupported_fp32"),
        "stdout:Converted 0/2 nodes (0.0%) to bf16; 2 casts inserted; 2 kept in FP32 without a bf16 kernel; no "
        "calibration data: checked on random data (first run): float outputs rel L2 <= 0, cosine >= 1 (synthetic "
        "inputs: the distance from FP32 on them; it cannot judge the task on real data); saved {dir}/out.onnx",
    ),
}


@dataclass
class Outcome:
    returncode: int
    stdout: str
    stderr: str
    folder: Path
    output: Path | None
    before: dict[str, str]
    after: dict[str, str]


def _digest(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` with its content hash (directories as such)."""
    found = {}
    for path in sorted(folder.rglob("*")):
        rel = str(path.relative_to(folder))
        found[rel] = "<dir>" if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest()
    return found


@functools.cache
def _unprivileged() -> list[str] | None:
    """A command prefix that drops root (whose writes ignore permissions), or None if it is not possible: no
    ``setpriv``, or the unprivileged user cannot import onnxprec (a checkout inside a private folder, such as one
    made by ``mktemp -d``)."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if not setpriv:
        return None
    prefix = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"]
    probe = subprocess.run([*prefix, sys.executable, "-c", "import onnxprec"], capture_output=True, cwd="/")
    return prefix if probe.returncode == 0 else None


def _run(name: str, case: Case, root: Path) -> Outcome:
    folder = root / re.sub(r"\W+", "_", name).strip("_")
    folder.mkdir()
    try:
        args = case.build(folder)
    except Exception as e:  # a broken builder fails its own case, not the corpus
        return Outcome(-1, "", f"builder failed: {type(e).__name__}: {e}", folder, None, {}, {})
    output = folder / case.output if case.output else None
    if output is not None:
        args += ["--output_path", str(output)]
    prefix: list[str] = []
    if case.as_user:
        prefix = _unprivileged() or []
        for path in [folder, *folder.rglob("*")]:
            path.chmod(path.stat().st_mode | 0o444 | (0o111 if path.is_dir() else 0))
    before = _digest(folder)
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", HOME=str(root))  # HOME: ONNX Runtime's telemetry id
    if prefix:  # as another user: a new interpreter under setpriv
        result = subprocess.run(
            [*prefix, sys.executable, "-m", case.tool, *args],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=folder,
            env=env,
        )
    else:  # a process of its own, forked from one that has imported the tools (no interpreter start per case)
        result = run_forked(case.tool, args, cwd=folder, env=env)
    after = _digest(folder)
    return Outcome(result.returncode, result.stdout, result.stderr, folder, output, before, after)


@pytest.fixture(scope="module")
def outcomes() -> dict[str, Outcome]:
    root = Path(tempfile.mkdtemp(prefix="onnxprec-bad-inputs-"))
    root.chmod(0o755)  # an unprivileged run must reach its folder
    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(16, 2 * (os.cpu_count() or 2))) as pool:
            futures = {name: pool.submit(_run, name, case, root) for name, case in CASES.items()}
            yield {name: future.result() for name, future in futures.items()}  # type: ignore[misc]
    finally:
        for path in root.rglob("*"):
            if path.is_dir():
                path.chmod(0o755)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def warned() -> dict[str, Outcome]:
    root = Path(tempfile.mkdtemp(prefix="onnxprec-warned-inputs-"))
    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(8, 2 * (os.cpu_count() or 2))) as pool:
            futures = {name: pool.submit(_run, name, case, root) for name, case in WARNINGS.items()}
            yield {name: future.result() for name, future in futures.items()}  # type: ignore[misc]
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("name", list(WARNINGS))
def test_accepted_input_that_selects_nothing_is_warned_about_in_one_line(name: str, warned: dict[str, Outcome]) -> None:
    case, outcome = WARNINGS[name], warned[name]
    assert "Traceback" not in outcome.stderr and outcome.returncode == 0, outcome.stderr
    expected = case.message.replace("{dir}", str(outcome.folder))
    if expected.startswith("stdout:"):
        assert outcome.stdout.strip() == expected[len("stdout:") :]
    else:
        assert f"[onnxprec] WARNING: {expected}" in outcome.stderr.splitlines(), outcome.stderr
    assert outcome.output is not None and outcome.output.is_file()


def test_the_corpus_is_large_enough() -> None:
    assert len(CASES) >= 40


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_gives_one_exact_line(name: str, outcomes: dict[str, Outcome]) -> None:
    case, outcome = CASES[name], outcomes[name]
    if case.as_user and _unprivileged() is None:
        pytest.skip("root without setpriv, or a checkout other users cannot read: permissions cannot be tested")
    assert "Traceback" not in outcome.stderr + outcome.stdout, outcome.stderr
    assert outcome.returncode == 2, outcome.stderr
    # progress lines at the default INFO level may come first; nothing else may
    lines = [line for line in outcome.stderr.splitlines() if line.strip() and not line.startswith("[onnxprec] INFO:")]
    assert len(lines) == 1, outcome.stderr
    expected = case.message.replace("{dir}", str(outcome.folder))
    if expected.startswith("re:"):
        assert re.fullmatch(
            "error: " + expected[3:].replace(str(outcome.folder), re.escape(str(outcome.folder))), lines[0]
        ), lines[0]
    else:
        assert lines[0] == f"error: {expected}"
    assert outcome.stdout == ""
    assert outcome.before == outcome.after, "the input folder changed (a partial output or a modified input)"
    if outcome.output is not None and str(outcome.output.relative_to(outcome.folder)) not in outcome.before:
        assert not outcome.output.is_file()  # no partial output (an existing input it named is checked above)
