"""Loading and saving models: onnx-ir in memory, weights memory-mapped, atomic writes, clear errors."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import gc
import logging
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import onnx
import onnx_ir as ir
from google.protobuf.message import DecodeError

from onnxprec._graph import all_graphs
from onnxprec._ops import is_known_onnx_domain_op
from onnxprec._progress import Progress
from onnxprec._protobuf import load_mapped, proto_graphs, write_streaming
from onnxprec._tensors import release
from onnxprec.errors import InvalidArgumentError, ModelLoadError, UnsupportedModelError

__all__ = [
    "PROTOBUF_LIMIT",
    "ModelSource",
    "WrittenModel",
    "atomic_path",
    "check_output_path",
    "exceeds_protobuf_limit",
    "external_data_paths",
    "load_model",
    "model_file",
    "save_model",
    "sibling_path",
    "total_initializer_bytes",
    "trim_heap",
    "write_atomically",
]

logger = logging.getLogger(__name__)

ModelSource = str | os.PathLike | onnx.ModelProto | ir.Model


@dataclass(frozen=True)
class WrittenModel:
    """What :func:`save_model` hands its ``check``: the complete temporary file, before it is renamed."""

    path: Path
    """The file (its external data beside it, under its final name)."""
    message: onnx.ModelProto | None = None
    """The file as :func:`onnxprec._protobuf.load_mapped` reads it (weights of 1 KiB or more are references to their
    bytes in it), known from writing it: for ONNX Runtime to run without reading it again. None when the weights
    went to an external data file."""


# Files at least this large are memory-mapped instead of parsed into memory.
_MAP_FILE_BYTES = 32 * 1024 * 1024
# ``ir.Model.meta`` key: the external data files of the model file it was loaded from.
_DATA_FILES = "onnxprec.external_data_files"
# ``ir.Model.meta`` key: the resolved path of the model file it was loaded from.
_MODEL_FILE = "onnxprec.model_file"
# Protobuf cannot serialize a message above 2 GiB; stay below with margin (the one place this rule is written).
PROTOBUF_LIMIT = 2_000_000_000


def load_model(source: ModelSource) -> ir.Model:
    """Loads a model into onnx-ir without reading external weights into memory.

    Args:
        source: A path to an ``.onnx`` file, an ``onnx.ModelProto`` or an ``ir.Model``.
            An ``ir.Model`` is returned as is (the caller owns it and it is modified in place).

    Returns:
        The model. External tensors are memory-mapped on first access, never copied.

    Raises:
        ModelLoadError: The file is missing, is not an ONNX model, is truncated, or references
            external data that is missing or too short.
    """
    if isinstance(source, ir.Model):
        return source
    if isinstance(source, onnx.ModelProto):
        _check_model_proto(source, "the in-memory model")
        return _deserialize(source, "the in-memory model")
    path = Path(source)
    if not path.exists():
        raise ModelLoadError(f"Model file '{path}' does not exist: check the path (--onnx_path).")
    if not path.is_file():
        raise ModelLoadError(f"'{path}' is a directory, not an ONNX file: pass the path of a .onnx file.")
    try:
        proto = _read_proto(path)
    except (DecodeError, RuntimeError, ValueError, OSError) as e:
        raise ModelLoadError(
            f"'{path}' is not a readable ONNX model (it may be truncated or corrupt: {_short(e)}); "
            "re-export or re-download it."
        ) from e
    _check_model_proto(proto, f"'{path}'")
    data_files = _check_external_data(proto, path)
    model = _deserialize(proto, f"'{path}'")
    ir.external_data.set_base_dir(model.graph, str(path.parent.resolve()))
    model.meta[_DATA_FILES] = data_files
    model.meta[_MODEL_FILE] = path.resolve()
    logger.debug("Loaded %s: %d nodes in the main graph", path, len(model.graph))
    return model


def _deserialize(proto: onnx.ModelProto, where: str) -> ir.Model:
    """onnx-ir's deserializer, with what it cannot represent said in one line."""
    try:
        return ir.serde.deserialize_model(proto)
    except ir.serde.SerdeError as e:
        cause: BaseException = e
        while cause.__cause__ is not None:
            cause = cause.__cause__
        if isinstance(cause, NotImplementedError) and "Map types" in str(cause):
            raise UnsupportedModelError(
                f"{where} has a value of map type (such as sklearn-onnx's ZipMap output), which onnx-ir cannot "
                f"represent yet{_ml_nodes(proto)}"
            ) from e
        raise ModelLoadError(
            f"{where} cannot be read into onnx-ir ({_short(cause)}): check it with onnx.checker."
        ) from e


