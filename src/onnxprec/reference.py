"""Reference runs: ONNX Runtime on calibration batches -> streaming per-tensor statistics.

Only running statistics are kept per tensor (absmax, min, max, dtype, first shape), never the tensors of
all batches. Intermediate tensors are marked as graph outputs in chunks whose estimated size stays under
a memory budget, so a large model's activations never all sit in memory at once.
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx_ir as ir

from onnxprec._graph import FLOAT_TYPES
from onnxprec._io import total_initializer_bytes
from onnxprec._protobuf import write_streaming
from onnxprec._tensors import release
from onnxprec.errors import CalibrationDataError, InvalidArgumentError, UnsupportedModelError

__all__ = [
    "ReferenceResult",
    "TensorStats",
    "ort_providers",
    "run_reference",
]

logger = logging.getLogger(__name__)

_IN_MEMORY_LIMIT = 256 * 1024 * 1024  # below this, hand ORT the serialized bytes instead of temp files
DEFAULT_BUDGET_BYTES = 768 * 1024 * 1024


@dataclass
class TensorStats:
    """Running statistics of one tensor over all batches (ModelOpt's ``TensorStats`` fields)."""

    absmax: float
    min: float
    max: float
    shape: tuple[int, ...]
    dtype: np.dtype
    batches: int = 1

    @classmethod
    def of(cls, array: np.ndarray) -> TensorStats:
        lo, hi = _min_max(array)
        return cls(max(abs(lo), abs(hi)), lo, hi, tuple(array.shape), array.dtype)

    def update(self, array: np.ndarray) -> None:
        lo, hi = _min_max(array)
        self.min, self.max = min(self.min, lo), max(self.max, hi)
        self.absmax = max(self.absmax, abs(lo), abs(hi))
        self.batches += 1

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def is_float(self) -> bool:
        return bool(np.issubdtype(self.dtype, np.floating))


def _min_max(array: np.ndarray) -> tuple[float, float]:
    if array.size == 0 or not (np.issubdtype(array.dtype, np.number) or array.dtype == np.bool_):
        return 0.0, 0.0
    if np.issubdtype(array.dtype, np.floating) and np.isnan(array).any():
        return -math.inf, math.inf  # NaN in FP32 already: treat as unbounded
    return float(array.min()), float(array.max())


@dataclass
class ReferenceResult:
    """What a reference run leaves behind: statistics by tensor name, and the first batch for validation."""

    stats: dict[str, TensorStats]
    first_feeds: dict[str, np.ndarray]
    first_outputs: dict[str, np.ndarray] = field(default_factory=dict)
    num_batches: int = 1


_PROVIDERS = {
    "cpu": "CPUExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "trt": "TensorrtExecutionProvider",
    "dml": "DmlExecutionProvider",
}


def ort_providers(providers: Sequence[str] | None) -> list:
    """Maps ModelOpt-style provider names (``cpu``, ``cuda:0``, ``trt``, ``dml``) to ONNX Runtime's."""
    import onnxruntime as ort

    available = set(ort.get_available_providers())
    result: list = []
    for item in providers or ["cpu"]:
        kind, _, device = item.lower().partition(":")
        if kind not in _PROVIDERS:
            raise InvalidArgumentError(
                f"Unknown provider '{item}': use cpu, cuda[:N], trt or dml (e.g. --providers cuda:0 cpu)."
            )
        name = _PROVIDERS[kind]
        if name not in available:
            raise InvalidArgumentError(
                f"Provider '{item}' ({name}) is not available in this onnxruntime build "
                f"(available: {sorted(available)}); install onnxruntime-gpu or use --providers cpu."
            )
        result.append((name, {"device_id": int(device)}) if device else name)
    if "CPUExecutionProvider" not in [p if isinstance(p, str) else p[0] for p in result]:
        result.append("CPUExecutionProvider")
    return result


def _session_options() -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    # Keep every marked tensor as the model computes it: only the basic, semantics-preserving rewrites.
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    return options


def _concrete_sizes(model: ir.Model, feeds: dict[str, np.ndarray]) -> dict[str, int]:
    """Byte sizes of intermediate tensors from ONNX shape inference with the inputs' concrete shapes."""
    import onnx
    from onnx_ir.passes.common import _c_api_utils

    def infer(proto: onnx.ModelProto) -> dict[str, int]:
        for inp in proto.graph.input:
            array = feeds.get(inp.name)
            if array is None or not inp.type.HasField("tensor_type"):
                continue
            shape = inp.type.tensor_type.shape
            shape.ClearField("dim")
            for size in np.asarray(array).shape:
                shape.dim.add().dim_value = int(size)
        inferred = onnx.shape_inference.infer_shapes(proto, data_prop=True)
        sizes = {}
        for info in inferred.graph.value_info:
            tensor_type = info.type.tensor_type
            dims = [d.dim_value if d.HasField("dim_value") else -1 for d in tensor_type.shape.dim]
            if tensor_type.HasField("shape") and all(d >= 0 for d in dims) and tensor_type.elem_type:
                itemsize = onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type).itemsize
                sizes[info.name] = math.prod(dims) * itemsize
        return sizes

    try:
        return _c_api_utils.call_onnx_api(infer, model)
    except Exception as e:  # inference is only an estimate here; fall back to the heuristic
        logger.debug("Concrete shape inference failed: %s", e)
        return {}


