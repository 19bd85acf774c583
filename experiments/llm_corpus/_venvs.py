"""The Optimum venv: ``optimum-onnx`` pins transformers < 4.58, the torch venv has 5.x, so Optimum gets its own
venv (``$ONNXPREC_OPTIMUM_VENV`` or ``~/.cache/onnxprec/optimum-venv``) with the same local CPU torch."""

from __future__ import annotations

import os
from pathlib import Path

from zoo._venv import CACHE_ROOT, TORCH_PIN, create_venv

OPTIMUM_VENV = Path(os.environ.get("ONNXPREC_OPTIMUM_VENV", CACHE_ROOT / "optimum-venv")).expanduser()
OPTIMUM_STEPS: tuple[tuple[str, ...], ...] = (
    ("pip", "install", TORCH_PIN),
    ("pip", "install", "optimum-onnx[onnxruntime]==0.1.0", "transformers>=4.50,<4.58", "onnxscript", "safetensors"),
)
OPTIMUM_CHECK = (
    "import torch, transformers, onnxruntime",
    "from optimum.exporters.onnx import main_export",
)


def ensure_optimum_venv() -> Path:
    """Python of the Optimum venv; creates it when missing."""
    return create_venv(OPTIMUM_VENV, OPTIMUM_STEPS, OPTIMUM_CHECK)