def _ml_nodes(proto: onnx.ModelProto) -> str:
    """The end of the map-type refusal: what of the main graph a tool could convert, and what to do."""
    advice = ": convert it without the map (sklearn-onnx: options={'zipmap': False})."
    ml = sorted({node.op_type for node in proto.graph.node if node.domain == "ai.onnx.ml"})
    if not ml:
        return advice
    others = sum(1 for node in proto.graph.node if node.domain in ("", "ai.onnx"))
    text = f"; its ai.onnx.ml nodes ({', '.join(ml)}) compute in float32 or float64 only (no FP16, BF16 or INT8 form)"
    if not others:
        return text + " and it has no other node: nothing in it has a lower-precision form."
    which = "the ai.onnx one" if others == 1 else "the ai.onnx ones"
    return text + f", so only {others} of its {len(proto.graph.node)} nodes ({which}) could be converted" + advice


def _read_proto(path: Path) -> onnx.ModelProto:
    """Large single files are scanned with their weights memory-mapped; others go through onnx.load."""
    stat = path.stat()
    # onnx-ir refuses to map files with several hard links (a security check), so those are read normally.
    if stat.st_size >= _MAP_FILE_BYTES and stat.st_nlink == 1:
        return load_mapped(path)
    return onnx.load(str(path), load_external_data=False)


def _short(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0][:200] if text else type(error).__name__


def _check_model_proto(proto: onnx.ModelProto, where: str) -> None:
    """Rejects byte strings that protobuf happened to parse but that are not models."""
    if proto.ir_version <= 0 or not proto.HasField("graph") or not proto.opset_import:
        raise ModelLoadError(
            f"{where} is not an ONNX model (no IR version, graph or opset import): "
            "pass a model saved by onnx.save or an exporter."
        )
    if len(proto.graph.node) == 0:
        raise ModelLoadError(f"{where} has an empty graph: there is nothing to convert.")
    _check_opsets(proto)
    opsets = {("" if d.domain == "ai.onnx" else d.domain): d.version for d in proto.opset_import}
    _check_graph(proto.graph, set(), opsets, proto)


def _invalid(problem: str) -> ModelLoadError:
    return ModelLoadError(
        f"The graph is not a valid ONNX graph ({problem}): fix the model (onnx.checker.check_model names the problem)."
    )


def _check_opsets(proto: onnx.ModelProto) -> None:
    newest = onnx.defs.onnx_opset_version()
    for entry in proto.opset_import:
        if entry.domain in ("", "ai.onnx") and entry.version > newest:
            raise ModelLoadError(
                f"The model imports opset {entry.version} of the default domain; this onnx knows up to {newest}: "
                "upgrade onnx and onnxruntime, or export the model at an older opset."
            )


def _node_name(node: onnx.NodeProto) -> str:
    return node.name or f"{node.op_type} making '{node.output[0] if node.output else ''}'"


