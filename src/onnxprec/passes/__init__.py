"""Generic onnx-ir passes, one per module (``<Verb><Object>Pass``), shared by AutoCast and the other tools, and
``run_passes``: a sequence of them with one error path (``user_error``: a user error raised in a pass, as itself)."""

from onnxprec.passes._sequence import run_passes, user_error
from onnxprec.passes.convert_fp64_to_fp32 import ConvertFp64ToFp32Pass
from onnxprec.passes.infer_types import InferTypesPass
from onnxprec.passes.lift_float_constants import LiftFloatConstantsPass
from onnxprec.passes.name_nodes import NameNodesPass
from onnxprec.passes.remove_redundant_casts import RemoveRedundantCastsPass, RemoveRedundantCastsResult
from onnxprec.passes.upgrade_opset import OpsetUpgradeError, UpgradeOpsetPass
from onnxprec.passes.widen_movement_islands import WidenMovementIslandsPass, WidenMovementIslandsResult
from onnxprec.passes.widen_to_fp32 import WidenToFp32Pass

__all__ = [
    "ConvertFp64ToFp32Pass",
    "InferTypesPass",
    "LiftFloatConstantsPass",
    "NameNodesPass",
    "OpsetUpgradeError",
    "RemoveRedundantCastsPass",
    "RemoveRedundantCastsResult",
    "UpgradeOpsetPass",
    "WidenMovementIslandsPass",
    "WidenMovementIslandsResult",
    "WidenToFp32Pass",
    "run_passes",
    "user_error",
]
