"""User-facing errors.

Every error a user can cause (a bad path, a corrupt file, an invalid flag...) is raised as an
:class:`OnnxprecError` subclass whose message names the problem *and* the fix, in one line. The CLI prints
the message and exits with code 2, without a traceback. Anything else that escapes is a bug in onnxprec.
"""

from __future__ import annotations

__all__ = [
    "CalibrationDataError",
    "InvalidArgumentError",
    "ModelLoadError",
    "OnnxprecError",
    "UnsupportedModelError",
    "ValidationError",
]


class OnnxprecError(Exception):
    """Base class of errors caused by user input; the CLI turns them into exit code 2."""


class InvalidArgumentError(OnnxprecError, ValueError):
    """An argument or flag has a bad value (invalid regex, unknown op type, bad output path...)."""


class ModelLoadError(OnnxprecError):
    """The model file is missing, not an ONNX model, truncated, or its external data is missing."""


class UnsupportedModelError(OnnxprecError):
    """The model is valid ONNX but this tool cannot process it (e.g. it is already quantized)."""


class CalibrationDataError(OnnxprecError):
    """Calibration data cannot be read, or does not match the model's inputs."""


class ValidationError(OnnxprecError):
    """The converted model failed validation (checker, type inference or I/O contract)."""