def _estimated_sizes(model: ir.Model, feeds: dict[str, np.ndarray]) -> dict[str, int]:
    """Byte size of every main-graph tensor: concrete shape inference, else the largest activation input.

    Shapes that inference cannot make concrete (e.g. after a Pad whose pads are computed) are estimated
    as the largest non-constant input of their producer: right within a small factor for the elementwise,
    convolution and matmul chains that make up real models, which is all the chunking needs.
    """
    sizes = _concrete_sizes(model, feeds)
    for name, array in feeds.items():
        sizes[name] = int(np.asarray(array).nbytes)
    default = max(sizes.values(), default=4)
    for node in model.graph:
        inputs = [sizes.get(str(v.name), 0) for v in node.inputs if v is not None and not v.is_initializer()]
        estimate = max(inputs, default=0) or default
        for out in node.outputs:
            sizes.setdefault(str(out.name), estimate)
    return sizes


def _chunks(values: list[ir.Value], sizes: dict[str, int], budget: int) -> list[list[ir.Value]]:
    chunks: list[list[ir.Value]] = [[]]
    used = 0
    for value in values:
        size = sizes.get(str(value.name), 0)
        if chunks[-1] and used + size > budget:
            chunks.append([])
            used = 0
        chunks[-1].append(value)
        used += size
    return chunks


def _values_to_mark(model: ir.Model) -> list[ir.Value]:
    outputs = set(model.graph.outputs)
    marked = []
    for node in model.graph:
        for out in node.outputs:
            if not out.name or out in outputs:
                continue
            if out.dtype is None or out.dtype in FLOAT_TYPES:
                marked.append(out)
    return marked


@contextlib.contextmanager
def _model_factory(model: ir.Model) -> Iterator[Callable[[list[str]], object]]:
    """Yields ``make(output_names) -> path or bytes`` for ORT, writing the weights at most once."""
    if total_initializer_bytes(model) < _IN_MEMORY_LIMIT:
        original = list(model.graph.outputs)
        by_name = ir.convenience.create_value_mapping(model.graph)

        def make_bytes(names: list[str]) -> object:
            try:
                model.graph.outputs.extend(by_name[n] for n in names)
                buffer = io.BytesIO()
                write_streaming(model, buffer)  # inlines weights mapped from the model file
                return buffer.getvalue()
            finally:
                model.graph.outputs[:] = original

        yield make_bytes
        return
    with tempfile.TemporaryDirectory(prefix="onnxprec-ref-") as tmp:
        base = Path(tmp) / "base.onnx"
        ir.save(model, base, external_data="weights.data", size_threshold_bytes=1024)
        for value in model.graph.initializers.values():  # unmap the source pages the copy touched
            if value.const_value is not None:
                release(value.const_value)
        copy = ir.load(base)
        original = list(copy.graph.outputs)
        by_name = ir.convenience.create_value_mapping(copy.graph)

        def make_file(names: list[str]) -> object:
            copy.graph.outputs[:] = original + [by_name[n] for n in names]
            path = Path(tmp) / "marked.onnx"
            ir.save(copy, path)
            return str(path)

        yield make_file


def run_reference(
    model: ir.Model,
    batches: Sequence[dict[str, np.ndarray]],
    *,
    providers: Sequence[str] | None = None,
    budget_bytes: int = DEFAULT_BUDGET_BYTES,
) -> ReferenceResult:
    """Runs ``model`` on every batch and returns running statistics for every float tensor of the main graph.

    Raises:
        UnsupportedModelError: ONNX Runtime cannot load the model.
        CalibrationDataError: ONNX Runtime fails on the given inputs.
    """
    import onnxruntime as ort

    provider_list = ort_providers(providers)
    marked = _values_to_mark(model)
    chunks = _chunks(marked, _estimated_sizes(model, batches[0]), budget_bytes)
    graph_outputs = [str(v.name) for v in model.graph.outputs]
    stats: dict[str, TensorStats] = {}
    first_outputs: dict[str, np.ndarray] = {}
    for batch in batches:
        for name, array in batch.items():
            _record(stats, name, array)
    from tqdm.auto import tqdm

    with _model_factory(model) as make:
        progress = tqdm(total=len(chunks) * len(batches), desc="Reference run", disable=None, leave=False)
        for chunk_index, chunk in enumerate(chunks):
            names = [str(v.name) for v in chunk]
            try:
                session = ort.InferenceSession(make(names), _session_options(), providers=provider_list)
            except Exception as e:
                raise UnsupportedModelError(
                    f"ONNX Runtime cannot load the model for the reference run ({_first_line(e)}); "
                    "skip the reference run with --data_max inf, or use a provider that supports its ops."
                ) from None
            fetch = graph_outputs + names if chunk_index == 0 else names
            for i, batch in enumerate(batches):
                try:
                    results = session.run(fetch, batch)
                except Exception as e:
                    raise CalibrationDataError(
                        f"ONNX Runtime failed to run the model on calibration batch {i} ({_first_line(e)}); "
                        "check the input shapes or pass real inputs with --calibration_data."
                    ) from None
                for name, array in zip(fetch, results):
                    _record(stats, name, array)
                    if chunk_index == 0 and i == 0 and name in graph_outputs:
                        first_outputs[name] = array
                del results
                progress.update()
            del session
        progress.close()
    logger.info("Reference run: %d tensors over %d batch(es) in %d chunk(s)", len(stats), len(batches), len(chunks))
    return ReferenceResult(stats, dict(batches[0]), first_outputs, len(batches))


def _record(stats: dict[str, TensorStats], name: str, array: np.ndarray) -> None:
    array = np.asarray(array)
    current = stats.get(name)
    if current is None:
        stats[name] = TensorStats.of(array)
    else:
        current.update(array)


def _first_line(error: BaseException) -> str:
    lines = [ln for ln in str(error).strip().splitlines() if ln.strip()]
    text = lines[0] if lines else type(error).__name__
    return text[:300]