def _check_graph(graph: onnx.GraphProto, outer: set[str], opsets: dict[str, int], model: onnx.ModelProto) -> None:
    """Rejects what no runtime can run, in ONNX's own terms: values read but never made (dangling inputs),
    values made twice, cycles, inputs declared twice, default-domain ops that neither ONNX nor ONNX Runtime (its
    contrib ops registered in the ONNX domain) knows at the imported opset, and domains the model does not import.
    Subgraphs see the values of their enclosing graphs."""
    functions = {(f.domain, f.name) for f in model.functions}
    defined = set(outer)
    producers: dict[str, onnx.NodeProto] = {}
    for value in graph.input:
        if value.name in defined - outer:
            raise _invalid(f"graph input '{value.name}' is declared twice")
        defined.add(value.name)
    defined.update(t.name for t in graph.initializer)
    defined.update(t.values.name for t in graph.sparse_initializer)
    for node in graph.node:
        for out in node.output:
            if not out:
                continue
            if out in producers:
                raise _invalid(
                    f"value '{out}' is made twice, by node '{_node_name(producers[out])}' and by node "
                    f"'{_node_name(node)}'"
                )
            producers[out] = node
        domain = "" if node.domain == "ai.onnx" else node.domain
        if domain not in opsets and (node.domain, node.op_type) not in functions:
            raise ModelLoadError(
                f"Node '{_node_name(node)}' uses domain '{node.domain}', which the model does not import: add it to "
                "the model's opset_import."
            )
        standard = domain in ("", "ai.onnx.ml") and (node.domain, node.op_type) not in functions
        if standard and not is_known_onnx_domain_op(node.op_type, domain, opsets[domain]):
            raise ModelLoadError(
                f"Node '{_node_name(node)}' is '{node.op_type}', which is no ONNX op at opset {opsets[domain]}: "
                "fix the model, or give the op its custom domain."
            )
    # What is read must be made by an input, an initializer or another node, without a cycle (Kahn's order).
    made = defined | set(producers)
    missing: dict[int, int] = {}  # node index -> inputs not yet made
    readers: dict[str, list[int]] = {}
    for index, node in enumerate(graph.node):
        for name in node.input:
            if name and name not in made:
                raise _invalid(f"node '{_node_name(node)}' reads '{name}', which no node, input or initializer makes")
            if name and name not in defined:
                readers.setdefault(name, []).append(index)
                missing[index] = missing.get(index, 0) + 1
    queue = [i for i in range(len(graph.node)) if i not in missing]
    while queue:
        for name in graph.node[queue.pop()].output:
            for reader in readers.pop(name, ()):
                missing[reader] -= 1
                if not missing[reader]:
                    queue.append(reader)
    stuck = next((i for i, count in missing.items() if count), None)
    if stuck is not None:
        node = graph.node[stuck]
        name = next(n for n in node.input if n in readers)
        raise _invalid(f"node '{_node_name(node)}' reads '{name}', which depends on the node's own output (a cycle)")
    for node in graph.node:
        for attr in node.attribute:
            subgraphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
            for sub in subgraphs:
                _check_graph(sub, made, opsets, model)


def _external_entries(tensor: onnx.TensorProto) -> dict[str, str]:
    return {entry.key: entry.value for entry in tensor.external_data}


def _iter_graph_tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    for g in proto_graphs(graph):
        yield from g.initializer
        yield from (attr.t for node in g.node for attr in node.attribute if attr.type == onnx.AttributeProto.TENSOR)


def _check_external_data(proto: onnx.ModelProto, path: Path) -> set[Path]:
    """Checks that every external data file exists, lies in the model's folder and is long enough, before
    anything is mapped; returns their resolved paths."""
    sizes: dict[Path, int] = {}
    for tensor in _iter_graph_tensors(proto.graph):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = _external_entries(tensor)
        location = info.get("location", "")
        data_path = path.parent / location
        folder = path.parent.resolve()
        if folder not in data_path.resolve().parents:
            raise ModelLoadError(
                f"External data file '{location}' (needed by tensor '{tensor.name}') is outside the model's folder "
                f"'{path.parent}': move it beside the model and fix its location."
            )
        if data_path not in sizes:
            if not data_path.is_file():
                raise ModelLoadError(
                    f"External data file '{location}' (needed by tensor '{tensor.name}') is missing next to "
                    f"'{path}': copy it into '{path.parent}' beside the model."
                )
            sizes[data_path] = data_path.stat().st_size
        end = int(info.get("offset", 0)) + int(info.get("length", 0))
        if end > sizes[data_path]:
            raise ModelLoadError(
                f"External data file '{data_path}' is truncated: tensor '{tensor.name}' needs {end} bytes, "
                f"the file has {sizes[data_path]}; copy the complete file again."
            )
    return {p.resolve() for p in sizes}


def model_file(model: ir.Model) -> Path | None:
    """The file ``model`` was loaded from by :func:`load_model` (None for a model built or given in memory)."""
    path = model.meta.get(_MODEL_FILE)
    return path if isinstance(path, Path) else None


def external_data_paths(model: ir.Model) -> set[Path]:
    """Returns the resolved paths of all external data files the model's tensors reference, and those the
    model file referenced when it was loaded (a converted weight no longer shows where it came from)."""
    paths: set[Path] = set(model.meta.get(_DATA_FILES, ()))
    for graph in all_graphs(model.graph):
        for value in graph.initializers.values():
            tensor = value.const_value
            if isinstance(tensor, ir.ExternalTensor):
                paths.add(Path(tensor.path).resolve())
    return paths


