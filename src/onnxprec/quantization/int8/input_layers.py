"""ort-cpu's second try under the accuracy guard: the layers that read the model input quantized too.

On ort-cpu a static layer that reads the model's own float input stays float unless ``nodes_to_quantize`` names it
(:func:`onnxprec.quantization.int8.place.place`): a CNN's first Conv is a small share of its compute and an 8-bit
image's pixel step is about one INT8 step. Where those layers hold most of the weights (a spectrogram's STFT Convs
before a small filterbank MatMul), the layers left to quantize are the small ones, and when the guard misses with
them there is no float fallback left that keeps anything INT8. Then the run is repeated once with the input readers
quantized as well, as if ``nodes_to_quantize`` named every layer, and the guard judges that result as any other;
when it misses too, or cannot be built, the first result and its guard line stand.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from onnxprec.errors import OnnxprecError

if TYPE_CHECKING:
    import onnx_ir as ir

    from onnxprec.quantization.int8._options import Int8Options
    from onnxprec.quantization.int8._report import Int8Report
    from onnxprec.quantization.int8.place import Plan

__all__ = ["INPUT_REASON", "retry_options", "second_try"]

logger = logging.getLogger(__name__)

_Result = TypeVar("_Result")

INPUT_REASON = "reads the model input"
"""How :func:`~onnxprec.quantization.int8.place.place` starts the reason of a layer kept float as an input reader."""


def _weight_elements(model: ir.Model, names: set[str]) -> int:
    """The weight elements of the named Conv/MatMul/Gemm nodes of the main graph."""
    total = 0
    for node in model.graph:
        if str(node.name) in names and len(node.inputs) > 1:
            weight = node.inputs[1]
            if weight is not None and weight.const_value is not None:
                total += int(weight.const_value.size)
    return total


def retry_options(model: ir.Model, plan: Plan, options: Int8Options, report: Int8Report) -> Int8Options | None:
    """The options of the second try (module docstring), or None when there is none to make: the guard held or is
    off, the user chose the layers, the calibration data cannot be read again, or the input readers hold fewer
    weights than the layers quantized without them (the first Conv of a CNN)."""
    if not report.guard_failure or not options.accuracy_guard or options.runtime != "ort-cpu":
        return None
    if options.nodes_to_quantize or options.calibration_data_reader is not None:
        return None
    readers = {name for name, why in plan.skipped if why.startswith(INPUT_REASON)}
    quantized = {str(layer.node.name) for layer in plan.layers}
    if not readers or _weight_elements(model, readers) <= _weight_elements(model, quantized):
        return None
    names = sorted(readers | quantized)
    logger.info(
        "The accuracy guard missed with the %d layers that read the model input in float (%s): trying again with "
        "them quantized", len(readers), ", ".join(sorted(readers)),
    )  # fmt: skip
    return dataclasses.replace(options, nodes_to_quantize=[f"{re.escape(name)}$" for name in names])


def second_try(
    model: ir.Model,
    plan: Plan,
    options: Int8Options,
    report: Int8Report,
    quantize: Callable[[Int8Options], tuple[_Result, Int8Report]],
) -> tuple[_Result, Int8Report] | None:
    """The second try's result and report (``quantize``: the pipeline on the sanitized ``model`` with other
    options) when :func:`retry_options` makes one and the guard holds it; else None, and the first result stands."""
    retry = retry_options(model, plan, options, report)
    if retry is None:
        return None
    try:
        result, second = quantize(retry)
    except OnnxprecError as e:  # the first result, written for inspection, says more
        logger.info("The second try with the layers that read the model input quantized failed: %s", e)
        return None
    if second.guard_failure:
        logger.info("The second try with the layers that read the model input quantized missed too: %s",
                    second.guard_failure)  # fmt: skip
        return None
    second.input_layers = [name for name, why in report.skipped if why.startswith(INPUT_REASON)]
    return result, second
