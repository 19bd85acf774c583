"""ONNX Runtime's ``quantize_static`` and ``quantize_dynamic`` with the same arguments, on onnxprec's INT8 pipeline.

``from onnxprec.quantization import quantize_static, CalibrationMethod`` replaces ``from onnxruntime.quantization
import ...``: the arguments keep their names and meanings, and ONNX Runtime's own enums are accepted too. What
differs, on purpose:

- every layer is quantized per channel, symmetric INT8 weights (``per_channel`` is accepted and ignored: per-tensor
  weights only lose accuracy);
- activations are UINT8 with zero points, the fast form of ONNX Runtime's x86 kernels, for ``QInt8`` and ``QUInt8``;
  ``QInt16`` (symmetric, zero point 0) and ``QUInt16`` give 16-bit activations with INT8 weights, as ONNX Runtime's
  (opset 21; its CPU provider runs those layers in float between the Q/DQ);
- ``QuantFormat.QDQ`` only: ONNX Runtime fuses it into the same QLinear kernels as ``QOperator``; and QDQ it is:
  no contrib op (the quantizer's float-output pointwise Convs, ``com.microsoft::MatMulIntegerToFloat``, stay
  QLinearConv here, ``float_linear_outputs=False``), so other execution providers take the model as ORT's own;
- ``Entropy`` leaves the bin of exact zeros out and never fails on a wide range ("Too many bins for data range");
- the placement is onnxprec's for ONNX Runtime's CPU provider (static activations everywhere, as the name says:
  Pad folded into Conv, ReLU/Clip absorbed, no DequantizeLinear in front of an op that cannot fuse), with bias
  correction; no float fallback unless ``extra_options={"TargetAccuracy": "rel_l2<=0.03"}``.

``extra_options`` understood: ``CalibPercentile``, ``SmoothQuant`` (bool), ``TargetAccuracy`` (AutoCast's syntax),
``BiasCorrection`` (bool); other keys are ignored with a warning.

``quantize_dynamic`` quantizes MatMul and Gemm layers with a constant weight (per-channel INT8 weights, activations
quantized at every run: ``DynamicQuantizeMatMul``/``MatMulIntegerToFloat`` once ONNX Runtime fuses them); it reads no
data, so nothing is fitted to data (no SmoothQuant, outlier channels or bias correction). Other op types
(Conv, Gather, Attention...) stay float, with a warning when ``op_types_to_quantize`` names them.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import os
import re
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from onnxprec.errors import InvalidArgumentError

if TYPE_CHECKING:
    import onnx

__all__ = ["CalibrationMethod", "QuantFormat", "QuantType", "quantize_dynamic", "quantize_static"]

logger = logging.getLogger(__name__)


class CalibrationMethod(enum.Enum):
    """ONNX Runtime's calibration methods (``Distribution`` has no equivalent here)."""

    MinMax = 0
    Entropy = 1
    Percentile = 2
    Distribution = 3


class QuantFormat(enum.Enum):
    """ONNX Runtime's output formats; only QDQ is written."""

    QOperator = 0
    QDQ = 1


class QuantType(enum.Enum):
    """ONNX Runtime's INT8 types (accepted for compatibility; see the module docstring)."""

    QInt8 = 0
    QUInt8 = 1
    QFLOAT8E4M3FN = 2
    QInt16 = 3
    QUInt16 = 4
    QInt4 = 5
    QUInt4 = 6


_METHODS = {"MinMax": "max", "Entropy": "entropy", "Percentile": "percentile"}
_ACTIVATION_TYPES: dict[str, str | None] = {"QInt8": None, "QUInt8": None, "QInt16": "int16", "QUInt16": "uint16"}
"""ONNX Runtime's activation types: 8 bits are UINT8 on CPU (the placement's default), 16 bits as asked."""


def _name(value: Any) -> str:
    return str(getattr(value, "name", value))


