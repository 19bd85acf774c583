"""Raise the default-domain opset to a minimum (never lowers it)."""

from __future__ import annotations

import logging

import onnx_ir as ir

from onnxprec._ops import default_opset, min_ir_version
from onnxprec.errors import UnsupportedModelError

__all__ = ["UpgradeOpsetPass"]

logger = logging.getLogger(__name__)


class UpgradeOpsetPass(ir.passes.InPlacePass):
    """Converts the model to ``target`` opset with onnxscript's version converter when it is lower.

    The IR version is kept unless the new opset needs a newer one (ONNX Runtime releases reject IR
    versions newer than they know, so we never raise it gratuitously).
    """

    def __init__(self, target: int) -> None:
        super().__init__()
        self.target = target

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        current = default_opset(model)
        if current >= self.target:
            return ir.passes.PassResult(model, modified=False)
        from onnxscript import version_converter  # slow import: only when needed

        converter_logger = logging.getLogger("onnxscript.version_converter")
        level = converter_logger.level
        converter_logger.setLevel(logging.ERROR)  # it warns when it falls back to the C API: not our user's concern
        try:
            version_converter.convert_version(model, self.target, fallback=True)
        except Exception as e:
            raise UnsupportedModelError(
                f"Could not upgrade the model from opset {current} to {self.target} ({e}); "
                f"upgrade it yourself (onnx.version_converter) or pass --opset {current} to convert at "
                "the model's own opset."
            ) from e
        finally:
            converter_logger.setLevel(level)
        reached = default_opset(model)
        if reached != self.target:
            raise UnsupportedModelError(
                f"Could not upgrade the model from opset {current} to {self.target} (the ONNX version converter "
                f"failed); upgrade it yourself or pass --opset {current} to convert at the model's own opset."
            )
        needed = min_ir_version(self.target)
        if model.ir_version < needed:
            model.ir_version = needed
        logger.info("Upgraded opset %d -> %d", current, self.target)
        return ir.passes.PassResult(model, modified=True)
