"""Debugging tools: per-node dumps (``dump_model``) and node-by-node comparison of two models (``compare_models``).

``dump_model`` has the meaning of AMD Quark's: it runs a model on one batch and writes each quantized node's output
(and optionally every float output) as ``.bin``/``.txt`` files with an ``index.json``. ``compare_models`` runs a
reference and its conversion on the same inputs, matches their tensors (through renames, inserted Casts and
DequantizeLinear) and finds the first node whose output diverges, with the ``--nodes_to_exclude`` pattern that
would keep it in high precision. Both run through the reference runner in bounded memory. The implementations are
imported on first use, so ``python -m onnxprec.debug`` can print ``--help`` without loading the runtime.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from onnxprec.debug._options import CompareOptions, DumpOptions
    from onnxprec.debug.compare import CompareReport, CompareRow, OutputError, Verification, compare_models
    from onnxprec.debug.dump import DumpResult, dump_model

__all__ = [
    "CompareOptions",
    "CompareReport",
    "CompareRow",
    "DumpOptions",
    "DumpResult",
    "OutputError",
    "Verification",
    "compare_models",
    "dump_model",
]

_HOMES = {
    "CompareOptions": "onnxprec.debug._options",
    "DumpOptions": "onnxprec.debug._options",
    "DumpResult": "onnxprec.debug.dump",
    "dump_model": "onnxprec.debug.dump",
}


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module(_HOMES.get(name, "onnxprec.debug.compare")), name)
    raise AttributeError(f"module 'onnxprec.debug' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