def quantize_static(
    model_input: str | Path | onnx.ModelProto,
    model_output: str | Path,
    calibration_data_reader: Any = None,
    quant_format: Any = QuantFormat.QDQ,
    op_types_to_quantize: Sequence[str] | None = None,
    per_channel: bool = False,
    reduce_range: bool = False,
    activation_type: Any = QuantType.QInt8,
    weight_type: Any = QuantType.QInt8,
    nodes_to_quantize: Sequence[str] | None = None,
    nodes_to_exclude: Sequence[str] | None = None,
    use_external_data_format: bool = False,
    calibrate_method: Any = CalibrationMethod.MinMax,
    calibration_providers: Sequence[str] | None = None,
    extra_options: Mapping[str, Any] | None = None,
    calibration_cache_path: str | Path | None = None,
) -> Any:
    """Static INT8 quantization with ONNX Runtime's ``quantize_static`` arguments (see the module docstring).

    Args:
        model_input: The float model (a path or a ``ModelProto``).
        model_output: Where to write the quantized model.
        calibration_data_reader: A ``CalibrationDataReader`` (or any source onnxprec reads); required.
        quant_format: ``QuantFormat.QDQ`` (``QOperator`` is refused).
        op_types_to_quantize: Only these op types (default: all supported).
        per_channel: Accepted; weights are always per channel.
        reduce_range: Must be False (7-bit weights are for pre-VNNI CPUs).
        activation_type: ``QInt8``/``QUInt8``: UINT8 activations on CPU; ``QInt16``/``QUInt16``: 16-bit.
        weight_type: ``QInt8``.
        nodes_to_quantize: Exact node names to quantize (default: all).
        nodes_to_exclude: Exact node names kept in float.
        use_external_data_format: Save the weights in ``<output>.data``.
        calibrate_method: ``MinMax``, ``Entropy`` or ``Percentile``.
        calibration_providers: ONNX Runtime provider names for calibration (``CPUExecutionProvider``...).
        extra_options: See the module docstring.
        calibration_cache_path: Refused: onnxprec keeps no calibration cache (its calibration takes seconds on
            small models); pass the reader.

    Returns:
        The :class:`~onnxprec.quantization.int8.Int8Report`.

    Raises:
        OnnxprecError: A bad argument, model or calibration data; the message says how to fix it.
    """
    _check_static_arguments(calibration_cache_path, calibration_data_reader, quant_format, weight_type, reduce_range)
    options = _static_options(activation_type, calibrate_method, extra_options, calibration_providers)
    return _quantize(
        model_input,
        model_output,
        calibration_data_reader=calibration_data_reader,
        op_types_to_quantize=op_types_to_quantize,
        nodes_to_quantize=nodes_to_quantize,
        nodes_to_exclude=nodes_to_exclude,
        use_external_data_format=use_external_data_format,
        **options,
    )


def _check_static_arguments(
    calibration_cache_path: Any, calibration_data_reader: Any, quant_format: Any, weight_type: Any, reduce_range: bool
) -> None:
    """Raises on the ``quantize_static`` arguments onnxprec does not take, each with how to fix it."""
    if calibration_cache_path is not None:
        raise InvalidArgumentError(
            "calibration_cache_path is not supported (onnxprec keeps no calibration cache): drop it and pass "
            "calibration_data_reader."
        )
    if calibration_data_reader is None:
        raise InvalidArgumentError("quantize_static needs calibration_data: pass a calibration_data_reader.")
    if _name(quant_format) != "QDQ":
        raise InvalidArgumentError(
            "quant_format QOperator is not written: use QuantFormat.QDQ (ONNX Runtime fuses it into the same QLinear "
            "kernels)."
        )
    if _name(weight_type) != "QInt8":
        raise InvalidArgumentError(f"weight_type {_name(weight_type)} is not supported: use QuantType.QInt8.")
    if reduce_range:
        raise InvalidArgumentError("reduce_range=True (7-bit weights) is not supported: drop it.")


def _static_options(
    activation_type: Any,
    calibrate_method: Any,
    extra_options: Mapping[str, Any] | None,
    calibration_providers: Sequence[str] | None,
) -> dict[str, Any]:
    """The INT8 tool's options for ``quantize_static``'s activation type, calibration method, extra options and
    providers (ONNX Runtime's behaviour: no accuracy guard; a result that misses its bound is only warned about)."""
    if _name(activation_type) not in _ACTIVATION_TYPES:
        raise InvalidArgumentError(
            f"activation_type {_name(activation_type)} is not supported: use QuantType.QUInt8, QInt8, QInt16 or "
            "QUInt16."
        )
    method = _METHODS.get(_name(calibrate_method))
    if method is None:
        raise InvalidArgumentError(
            f"calibrate_method {_name(calibrate_method)} is not supported: use MinMax, Entropy or Percentile."
        )
    options: dict[str, Any] = {"activations": "static", "target_accuracy": None, "calibration_method": method,
                               "float_linear_outputs": False, "accuracy_guard": False,
                               "activation_type": _ACTIVATION_TYPES[_name(activation_type)]}  # fmt: skip
    extras = dict(extra_options or {})
    if "CalibPercentile" in extras:
        options["percentile"] = float(extras.pop("CalibPercentile"))
    if "SmoothQuant" in extras:
        options["smoothquant"] = bool(extras.pop("SmoothQuant"))
    if "TargetAccuracy" in extras:
        options["target_accuracy"] = extras.pop("TargetAccuracy")
    if "BiasCorrection" in extras:
        options["bias_correction"] = bool(extras.pop("BiasCorrection"))
    if extras:
        logger.warning("quantize_static: extra_options %s are ignored by onnxprec", sorted(extras))
    if calibration_providers:
        names = {"CPUExecutionProvider": "cpu", "CUDAExecutionProvider": "cuda", "TensorrtExecutionProvider": "trt",
                 "DmlExecutionProvider": "dml"}  # fmt: skip
        options["calibration_eps"] = tuple(names.get(p, p) for p in calibration_providers)
    return options


