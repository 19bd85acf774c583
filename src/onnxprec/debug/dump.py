"""``onnxprec dump``: every quantized node's output (and optionally every float output) to ``.bin``/``.txt`` files.

The ``.bin`` holds every value; the ``.txt`` the first ``text_values`` (then a ``#`` line, which ``np.loadtxt``
skips, saying how many the ``.bin`` holds), so that the text of a model's activations stays small.

The same meaning as AMD Quark's ``dump_model``, for any model. The pipeline::

    load -> name and type nodes -> select tensors -> run the first batch (chunked) -> write each tensor as it
    arrives -> constant DequantizeLinear outputs ORT did not hand over, in numpy -> index.json -> publish

Selected tensors are fetched through the reference runner in chunks under a memory budget; the writer
(:class:`DumpWriter`, an observer) writes each array and its statistics as it arrives and keeps nothing else.
Everything is written to a temporary folder beside ``output_dir`` and published when complete, so a failed
run leaves no partial dump behind.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import onnx_ir as ir

from onnxprec import calibration
from onnxprec._graph import FileNames
from onnxprec._io import ModelSource, check_output_path
from onnxprec._ops import QUANTIZED_OPS
from onnxprec._options import fields_in
from onnxprec._report import SUMMARY, header
from onnxprec.calibration_data import CalibrationArgs
from onnxprec.debug._arrays import statistics, write_binary, write_text
from onnxprec.debug._common import fetchable, model_path, prepare
from onnxprec.debug._options import DEFAULT_TEXT_VALUES, DumpOptions
from onnxprec.errors import CalibrationDataError, InvalidArgumentError
from onnxprec.reference import DEFAULT_BUDGET_BYTES, float_tensors, run_reference

__all__ = ["DumpResult", "DumpWriter", "dequantize", "dump_model"]

logger = logging.getLogger(__name__)

INDEX = "index.json"


@dataclass
class DumpResult:
    """What :func:`dump_model` wrote: the folder, its index (``index.json`` as data) and how many runs it took."""

    TOOL: ClassVar[str] = "dump"

    output_dir: Path
    index: dict[str, Any]
    chunks: int

    @property
    def tensors(self) -> list[dict[str, Any]]:
        """The entries of ``index.json``: one per dumped tensor."""
        return list(self.index["tensors"])

    @property
    def summary(self) -> str:
        """What was dumped, what was skipped and why, and how to dump float outputs when nothing was."""
        tensors = self.index["tensors"]
        quantized = sum(1 for t in tensors if "bin" in t["files"])
        floats = sum(1 for t in tensors if "float_bin" in t["files"])
        text = (
            f"Dumped {len(tensors)} tensors ({quantized} quantized outputs, {floats} float outputs) to "
            f"{self.output_dir} in {self.chunks} run(s)"
        )
        reasons: dict[str, int] = {}
        for skipped in self.index["skipped"]:
            reasons[skipped["reason"]] = reasons.get(skipped["reason"], 0) + 1
        if reasons:
            text += "; skipped " + ", ".join(f"{n} ({reason})" for reason, n in reasons.items())
        if not quantized and not self.index["dump_float"]:
            text += "; the model has no quantized node output to dump: --dump_float dumps every float node output"
        return text

    def to_json(self) -> dict[str, Any]:
        """The ``--report_json`` data: the folder, the number of runs and the index (``index.json``)."""
        index = {k: v for k, v in self.index.items() if k != "tool"}
        return {**header(self), "output_dir": str(self.output_dir), "chunks": self.chunks, **index}


# --------------------------------------------------------------------------------------------------
# What is dumped


@dataclass(frozen=True)
class _Wanted:
    node: ir.Node
    quantized: bool
    float: bool


def _selection(model: ir.Model, dump_float: bool) -> tuple[dict[str, _Wanted], list[str]]:
    """The tensors to dump by name, and the quantized outputs that cannot be fetched (INT4 QuantizeLinear)."""
    wanted: dict[str, _Wanted] = {}
    skipped: list[str] = []
    for node in model.graph:
        quantized = node.op_type in QUANTIZED_OPS
        for out in node.outputs:
            if not out.name or out.name in wanted:
                continue
            as_float = dump_float and float_tensors(out)
            if not (quantized or as_float):
                continue
            if not fetchable(out):
                skipped.append(out.name)
                continue
            wanted[out.name] = _Wanted(node, quantized, as_float)
    return wanted, skipped


# --------------------------------------------------------------------------------------------------
# The writer


class DumpWriter:
    """An observer that writes each wanted tensor of the first batch to files as it arrives, then drops it.

    Args:
        folder: Where the files go (the caller's temporary folder).
        wanted: Tensor name -> what to write: ``<stem>.bin``/``.txt`` for quantized outputs,
            ``<stem>_float.bin``/``.txt`` for float outputs.
        text_values: Values written to each ``.txt`` (the first, in C order; 0: all).
    """

    def __init__(
        self,
        folder: Path,
        wanted: Mapping[str, _Wanted],
        pool: Executor | None = None,
        workers: int = 1,
        text_values: int = 0,
    ) -> None:
        self.folder = folder
        self.wanted = wanted
        self.pool = pool
        self.workers = workers
        self.text_values = text_values
        self.entries: dict[str, dict[str, Any]] = {}
        self._names = FileNames(reserved=(Path(INDEX).stem,))

    def update(self, name: str, array: np.ndarray) -> None:
        what = self.wanted.get(name)
        if what is None or name in self.entries:
            return
        array = np.asarray(array)
        files: dict[str, str] = {}
        stems = []
        if what.quantized:
            stems.append(("", self._names(name)))
        if what.float:
            stems.append(("float_", self._names(f"{name}_float")))
        for prefix, stem in stems:
            with open(self.folder / f"{stem}.bin", "wb") as stream:
                write_binary(stream, array)
            with open(self.folder / f"{stem}.txt", "wb") as stream:
                flat = array.reshape(-1)
                cut = self.text_values and flat.size > self.text_values
                write_text(stream, flat[: self.text_values] if cut else flat, self.pool, self.workers)
                if cut:
                    stream.write(f"# the first {self.text_values} of {flat.size} values; all in {stem}.bin\n".encode())
            files[f"{prefix}bin"], files[f"{prefix}txt"] = f"{stem}.bin", f"{stem}.txt"
        self.entries[name] = {
            "name": name,
            "node": what.node.name or "",
            "op_type": what.node.op_type,
            "domain": what.node.domain or "",
            "dtype": str(array.dtype),
            "shape": list(array.shape),
            "files": files,
            "stats": statistics(array),
        }

    def missing(self) -> list[str]:
        return [name for name in self.wanted if name not in self.entries]


# --------------------------------------------------------------------------------------------------
# Constant DequantizeLinear in numpy


def dequantize(
    data: np.ndarray, scale: np.ndarray, zero_point: np.ndarray | None = None, *, axis: int = 1, block_size: int = 0
) -> np.ndarray:
    """``DequantizeLinear``: ``(data - zero_point) * scale``, per tensor, per axis or per block (opset 21).

    Args:
        data: Quantized values (int8/uint8/int16/int32 or ml_dtypes int4/uint4).
        scale: Scalar, ``[data.shape[axis]]`` (per axis) or ``data``'s shape with ``axis`` divided into blocks.
        zero_point: Same shape as ``scale``, or None.
        axis: The quantization axis (negative counts from the end).
        block_size: Elements per block along ``axis`` (0: per tensor or per axis).

    Returns:
        The dequantized tensor, of ``scale``'s dtype.
    """
    values = np.asarray(data).astype(np.float32)
    scale = np.asarray(scale)
    zero = np.zeros((), np.float32) if zero_point is None else np.asarray(zero_point).astype(np.float32)
    scale32 = scale.astype(np.float32)
    if scale.ndim and values.ndim:
        axis = axis % values.ndim
        if block_size:
            scale32 = np.repeat(scale32, block_size, axis=axis).take(range(values.shape[axis]), axis=axis)
            if zero.ndim:
                zero = np.repeat(zero, block_size, axis=axis).take(range(values.shape[axis]), axis=axis)
        else:
            shape = [1] * values.ndim
            shape[axis] = -1
            scale32 = scale32.reshape(shape)
            zero = zero.reshape(shape) if zero.ndim else zero
    return ((values - zero) * scale32).astype(scale.dtype)


def _constant_dequantize(node: ir.Node) -> np.ndarray | None:
    """The output of a DequantizeLinear whose inputs are all initializers or constants (None otherwise)."""
    if node.op_type != "DequantizeLinear":
        return None
    arrays: list[np.ndarray | None] = []
    for value in node.inputs:
        if value is None:
            arrays.append(None)
            continue
        if value.const_value is None:
            return None
        arrays.append(value.const_value.numpy())
    axis = node.attributes["axis"].as_int() if "axis" in node.attributes else 1
    block = node.attributes["block_size"].as_int() if "block_size" in node.attributes else 0
    zero = arrays[2] if len(arrays) > 2 else None
    data, scale = arrays[0], arrays[1]
    if data is None or scale is None:
        return None
    return dequantize(data, scale, zero, axis=axis, block_size=block)


# --------------------------------------------------------------------------------------------------
# Inputs and the output folder


def _input_shapes(shapes: Any, model: ir.Model) -> dict[str, tuple[int, ...]] | None:
    """Quark's ``random_data_reader_input_shape`` (dict, list of shapes, one shape, or text) as ``{name: shape}``."""
    if shapes is None or (isinstance(shapes, (Mapping, Sequence)) and not shapes):
        return None
    if isinstance(shapes, (str, Mapping)):
        return calibration.parse_input_shapes(shapes)
    names = [spec.name for spec in calibration.input_specs(model)]
    items = list(shapes)
    if all(isinstance(d, (int, np.integer)) for d in items):
        items = [items]
    if len(items) > len(names) or not all(isinstance(s, (list, tuple)) for s in items):
        raise InvalidArgumentError(
            f"random_data_reader_input_shape {shapes!r} does not fit the model's inputs {names}: give "
            "{name: shape} or one shape per input."
        )
    return {name: tuple(int(d) for d in shape) for name, shape in zip(names, items)}


def _check_folder(output_dir: Path, overwrite: bool) -> None:
    """Refuses a folder that holds files unless ``overwrite``."""
    if not overwrite and output_dir.is_dir() and any(output_dir.iterdir()):
        raise InvalidArgumentError(
            f"--output_dir '{output_dir}' is not empty: choose a new or empty folder, or pass --overwrite "
            "(an earlier dump there is replaced, other files are kept)."
        )


def _earlier_dump(output_dir: Path) -> list[Path]:
    """The files of the dump ``output_dir`` holds (those its ``index.json`` lists; none without one)."""
    try:
        index = json.loads((output_dir / INDEX).read_text())
        names = [name for entry in index["tensors"] for name in entry["files"].values()]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return []
    return [output_dir / name for name in names if Path(name).name == name]


def _publish(staging: Path, output_dir: Path) -> None:
    """Moves a complete dump into place: a rename of the folder, or of each file (index last) into an existing one,
    whose earlier dump's files are removed."""
    if not output_dir.exists():
        os.replace(staging, output_dir)
        return
    stale = _earlier_dump(output_dir)
    written = sorted(staging.iterdir(), key=lambda p: p.name == INDEX)
    for path in written:
        os.replace(path, output_dir / path.name)
    staging.rmdir()
    for path in set(stale) - {output_dir / p.name for p in written}:
        path.unlink(missing_ok=True)


# --------------------------------------------------------------------------------------------------
# The tool


def _dump(model: ir.Model, batches: Iterable[Mapping[str, np.ndarray]], options: DumpOptions, staging: Path) -> dict:
    first = next(iter(batches), None)
    if first is None:
        raise CalibrationDataError("The dump data holds no batch: give at least one set of inputs.")
    wanted, skipped = _selection(model, options.dump_float)
    values = [out for node in model.graph for out in node.outputs if out.name in wanted]
    workers = min(4, os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="onnxprec-dump") as pool:
        writer = DumpWriter(staging, wanted, pool, workers, options.text_values)
        result = run_reference(
            model,
            [first],
            select=values,
            observers=[writer],
            providers=options.providers,
            budget_bytes=options.budget_bytes or DEFAULT_BUDGET_BYTES,
            observe_inputs=False,
        )
    for name in writer.missing():  # constant DequantizeLinear outputs that ONNX Runtime folded away
        array = _constant_dequantize(wanted[name].node)
        if array is not None:
            writer.update(name, array)
    missing = writer.missing()
    if missing:
        logger.warning("%d selected tensors were not produced by the run: %s", len(missing), missing[:10])
    order = {name: i for i, name in enumerate(wanted)}
    return {
        "entries": sorted(writer.entries.values(), key=lambda e: order[e["name"]]),
        "inputs": {k: {"dtype": str(v.dtype), "shape": list(np.shape(v))} for k, v in first.items()},
        "chunks": result.chunks,
        "skipped": [{"name": n, "reason": "4-bit tensors cannot be fetched from ONNX Runtime"} for n in skipped]
        + [{"name": n, "reason": "not produced by the run"} for n in missing],
    }


def dump_model(
    model: ModelSource,
    dump_data_reader: Any = None,
    random_data_reader_input_shape: Any = None,
    dump_float: bool = False,
    output_dir: str = "./dump_results",
    *,
    overwrite: bool = False,
    text_values: int = DEFAULT_TEXT_VALUES,
    providers: Sequence[str] = ("cpu",),
    budget_bytes: int | None = None,
) -> DumpResult:
    """Runs the model on one batch and writes each quantized node's output (and optionally every float output).

    For every output of a quantized node (DequantizeLinear, QuantizeLinear, MatMulNBits and the other QDQ /
    QOperator / contrib quantized ops; constant DequantizeLinear outputs are the dequantized weights) the folder
    gets ``<name>.bin`` (raw little-endian, C order) and ``<name>.txt`` (one value a line, the first
    ``text_values``); with ``dump_float``
    every float node output also gets ``<name>_float.bin`` and ``<name>_float.txt``. Characters other than
    letters, digits, ``.``, ``_``, ``+`` and ``-`` in names become ``_``; names that collide get ``_1``, ``_2``...
    ``index.json`` lists every tensor: ``name``, ``node``, ``op_type``, ``dtype``, ``shape``, ``files`` and
    ``stats`` (min, max, mean, std of the finite values, ``nonfinite`` count). Tensors of subgraphs (If/Loop
    bodies) are not dumped.

    Args:
        model: A path, an ``onnx.ModelProto`` or an ``ir.Model`` (named and typed in place where needed).
        dump_data_reader: Inputs (only the first batch is used): a path (an ``.npz`` file, a folder of ``.npz`` files, a
            Polygraphy ``.json``), a dict of arrays, a list or iterator of feed dicts, or an ONNX Runtime
            ``CalibrationDataReader``; None: realistic random inputs.
        random_data_reader_input_shape: Sizes of dynamic inputs for random data: ``"name:1x3x224x224,ids:1x128"`` or a
            dict of shapes, a list of shapes in input order, or ``{}`` (sizes chosen from the model).
        dump_float: Also dump every node's float output as <name>_float.bin and <name>_float.txt.
        output_dir: Folder of the dump (created; its parent must exist; a folder that holds files is refused
            without ``overwrite``).
        overwrite: Write into an ``output_dir`` that holds files: an earlier dump there (the files its
            ``index.json`` lists) is replaced, other files are kept.
        text_values: Values written to each ``.txt`` file: the first N in C order, then a ``#`` line saying how many
            the ``.bin`` holds (the ``.bin`` always holds all); 0: every value, as Quark writes them.
        providers: ONNX Runtime providers for the run: ``cpu``, ``cuda:N``, ``trt``, ``dml``.
        budget_bytes: Upper bound on the bytes of the tensors fetched in one ONNX Runtime run (tensors are fetched
            in chunks); None: the reference runner's default (768 MiB).

    Returns:
        The folder, the index (as written to ``index.json``) and the number of runs.

    Raises:
        OnnxprecError: A bad model, input data or output folder; nothing is written then.
    """
    options = DumpOptions(**fields_in(DumpOptions, locals()))
    out = Path(options.output_dir)
    check_output_path(out, flag="--output_dir", folder=True)
    _check_folder(out, options.overwrite)
    loaded = prepare(model)
    data = CalibrationArgs(options.dump_data_reader, _input_shapes(options.random_data_reader_input_shape, loaded))
    parent = out.resolve().parent

    def run(batches: Iterable[Mapping[str, np.ndarray]]) -> tuple[dict, Path]:
        staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=parent))
        try:
            return _dump(loaded, batches, options, staging), staging
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise

    dumped, staging = data.run(loaded, run)
    with contextlib.ExitStack() as cleanup:
        cleanup.callback(shutil.rmtree, staging, True)
        index = {
            "tool": "dump",
            "model": str(model_path(model)) if model_path(model) is not None else None,
            "dump_float": options.dump_float,
            "inputs": dumped["inputs"],
            "tensors": dumped["entries"],
            "skipped": dumped["skipped"],
        }
        (staging / INDEX).write_text(json.dumps(index, indent=1, allow_nan=False) + "\n")
        os.chmod(staging, 0o777 & ~_umask())  # mkdtemp makes 0700; give the usual permissions
        _publish(staging, out)
    result = DumpResult(out, index, dumped["chunks"])
    logger.info(result.summary, extra=SUMMARY)
    return result


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
