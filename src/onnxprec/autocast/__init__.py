"""AutoCast: FP32 -> mixed FP32/FP16 or FP32/BF16, a drop-in for ModelOpt's ``convert_to_mixed_precision``.

The pipeline, one pass per step::

    load -> sanitize -> (reference run) -> classify -> convert -> remove redundant casts -> validate -> save

``convert_to_mixed_precision`` takes the same arguments as ModelOpt's and returns an ``onnx.ModelProto``;
``convert_file`` streams path to path (weights converted while they are written; external data on request
or above 2 GB) and returns a report. The implementation lives in ``_api``; it is imported on first use, so
``python -m onnxprec.autocast`` can set up its process before the heavy imports.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from onnxprec._exports import lazy_exports

if TYPE_CHECKING:
    from onnxprec.autocast._api import (
        AutoCastOptions,
        AutoCastReport,
        NodeRuleBase,
        convert_file,
        convert_model,
        convert_to_mixed_precision,
        default_output_path,
    )

__all__ = [
    "AutoCastOptions",
    "AutoCastReport",
    "NodeRuleBase",
    "convert_file",
    "convert_model",
    "convert_to_mixed_precision",
    "default_output_path",
]


__getattr__, __dir__ = lazy_exports(__name__, __all__, "onnxprec.autocast._api")
