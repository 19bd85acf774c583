"""The options of ``dump`` and ``compare``, each declared once: API keyword, flag and help.

This module imports nothing heavy (no onnx, onnx-ir or numpy), so the command line can print ``--help`` without
loading the runtime.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from onnxprec._arg_groups import calibration_data_option, input_shapes_option, providers_option
from onnxprec._options import ToolOptions, option
from onnxprec.errors import InvalidArgumentError

__all__ = ["DEFAULT_ATOL", "DEFAULT_RTOL", "DEFAULT_TEXT_VALUES", "CompareOptions", "DumpOptions"]

# A node diverges when rel_l2 > rtol and max_abs > atol (or it has non-finite values the reference has not):
# FP16 conversions of real models stay below 1e-2 relative L2 on almost every node, a real divergence does not.
DEFAULT_RTOL = 0.05
DEFAULT_ATOL = 1e-3
# The .txt of a tensor holds its first values only (16 bytes a float32 value): the .bin holds them all.
DEFAULT_TEXT_VALUES = 1024

_BUDGET_DOC = (
    "Upper bound on the bytes of the tensors fetched in one ONNX Runtime run (tensors are fetched in chunks); "
    "None: the reference runner's default (768 MiB)."
)


def _check_budget(budget_bytes: int | None) -> None:
    if budget_bytes is not None and budget_bytes <= 0:
        raise InvalidArgumentError(f"budget_bytes must be positive, got {budget_bytes}.")


@dataclass
class DumpOptions(ToolOptions):
    """The settings of :func:`onnxprec.debug.dump_model` (AMD Quark's ``dump_model`` arguments and more).

    Quark's keywords ``dump_data_reader`` and ``random_data_reader_input_shape`` are the command line's
    ``--calibration_data`` and ``--input_shapes``, spelled as in the other tools.
    """

    TITLE = "dump options"

    dump_data_reader: Any = calibration_data_option(
        "Inputs (only the first batch is used)", default="realistic random inputs"
    )
    random_data_reader_input_shape: Any = input_shapes_option(
        more=", a list of shapes in input order, or ``{}`` (sizes chosen from the model)"
    )
    dump_float: bool = option(
        False, help="Also dump every node's float output as <name>_float.bin and <name>_float.txt."
    )
    output_dir: str = option(
        "./dump_results",
        metavar="DIR",
        help="Folder of the dump (created; its parent must exist; a folder that holds files is refused without "
        "--overwrite).",
        doc="Folder of the dump (created; its parent must exist; a folder that holds files is refused without "
        "``overwrite``).",
    )
    overwrite: bool = option(
        False,
        help="Write into a --output_dir that holds files: an earlier dump there (the files its index.json lists) is "
        "replaced, other files are kept.",
        doc="Write into an ``output_dir`` that holds files: an earlier dump there (the files its ``index.json`` "
        "lists) is replaced, other files are kept.",
    )
    text_values: int = option(
        DEFAULT_TEXT_VALUES,
        metavar="N",
        help="Values written to each .txt file: the first N in C order, then a '# ...' line saying how many the .bin "
        "holds (the .bin always holds all); 0: every value, as Quark writes them.",
        doc="Values written to each ``.txt`` file: the first N in C order, then a ``#`` line saying how many the "
        "``.bin`` holds (the ``.bin`` always holds all); 0: every value, as Quark writes them.",
    )
    providers: Sequence[str] = providers_option("the run")
    budget_bytes: int | None = option(None, api_only=True, help=_BUDGET_DOC)

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_budget(self.budget_bytes)
        if isinstance(self.text_values, bool) or not isinstance(self.text_values, int) or self.text_values < 0:
            raise InvalidArgumentError(f"text_values must be an integer >= 0, got {self.text_values!r}.")


@dataclass
class CompareOptions(ToolOptions):
    """The settings of :func:`onnxprec.debug.compare_models`."""

    TITLE = "compare options"

    calibration_data: Any = calibration_data_option(
        "Inputs for both models", default="realistic random inputs made from the reference's inputs"
    )
    atol: float = option(
        DEFAULT_ATOL,
        help="A node diverges when its max abs error exceeds atol and its relative L2 error exceeds rtol, or "
        "when it has non-finite values the reference has not.",
    )
    rtol: float = option(DEFAULT_RTOL, help="Relative L2 error tolerance (see --atol).")
    input_shapes: str | Mapping[str, Sequence[int]] | None = input_shapes_option()
    providers: Sequence[str] = providers_option("both models' runs")
    verify: bool = option(
        False,
        help="Re-run AutoCast on the reference with the printed --nodes_to_exclude pattern and compare again, "
        "to check that keeping the first divergent node in high precision fixes the divergence.",
    )
    autocast_options: Mapping[str, Any] | None = option(
        None,
        api_only=True,
        help="Other ``convert_to_mixed_precision`` arguments for the conversion of ``verify`` (e.g. "
        "``{'data_max': math.inf}`` when the candidate was made that way).",
    )
    budget_bytes: int | None = option(None, api_only=True, help=_BUDGET_DOC)

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("atol", "rtol"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or math.isnan(value) or value < 0:
                raise InvalidArgumentError(f"{name} must be a number >= 0, got {value!r}.")
        _check_budget(self.budget_bytes)
