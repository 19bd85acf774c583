"""The anchors venv: the tools onnxprec is measured against, kept apart from the project's own venv.

It holds NVIDIA ModelOpt AutoCast (``nvidia-modelopt[onnx]==0.47.0``), onnxconverter-common (float16 and
auto_mixed_precision) and onnxruntime's own ``transformers.float16`` / ``MatMulNBitsQuantizer``.
Default location ``$ONNXPREC_ANCHORS_VENV`` or ``~/.cache/onnxprec/anchors-venv``.

    python -m zoo.anchors_env [--path DIR]      # creates it if missing, prints its python

Install order matters: the local CPU build of torch goes in first (ModelOpt accepts it; an unpinned torch
would pull a multi-GB CUDA build); ModelOpt's ``[onnx]`` extra pulls ``onnxruntime-gpu``, which shares the
``onnxruntime`` package folder with the CPU wheel, so the CPU onnxruntime is force-reinstalled last.
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from ._venv import CACHE_ROOT, TORCH_PIN, create_venv

logger = logging.getLogger(__name__)

ANCHOR_VENV = Path(os.environ.get("ONNXPREC_ANCHORS_VENV", CACHE_ROOT / "anchors-venv")).expanduser()
MODELOPT_PIN = "nvidia-modelopt[onnx]==0.47.0"
ORT_CPU_VERSION = "1.32.0"

STEPS: tuple[tuple[str, ...], ...] = (
    ("pip", "install", TORCH_PIN),
    ("pip", "install", MODELOPT_PIN, "onnxconverter-common", f"onnxruntime=={ORT_CPU_VERSION}", "psutil"),
    # onnxruntime-gpu (from modelopt[onnx]) and onnxruntime write the same files: make the CPU build win
    ("pip", "install", "--force-reinstall", "--no-deps", f"onnxruntime=={ORT_CPU_VERSION}"),
)
CHECK = (
    "from modelopt.onnx.autocast import convert_to_mixed_precision",
    "from onnxconverter_common import float16, auto_mixed_precision",
    "from onnxruntime.transformers import float16 as ort_float16",
    "from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer",
    "import onnxruntime",
    "assert 'CPUExecutionProvider' in onnxruntime.get_available_providers()",
    "assert hasattr(onnxruntime, 'InferenceSession')",
)


def ensure_anchor_venv(path: Path | None = None) -> Path:
    """Python executable of the anchors venv at ``path`` (default ``ANCHOR_VENV``); creates it if missing."""
    return create_venv(Path(path) if path is not None else ANCHOR_VENV, STEPS, CHECK)


def versions(python: Path) -> list[str]:
    """``pip freeze`` lines of the anchors venv for modelopt, onnx* and torch."""
    cmd = [str(python), "-m", "pip", "freeze"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    keys = ("modelopt", "onnx", "torch")
    return [line for line in out.splitlines() if any(k in line.lower() for k in keys)]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m zoo.anchors_env", description=__doc__.splitlines()[0])
    ap.add_argument("--path", type=Path, default=None, help=f"venv folder (default {ANCHOR_VENV})")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        python = ensure_anchor_venv(a.path)
    except (subprocess.CalledProcessError, OSError) as e:
        print(f"error: could not create the anchors venv: {e}", file=sys.stderr)
        return 2
    print(python)
    for line in versions(python):
        print(f"  {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
