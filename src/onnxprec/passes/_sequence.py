"""Pass sequences with one error path, for every tool's sanitize: passes run in order as ``ir.passes.Sequential``
runs them, each result kept, and a user error raised inside a pass surfaces as itself."""

from __future__ import annotations

import onnx_ir as ir

from onnxprec.errors import OnnxprecError

__all__ = ["run_passes", "user_error"]


def user_error(error: BaseException) -> OnnxprecError | None:
    """The :class:`~onnxprec.errors.OnnxprecError` behind ``error`` (onnx-ir wraps what a pass raises in
    ``PassError``\\ s, whose causes lead to it), or None when the failure is not the user's to fix."""
    cause: BaseException | None = error
    while cause is not None and not isinstance(cause, OnnxprecError):
        cause = cause.__cause__ or cause.__context__
    return cause


def run_passes(model: ir.Model, *passes: ir.passes.PassBase) -> list[ir.passes.PassResult]:
    """Runs ``passes`` on ``model`` in order and returns their results.

    Raises:
        OnnxprecError: A pass raised one (a user error, e.g. an opset the model cannot be upgraded to): as itself.
        ir.passes.PassError: Any other failure, naming the pass and those that ran before it.
    """
    results: list[ir.passes.PassResult] = []
    for step in passes:
        try:
            results.append(step(model))
        except Exception as e:
            error = user_error(e)
            if error is not None:
                raise error from None
            done = [type(s).__name__ for s in passes[: len(results)]]
            raise ir.passes.PassError(f"An error occurred in the '{step}' pass after the passes {done}") from e
    return results