def total_initializer_bytes(model: ir.Model) -> int:
    """Sum of the byte sizes of all initializers (main graph and subgraphs), without reading them."""
    total = 0
    for graph in all_graphs(model.graph):
        for value in graph.initializers.values():
            if value.const_value is not None:
                total += value.const_value.nbytes
    return total


def exceeds_protobuf_limit(model: ir.Model) -> bool:
    """Whether the model's weights are too large for one protobuf message: save them as external data."""
    return total_initializer_bytes(model) > PROTOBUF_LIMIT


def sibling_path(path: str | os.PathLike, suffix: str) -> Path:
    """A tool's default output: ``<name><suffix>.onnx`` beside ``path`` (``.quant``: ``model.quant.onnx``)."""
    source = Path(path)
    stem = source.name[: -len(".onnx")] if source.name.endswith(".onnx") else source.name
    return source.with_name(f"{stem}{suffix}.onnx")


def check_output_path(
    output: str | os.PathLike,
    protected: Iterable[str | os.PathLike] = (),
    *,
    flag: str = "--output_path",
    data_file: bool = True,
    folder: bool = False,
) -> Path:
    """The one output-path check of every tool: fails before the work when ``output`` cannot be written.

    Args:
        output: The file a tool will write (a model, a report), or with ``folder`` the folder it fills.
        protected: Files that must not be overwritten: the input model, its external data files, other inputs.
        flag: The option that named ``output``, for the message (``--output_path``, ``--report_json``...).
        data_file: ``output`` is a model that may get ``<output>.data`` beside it: that file must not be
            protected either.
        folder: ``output`` is a folder (created if missing; its parent must exist).

    Returns:
        The resolved path.

    Raises:
        InvalidArgumentError: ``output`` would overwrite a protected file, its folder is missing or not
            writable, or it is a folder where a file is expected (or a file where a folder is).
    """
    path = Path(output)
    resolved = path.resolve()
    written = {resolved, resolved.with_name(resolved.name + ".data")} if data_file and not folder else {resolved}
    for p in protected:
        if Path(p).resolve() in written:
            raise InvalidArgumentError(f"{flag} '{output}' would overwrite the input '{p}': choose another path.")
    if not resolved.parent.is_dir():
        raise InvalidArgumentError(
            f"Folder '{resolved.parent}' of {flag} does not exist: create it or choose another path."
        )
    if folder and path.exists() and not path.is_dir():
        raise InvalidArgumentError(f"{flag} '{output}' is a file, not a folder: choose another folder.")
    if not folder and resolved.is_dir():
        raise InvalidArgumentError(f"{flag} '{output}' is a folder: give the path of the file to write.")
    target = resolved if folder and resolved.is_dir() else resolved.parent
    if not os.access(target, os.W_OK | os.X_OK):
        raise InvalidArgumentError(
            f"Folder '{target}' of {flag} is not writable: choose another path or fix its permissions."
        )
    return resolved


