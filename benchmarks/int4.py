"""The INT4 part: onnxprec's weight-only methods against ModelOpt's, ONNX Runtime's and onnxruntime-genai's builder.

    python -m benchmarks int4 [--plan smollm2|synthetic|genai|all] [--tools ID,...] [--repeats 1] [--tag T]

The tool table is :data:`TOOLS` (one :class:`Int4Tool` a row), the models and their tools :data:`PLANS`; every
run goes through the harness's process runner and results schema (:mod:`benchmarks.harness`). On SmolLM2 the
zoo's windows 0-7 calibrate every calibrated tool and 8-15 score perplexity (FP32 in the same run); each result
gets its quantized layers' storage against the ideal (:func:`ideal_bytes`), CPU latency through
:func:`onnxprec.evaluate.evaluate_models`, and on the builder's model (``--plan genai``) onnxruntime-genai decode
speed (:func:`onnxprec.evaluate.generate_models`). The method as BENCHMARKS.md states it is ``report_text.md``'s
``int4.*`` blocks; the results (``int4-<date>-<tag>.json``) render through :mod:`benchmarks.report_int4`.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto

import onnxprec
import zoo

from .harness import RunConfig, ensure_anchors, measure, median, new_results, results_path, write_results
from .output_metrics import latencies, session
from .tools import RUNNER, parse_tools

logger = logging.getLogger(__name__)

MIB = 1 << 20
SCHEMA = 1
KIND = "int4"
LLM = "smollm2_135m"
SYNTHETIC = "matmul_4gb"
CALIBRATION_WINDOWS = range(0, 8)
EVALUATION_WINDOWS = range(8, 16)
GENAI = "smollm2_genai"  # the builder's FP32 SmolLM2 (<zoo>/genai/smollm2_fp32), from the same token windows as LLM
GENAI_FP16 = "smollm2_genai_fp16"  # the builder's FP16 SmolLM2 (<zoo>/genai/smollm2_fp16), the same windows
GENAI_BUILDS = {GENAI: "smollm2_fp32", GENAI_FP16: "smollm2_fp16"}
GENAI_FILES = ("genai_config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
# Billion-parameter LLMs (zoo.bigllm): benchmark name -> zoo.bigllm key. Windows 0-7 of their token array are the
# calibration windows (4 code, 4 prose), 8-15 the held-out ones (4 code, 4 prose), so the ranges above apply.
BIGLLM = {"qwen_1.5b": "qwen-1.5b", "qwen_0.5b": "qwen-0.5b"}
BIGLLM_WINDOWS = 4  # windows of each kind (code, prose) for calibration and for held-out perplexity
DECODE_TOKENS = 64
PREFILL_WINDOWS = range(8, 11)  # held-out windows of 256 tokens: the prompts of the prefill measurement
# ModelOpt matches its patterns with re.match from the start of the name, so its default r"/lm_head" misses the
# exporter's "/model/lm_head/MatMul" and quantizes the head (int4.md); every tool here gets a pattern that keeps it.
EXCLUDE = r".*/lm_head"


@dataclass(frozen=True)
class Int4Tool:
    """One quantizer configuration (a row of the table).

    Attributes:
        id: Name on the command line and in the results (``onnxprec:awq_gptq``, ``modelopt:awq_clip``...).
        runner: The ``_runner.py`` tool (``onnxprec_int4``, ``modelopt_int4``, ``ort_int4``, ``genai_builder``;
            ``onnxprec``: AutoCast with its default flags, for the genai plan's time/RSS comparison).
        venv: ``project``, ``anchors`` or ``torch`` (the zoo's torch venv: onnxruntime-genai's builder).
        method: The tool's calibration method name.
        block_size: Weights per scale along K (-1: per output channel).
        zero_point: Asymmetric (UINT4 with zero points).
        output_format: ``qdq`` or ``matmulnbits`` (onnxprec and ORT; ModelOpt writes QDQ).
        calibrated: Gets the calibration windows (else the tool's random data or none).
        latency: Whether its result joins the CPU latency comparison.
        exclude: Regex of the layers kept in float (empty: every layer quantized, as the builder's ``-p int4``).
        budget_mb: onnxprec's ``--size_budget_mb`` (each layer's precision chosen within it).
    """

    id: str
    runner: str
    venv: str
    method: str
    block_size: int = 128
    zero_point: bool = False
    output_format: str = "qdq"
    calibrated: bool = True
    latency: bool = False
    exclude: str = EXCLUDE
    budget_mb: float | None = None

    def user_command(self) -> str:
        """What a user would type (or call) for the same quantization."""
        zp = " --use_zero_point" if self.zero_point else ""
        if self.runner == "prebuilt":
            return f"python -m zoo.bigllm build MODEL --variants {self.method}"
        if self.runner == "onnxprec_int8":
            return "onnxprec quantize int8 --onnx_path M --calibration_data calib/"
        if self.runner == "onnxprec_int4" and self.method == "default":
            data = " --calibration_data calib/" if self.calibrated else ""
            budget = f" --size_budget_mb {self.budget_mb:g}" if self.budget_mb else ""
            return f"onnxprec quantize int4 --onnx_path M{budget}{data}"
        if self.runner == "onnxprec_int4":
            data = " --calibration_data calib/" if self.calibrated else ""
            fmt = f" --output_format {self.output_format}" if self.output_format != "qdq" else ""
            fmt += " --nodes_to_exclude --quantize_embeddings" if not self.exclude and not self.budget_mb else ""
            fmt += f" --size_budget_mb {self.budget_mb:g}" if self.budget_mb else ""
            return (
                f"onnxprec quantize int4 --onnx_path M --calibration_method {self.method} "
                f"--block_size {self.block_size}{zp}{fmt}{data}"
            )
        if self.runner == "genai_builder":
            extra = f" --extra_options algo_config={self.method}" if self.method != "default" else ""
            return f"python -m onnxruntime_genai.models.builder -i smollm2_hf -o OUT -p int4 -e cpu{extra}"
        if self.runner == "onnxprec":
            return "python -m onnxprec.autocast --onnx_path M --output_path OUT --keep_io_types"
        if self.runner == "modelopt_int4":
            reader = "reader" if self.calibrated else "None"
            return (
                f"modelopt.onnx.quantization.int4.quantize(M, calibration_method={self.method!r}, "
                f"calibration_data_reader={reader}, calibration_eps=['cpu'], block_size={self.block_size}"
                f"{', use_zero_point=True' if self.zero_point else ''})"
            )
        if self.method == "hqq":
            return f"MatMulNBitsQuantizer(M, algo_config=HQQWeightOnlyQuantConfig(block_size={self.block_size}))"
        every = self.output_format == "matmulnbits" and not self.exclude
        fmt = "QOperator" if self.output_format == "matmulnbits" else "QDQ"
        ops = ", op_types_to_quantize=('MatMul', 'Gather')" if every else ""
        return (
            f"MatMulNBitsQuantizer(M, algo_config=DefaultWeightOnlyQuantConfig(block_size={self.block_size}, "
            f"is_symmetric={not self.zero_point}, accuracy_level=4, quant_format=QuantFormat.{fmt}{ops}))"
        )


def _ours(method: str, block: int = 128, zp: bool = False, fmt: str = "qdq", lat: bool = False) -> Int4Tool:
    suffix = ("" if block == 128 else f":b{block}" if block > 0 else ":per-channel") + (":zp" if zp else "")
    tool_id = f"onnxprec:{method}{suffix}" + (":matmulnbits" if fmt == "matmulnbits" else "")
    return Int4Tool(tool_id, "onnxprec_int4", "project", method, block, zp, fmt, method != "rtn", lat)


def _budget(method: str, mb: float, data: str = "", fmt: str = "qdq") -> Int4Tool:
    """onnxprec under ``--size_budget_mb mb``, every layer a candidate (``data``: ``:nodata`` or ``:random``, no
    calibration windows)."""
    tool = _ours(method, fmt=fmt)
    kind = tool.id.removeprefix(f"onnxprec:{method}")
    return replace(tool, id=f"onnxprec:{method}:budget{mb:g}{kind}{data}", calibrated=tool.calibrated and not data,
                   budget_mb=mb, exclude="")  # fmt: skip


TOOLS: dict[str, Int4Tool] = {
    t.id: t
    for t in (
        Int4Tool("ort:rtn", "ort_int4", "anchors", "rtn", calibrated=False, latency=True),
        Int4Tool("ort:rtn:zp", "ort_int4", "anchors", "rtn", zero_point=True, calibrated=False),
        Int4Tool("modelopt:rtn_dq", "modelopt_int4", "anchors", "rtn_dq", calibrated=False),
        Int4Tool("modelopt:awq_lite", "modelopt_int4", "anchors", "awq_lite"),
        Int4Tool("modelopt:awq_clip", "modelopt_int4", "anchors", "awq_clip", latency=True),
        _ours("rtn", lat=True),
        _ours("rtn", zp=True),
        _ours("awq_lite"),
        _ours("awq_clip"),
        _ours("gptq"),
        _ours("awq_full"),
        _ours("awq_gptq", lat=True),
        _ours("awq_gptq", zp=True),
        _ours("awq_gptq", fmt="matmulnbits", lat=True),
        _ours("rtn", block=32),
        _ours("awq_gptq", block=32),
        _ours("rtn", block=-1),
        _ours("awq_gptq", block=-1),
        # the synthetic stack: random calibration (no windows)
        Int4Tool("onnxprec:rtn:random", "onnxprec_int4", "project", "rtn", calibrated=False),
        Int4Tool("onnxprec:awq_lite:random", "onnxprec_int4", "project", "awq_lite", calibrated=False),
        _budget("kquant", 800, ":random"),
    )
}
_GENAI_ONLY = (
    _ours("awq_lite", zp=True),
    _ours("rtn", block=32, fmt="matmulnbits"),
    # every layer, lm_head and the tied embedding included: the builder default's format, for the decode target
    replace(_ours("rtn", block=32, fmt="matmulnbits"), id="onnxprec:rtn:b32:matmulnbits:all", exclude=""),
    Int4Tool("builder:default", "genai_builder", "torch", "default", 32, False, "matmulnbits", False),
    Int4Tool("builder:k_quant_mixed", "genai_builder", "torch", "k_quant_mixed", 32, False, "matmulnbits", False),
    Int4Tool("onnxprec:autocast", "onnxprec", "project", "autocast", calibrated=False),
    # the size/perplexity frontier: ORT's RTN (every MatMul and the embedding Gather) and HQQ (every MatMul; its
    # Gather is not supported) in MatMulNBits, zero points (ORT's default), and onnxprec under a size budget
    *(
        Int4Tool(f"ort:{m}:b{b}:matmulnbits:all", "ort_int4", "anchors", m, b, True, "matmulnbits", False, exclude="")
        for m in ("rtn", "hqq")
        for b in (32, 128)
    ),
    *(_budget("awq_gptq", mb) for mb in (80, 86.5, 100, 113.6, 150)),
    # the builder's format (MatMulNBits) at the builder outputs' sizes, for the decode-speed goal
    *(_budget("awq_gptq", mb, fmt="matmulnbits") for mb in (86.5, 113.6)),
    # without data: the default method, the previous one (kquant) and a cheaper calibrated one, on the text the
    # model writes itself
    *(_budget(m, 86.5, ":nodata") for m in ("awq_gptq", "kquant", "awq_lite")),
    *(
        Int4Tool(f"onnxprec:{m}:nodata", "onnxprec_int4", "project", m, calibrated=False)
        for m in ("kquant", "awq_lite")
    ),
    replace(_ours("awq_gptq"), id="onnxprec:awq_gptq:nodata", calibrated=False),
)
_BIGLLM_ONLY = (
    # the zoo's anchors (zoo.bigllm, built once; time and peak RSS from its build.json)
    *(
        Int4Tool(f"{tool}:zoo", "prebuilt", "project", variant, 32, False, "matmulnbits", False, exclude="")
        for tool, variant in (
            ("builder:default", "int4-default"),
            ("builder:k_quant_mixed", "int4-k_quant_mixed"),
            ("builder:k_quant_last", "int4-k_quant_last"),
            ("ort:rtn:b32", "ort-rtn"),
            ("ort:k_quant:b32", "ort-k_quant"),
        )
    ),
    # onnxprec without options: with the calibration windows and without data
    Int4Tool("onnxprec:default", "onnxprec_int4", "project", "default", exclude=""),
    Int4Tool("onnxprec:default:nodata", "onnxprec_int4", "project", "default", calibrated=False, exclude=""),
    # under a size budget equal to the builder's k_quant_mixed output on the 1.5B (its build.json: 2,182.3 MB)
    Int4Tool("onnxprec:default:budget_kqm", "onnxprec_int4", "project", "default", exclude="", budget_mb=2182.3),
    Int4Tool("onnxprec:int8", "onnxprec_int8", "project", "int8", exclude=""),
)
_SMOLLM2_TOOLS = [t for t in TOOLS if not t.endswith(":random")]
TOOLS.update({t.id: t for t in _BIGLLM_ONLY})
TOOLS.update({t.id: t for t in _GENAI_ONLY})
# the genai plan's rows whose time and peak RSS are compared with the same runs on the zoo export
GENAI_COMPARED = ("onnxprec:autocast", "onnxprec:rtn:zp", "onnxprec:awq_lite:zp")
PLANS: dict[str, dict[str, list[str]]] = {
    "smollm2": {LLM: _SMOLLM2_TOOLS},
    "synthetic": {SYNTHETIC: ["onnxprec:rtn:random", "onnxprec:awq_lite:random"]},
}
PLANS["genai"] = {
    GENAI: [
        *GENAI_COMPARED,
        "onnxprec:awq_gptq:zp",
        "onnxprec:rtn:b32:matmulnbits",
        "onnxprec:rtn:b32:matmulnbits:all",
        "builder:default",
        "builder:k_quant_mixed",
        "modelopt:rtn_dq",
        "modelopt:awq_lite",
    ],
    LLM: list(GENAI_COMPARED),
}
PLANS["bigllm"] = {
    model: [
        *(t.id for t in _BIGLLM_ONLY if t.runner == "prebuilt"),
        "onnxprec:default",
        "onnxprec:default:nodata",
    ]
    for model in BIGLLM
}
PLANS["all"] = {**PLANS["smollm2"], **PLANS["synthetic"]}


# ------------------------------------------------------------------------------------------------------------
# data
# ------------------------------------------------------------------------------------------------------------


def write_calibration(ids: np.ndarray, folder: Path, feeds: Sequence[dict[str, np.ndarray]] = ()) -> Path:
    """One ``.npz`` per calibration window, named in window order: ``input_ids [1, S]``, or ``feeds`` (every input
    of the model, one dict a window)."""
    folder.mkdir(parents=True, exist_ok=True)
    for k, i in enumerate(CALIBRATION_WINDOWS):
        arrays: dict[str, Any] = dict(feeds[k]) if feeds else {"input_ids": ids[i : i + 1]}
        np.savez(folder / f"window{i:02d}.npz", **arrays)
    return folder


def window_feeds(src: Path, ids: np.ndarray, windows: range) -> list[dict[str, np.ndarray]]:
    """Every input of the model for each window (mask and empty KV cache completed by onnxprec's calibration
    layer; just ``input_ids`` for a model without them)."""
    from onnxprec.llm_inputs import llm_feeds

    return llm_feeds(src, ids[windows.start : windows.stop], seq_len=ids.shape[1])


def opset21(src: Path, work: Path) -> Path:
    """The model at opset 21 (the ONNX version converter, through ``onnxprec preprocess --opset 21`` with its other
    steps skipped), the common input of every tool: ModelOpt's ``int4.quantize`` keeps an opset-17 model's opset and
    writes INT4 ``DequantizeLinear`` that ONNX Runtime rejects, and ORT's QDQ mode raises the opset to 21 without
    converting the nodes (its ``ReduceMean`` keeps the ``axes`` attribute), so neither runs on the zoo's export."""
    import onnx

    from onnxprec.preprocess import quant_pre_process

    m = onnx.load(str(src), load_external_data=False)
    if max(o.version for o in m.opset_import if o.domain in ("", "ai.onnx")) >= 21:
        return src
    dst = work / f"{src.stem}.opset21.onnx"
    quant_pre_process(
        src,
        dst,
        skip_optimization=True,
        skip_onnx_shape=True,
        skip_symbolic_shape=True,
        opset=21,
        save_as_external_data=src.with_name(src.name + ".data").exists(),
        all_tensors_to_one_file=True,
    )
    return dst


def held_out_perplexity(
    path: Path, ids: np.ndarray, feeds: Sequence[dict[str, np.ndarray]] = (), reference: Path | None = None
) -> dict[str, float | None]:
    """``perplexity`` of ``path`` on the held-out windows, one window per ONNX Runtime call (``feeds``: every input of
    each window, else ``input_ids`` alone); with a ``reference`` (the float model), also the mean ``kl`` divergence
    of its next-token distributions from the reference's and the ``top1`` agreement, as ``onnxprec evaluate``."""
    from onnxprec.metrics import ErrorStats, Perplexity

    sess = session(path, str(path.name))
    ref = session(reference, str(reference.name)) if reference is not None else None
    ppl, agree = Perplexity(), ErrorStats(track_top1=True, track_kl=True)
    for k, i in enumerate(EVALUATION_WINDOWS):
        window = feeds[k] if feeds else {"input_ids": ids[i : i + 1]}
        logits = sess.run(window, ["logits"])[0]
        ppl.update(logits, ids[i : i + 1])
        if ref is not None:
            agree.update(ref.run(window, ["logits"])[0], logits)
        del logits
    del sess, ref
    return {"perplexity": float(ppl.value), **({"kl": agree.kl, "top1": agree.top1} if reference else {})}


# ------------------------------------------------------------------------------------------------------------
# storage of the quantized layers
# ------------------------------------------------------------------------------------------------------------

_BITS: dict[int, int] = {
    TensorProto.INT4: 4,
    TensorProto.UINT4: 4,
    TensorProto.INT8: 8,
    TensorProto.UINT8: 8,
    TensorProto.FLOAT16: 16,
    TensorProto.BFLOAT16: 16,
    TensorProto.FLOAT: 32,
}


def _tensor_bytes(t: TensorProto) -> int:
    n = math.prod(t.dims)
    return math.ceil(n * _BITS.get(t.data_type, 32) / 8)


def quantizable_weights(fp32: Path, exclude: str = EXCLUDE) -> list[tuple[int, int]]:
    """``(K, N)`` of every MatMul/Gemm 2-D initializer weight in the FP32 model outside ``exclude``."""
    import re

    m = onnx.load(str(fp32), load_external_data=False)
    inits = {t.name: t for t in m.graph.initializer}
    out = []
    for n in m.graph.node:
        if n.op_type not in ("MatMul", "Gemm") or len(n.input) < 2 or re.search(exclude, n.name):
            continue
        w = inits.get(n.input[1])
        if w is None or len(w.dims) != 2 or n.input[0] in inits:
            continue
        trans_b = any(a.name == "transB" and a.i for a in n.attribute)
        k, nn = (w.dims[1], w.dims[0]) if trans_b else (w.dims[0], w.dims[1])
        out.append((int(k), int(nn)))
    return out


def ideal_bytes(weights: Sequence[tuple[int, int]], block_size: int, zero_point: bool, scale_bits: int = 32) -> int:
    """4 bits a weight, one scale (and one 4-bit zero point) per block of ``block_size`` along K per column."""
    bits = 0
    for k, n in weights:
        blocks = 1 if block_size <= 0 else math.ceil(k / block_size)
        bits += 4 * k * n + blocks * n * (scale_bits + (4 if zero_point else 0))
    return math.ceil(bits / 8)


def quantized_storage(path: Path) -> dict[str, Any]:
    """Bytes of the tensors that hold the quantized layers (DequantizeLinear of 4-bit weights, MatMulNBits),
    read from the graph's tensor metadata (no weight is loaded), and the file's size on disk."""
    m = onnx.load(str(path), load_external_data=False)
    inits = {t.name: t for t in m.graph.initializer}
    layers = 0
    nbytes = 0
    scale_type = None
    for n in m.graph.node:
        if n.op_type == "DequantizeLinear" and n.input[0] in inits:
            if inits[n.input[0]].data_type not in (TensorProto.INT4, TensorProto.UINT4):
                continue
            pieces = list(n.input)
        elif n.op_type == "MatMulNBits":
            pieces = list(n.input[1:4])
        else:
            continue
        layers += 1
        nbytes += sum(_tensor_bytes(inits[p]) for p in pieces if p in inits)
        if len(pieces) > 1 and pieces[1] in inits:
            scale_type = inits[pieces[1]].data_type
    files = [path, *{path.parent / t.external_data[0].value for t in inits.values() if t.external_data}]
    return {
        "layers": layers,
        "layer_bytes": nbytes,
        "scale_bits": _BITS.get(scale_type or TensorProto.FLOAT, 32),
        "file_bytes": sum(f.stat().st_size for f in files if f.exists()),
    }


# ------------------------------------------------------------------------------------------------------------
# the run
# ------------------------------------------------------------------------------------------------------------


def _command(tool: Int4Tool, python: Path, src: Path, dst: Path, calib: Path | None, report: Path) -> list[str]:
    cmd = [str(python), str(RUNNER), tool.runner, "--input", str(src), "--output", str(dst)]
    cmd += ["--method", tool.method, "--block-size", str(tool.block_size), "--format", tool.output_format]
    cmd += ["--exclude", *([tool.exclude] if tool.exclude else [])]
    if tool.zero_point:
        cmd.append("--zero-point")
    if tool.calibrated and calib is not None:
        cmd += ["--calib", str(calib)]
    if tool.runner == "onnxprec_int4":
        cmd += ["--report-json", str(report)]
    if tool.budget_mb:
        cmd += ["--size-budget-mb", str(tool.budget_mb)]
    if tool.runner == "onnxprec_int4" and tool.id.endswith(":random"):
        # random weights on random data: the storage and speed rows, not an accuracy the guard could keep
        cmd.append("--no-accuracy-guard")
    return cmd


def _measure(
    tool: Int4Tool, python: Path, src: Path, dst: Path, calib: Path | None, work: Path, config: RunConfig
) -> dict[str, Any]:
    if tool.runner == "prebuilt":
        return _prebuilt(tool, src, dst)
    report = work / f"{tool.id.replace(':', '_')}.report.json"
    cmd = _command(tool, python, src, dst, calib, report)
    rec = measure(cmd, work / f"{tool.id.replace(':', '_')}.log", config.timeout_s, config.mem_limit_mb)
    if rec["status"] == "ok" and report.exists():
        data = json.loads(report.read_text())
        rec["report_seconds"] = data.get("seconds") or data.get("time_s")
    peak = f"{rec['peak_rss_mb']:.0f}" if rec["peak_rss_mb"] else "?"
    logger.info("%s: %s, %.1f s, peak RSS %s MiB %s", tool.id, rec["status"], rec["wall_s"], peak, rec.get("error", ""))
    return rec


def _prebuilt(tool: Int4Tool, src: Path, dst: Path) -> dict[str, Any]:
    """A zoo.bigllm anchor built earlier (beside the FP32 build ``src``): its files linked into ``dst``'s folder, its
    build's wall time and peak RSS (zoo.bigllm's build.json) as the round's record."""
    folder = src.parent.with_name(src.parent.name.removesuffix("-fp32") + f"-{tool.method}")
    if not (folder / "model.onnx").exists():
        return {"status": "missing", "wall_s": 0.0, "peak_rss_mb": None, "error": f"not built: {folder}"}
    for f in folder.iterdir():
        (dst.parent / f.name).symlink_to(f)
    info = json.loads((folder / "build.json").read_text())
    return {"status": "ok", "wall_s": info["wall_s"], "peak_rss_mb": info["peak_rss_mb"], "convert_s": None,
            "command": info["command"]}  # fmt: skip


@dataclass
class _Model:
    """One model of the plan while its tools run round by round."""

    name: str
    src: Path
    tools: list[Int4Tool]
    work: Path
    ids: np.ndarray | None = None
    calib: Path | None = None
    calib_full: Path | None = None
    eval_feeds: list[dict[str, np.ndarray]] | None = None
    weights: list[tuple[int, int]] | None = None


def plan(config: RunConfig) -> dict[str, list[str]]:
    """``config.plan``'s models and tools, only ``config.models`` and ``config.tools`` when given (both given:
    those tools on those models)."""
    parse_tools(config.tools or [], TOOLS)
    if config.models and config.tools:  # an explicit plan: these tools on these models
        return {m: list(config.tools) for m in config.models}
    chosen = {m: [t for t in ts if config.tools is None or t in config.tools] for m, ts in PLANS[config.plan].items()}
    return {m: ts for m, ts in chosen.items() if ts and (not config.models or m in config.models)}


def run(config: RunConfig) -> Path:
    """Runs the plan, every round over every model's tools in turn; writes and returns the results file."""
    todo = plan(config)
    if config.decode_from:
        return decode_only(todo, config, config.decode_from)
    ensure_anchors(config, {TOOLS[t].venv for ts in todo.values() for t in ts})
    torch = zoo.TORCH_VENV / "bin" / "python"
    pythons = {"project": Path(sys.executable), "anchors": config.anchors_python, "torch": torch}
    calibration = f"{LLM}: windows {CALIBRATION_WINDOWS.start}-{CALIBRATION_WINDOWS.stop - 1} of 256 tokens"
    evaluation = f"{LLM}: windows {EVALUATION_WINDOWS.start}-{EVALUATION_WINDOWS.stop - 1} (held out)"
    result = new_results(KIND, config, calibration=calibration, evaluation=evaluation)
    work = Path(tempfile.mkdtemp(prefix="onnxprec-int4-", dir=config.work_dir))
    try:
        models = [_prepare(m, [TOOLS[t] for t in ts], work / m, config) for m, ts in todo.items()]
        rounds: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for r in range(config.repeats):
            for m in models:
                for tool in m.tools:
                    python = pythons[tool.venv]
                    assert python is not None
                    dst = _output(m, tool)
                    shutil.rmtree(dst.parent, ignore_errors=True)
                    dst.parent.mkdir(parents=True)
                    logger.info("[round %d/%d] %s: %s", r + 1, config.repeats, m.name, tool.id)
                    calib = m.calib_full if tool.venv == "anchors" else m.calib
                    src = m.src.parents[1] / "smollm2_hf" if tool.venv == "torch" else m.src
                    rounds.setdefault((m.name, tool.id), []).append(
                        _measure(tool, python, src, dst, calib, m.work, config)
                    )
        for m in models:
            result["models"][m.name] = _finish(m, {t.id: rounds[m.name, t.id] for t in m.tools}, config)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    path = results_path(config, KIND)
    write_results(path, result)
    logger.info("wrote %s", path)
    return path


def _output(m: _Model, tool: Int4Tool) -> Path:
    """Every tool writes ``model.onnx`` in a folder of its own (the genai files go beside it)."""
    return m.work / tool.id.replace(":", "_") / "model.onnx"


def _prepare(model: str, tools: list[Int4Tool], work: Path, config: RunConfig) -> _Model:
    work.mkdir(parents=True)
    if model in BIGLLM:
        return _prepare_bigllm(model, tools, work)
    src = (
        zoo.build_genai([GENAI_BUILDS[model]], config.zoo_dir)[0]
        if model in GENAI_BUILDS
        else zoo.model_path(model, config.zoo_dir)
    )
    if any(t.venv == "anchors" for t in tools):
        src = opset21(src, work)
    m = _Model(model, src, tools, work, weights=quantizable_weights(src))
    if model == LLM or model in GENAI_BUILDS:
        m.ids = zoo.inputs(LLM, config.zoo_dir)["input_ids"]
        m.calib = write_calibration(m.ids, work / "calib")
        m.eval_feeds = window_feeds(src, m.ids, EVALUATION_WINDOWS)
        if any(t.venv == "anchors" and t.calibrated for t in tools):
            m.calib_full = write_calibration(m.ids, work / "calib_full", window_feeds(src, m.ids, CALIBRATION_WINDOWS))
    return m


def bigllm_windows(key: str) -> np.ndarray:
    """A zoo.bigllm model's token windows: :data:`BIGLLM_WINDOWS` each of calibration code and prose (rows 0-7),
    then of held-out code and prose (rows 8-15)."""
    from zoo import bigllm

    with np.load(bigllm.text_path(key)) as z:
        kinds = ("calib_code", "calib_prose", "heldout_code", "heldout_prose")
        return np.concatenate([z[k][:BIGLLM_WINDOWS] for k in kinds])


def _prepare_bigllm(model: str, tools: list[Int4Tool], work: Path) -> _Model:
    from zoo import bigllm

    key = BIGLLM[model]
    src = bigllm.output_dir(key, "fp32") / "model.onnx"
    if not src.exists():
        raise RuntimeError(f"{model}: build it first (python -m zoo.bigllm build {key})")
    m = _Model(model, src, tools, work, weights=quantizable_weights(src, exclude="^$"))
    m.ids = bigllm_windows(key)
    m.calib = write_calibration(m.ids, work / "calib")
    m.eval_feeds = window_feeds(src, m.ids, EVALUATION_WINDOWS)
    return m


def _finish(m: _Model, rounds: dict[str, list[dict[str, Any]]], config: RunConfig) -> dict[str, Any]:
    """The model's rows: medians over the rounds, storage, perplexity, latency (zoo LLM) or genai decode speed."""
    src, ids = m.src, m.ids
    entry: dict[str, Any] = {
        "fp32": {"file_bytes": sum(p.stat().st_size for p in [src, src.with_name(src.name + ".data")] if p.exists())},
        "quantizable_layers": len(m.weights or []),
        "tools": {},
    }
    if ids is not None:
        entry["fp32"]["perplexity"] = held_out_perplexity(src, ids, m.eval_feeds or ())["perplexity"]
        logger.info("%s FP32 held-out perplexity %.4f", m.name, entry["fp32"]["perplexity"])
    outputs: dict[str, Path] = {}
    for tool in m.tools:
        runs = rounds[tool.id]
        ok = [x for x in runs if x["status"] == "ok"]
        rec: dict[str, Any] = {"tool": asdict(tool), "user_command": tool.user_command(), "rounds": runs}
        rec["status"] = runs[-1]["status"]
        rec.update({k: median([x[k] for x in ok]) for k in ("wall_s", "peak_rss_mb", "convert_s")})
        rec.update({"error": runs[-1]["error"]} if "error" in runs[-1] else {})
        if runs[-1]["status"] == "ok":
            outputs[tool.id] = dst = _output(m, tool)
            for f in GENAI_FILES:  # a tool that does not carry the genai files (ModelOpt) gets them for decoding
                if m.name in GENAI_BUILDS and not (dst.parent / f).exists() and (src.parent / f).exists():
                    shutil.copy2(src.parent / f, dst.parent / f)
            storage = quantized_storage(dst)
            rec.update(storage)
            rec["ideal_bytes"] = ideal_bytes(m.weights or [], tool.block_size, tool.zero_point, storage["scale_bits"])
            if ids is not None:
                try:
                    reference = None if m.name in BIGLLM else src  # the FP32 1.5B once per model, not per tool
                    rec.update(held_out_perplexity(dst, ids, m.eval_feeds or (), reference=reference))
                except Exception as e:  # a result ONNX Runtime cannot run is a result too
                    rec["perplexity_error"] = f"{type(e).__name__}: {e}"[:400]
                logger.info("%s: held-out perplexity %s", tool.id, rec.get("perplexity", rec.get("perplexity_error")))
        entry["tools"][tool.id] = rec
    lat_paths = {"fp32": src, **{t.id: outputs[t.id] for t in m.tools if t.latency and t.id in outputs}}
    if m.name == LLM and config.latency and ids is not None and len(lat_paths) > 1:
        feeds = {"prefill": ids[:1], "decode": ids[:1, :1]}  # a 256-token prompt, one token
        entry["latency"] = {k: latencies(lat_paths, {"input_ids": x}, config.latency_runs) for k, x in feeds.items()}
        medians = {k: {m: v.get("median_ms") for m, v in d.items()} for k, d in entry["latency"].items()}
        logger.info("latency: %s", json.dumps(medians))
    if (m.name in GENAI_BUILDS or m.name in BIGLLM) and config.latency:
        quantized = {k: p for k, p in outputs.items() if TOOLS[k].runner != "onnxprec"}
        prompts = ids[PREFILL_WINDOWS.start : PREFILL_WINDOWS.stop] if ids is not None else None
        decode_rounds = config.repeats + 1 if m.name in BIGLLM else max(config.repeats, 5)
        entry["genai_decode"] = genai_decode({"fp32": src, **quantized}, decode_rounds, prompts)
    return entry


def decode_only(todo: dict[str, list[str]], config: RunConfig, folder: Path) -> Path:
    """``--decode-from folder``: no quantization; the planned tools' outputs, made earlier into ``folder/<model>/`` by
    :func:`_output`'s names (the base model as ``fp32/model.onnx``, optional), timed by :func:`genai_decode` on
    ``config.providers`` (a GPU machine that lacks the quantizers' venvs); the entry names its provider, the
    settings the card."""
    import onnxruntime

    from onnxprec.evaluate._generate import import_genai

    smi = ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"]
    gpu = subprocess.run(smi, capture_output=True, text=True).stdout if shutil.which(smi[0]) else ""
    genai = import_genai().__version__
    result = new_results(KIND, config, providers=config.providers, card=gpu.partition("\n")[0] or None, genai=genai)
    # the modules in use (onnxruntime-gpu's build; onnxprec from a source tree)
    result["versions"]["project"].update(onnxruntime=onnxruntime.__version__, onnxprec=onnxprec.__version__)
    prompts = zoo.inputs(LLM, config.zoo_dir)["input_ids"][PREFILL_WINDOWS.start : PREFILL_WINDOWS.stop]
    for model, tools in todo.items():
        paths = {t: _output(_Model(model, Path(), [], folder / model), TOOLS[t]) for t in tools}
        if (base := folder / model / "fp32" / "model.onnx").exists():  # the base model, where it was copied too
            paths = {"fp32": base, **paths}
        speeds = genai_decode(paths, max(config.repeats, 5), prompts, [config.providers])
        result["models"][model] = {"providers": config.providers, "genai_decode": speeds}
    write_results(path := results_path(config, KIND), result)
    return path


def genai_decode(
    paths: dict[str, Path], rounds: int, prompts: np.ndarray | None = None, providers: Sequence[str] | None = None
) -> dict[str, dict[str, Any]]:
    """onnxruntime-genai greedy decode tokens/s on ``providers`` (default the CPU; three short prompts,
    :data:`DECODE_TOKENS` new tokens) and, with ``prompts`` (token ids ``[N, S]``), the prefill time of one
    ``S``-token prompt in ms (the prompt's forward pass and the first new token, averaged over the ``N`` prompts);
    the models alternate round by round; the median and every round."""
    from onnxprec.evaluate import generate_models

    speeds: dict[str, list[float]] = {k: [] for k in paths}
    prefill: dict[str, list[float]] = {k: [] for k in paths}
    errors: dict[str, str] = {}
    for r in range(rounds):
        for key, path in paths.items():
            if key in errors:
                continue
            try:
                res = generate_models([path], providers=providers, max_new_tokens=DECODE_TOKENS).models[0]
                if prompts is not None:
                    pre = generate_models([path], data=prompts, providers=providers, max_new_tokens=1).models[0]
                    prefill[key].append(1000 * pre.prefill_seconds / len(prompts))
            except Exception as e:  # a model onnxruntime-genai cannot load is a result too
                errors[key] = f"{type(e).__name__}: {e}"[:300]
                continue
            speeds[key].append(float(res.decode_tokens_per_s or 0.0))
            logger.info(
                "[decode round %d/%d] %s: %.1f tok/s%s", r + 1, rounds, key, speeds[key][-1],
                f", prefill {prefill[key][-1]:.0f} ms" if prefill[key] else "",
            )  # fmt: skip
    return {
        k: {"decode_tokens_per_s": median(v), "rounds": v}
        | ({"prefill_ms": median(prefill[k]), "prefill_rounds": prefill[k], "prefill_tokens": prompts.shape[1]}
           if prompts is not None and prefill[k] else {})
        if k not in errors
        else {"error": errors[k]}
        for k, v in speeds.items()
    }  # fmt: skip