def _quantize(
    model_input: str | Path | onnx.ModelProto,
    model_output: str | Path,
    nodes_to_quantize: Sequence[str] | None,
    nodes_to_exclude: Sequence[str] | None,
    **options: Any,
) -> Any:
    """The INT8 tool on ORT's arguments: a ``ModelProto`` is written to a temporary file (as ORT does), node names
    are exact."""
    from onnxprec.quantization.int8._api import quantize_file

    with contextlib.ExitStack() as stack:
        if not isinstance(model_input, (str, os.PathLike)):
            import onnx_ir as ir

            folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="onnxprec-ort-quantize-")))
            path = folder / "model_input.onnx"
            ir.save(ir.from_proto(model_input), path, external_data="model_input.onnx.data", size_threshold_bytes=1024)
            model_input = path
        return quantize_file(
            model_input,
            model_output,
            nodes_to_quantize=[f"^{re.escape(n)}$" for n in nodes_to_quantize] if nodes_to_quantize else None,
            nodes_to_exclude=[f"^{re.escape(n)}$" for n in nodes_to_exclude] if nodes_to_exclude else None,
            **options,
        )


_DYNAMIC_OPS = ("MatMul", "Gemm")


def quantize_dynamic(
    model_input: str | Path | onnx.ModelProto,
    model_output: str | Path,
    op_types_to_quantize: Sequence[str] | None = None,
    per_channel: bool = False,
    reduce_range: bool = False,
    weight_type: Any = QuantType.QInt8,
    nodes_to_quantize: Sequence[str] | None = None,
    nodes_to_exclude: Sequence[str] | None = None,
    use_external_data_format: bool = False,
    extra_options: Mapping[str, Any] | None = None,
) -> Any:
    """Dynamic INT8 quantization with ONNX Runtime's ``quantize_dynamic`` arguments (see the module docstring).

    Args:
        model_input: The float model (a path or a ``ModelProto``).
        model_output: Where to write the quantized model.
        op_types_to_quantize: Op types to quantize: MatMul and Gemm (the default); others stay float.
        per_channel: Accepted; weights are always per channel.
        reduce_range: Must be False (7-bit weights are for pre-VNNI CPUs).
        weight_type: ``QInt8``.
        nodes_to_quantize: Exact node names to quantize (default: all).
        nodes_to_exclude: Exact node names kept in float.
        use_external_data_format: Save the weights in ``<output>.data``.
        extra_options: Accepted; ignored with a warning.

    Returns:
        The :class:`~onnxprec.quantization.int8.Int8Report`.

    Raises:
        OnnxprecError: A bad argument or model; the message says how to fix it.
    """
    if _name(weight_type) != "QInt8":
        raise InvalidArgumentError(f"weight_type {_name(weight_type)} is not supported: use QuantType.QInt8.")
    if reduce_range:
        raise InvalidArgumentError("reduce_range=True (7-bit weights) is not supported: drop it.")
    if extra_options:
        logger.warning("quantize_dynamic: extra_options %s are ignored by onnxprec", sorted(extra_options))
    op_types = tuple(op_types_to_quantize or _DYNAMIC_OPS)
    ignored = sorted(set(op_types) - set(_DYNAMIC_OPS))
    if ignored:
        logger.warning("quantize_dynamic: %s stay float (onnxprec quantizes MatMul and Gemm dynamically)", ignored)
    kept = tuple(op for op in op_types if op in _DYNAMIC_OPS)
    if not kept:
        raise InvalidArgumentError(f"op_types_to_quantize {list(op_types)} has no MatMul or Gemm: nothing to quantize.")
    return _quantize(
        model_input,
        model_output,
        nodes_to_quantize=nodes_to_quantize,
        nodes_to_exclude=nodes_to_exclude,
        op_types_to_quantize=kept,
        use_external_data_format=use_external_data_format,
        activations="dynamic",
        target_accuracy=None,
        accuracy_guard=False,  # ONNX Runtime's behaviour, as quantize_static: a missed bound is only warned about
        smoothquant=False,
        outlier_channels=0,
        bias_correction=False,
        weight_rounding="rtn",
    )
