"""The runtime layer: ONNX Runtime providers, sessions and feeds/fetches of every float type.

Every ONNX Runtime session in onnxprec is created here. :func:`create_session` takes an ``ir.Model`` (its
memory-mapped weights are handed to ONNX Runtime by file reference, never copied through Python), a path, or
serialized bytes; :class:`Session` feeds and fetches FP32, FP16, BF16 and FP8 tensors alike (numpy has no BF16
or FP8 dtype, so those travel as ``ml_dtypes`` arrays through OrtValues).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import importlib
import importlib.metadata
import logging
import os
import re
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import ml_dtypes
import numpy as np
import onnx
import onnx_ir as ir

from onnxprec._graph import all_graphs
from onnxprec._ops import (
    FloatContract,
    contrib_float_contract,
    float_contract_of_schema,
    is_ort_onnx_domain_op,
    normalized_domain,
)
from onnxprec.errors import InvalidArgumentError, UnsupportedModelError

__all__ = [
    "Optimization",
    "Session",
    "create_session",
    "first_line",
    "float_contract",
    "float_to_fp16",
    "import_onnxruntime",
    "is_kernel_gap",
    "lacks_kernels",
    "model_proto",
    "ort_model",
    "resolve_providers",
    "session_weight_bytes",
]

logger = logging.getLogger(__name__)

Optimization = Literal["none", "basic", "all"]

PROVIDER_NAMES = {
    "cpu": "CPUExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "trt": "TensorrtExecutionProvider",
    "dml": "DmlExecutionProvider",
}

# ONNX element types numpy cannot hold natively: they are fed and fetched as ml_dtypes arrays.
_ML_DTYPES: dict[int, np.dtype[Any]] = {
    onnx.TensorProto.BFLOAT16: np.dtype(ml_dtypes.bfloat16),
    onnx.TensorProto.FLOAT8E4M3FN: np.dtype(ml_dtypes.float8_e4m3fn),
    onnx.TensorProto.FLOAT8E4M3FNUZ: np.dtype(ml_dtypes.float8_e4m3fnuz),
    onnx.TensorProto.FLOAT8E5M2: np.dtype(ml_dtypes.float8_e5m2),
    onnx.TensorProto.FLOAT8E5M2FNUZ: np.dtype(ml_dtypes.float8_e5m2fnuz),
}
_TYPE_STRINGS: dict[str, np.dtype[Any]] = {
    "tensor(float)": np.dtype(np.float32),
    "tensor(float16)": np.dtype(np.float16),
    "tensor(double)": np.dtype(np.float64),
    "tensor(bfloat16)": _ML_DTYPES[onnx.TensorProto.BFLOAT16],
    "tensor(float8e4m3fn)": _ML_DTYPES[onnx.TensorProto.FLOAT8E4M3FN],
    "tensor(float8e4m3fnuz)": _ML_DTYPES[onnx.TensorProto.FLOAT8E4M3FNUZ],
    "tensor(float8e5m2)": _ML_DTYPES[onnx.TensorProto.FLOAT8E5M2],
    "tensor(float8e5m2fnuz)": _ML_DTYPES[onnx.TensorProto.FLOAT8E5M2FNUZ],
}
_ONNX_TYPE_OF = {dtype: code for code, dtype in _ML_DTYPES.items()}

# In-memory weights up to this size are embedded in the serialized model; larger ones go to a temp file.
_INLINE_LIMIT = 256 * 1024 * 1024


def first_line(error: BaseException, limit: int = 300) -> str:
    """The first non-empty line of an exception's message (ONNX Runtime's are long and multi-line)."""
    lines = [ln.strip() for ln in str(error).strip().splitlines() if ln.strip()]
    text = lines[0] if lines else type(error).__name__
    return text[:limit]


def import_onnxruntime() -> Any:
    """Imports onnxruntime, with a clear message when it is missing or when two builds share its folder (checked
    once per process: the look-up of the installed builds costs tens of milliseconds, and every session asks)."""
    checked = getattr(import_onnxruntime, "checked", None)
    if checked is not None:
        return checked
    installed = []
    for dist in ("onnxruntime", "onnxruntime-gpu", "onnxruntime-directml", "onnxruntime-openvino"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            installed.append(f"{dist}=={importlib.metadata.version(dist)}")
    try:
        ort = importlib.import_module("onnxruntime")
    except ImportError:
        raise UnsupportedModelError(
            "onnxruntime is not installed: pip install onnxprec[cpu] (or onnxprec[gpu] for CUDA)."
        ) from None
    if len(installed) > 1 and not hasattr(ort, "InferenceSession"):
        raise UnsupportedModelError(
            f"Several ONNX Runtime builds are installed ({', '.join(installed)}) and overwrote each other: "
            "pip uninstall them all, then install exactly one (onnxprec[cpu] or onnxprec[gpu])."
        )
    if len(installed) > 1 and not getattr(import_onnxruntime, "warned", False):
        import_onnxruntime.warned = True  # type: ignore[attr-defined]
        logger.warning(
            "Several ONNX Runtime builds are installed (%s); they share one package folder and the last one "
            "installed wins: keep exactly one (onnxprec[cpu] or onnxprec[gpu]).",
            ", ".join(installed),
        )
    ort.set_default_logger_severity(4)  # errors reach the user as exceptions, not as log lines
    import_onnxruntime.checked = ort  # type: ignore[attr-defined]
    return ort


@functools.lru_cache(maxsize=1)
def _contrib_schemas() -> dict[tuple[str, str], list[tuple[int, FloatContract | None]]]:
    """ONNX Runtime's own op schemas (contrib ops, in com.microsoft or the ONNX domain): (domain, op) ->
    [(since_version, float contract)] in version order; empty when onnxruntime is not installed."""
    try:
        state = importlib.import_module("onnxruntime.capi.onnxruntime_pybind11_state")
        schemas = state.get_all_operator_schema()
    except (ImportError, AttributeError):
        return {}
    found: dict[tuple[str, str], list[tuple[int, FloatContract | None]]] = {}
    for schema in sorted(schemas, key=lambda s: s.since_version):
        domain = normalized_domain(schema.domain)
        if domain in ("", "ai.onnx.ml") and onnx.defs.has(schema.name, schema.since_version, domain):
            continue  # ONNX's own op: ONNX's schema covers it
        contract = float_contract_of_schema(
            [p.typeStr for p in schema.inputs],
            [p.typeStr for p in schema.outputs],
            {c.type_param_str: list(c.allowed_type_strs) for c in schema.type_constraints},
        )
        found.setdefault((domain, schema.name), []).append((schema.since_version, contract))
    return found


def float_contract(node: ir.Node, opset: int) -> FloatContract | None:
    """How the float slots of an ONNX Runtime contrib op follow its precision, or None (not ORT's, no low type).

    The common LLM ops come from :data:`onnxprec._ops.CONTRIB_FLOAT_CONTRACTS`; any other op of ORT's (in
    ``com.microsoft``, or registered in the ONNX domain) from the installed onnxruntime's schema of the op.

    Args:
        node: The node.
        opset: The model's opset of the node's domain.
    """
    known = contrib_float_contract(node, opset)
    if known is not None:
        return known
    domain = normalized_domain(node.domain)
    if domain == "" and not is_ort_onnx_domain_op(node.op_type, domain, opset):
        return None
    versions = [c for since, c in _contrib_schemas().get((domain, node.op_type), []) if since <= opset]
    return versions[-1] if versions else None


# ORT 1.31's CUDA session names a node no provider has a kernel for this way (its op type is the only handle on a
# node it names '', e.g. one of an op expanded into its function body).
NO_PROVIDER = re.compile(r"Provider type for (\w+) node with name '[^']*' is not set")


def is_kernel_gap(error: str) -> bool:
    """Whether ONNX Runtime's error says it has no kernel for a node (it typed the graph, then found no provider to
    run a node: a BF16 op on the CPU; ORT names a node of an op expanded into its function body '')."""
    return "NOT_IMPLEMENTED" in error or "Could not find an implementation" in error or bool(NO_PROVIDER.search(error))


def lacks_kernels(
    nodes: Sequence[tuple[ir.Node, frozenset[int], frozenset[int]]],
    opsets: Mapping[str, int],
    dtype: ir.DataType,
    provider: str,
) -> set[ir.Node]:
    """The nodes ONNX Runtime cannot run with their float slots in ``dtype`` on ``provider`` (``cuda``...), the CPU
    provider being its fallback: each distinct op signature is probed once, as a one-node model in a session.

    Each entry is a node with the input and output slots that stay FP32 (the others of type FLOAT become
    ``dtype``). A probe that fails for any other reason than a missing kernel (a synthetic one-node model ORT cannot
    type, say) tells nothing, and its nodes are not returned. ORT's kernel registry would say the same without
    sessions, but reading it (``get_all_opkernel_def``) crashes onnxruntime-gpu 1.31 when TensorRT is not installed.
    ORT expands a few ops without a kernel into their ONNX function body (BF16 Clip on CUDA into Less, Where...):
    the probe runs what ORT runs, so such an op lacks a kernel exactly when its body does.
    """
    ort = import_onnxruntime()
    options = ort.SessionOptions()
    options.log_severity_level = 4
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    providers = resolve_providers([provider])
    results: dict[tuple[Any, ...], bool] = {}
    lacking: set[ir.Node] = set()
    for node, fp32_inputs, fp32_outputs in nodes:
        probe = _probe_model(node, opsets, dtype, fp32_inputs, fp32_outputs)
        if probe is None:
            continue
        key, model = probe
        if key not in results:
            try:
                ort.InferenceSession(model.SerializeToString(), options, providers=providers)
                results[key] = False
            except Exception as e:  # ORT raises its own exception types
                results[key] = is_kernel_gap(str(e))
                logger.debug("Kernel probe of %s: %s", key[:2], first_line(e))
        if results[key]:
            lacking.add(node)
    return lacking


def _probe_model(
    node: ir.Node,
    opsets: Mapping[str, int],
    dtype: ir.DataType,
    fp32_inputs: frozenset[int],
    fp32_outputs: frozenset[int],
) -> tuple[tuple[Any, ...], onnx.ModelProto] | None:
    """A model of ``node`` alone, its FLOAT slots (but the FP32 ones) in ``dtype``, and the key of its signature;
    None for nodes a lone copy cannot stand for (subgraphs, non-tensor or untyped values)."""
    if any(a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS) for a in node.attributes.values()):
        return None

    def types(values: Sequence[ir.Value | None], kept: frozenset[int]) -> list[int | None] | None:
        found: list[int | None] = []
        for i, value in enumerate(values):
            if value is None:
                found.append(None)
                continue
            if not isinstance(value.type, ir.TensorType) or value.dtype is None:
                return None
            low = value.dtype == ir.DataType.FLOAT and i not in kept
            found.append(int(dtype if low else value.dtype))
        return found

    ins, outs = types(node.inputs, fp32_inputs), types(node.outputs, fp32_outputs)
    if ins is None or outs is None:
        return None
    proto = ir.serde.serialize_node(node)
    attributes = tuple(sorted(a.SerializeToString() for a in proto.attribute))
    key = (normalized_domain(node.domain), node.op_type, tuple(ins), tuple(outs), attributes)
    del proto.input[:], proto.output[:]
    proto.input.extend(f"i{i}" if t is not None else "" for i, t in enumerate(ins))
    proto.output.extend(f"o{i}" if t is not None else "" for i, t in enumerate(outs))
    graph = onnx.helper.make_graph(
        [proto],
        "probe",
        [onnx.helper.make_tensor_value_info(f"i{i}", t, None) for i, t in enumerate(ins) if t is not None],
        [onnx.helper.make_tensor_value_info(f"o{i}", t, None) for i, t in enumerate(outs) if t is not None],
    )
    imports = [onnx.helper.make_opsetid(d, v) for d, v in opsets.items()]
    model = onnx.helper.make_model(graph, opset_imports=imports, ir_version=10)
    return key, model


def resolve_providers(names: Sequence[str] | None = None, *, trt_plugins: Sequence[str] = ()) -> list[Any]:
    """ONNX Runtime providers from ModelOpt-style names: ``cpu``, ``cuda[:N]``, ``trt[:N]``, ``dml[:N]``.

    The CPU provider is always appended as the fallback. TensorRT plugin libraries are passed to the
    TensorRT provider (``trt_extra_plugin_lib_paths``).

    Raises:
        InvalidArgumentError: An unknown name, or a provider this onnxruntime build does not have.
    """
    ort = import_onnxruntime()
    available = set(ort.get_available_providers())
    result: list[Any] = []
    for item in names or ["cpu"]:
        kind, _, device = str(item).lower().partition(":")
        if kind not in PROVIDER_NAMES or (device and not device.isdigit()):
            raise InvalidArgumentError(
                f"Unknown provider '{item}': use cpu, cuda[:N], trt[:N] or dml[:N] (e.g. --providers cuda:0 cpu)."
            )
        name = PROVIDER_NAMES[kind]
        if name not in available:
            raise InvalidArgumentError(
                f"Provider '{item}' ({name}) is not available in this onnxruntime build "
                f"(available: {sorted(available)}); install onnxprec[gpu] or use cpu."
            )
        options: dict[str, str] = {}
        if device:
            options["device_id"] = device
        if kind == "trt" and trt_plugins:
            options["trt_extra_plugin_lib_paths"] = ";".join(str(Path(p).resolve()) for p in trt_plugins)
        result.append((name, options) if options else name)
    if "CPUExecutionProvider" not in [p if isinstance(p, str) else p[0] for p in result]:
        result.append("CPUExecutionProvider")
    return result


def float_to_fp16(source: np.ndarray, out: np.ndarray) -> None:
    """Converts the float32 values of ``source`` into the float16 array ``out`` (both C-contiguous, same size) with
    ONNX Runtime's Cast kernel: round to nearest even like numpy's ``astype``, in hardware, tens of times faster.

    Finite results equal numpy's bit for bit; where numpy's would be inf or NaN this one may differ (NaN payloads),
    so callers redo those values (:func:`onnxprec._tensors.cast_array` does).
    """
    if source.dtype != np.float32 or out.dtype != np.float16 or source.size != out.size:
        raise ValueError(f"float_to_fp16 takes float32 into float16 of one size, not {source.dtype} into {out.dtype}")
    if not (source.flags.c_contiguous and out.flags.c_contiguous and out.flags.writeable):
        raise ValueError("float_to_fp16 takes C-contiguous arrays (and a writable output)")
    if not source.size:
        return
    session = _cast_session()
    binding = session.io_binding()
    binding.bind_input("x", "cpu", 0, np.float32, [source.size], source.ctypes.data)
    binding.bind_output("y", "cpu", 0, np.float16, [out.size], out.ctypes.data)
    session.run_with_iobinding(binding)


@functools.cache
def _cast_session() -> Any:
    """The one-node session of :func:`float_to_fp16` (a float32 vector cast to float16), made once."""
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Cast", ["x"], ["y"], to=onnx.TensorProto.FLOAT16)],
        "float_to_fp16",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n"])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT16, ["n"])],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 19)], ir_version=9)
    ort = import_onnxruntime()
    return ort.InferenceSession(model.SerializeToString(), session_options("none"), providers=["CPUExecutionProvider"])


DEVICE_SESSION_BYTES = 1024 * 1024 * 1024
"""Weights per session of a segmented run on a device provider, where a session costs seconds whatever its size (the
provider's handles, the weights copied to the device): about one decoder layer of an 8B model in FP32 (832 MiB)."""


def session_weight_bytes(providers: Sequence[str] | None, cpu_bytes: int) -> int:
    """Weights per session of a run cut into segments on ModelOpt-style ``providers``: ``cpu_bytes`` when the first is
    the CPU (or none is given), :data:`DEVICE_SESSION_BYTES` on a device (``cuda``, ``trt``, ``dml``)."""
    first = str(providers[0]).lower().partition(":")[0] if providers else "cpu"
    return cpu_bytes if first == "cpu" else DEVICE_SESSION_BYTES


def session_options(
    optimization: Optimization = "basic",
    *,
    low_memory: bool = False,
    prepacking: bool | None = None,
    custom_op_libraries: Sequence[str] = (),
    spinning: bool = True,
) -> Any:
    """Session options: quiet logs, the graph optimization level, and optional memory savings.

    Args:
        optimization: ``none`` where numerics are compared (no ORT rewrites, no folded weight copies),
            ``basic`` for reference runs (semantics-preserving rewrites only), ``all`` for latency.
        low_memory: Do not pre-pack weights (pre-packing keeps a second copy of every MatMul weight) and
            execute nodes in list order, so that observed activations are freed early.
        prepacking: Pre-pack weights (None: unless ``low_memory``). MatMulNBits without its pre-packed weight
            dequantizes the whole weight to float32 on each run: a quantized model runs in less memory with it.
        custom_op_libraries: Shared libraries with custom op kernels to register.
        spinning: Let idle intra-op threads spin between kernels (lower latency; off, a run of many kernels takes
            fewer CPU seconds when other processes share the cores).
    """
    ort = import_onnxruntime()
    options = ort.SessionOptions()
    if not spinning:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 4  # errors come as exceptions (one line each), not as log lines
    options.graph_optimization_level = {
        "none": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }[optimization]
    if low_memory if prepacking is None else not prepacking:
        options.add_session_config_entry("session.disable_prepacking", "1")
    if low_memory:
        # Kahn order over the node list: a tensor's consumers run soon after it (the default reverse-DFS
        # order can keep every observed activation alive until the end of the run).
        options.execution_order = ort.ExecutionOrder.PRIORITY_BASED
    for library in custom_op_libraries:
        if not Path(library).is_file():
            raise InvalidArgumentError(f"Custom op library '{library}' does not exist: check --custom_op_lib.")
        options.register_custom_ops_library(str(library))
    return options


class Session:
    """An ONNX Runtime session that feeds and fetches every float type, BF16 and FP8 included."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.input_types = {i.name: i.type for i in inner.get_inputs()}
        self.output_types = {o.name: o.type for o in inner.get_outputs()}
        self.output_names = [o.name for o in inner.get_outputs()]
        special = {t for t in (*self.input_types.values(), *self.output_types.values()) if _is_special(t)}
        self._bind = bool(special)

    def feeds(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Casts float feeds to the element types the model declares (e.g. FP32 data into an FP16 input)."""
        result = {}
        for name, array in feeds.items():
            if array is None or isinstance(array, list):  # an optional or a sequence: ONNX Runtime takes it as is
                result[name] = array
                continue
            array = np.asarray(array)
            wanted = _TYPE_STRINGS.get(self.input_types.get(name, ""))
            if wanted is not None and array.dtype != wanted and _is_float(array.dtype):
                array = array.astype(wanted)
            result[name] = array
        return result

    def run(self, feeds: Mapping[str, np.ndarray], fetches: Sequence[str] | None = None) -> list[Any]:
        """Runs the model; returns the fetched outputs (all by default) as numpy / ml_dtypes arrays."""
        names = list(fetches) if fetches is not None else self.output_names
        prepared = self.feeds(feeds)
        if not self._bind:
            return self.inner.run(names, prepared)
        return self._run_bound(prepared, names)

    def _run_bound(self, feeds: dict[str, np.ndarray], names: list[str]) -> list[Any]:
        ort = import_onnxruntime()
        binding = self.inner.io_binding()
        for name, array in feeds.items():
            code = _ONNX_TYPE_OF.get(array.dtype)
            if code is None:
                binding.bind_cpu_input(name, np.ascontiguousarray(array))
            else:
                raw = np.ascontiguousarray(array).view(np.uint16 if array.dtype.itemsize == 2 else np.uint8)
                binding.bind_ortvalue_input(
                    name, ort.OrtValue.ortvalue_from_numpy_with_onnx_type(raw, onnx_element_type=code)
                )
        for name in names:
            binding.bind_output(name, "cpu")
        self.inner.run_with_iobinding(binding)
        return [_to_numpy(value) for value in binding.get_outputs()]


def _is_float(dtype: np.dtype) -> bool:
    return bool(np.issubdtype(dtype, np.floating)) or dtype in _ONNX_TYPE_OF


def _is_special(type_string: str) -> bool:
    dtype = _TYPE_STRINGS.get(type_string)
    return dtype is not None and dtype in _ONNX_TYPE_OF


def _to_numpy(value: Any) -> Any:
    """An OrtValue on the CPU as a numpy array; BF16/FP8 as ml_dtypes arrays (copied out of ORT's buffer)."""
    type_string = value.data_type()
    dtype = _TYPE_STRINGS.get(type_string)
    if dtype is None or dtype not in _ONNX_TYPE_OF:
        return value.numpy()
    shape = tuple(value.shape())
    count = int(np.prod(shape, dtype=np.int64))
    out = np.empty(shape, dtype=dtype)
    if count:
        ctypes.memmove(out.ctypes.data, value.data_ptr(), count * dtype.itemsize)
    return out


# --------------------------------------------------------------------------------------------------
# Sessions from a model in memory, a path or bytes


def _external_base_dir(model: ir.Model) -> tuple[Path | None, int]:
    """The one folder the model's external tensors live in (None if there are none) and in-memory bytes."""
    folders: set[Path] = set()
    in_memory = 0
    for graph in all_graphs(model.graph):
        for value in graph.initializers.values():
            tensor = value.const_value
            if isinstance(tensor, ir.ExternalTensor):
                folders.add(Path(tensor.base_dir).resolve())
            elif tensor is not None:
                in_memory += tensor.nbytes
    if len(folders) > 1:
        return None, -1  # mixed folders: the caller writes a temporary copy
    return (folders.pop() if folders else None), in_memory


@contextlib.contextmanager
def ort_model(model: ir.Model) -> Iterator[tuple[bytes | str, Path | None]]:
    """Yields ``(bytes or path, external data folder)`` for ONNX Runtime without copying mapped weights.

    Weights memory-mapped from files stay file references: ONNX Runtime maps the same files itself
    (``session.model_external_initializers_file_folder_path``), so no second copy is made in this process.
    In-memory weights are embedded when small; otherwise they are written once to a temporary file.
    """
    folder, in_memory = _external_base_dir(model)
    if 0 <= in_memory < _INLINE_LIMIT:
        yield ir.serde.serialize_model(model).SerializeToString(), folder
        return
    with tempfile.TemporaryDirectory(prefix="onnxprec-ort-") as tmp:
        path = Path(tmp) / "model.onnx"
        ir.save(model, path, external_data="model.onnx.data", size_threshold_bytes=1024)  # model unchanged
        yield str(path), None


def model_proto(payload: bytes | str) -> onnx.ModelProto:
    """The message of what :func:`ort_model` yields (bytes, or a path whose weights stay file references)."""
    if isinstance(payload, bytes):
        proto = onnx.ModelProto()
        proto.ParseFromString(payload)
        return proto
    return onnx.load(payload, load_external_data=False)


def create_session(
    source: ir.Model | onnx.ModelProto | str | os.PathLike | bytes,
    *,
    providers: Sequence[str] | None = None,
    optimization: Optimization = "basic",
    low_memory: bool = False,
    prepacking: bool | None = None,
    trt_plugins: Sequence[str] = (),
    custom_op_libraries: Sequence[str] = (),
    what: str = "the model",
    external_data_folder: str | os.PathLike | None = None,
    optimized_model_path: str | os.PathLike | None = None,
    profile_prefix: str | os.PathLike | None = None,
    spinning: bool = True,
) -> Session:
    """Creates a session on ``providers`` (ModelOpt-style names, default cpu).

    Args:
        source: An ``ir.Model`` (mapped weights are passed by file reference), a ModelProto, a path or bytes.
        providers: ``cpu``, ``cuda:N``, ``trt``, ``dml``; the CPU provider is always the fallback.
        optimization: ``none``, ``basic`` or ``all`` (see :func:`session_options`).
        low_memory: Skip weight pre-packing (reference runs on large models).
        prepacking: Pre-pack weights whatever ``low_memory`` says (None: as it says; see :func:`session_options`).
        trt_plugins: TensorRT plugin libraries for the TensorRT provider.
        custom_op_libraries: Custom op libraries registered on the session.
        what: How error messages name the model.
        external_data_folder: Folder of external data for a model given as bytes.
        optimized_model_path: Write the graph ONNX Runtime optimized (at ``optimization``) there, every
            initializer of 1 KiB or more in one external data file ``<name>.data`` beside it (so any size works).
        profile_prefix: Turn ONNX Runtime's profiler on; ``session.inner.end_profiling()`` writes its JSON to a file
            whose path starts with this prefix (:func:`onnxprec._ort_profile.profile_kernels` reads it).
        spinning: Let idle intra-op threads spin (see :func:`session_options`); off for runs whose CPU seconds
            matter more than their latency (reference runs, an LLM writing text).

    Raises:
        UnsupportedModelError: ONNX Runtime cannot load the model (the message has ORT's first line).
    """
    ort = import_onnxruntime()
    provider_list = resolve_providers(providers, trt_plugins=trt_plugins)
    options = session_options(
        optimization, low_memory=low_memory, prepacking=prepacking, custom_op_libraries=custom_op_libraries,
        spinning=spinning,
    )  # fmt: skip
    if optimized_model_path is not None:
        optimized = Path(optimized_model_path)
        options.optimized_model_filepath = str(optimized)
        options.add_session_config_entry(
            "session.optimized_model_external_initializers_file_name", optimized.name + ".data"
        )
        options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
    if profile_prefix is not None:
        options.enable_profiling = True
        options.profile_file_prefix = str(profile_prefix)
    with contextlib.ExitStack() as stack:
        if isinstance(source, ir.Model):
            payload, folder = stack.enter_context(ort_model(source))
        elif isinstance(source, onnx.ModelProto):
            payload, folder = source.SerializeToString(), None
        elif isinstance(source, bytes):
            payload, folder = source, None
        else:
            payload, folder = str(source), None
        folder = Path(external_data_folder) if external_data_folder is not None else folder
        if folder is not None and isinstance(payload, bytes):
            options.add_session_config_entry("session.model_external_initializers_file_folder_path", str(folder))
        try:
            inner = ort.InferenceSession(payload, options, providers=provider_list)
        except Exception as e:  # ORT raises its own exception types
            raise UnsupportedModelError(f"ONNX Runtime cannot load {what}: {first_line(e)}") from e
    return Session(inner)
