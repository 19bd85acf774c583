"""What an FP8 run did and measured: INT8's report, named for FP8 (:meth:`Fp8Report.to_json` is ``--report_json``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from onnxprec.quantization.int8 import Int8Report

__all__ = ["Fp8Report"]


@dataclass
class Fp8Report(Int8Report):
    """The outcome of an FP8 run: the layers (``static``: FP8, or ``float``), static tensors, accuracy, timings."""

    TOOL: ClassVar[str] = "quantize fp8"
    FORMAT: ClassVar[str] = "FP8"
