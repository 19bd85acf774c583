"""Helpers for tests: tiny hand-built models, ORT runs (through :mod:`onnxprec._ort`), and ../shared data."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnxprec._ort import create_session

__all__ = ["SHARED", "make_model", "run", "shared_path", "tensor_info"]

F = TensorProto.FLOAT
F16 = TensorProto.FLOAT16
BF16 = TensorProto.BFLOAT16

# ../shared beside the project root (tests skip when it is absent, e.g. on a fresh clone)
SHARED = Path(os.environ.get("ONNXPREC_SHARED", Path(__file__).resolve().parents[3] / "shared"))


def shared_path(*parts: str) -> Path | None:
    """A path under ../shared, or None when it does not exist."""
    path = SHARED.joinpath(*parts)
    return path if path.exists() else None


def tensor_info(name: str, elem_type: int = F, shape: Sequence[int | str | None] | None = None) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem_type, shape)


def make_model(
    nodes: Sequence[onnx.NodeProto],
    inputs: Sequence[onnx.ValueInfoProto],
    outputs: Sequence[onnx.ValueInfoProto],
    initializers: dict[str, np.ndarray] | None = None,
    *,
    opset: int = 17,
    extra_opsets: dict[str, int] | None = None,
    ir_version: int = 8,
) -> onnx.ModelProto:
    """A checked model from nodes and numpy initializers."""
    inits = [numpy_helper.from_array(np.asarray(v), name=k) for k, v in (initializers or {}).items()]
    graph = helper.make_graph(list(nodes), "test", list(inputs), list(outputs), inits)
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in (extra_opsets or {}).items()]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = ir_version
    return model


def run(model: onnx.ModelProto | str | Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Runs a model on ONNX Runtime CPU (default optimizations); float inputs are cast to the model's input
    types, and BF16/FP8 outputs come back as ml_dtypes arrays (see :class:`onnxprec._ort.Session`)."""
    return create_session(model, optimization="all", what="the test model").run(feeds)
