"""User-facing errors.

Every error a user can cause (a bad path, a corrupt file, an invalid flag...) is raised as an
:class:`OnnxprecError` subclass whose message names the problem *and* the fix, in one line. The CLI prints
the message and exits with code 2, without a traceback (3 for :class:`AccuracyGuardError`: a result the accuracy
guard refused). Anything else that escapes is a bug in onnxprec.
"""

from __future__ import annotations

__all__ = [
    "ACCURACY_GUARD_EXIT",
    "AccuracyGuardError",
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


class AccuracyGuardError(OnnxprecError):
    """The result misses the tool's default accuracy bound even after its float fallback: the model was written for
    inspection, and ``report`` says what was measured. The CLI exits with :data:`ACCURACY_GUARD_EXIT` (not 2, which
    means bad input)."""

    def __init__(self, message: str, report: object) -> None:
        super().__init__(message)
        self.report = report


ACCURACY_GUARD_EXIT = 3
"""The exit code of a result the accuracy guard refused (the model is written for inspection)."""
