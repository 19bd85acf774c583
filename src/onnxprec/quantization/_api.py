"""ModelOpt's one entry point, ``quantize(onnx_path, quantize_mode="int8" | "fp8" | "int4", ...)``, routed to tools.

ModelOpt's signature is written here only: ``quantize_mode="int8"`` runs the INT8 tool
(:func:`onnxprec.quantization.int8.quantize_file`, whose options have ModelOpt's names), ``"fp8"`` the FP8 tool
(:func:`onnxprec.quantization.fp8.quantize_file`, INT8's options with FP8's defaults); ``"int4"`` runs the INT4
weight-only tool (:func:`onnxprec.quantization.int4.quantize_file`) with ModelOpt's argument names mapped onto it. Both
write ``output_path`` (default ``<name>.quant.onnx``) and return the report.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from onnxprec.errors import InvalidArgumentError

__all__ = ["MODES", "quantize", "split_mode"]

MODES = ("int8", "fp8", "int4")
_INT4_UNSUPPORTED = ("op_types_to_quantize", "op_types_to_exclude", "nodes_to_quantize", "high_precision_dtype")
_MODELOPT_ALIASES = {"calibration_shapes": "input_shapes"}  # ModelOpt's keyword: the tools' option


def _check_mode(mode: object) -> str:
    if mode not in MODES:
        raise InvalidArgumentError(f"Unknown quantize_mode {mode!r}: use {', '.join(MODES)}.")
    return str(mode)


def split_mode(argv: Sequence[str]) -> tuple[str, list[str]]:
    """``--quantize_mode X`` (or ``--quantize_mode=X``) taken out of ``argv``: the mode (default int8) and the rest.

    Raises:
        InvalidArgumentError: An unknown mode or a flag without its value.
    """
    rest: list[str] = []
    mode = "int8"
    args = list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--quantize_mode":
            if i + 1 >= len(args):
                raise InvalidArgumentError(f"--quantize_mode needs a value: {', '.join(MODES)}.")
            mode, i = args[i + 1], i + 2
            continue
        if arg.startswith("--quantize_mode="):
            mode = arg.split("=", 1)[1]
        else:
            rest.append(arg)
        i += 1
    return _check_mode(mode), rest


def quantize(
    onnx_path: str | Path,
    quantize_mode: str = "int8",
    calibration_data: Any = None,
    calibration_method: str | None = None,
    calibration_data_reader: Any = None,
    calibration_eps: Sequence[str] = ("cpu",),
    op_types_to_quantize: Sequence[str] | None = None,
    op_types_to_exclude: Sequence[str] | None = None,
    nodes_to_quantize: Sequence[str] | None = None,
    nodes_to_exclude: Sequence[str] | None = None,
    use_external_data_format: bool = False,
    output_path: str | Path | None = None,
    log_level: str = "INFO",
    high_precision_dtype: str | None = None,
    **kwargs: Any,
) -> Any:
    """Quantizes ``onnx_path`` and writes ``output_path``: ModelOpt's ``modelopt.onnx.quantization.quantize``.

    Args:
        onnx_path: Path to the float model.
        quantize_mode: ``int8`` (static/dynamic INT8, :mod:`onnxprec.quantization.int8`), ``fp8`` (FP8 E4M3FN for
            TensorRT, :mod:`onnxprec.quantization.fp8`) or ``int4`` (weight-only, :mod:`onnxprec.quantization.int4`).
        calibration_data: Calibration inputs (a path, a dict of arrays, a list of feed dicts or a reader).
        calibration_method: INT8: max, entropy, percentile, mse (default); FP8: the same, max by default; INT4: rtn,
            awq_lite, awq_clip, gptq...
        calibration_data_reader: An ONNX Runtime ``CalibrationDataReader``; give it or ``calibration_data``.
        calibration_eps: ONNX Runtime providers for calibration: ``cpu``, ``cuda:N``, ``trt``, ``dml``.
        op_types_to_quantize: INT8 only: only these op types.
        op_types_to_exclude: INT8 only: op types kept in float.
        nodes_to_quantize: INT8 only: regexes of the nodes to quantize.
        nodes_to_exclude: Regexes of nodes kept in float (INT4's default excludes ``.*/lm_head``).
        use_external_data_format: Save the weights in ``<output>.data`` beside the model.
        output_path: Where to write (default beside the input).
        log_level: DEBUG, INFO, WARNING or ERROR.
        high_precision_dtype: INT8 and FP8: fp32, fp16 or bf16 for what stays in float (default: fp32 on ort-cpu,
            fp16 on trt and for FP8).
        **kwargs: Any other option of the chosen tool (:class:`~onnxprec.quantization.int8.Int8Options`,
            :class:`~onnxprec.quantization.fp8.Fp8Options` or
            :class:`~onnxprec.quantization.int4.Int4Options`, e.g. ``runtime``, ``block_size``); ModelOpt's
            ``calibration_shapes`` is the tools' ``input_shapes``. ModelOpt's ``calibration_cache_path`` is refused
            (no calibration cache here).

    Returns:
        The tool's report (``report.to_json()``).

    Raises:
        OnnxprecError: A bad argument, model or calibration data; the message says how to fix it.
    """
    mode = _check_mode(quantize_mode)
    named = {k: v for k, v in locals().items() if k not in ("onnx_path", "quantize_mode", "kwargs", "mode")}
    if kwargs.get("calibration_cache_path") is not None:
        raise InvalidArgumentError(
            "calibration_cache_path is not supported (onnxprec keeps no calibration cache): drop it and pass "
            "calibration_data."
        )
    kwargs.pop("calibration_cache_path", None)
    for modelopt, ours in _MODELOPT_ALIASES.items():
        if modelopt in kwargs:
            if ours in kwargs:
                raise InvalidArgumentError(f"Give {modelopt} or {ours}, not both.")
            kwargs[ours] = kwargs.pop(modelopt)
    if mode == "int8":
        from onnxprec.quantization import int8

        del named["output_path"]  # ModelOpt's names are INT8's options
        return int8.quantize_file(onnx_path, output_path, options=int8.Int8Options.from_call(None, kwargs, named))
    if mode == "fp8":
        from onnxprec.quantization import fp8

        del named["output_path"]  # and FP8's
        return fp8.quantize_file(onnx_path, output_path, options=fp8.Fp8Options.from_call(None, kwargs, named))
    given = {name: value for name, value in named.items() if name in _INT4_UNSUPPORTED and value is not None}
    if given:
        raise InvalidArgumentError(f"quantize_mode='int4' has no {', '.join(sorted(given))}: drop them.")
    if calibration_data is not None and calibration_data_reader is not None:
        raise InvalidArgumentError("Give calibration_data or calibration_data_reader, not both.")
    from onnxprec.quantization.int4 import quantize_file

    settings: dict[str, Any] = {"calibration_eps": tuple(calibration_eps), "log_level": log_level, **kwargs}
    if calibration_method is not None:
        settings["calibration_method"] = calibration_method
    source = calibration_data if calibration_data is not None else calibration_data_reader
    if source is not None:
        settings["calibration_data_reader"] = source
    if nodes_to_exclude is not None:
        settings["nodes_to_exclude"] = nodes_to_exclude
    return quantize_file(onnx_path, output_path, external_data=use_external_data_format or None, **settings)
