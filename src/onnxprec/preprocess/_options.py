"""Pre-processing options, each declared once: API keyword, command-line flag (ONNX Runtime's spelling), help.

The fields and defaults are those of ONNX Runtime's ``quant_pre_process`` (``python -m
onnxruntime.quantization.preprocess``); ``opset`` and ``providers`` are onnxprec's extras. Nothing heavy is
imported here, so ``--help`` is fast.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from onnxprec._arg_groups import genai_provider_option, providers_option
from onnxprec._options import ToolOptions, option
from onnxprec.errors import InvalidArgumentError

__all__ = ["PreprocessOptions"]

_EXTRAS = "onnxprec extras"


@dataclass
class PreprocessOptions(ToolOptions):
    """All pre-processing settings, validated once; names and defaults follow ONNX Runtime's ``quant_pre_process``."""

    TITLE = "pre-processing options (ONNX Runtime quant_pre_process flags)"

    skip_optimization: bool = option(
        False,
        help="Skip the ONNX Runtime graph optimization (basic level: constant folding, Conv+BatchNormalization "
        "and other fusions).",
    )
    skip_onnx_shape: bool = option(False, help="Skip ONNX shape inference.")
    skip_symbolic_shape: bool = option(
        False, help="Skip ONNX Runtime's symbolic shape inference (best for transformers; needs sympy)."
    )
    auto_merge: bool = option(
        False, help="Symbolic shape inference: merge symbolic dims automatically when they conflict."
    )
    int_max: int = option(
        2**31 - 1,
        metavar="INT",
        help="Symbolic shape inference: integers from this value on are boundless (e.g. Slice ends).",
    )
    guess_output_rank: bool = option(
        False, help="Symbolic shape inference: unknown ops get the rank of their first input."
    )
    verbose: int = option(
        0, metavar="LEVEL", help="Symbolic shape inference's own logs: 0 off, 1 warnings, 3 detailed."
    )
    save_as_external_data: bool = option(
        False,
        flags=("--external_data", "--save_as_external_data"),
        help="Save the weights as external data beside the output.",
    )
    all_tensors_to_one_file: bool = option(
        False,
        help="With --save_as_external_data: all weights in one file (otherwise one file per tensor, as ONNX does).",
    )
    external_data_location: str | None = option(
        None,
        metavar="FILE",
        help="Name of the one external data file, relative to the output (default: <output name>.data).",
    )
    external_data_size_threshold: int = option(
        1024, metavar="BYTES", help="Tensors larger than this many bytes go to external data."
    )
    opset: int | None = option(
        None,
        metavar="N",
        group=_EXTRAS,
        help="Upgrade the default-domain opset to this version (e.g. 21 for INT4 DequantizeLinear), verified by "
        "running the model before and after on the same random inputs (never lowered).",
    )
    providers: Sequence[str] = providers_option("the --opset check", flags=("--providers",))
    genai_provider: str | None = genai_provider_option()

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.int_max <= 0:
            raise InvalidArgumentError(f"int_max must be a positive integer, got {self.int_max}.")
        if self.external_data_size_threshold < 0:
            raise InvalidArgumentError(
                f"external_data_size_threshold must be >= 0, got {self.external_data_size_threshold}."
            )
        if self.opset is not None:
            import onnx

            newest = onnx.defs.onnx_opset_version()
            if not 7 <= int(self.opset) <= newest:
                raise InvalidArgumentError(f"--opset {self.opset} is out of range: use 7..{newest}.")
        location = self.external_data_location
        if location is not None and (Path(location).is_absolute() or ".." in Path(location).parts):
            raise InvalidArgumentError(
                f"external_data_location '{location}' must be a file name relative to the output model's folder "
                "(ONNX stores it relative to the model)."
            )
