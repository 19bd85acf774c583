"""Debugging tools: per-node dumps (``dump_model``) and node-by-node comparison of two models (``compare_models``).

``dump_model`` has the meaning of AMD Quark's: it runs a model on one batch and writes each quantized node's output
(and optionally every float output) as ``.bin``/``.txt`` files with an ``index.json``. ``compare_models`` runs a
reference and its conversion on the same inputs, matches their tensors (through renames, inserted Casts and
DequantizeLinear) and finds the first node whose output diverges, with the ``--nodes_to_exclude`` pattern that
would keep it in high precision. Both run through the reference runner in bounded memory. The implementations are
imported on first use, so ``python -m onnxprec.debug`` can print ``--help`` without loading the runtime.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from onnxprec._exports import lazy_exports

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


__getattr__, __dir__ = lazy_exports(__name__, __all__, "onnxprec.debug.compare", _HOMES)