def save_model(
    model: ir.Model,
    path: str | os.PathLike,
    *,
    external_data: bool | None = None,
    protected: set[Path] | None = None,
    check: Callable[[WrittenModel], None] | None = None,
    data_location: str | None = None,
    size_threshold: int = 1024,
) -> Path:
    """Saves atomically: the model is written to a temporary file beside ``path`` and renamed.

    The one save of every tool (AutoCast, INT4, preprocess).

    Args:
        model: The model to save. Lazy tensors are evaluated here, one at a time.
        path: Destination ``.onnx`` path.
        external_data: ``True`` writes weights above ``size_threshold`` bytes to ``data_location`` beside the
            model; ``False`` embeds them; ``None`` (default) embeds them unless the model exceeds 2 GB.
        protected: Files that must not be overwritten (the input model and its data files).
        check: Called with the complete temporary file (:class:`WrittenModel`) before the rename: if it raises,
            nothing is left behind and ``path`` is untouched (e.g. a check that loads the output in ONNX Runtime).
        data_location: The external data file's name, relative to the model's folder (default:
            ``<name>.data``).
        size_threshold: With external data, tensors of more bytes than this go to the data file.

    Returns:
        The path written.
    """
    out = Path(path)
    check_output_path(out, protected or set())
    data_name = data_location or out.name + ".data"
    if external_data is None:
        external_data = exceeds_protobuf_limit(model)
        if external_data:
            logger.info("Model weights exceed 2 GB: saving them as external data in '%s'", data_name)
    data_path = out.parent / data_name
    data_existed = data_path.exists()
    try:
        with atomic_path(out) as tmp_name:
            message = None
            if external_data:
                with _progress(model) as callback:
                    ir.save(
                        model, tmp_name, external_data=data_name, size_threshold_bytes=size_threshold, callback=callback
                    )
                _fsync(data_path)
            else:
                _inline_subgraph_external_tensors(model)
                with open(tmp_name, "wb") as stream:
                    message = write_streaming(model, stream, location=tmp_name.name if check is not None else None)
            if check is not None:
                check(WrittenModel(tmp_name, message))
            del message
    except BaseException:
        if external_data and not data_existed:
            with contextlib.suppress(OSError):
                os.remove(data_path)
        raise
    logger.debug("Saved %s (external data: %s)", out, external_data)
    return out


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _fsync(path: Path) -> None:
    """Flushes a file (or a directory entry) to disk."""
    flags = os.O_RDONLY | (os.O_DIRECTORY if path.is_dir() else 0)
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    except OSError:  # some file systems cannot fsync a directory
        logger.debug("fsync of %s not supported", path)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yields a temporary path beside ``path``; on success it is fsynced and renamed over ``path``.

    The only way onnxprec writes a file: a reader sees the old file or the complete new one, never a
    partial file, and a failure leaves nothing behind. The directory entry is fsynced after the rename.
    """
    out = Path(path)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the usual permissions
        _fsync(tmp)
        os.replace(tmp, out)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    _fsync(out.parent)


def write_atomically(path: str | os.PathLike, data: bytes | str) -> Path:
    """Writes ``data`` to ``path`` through :func:`atomic_path`."""
    with atomic_path(path) as tmp:
        if isinstance(data, str):
            tmp.write_text(data)
        else:
            tmp.write_bytes(data)
    return Path(path)


def _inline_subgraph_external_tensors(model: ir.Model) -> None:
    """Reads external tensors of subgraphs into memory so a single-file save is self-contained."""
    for graph in model.graph.subgraphs():
        for value in graph.initializers.values():
            if isinstance(value.const_value, ir.ExternalTensor):
                value.const_value = ir.Tensor(value.const_value.numpy().copy(), name=value.name)


def to_model_proto(model: ir.Model) -> onnx.ModelProto:
    """A self-contained ModelProto: weights mapped from files are read into it (as ``onnx.load`` would).

    Above 2 GB the message cannot be serialized as one file: save it with external data
    (``onnx.save(..., save_as_external_data=True)``), or use :func:`onnxprec.autocast.convert_file`.
    """
    for graph in all_graphs(model.graph):
        for value in graph.initializers.values():
            tensor = value.const_value
            if isinstance(tensor, ir.ExternalTensor):
                value.const_value = ir.Tensor(tensor.numpy().copy(), dtype=tensor.dtype, name=value.name)
                release(tensor)
    return ir.serde.serialize_model(model)


@contextlib.contextmanager
def _progress(model: ir.Model) -> Iterator[Callable[[ir.TensorProtocol, ir.external_data.CallbackInfo], None]]:
    """A progress bar over tensors written to external data (:class:`onnxprec._progress.Progress`)."""
    bar = Progress("Saving weights", "tensor").open()

    def callback(tensor: ir.TensorProtocol, info: ir.external_data.CallbackInfo) -> None:
        if bar.total is None:
            bar.set_total(info.total)
        bar.update()

    try:
        yield callback
    finally:
        bar.close()


@functools.cache
def _libc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None where the C library has none (musl, macOS, Windows)."""
    name = ctypes.util.find_library("c")
    try:
        return getattr(ctypes.CDLL(name), "malloc_trim", None) if name else None
    except OSError:
        return None


def trim_heap(*, collect: bool = True) -> bool:
    """Collects Python's garbage (``collect``) and returns the C heap's free pages to the system (glibc
    ``malloc_trim(0)``): memory freed in many blocks below the allocator's mapping threshold (an ONNX Runtime
    session's, its arrays') otherwise stays in the process's RSS. Returns whether the C library released any; False
    where it has no such call."""
    if collect:
        gc.collect()
    trim = _libc_trim()
    return bool(trim(0)) if trim is not None else False
