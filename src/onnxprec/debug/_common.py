"""What dump and compare share: models named and typed as AutoCast sees them, and topology."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import onnx_ir as ir

from onnxprec._io import ModelSource, load_model
from onnxprec.errors import ModelLoadError
from onnxprec.passes import InferTypesPass, NameNodesPass

__all__ = [
    "UNFETCHABLE",
    "depths",
    "fetchable",
    "model_path",
    "prepare",
]

logger = logging.getLogger(__name__)

# Element types ONNX Runtime's Python API cannot return as arrays (packed sub-byte types).
UNFETCHABLE = frozenset(
    t
    for t in (getattr(ir.DataType, name, None) for name in ("INT4", "UINT4", "INT2", "UINT2", "FLOAT4E2M1"))
    if t is not None
)


def fetchable(value: ir.Value) -> bool:
    """Whether ONNX Runtime can hand ``value`` back as an array (a tensor, not of a packed 4-bit type)."""
    if value.type is not None and not isinstance(value.type, ir.TensorType):
        return False  # a sequence, an optional or a map
    return value.dtype not in UNFETCHABLE


def model_path(source: ModelSource) -> Path | None:
    """The file of a model given as a path (None for in-memory models)."""
    return Path(source) if isinstance(source, (str, os.PathLike)) else None


def prepare(source: ModelSource, role: str | None = None) -> ir.Model:
    """Loads a model and names and types it as AutoCast does, so that node names match its ``nodes_to_exclude``.

    Unnamed nodes get AutoCast's names (``NameNodesPass``: ``<OpType>``, ``<OpType>_1``...) and values of unknown
    type get inferred types. A path or ModelProto is loaded into a new model; an ``ir.Model`` is annotated in
    place (names and types only). ``role`` ("reference", "candidate") names a model given as a positional argument
    in the error for a missing file (without it, the error names ``--onnx_path``).
    """
    path = model_path(source)
    if role is not None and path is not None and not path.exists():
        raise ModelLoadError(f"The {role} model '{path}' does not exist: check the path.")
    model = load_model(source)
    names = [node.name for node in model.graph.all_nodes()]
    if not all(names) or len(set(names)) != len(names):
        NameNodesPass()(model)
    if any(out.dtype is None for node in model.graph for out in node.outputs):
        InferTypesPass()(model)
    return model


def depths(graph: ir.Graph) -> dict[ir.Node, int]:
    """Each node's depth: 1 + the largest depth of the nodes producing its inputs (graph inputs are at 0)."""
    result: dict[ir.Node, int] = {}
    for node in graph:
        deepest = 0
        for value in node.inputs:
            producer = value.producer() if value is not None else None
            if producer is not None:
                deepest = max(deepest, result.get(producer, 0))
        result[node] = deepest + 1
    return result
