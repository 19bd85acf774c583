"""The converters the harness measures, and which of them run on which zoo model by default.

Every tool runs as its own process through ``benchmarks/_runner.py`` (so that its interpreter start-up, imports
and memory count as users experience them): onnxprec in the project's venv (``sys.executable``), the anchors in
the anchors venv (``zoo.anchors_env``). AutoCast tools always get ``--keep_io_types``; the ``:inf``
variants add ``--data_max inf`` (no reference run).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

from zoo import REAL_MODELS, SYNTHETIC

RUNNER = Path(__file__).resolve().parent / "_runner.py"


@dataclass(frozen=True)
class Tool:
    """One converter configuration.

    Attributes:
        id: Name on the command line and in the results (``onnxprec``, ``modelopt:inf``...).
        runner: The ``_runner.py`` tool it runs.
        venv: ``project`` (this interpreter) or ``anchors``.
        label: Short human name for tables.
        user_command: What a user would type for the same conversion (shown in BENCHMARKS.md).
        data_max: ``--data_max`` for the AutoCast tools (None: the tool's default, 512).
        anchor: Tool id this one's time and memory ratios are taken against (None: none).
        evaluate: Whether its output gets accuracy and latency metrics (not for the load/save baseline).
        needs_inputs: Whether it needs the real inputs (occ_amp validates against them).
        max_model_mb: Skip models larger than this (occ_amp is quadratic-ish in model size).
        timeout_s: Its own timeout when shorter than the run's.
        max_repeats: At most this many rounds (occ_amp: minutes per run, and its time is not in question).
        target: onnxprec's ``--target_accuracy`` (with the real inputs as calibration data).
    """

    id: str
    runner: str
    venv: str
    label: str
    user_command: str
    data_max: str | None = None
    anchor: str | None = "modelopt"
    evaluate: bool = True
    needs_inputs: bool = False
    max_model_mb: float | None = None
    timeout_s: float | None = None
    max_repeats: int | None = None
    target: str | None = None


_AUTOCAST = "--onnx_path {src} --output_path {dst} --keep_io_types"
TARGET = "rel_l2<=1e-3"  # the accuracy target of the onnxprec:target runs (AutoCast issue 11)
_OCC = "onnxconverter_common"
# fmt: off
TOOLS: dict[str, Tool] = {t.id: t for t in (
    Tool("onnxprec", "onnxprec", "project", "onnxprec", f"python -m onnxprec.autocast {_AUTOCAST}"),
    Tool("modelopt", "modelopt", "anchors", "ModelOpt", f"python -m modelopt.onnx.autocast {_AUTOCAST}", anchor=None),
    Tool("onnxprec:inf", "onnxprec", "project", "onnxprec data_max=inf",
         f"python -m onnxprec.autocast {_AUTOCAST} --data_max inf", "inf", "modelopt:inf"),
    Tool("modelopt:inf", "modelopt", "anchors", "ModelOpt data_max=inf",
         f"python -m modelopt.onnx.autocast {_AUTOCAST} --data_max inf", "inf", None),
    Tool("onnxprec:data", "onnxprec", "project", "onnxprec, real inputs as calibration data",
         f"python -m onnxprec.autocast {_AUTOCAST} -d inputs.npz", anchor=None, needs_inputs=True),
    Tool("onnxprec:target", "onnxprec", "project", f"onnxprec --target_accuracy {TARGET}",
         f"python -m onnxprec.autocast {_AUTOCAST} -d inputs.npz --target_accuracy '{TARGET}'",
         anchor="onnxprec:data", needs_inputs=True, target=TARGET, timeout_s=3600, max_repeats=1),
    Tool("occ_fp16", "occ_fp16", "anchors", "onnxconverter-common float16",
         f"{_OCC}.float16.convert_float_to_float16(onnx.load(src), keep_io_types=True)"),
    Tool("occ_amp", "occ_amp", "anchors", "onnxconverter-common auto_mixed_precision",
         f"{_OCC}.auto_mixed_precision.auto_convert_mixed_precision(onnx.load(src), real_inputs, rtol=0.01, "
         "atol=0.001, keep_io_types=True)", needs_inputs=True, max_model_mb=200, timeout_s=900, max_repeats=1),
    Tool("ort_fp16", "ort_fp16", "anchors", "onnxruntime transformers float16",
         "onnxruntime.transformers.float16.convert_float_to_float16(onnx.load(src), keep_io_types=True)"),
    Tool("baseline_loadsave", "baseline_loadsave", "project", "onnx.load + onnx.save",
         "onnx.save(onnx.load(src), dst)  # external data stays external", anchor=None, evaluate=False),
)}
# fmt: on

# the tools whose runs the others' time and memory are taken against, round by round (see Tool.anchor)
RATIO_ANCHORS = ("modelopt", "modelopt:inf", "baseline_loadsave", "onnxprec:data")

_CHAIN = re.compile(r"chain_\d+")
_MATMUL = re.compile(r"matmul_[\d.]+gb")

DEFAULT_TOOLS: dict[str, tuple[str, ...]] = {
    "efficientnet_lite0": ("onnxprec", "modelopt", "occ_fp16", "ort_fp16", "occ_amp"),
    "minilm_l6_v2": ("onnxprec", "modelopt", "occ_fp16", "ort_fp16", "occ_amp"),
    "smollm2_135m": ("onnxprec", "modelopt", "onnxprec:inf", "baseline_loadsave", "occ_fp16", "ort_fp16"),
    "chain": ("onnxprec", "modelopt", "onnxprec:inf", "modelopt:inf"),
    "matmul": ("onnxprec:inf", "modelopt:inf", "baseline_loadsave"),
}
# models measured with --heavy-repeats instead of --repeats
HEAVY_MODELS = frozenset({"chain_5000", "matmul_1gb", "matmul_2gb", "matmul_4gb"})
MODEL_GROUPS: dict[str, tuple[str, ...]] = {
    "real": REAL_MODELS,
    "chains": tuple(m for m in SYNTHETIC if _CHAIN.fullmatch(m)),
    "matmul": tuple(m for m in SYNTHETIC if _MATMUL.fullmatch(m)),
    "synthetic": SYNTHETIC,
    "all": REAL_MODELS + SYNTHETIC,
}


def family(model: str) -> str:
    """``real``, ``chain`` or ``matmul``."""
    if _CHAIN.fullmatch(model):
        return "chain"
    if _MATMUL.fullmatch(model):
        return "matmul"
    return "real"


def default_tools(model: str) -> tuple[str, ...]:
    """The tools measured on ``model`` when ``--tools`` is not given."""
    return DEFAULT_TOOLS.get(model) or DEFAULT_TOOLS[family(model)]


def expand_models(spec: Sequence[str]) -> list[str]:
    """Model names from names and group aliases (real, chains, matmul, synthetic, all), in order, once each."""
    out: list[str] = []
    for item in spec:
        for name in MODEL_GROUPS.get(item, (item,)):
            if name not in out:
                out.append(name)
    return out


def parse_tools(spec: Sequence[str], known: Collection[str] = TOOLS) -> list[str]:
    """Validated tool ids (of ``known``: AutoCast's tools by default)."""
    unknown = [t for t in spec if t not in known]
    if unknown:
        raise ValueError(f"unknown tool(s) {', '.join(unknown)}; known: {', '.join(known)}")
    return list(dict.fromkeys(spec))


def tool_command(
    tool: Tool,
    python: Path | str,
    src: Path,
    dst: Path,
    inputs_npz: Path | None = None,
    report_json: Path | None = None,
) -> list[str]:
    """The argv that runs ``tool`` on ``src`` writing ``dst`` (and onnxprec's report JSON, whose counts the harness
    reads)."""
    cmd = [str(python), str(RUNNER), tool.runner, "--input", str(src), "--output", str(dst)]
    if tool.data_max is not None:
        cmd += ["--data-max", tool.data_max]
    if tool.runner == "onnxprec" and report_json is not None:
        cmd += ["--report-json", str(report_json)]
    if tool.needs_inputs:
        if inputs_npz is None:
            raise ValueError(f"{tool.id} needs the model's real inputs")
        cmd += ["--inputs", str(inputs_npz)]
    if tool.target is not None:
        cmd += ["--target", tool.target]
    return cmd


def python_for(tool: Tool, anchors_python: Path | None) -> Path:
    """The interpreter ``tool`` runs in."""
    if tool.venv == "project":
        return Path(sys.executable)
    if anchors_python is None:
        raise ValueError(f"{tool.id} runs in the anchors venv, which was not prepared")
    return anchors_python
