"""Calibration sources: every source a user may have, read as feed dicts (one per batch), and their checks.

Sources (:class:`Source`): a ``.npz`` file (split along a static batch axis), a folder of ``.npz`` files (one
batch each), a Polygraphy JSON file, a dict of arrays, a list of dicts, an ONNX Runtime ``CalibrationDataReader``
(anything with ``get_next()``), or realistic random data (:func:`random_feeds`). The one object the tools use,
which checks, completes (LLM inputs), splits and replays these batches, is
:class:`onnxprec.calibration_data.CalibrationData`.
"""

from __future__ import annotations

import base64
import io
import json
import logging
import math
import os
import re
import zlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx_ir as ir

from onnxprec import _input_contracts
from onnxprec.errors import CalibrationDataError, InvalidArgumentError

__all__ = [
    "RANDOM_BYTES_LIMIT",
    "CalibrationSource",
    "InputSpec",
    "Source",
    "gather_table_rows",
    "image_channel_axis",
    "input_specs",
    "inputs_without_synthetic_form",
    "parse_input_shapes",
    "random_feeds",
    "read_npy",
    "read_polygraphy_json",
    "split_batch",
    "static_batch",
    "synthetic_images",
    "validate",
]

logger = logging.getLogger(__name__)

CalibrationSource = str | os.PathLike | Mapping[str, np.ndarray] | Iterable[Mapping[str, np.ndarray]] | Any


@dataclass(frozen=True)
class InputSpec:
    """A graph input the caller must feed: name, numpy dtype and dims (``int``, or ``str``/``None`` if dynamic)."""

    name: str
    dtype: np.dtype
    dims: tuple[int | str | None, ...]
    value: ir.Value

    @property
    def kind(self) -> str:
        """``tensor``, ``sequence``, ``optional`` or ``map``: what the input holds (``dtype`` is its element type)."""
        return "tensor" if self.value.type is None else type(self.value.type).__name__.removesuffix("Type").lower()

    def describe(self) -> str:
        dims = "x".join(str(d) if isinstance(d, int) else (d or "?") for d in self.dims)
        kind = "" if self.kind == "tensor" else f"{self.kind} of "
        return f"{self.name}: {kind}{self.dtype} [{dims}]"


def input_specs(model: ir.Model) -> list[InputSpec]:
    """The inputs that must be fed (graph inputs that are not initializers)."""
    specs = []
    for value in model.graph.inputs:
        if value.is_initializer():
            continue
        if value.dtype is None:
            raise CalibrationDataError(f"Graph input '{value.name}' has no element type; fix the model's inputs.")
        dims: tuple[int | str | None, ...] = ()
        if value.shape is not None:
            dims = tuple(
                d if isinstance(d, int) else (d.value if isinstance(d, ir.SymbolicDim) else None) for d in value.shape
            )
        specs.append(InputSpec(str(value.name), value.dtype.numpy(), dims, value))
    return specs


# --------------------------------------------------------------------------------------------------
# Reading user data


class Source:
    """The batches of a user's calibration source, read lazily as they are stored (not checked yet).

    A file, a folder, a dict or a list is read again on each iteration (one batch in memory at a time); a
    ``CalibrationDataReader`` or a generator can be iterated once (:attr:`one_shot`). One ``.npz`` file or a dict
    is split along axis 0 into runs of ``static_batch`` rows when it holds several of them. The object that checks,
    completes, splits and replays the batches is :class:`onnxprec.calibration_data.CalibrationData`.
    """

    def __init__(self, source: CalibrationSource, static_batch: int | None = None) -> None:
        self._source = source
        self._static_batch = static_batch
        self._files: list[Path] | None = None
        self._split = False
        self._used = False
        if isinstance(source, (str, os.PathLike)):
            self._files, self._split = _batch_files(Path(source))
            self.one_shot = False
        else:
            self.one_shot = hasattr(source, "get_next") or (
                isinstance(source, Iterable) and not isinstance(source, Mapping) and iter(source) is source
            )
            if not (isinstance(source, (Mapping, Iterable)) or hasattr(source, "get_next")):
                raise CalibrationDataError(
                    f"Unsupported calibration data of type {type(source).__name__}: pass a .npz file, a folder of "
                    ".npz files, a Polygraphy .json file, a dict of arrays, a list of dicts or a "
                    "CalibrationDataReader."
                )

    def __iter__(self) -> Iterator[dict[str, Any]]:
        if self.one_shot:
            if self._used:
                raise CalibrationDataError(
                    "This calibration source can be read only once: pass a list, a file or a folder to reuse it."
                )
            self._used = True
        source = self._source
        if self._files is not None:
            for path in self._files:
                if path.suffix.lower() == ".json":
                    yield from read_polygraphy_json(path)
                elif self._split:
                    yield from split_batch(_read_npz(path), self._static_batch, exact=True)
                else:
                    yield _read_npz(path)
        elif isinstance(source, Mapping):
            yield from split_batch({k: _as_feed(v) for k, v in source.items()}, self._static_batch, exact=True)
        elif hasattr(source, "get_next"):
            while (item := source.get_next()) is not None:
                yield dict(item)
        else:
            for item in source:  # type: ignore[union-attr]
                yield dict(item)  # type: ignore[arg-type]


def _batch_files(path: Path) -> tuple[list[Path], bool]:
    """The files to read, and whether the one .npz file is split along the batch axis."""
    if not path.exists():
        raise CalibrationDataError(f"Calibration data '{path}' does not exist: check --calibration_data.")
    if path.is_dir():
        files = sorted(path.glob("*.npz"))
        if not files:
            raise CalibrationDataError(f"No NPZ files found in folder '{path}': put one .npz per batch there.")
        return files, False
    if path.suffix.lower() not in (".npz", ".json"):
        raise CalibrationDataError(
            f"Unsupported calibration file '{path.name}': supported input types are .npz, a folder of .npz, "
            "Polygraphy .json, an .npy for a model with one input, and for a causal LM (an input_ids input) an .npy "
            "of token windows."
        )
    return [path], True


def read_npy(path: Path) -> np.ndarray:
    """The batch of a single-input model's input from an ``.npy`` file (batch on axis 0)."""
    try:
        return np.load(path, allow_pickle=False)
    except Exception as e:
        raise CalibrationDataError(
            f"Invalid input file '{path}': not a readable .npy ({type(e).__name__}); write it with numpy.save."
        ) from e


def _read_npz(path: Path) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except Exception as e:
        raise CalibrationDataError(
            f"Invalid input file '{path}': not a readable .npz ({type(e).__name__}); write it with numpy.savez."
        ) from e


def _decode_json_value(obj: Any) -> Any:
    """Decodes Polygraphy's encoded ndarrays (``{"array": base64(np.save), "polygraphy_class": "ndarray"}``)."""
    if isinstance(obj, dict):
        if "array" in obj and (obj.get("polygraphy_class") in (None, "ndarray")):
            raw = base64.b64decode(obj["array"])
            try:
                return np.load(io.BytesIO(raw), allow_pickle=False)
            except ValueError:
                return np.load(io.BytesIO(zlib.decompress(raw)), allow_pickle=False)
        if "values" in obj and obj.get("polygraphy_class") in ("OrderedDict", "dict"):
            return {k: _decode_json_value(v) for k, v in obj["values"].items()}
        return {k: _decode_json_value(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_decode_json_value(v) for v in obj]
    return obj


def read_polygraphy_json(path: Path) -> list[dict[str, np.ndarray]]:
    try:
        data = _decode_json_value(json.loads(path.read_text()))
    except (ValueError, OSError) as e:
        raise CalibrationDataError(
            f"Invalid input file '{path}': not a Polygraphy JSON input file ({type(e).__name__}); "
            "write it with `polygraphy run --save-inputs` or polygraphy.json.save_json."
        ) from e
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list) or not all(isinstance(b, dict) for b in data):
        raise CalibrationDataError(f"Invalid input file '{path}': expected a list of {{input name: array}} objects.")
    return [{k: np.asarray(v) for k, v in b.items()} for b in data]


def _as_feed(value: Any) -> Any:
    """An array; a list (a sequence input) or None (an empty optional) as it is."""
    return value if value is None or isinstance(value, list) else np.asarray(value)


def static_batch(specs: list[InputSpec]) -> int | None:
    """The model's static batch size (the first input with a static first axis), or None."""
    return next((s.dims[0] for s in specs if s.dims and isinstance(s.dims[0], int)), None)


def split_batch(batch: dict[str, Any], size: int | None, *, exact: bool = False) -> Iterator[dict[str, Any]]:
    """The runs of at most ``size`` samples of a batch, cut along axis 0 of the arrays whose first axis has the
    batch's size (that of its first array); other values go whole into every run. ``exact``: cut only when the
    batch holds a whole number (above one) of runs, else yield it as it is (a file of several static batches)."""
    arrays = [v for v in batch.values() if isinstance(v, np.ndarray) and v.ndim]
    total = arrays[0].shape[0] if arrays else 0
    if not size or size <= 0 or total <= size or (exact and (total % size or len(arrays) != len(batch))):
        yield batch
        return
    for start in range(0, total, size):
        yield {
            k: v[start : start + size] if isinstance(v, np.ndarray) and v.ndim and v.shape[0] == total else v
            for k, v in batch.items()
        }


def validate(batch: Mapping[str, Any], specs: list[InputSpec], where: str, *, lenient: bool = False) -> None:
    """Raises a one-line :class:`CalibrationDataError` unless ``batch`` holds exactly the inputs ``specs`` describe
    with their element types, ranks and static sizes (``lenient``: any float type for a float input and any integer
    type for an integer input, e.g. FP32 data for an FP16 model, cast later)."""
    expected = {s.name for s in specs}
    given = set(batch)
    if given != expected:
        missing, extra = sorted(expected - given), sorted(given - expected)
        raise CalibrationDataError(
            f"Calibration input names do not match the model's inputs ({where}): missing {missing}, "
            f"unexpected {extra}; the model expects {[s.describe() for s in specs]}."
        )
    for spec in specs:
        if spec.kind != "tensor":
            _validate_container(batch[spec.name], spec, where)
            continue
        array = np.asarray(batch[spec.name])
        if array.dtype != spec.dtype and not (lenient and _same_kind(array.dtype, spec.dtype)):
            raise CalibrationDataError(
                f"Calibration input '{spec.name}' has dtype {array.dtype}, the model expects {spec.dtype} ({where}): "
                f"convert it with .astype(np.{spec.dtype})."
            )
        if spec.dims and array.ndim != len(spec.dims):
            raise CalibrationDataError(
                f"Calibration input '{spec.name}' has rank {array.ndim} (shape {list(array.shape)}), the model "
                f"expects {spec.describe()} ({where})."
            )
        for axis, (dim, size) in enumerate(zip(spec.dims, array.shape)):
            if isinstance(dim, int) and dim > 0 and dim != size:
                raise CalibrationDataError(
                    f"Calibration input '{spec.name}' has size {size} on axis {axis}, the model expects "
                    f"{spec.describe()} ({where})."
                )


def _validate_container(value: object, spec: InputSpec, where: str) -> None:
    """A sequence input takes a list of arrays, an optional input an array (or a list) or None."""
    items = value if isinstance(value, list) else [] if value is None else [value]
    if spec.kind == "sequence" and not isinstance(value, list):
        raise CalibrationDataError(
            f"Calibration input '{spec.name}' is a sequence: give a list of arrays, not {type(value).__name__} "
            f"({where})."
        )
    for item in items:
        if isinstance(item, np.ndarray) and item.dtype != spec.dtype:
            raise CalibrationDataError(
                f"Calibration input '{spec.name}' holds dtype {item.dtype}, the model expects {spec.describe()} "
                f"({where}): convert it with .astype(np.{spec.dtype})."
            )


def _same_kind(given: np.dtype, wanted: np.dtype) -> bool:
    """Both float types (BF16 and FP8 included) or both integer types."""
    if given.kind in "iu" and wanted.kind in "iu":
        return True
    return _is_float(given) and _is_float(wanted)


def _is_float(dtype: np.dtype) -> bool:
    if dtype.kind == "f":
        return True
    try:
        return dtype.kind == "V" and ir.DataType.from_numpy(dtype).is_floating_point()
    except TypeError:  # a structured or opaque type
        return False


# Random data for one input above this many bytes is refused (a huge static dim, or a typo in --input_shapes).
RANDOM_BYTES_LIMIT = 4 << 30


# --------------------------------------------------------------------------------------------------
# Random data that lets real graphs run


def parse_input_shapes(text: str | Mapping[str, Any] | None) -> dict[str, tuple[int, ...]]:
    """Parses ``"name:1x3x320x320,ids:1x128"`` (or a dict) into ``{name: shape}``."""
    if text is None:
        return {}
    if isinstance(text, Mapping):
        return {str(k): tuple(int(d) for d in v) for k, v in text.items()}
    shapes: dict[str, tuple[int, ...]] = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        name, sep, dims = item.rpartition(":")
        if not sep or not name or not re.fullmatch(r"\d+(x\d+)*", dims):
            raise InvalidArgumentError(
                f"Invalid --input_shapes entry '{item}': write name:DIMxDIM..., e.g. input:1x3x224x224."
            )
        shapes[name] = tuple(int(d) for d in dims.split("x"))
    return shapes


# Dynamic dims are filled by name. Each retry picks the next size of every list.
_BATCH_DIMS = (1, 2, 1, 4)
_SEQUENCE_DIMS = (128, 64, 256, 32, 512)
_IMAGE_DIMS = (224, 256, 320, 512, 640)
_OTHER_DIMS = (1, 8, 16, 32, 64)
_SEQ_NAME = re.compile(r"seq|sequence|len|length|token|time|frame|step|past|total|position|src|tgt|word", re.I)
_BATCH_NAME = re.compile(r"^(n|b|bs|batch.*|.*_batch|batch_size|num_seq.*)$", re.I)
_IMAGE_NAME = re.compile(r"^(h|w|height|width|.*_h|.*_w|.*height|.*width|img.*|image.*)$", re.I)


def _pick(values: tuple[int, ...], attempt: int) -> int:
    """Attempt 0 takes the first size, attempt 1 is ModelOpt's (every dynamic dim 1), later ones the next sizes."""
    if attempt == 1:
        return 1
    return values[max(attempt - 1, 0) % len(values)]


def _dynamic_size(spec: InputSpec, axis: int, dim: str | None, attempt: int) -> int:
    if dim and _BATCH_NAME.match(dim):
        return _pick(_BATCH_DIMS, attempt)
    if dim and _SEQ_NAME.search(dim):
        return _pick(_SEQUENCE_DIMS, attempt)
    if dim and _IMAGE_NAME.match(dim):
        return _pick(_IMAGE_DIMS, attempt)
    rank = len(spec.dims)
    if axis == 0:
        return _pick(_BATCH_DIMS, attempt)
    if rank == 4 and axis in (2, 3) and np.issubdtype(spec.dtype, np.floating):
        return _pick(_IMAGE_DIMS, attempt)  # NCHW images
    if rank in (2, 3) and axis == 1:
        return _pick(_SEQUENCE_DIMS, attempt)  # [batch, seq(, hidden)]
    return _pick(_OTHER_DIMS, attempt)


def gather_table_rows(value: ir.Value, depth: int = 3) -> int | None:
    """How many ids an integer input takes: the rows of the embedding table it indexes (Gather), or the classes of
    the one-hot it is turned into (an Equal with a constant of ids ``0..n-1``, as a JAX/TF export writes one-hot,
    or OneHot's constant depth), looking through reshapes, broadcasts and casts."""
    for use in value.uses():
        node = use.node
        if node.op_type == "Gather" and use.idx == 1 and node.inputs[0] is not None:
            table = node.inputs[0]
            axis = node.attributes["axis"].as_int() if "axis" in node.attributes else 0
            rows = table.shape[axis] if table.shape is not None else None
            if isinstance(rows, int):
                return rows
        classes = _one_hot_classes(node, use.idx)
        if classes is not None:
            return classes
        if depth and node.op_type in ("Reshape", "Unsqueeze", "Squeeze", "Flatten", "Cast", "Identity", "Expand"):
            rows = gather_table_rows(node.outputs[0], depth - 1)
            if rows is not None:
                return rows
    return None


def _one_hot_classes(node: ir.Node, index: int) -> int | None:
    """The class count of a one-hot that ``node`` makes of its input ``index``: an Equal with a constant of ids
    ``0..n-1`` (n), or OneHot's constant depth; else None."""
    if node.op_type == "Equal" and len(node.inputs) == 2:
        other = node.inputs[1 - index]
        ids = other.const_value.numpy() if other is not None and other.const_value is not None else None
        if ids is not None and ids.size > 1 and np.issubdtype(ids.dtype, np.integer) and ids.min() == 0:
            return int(ids.max()) + 1
    if node.op_type == "OneHot" and index == 0 and len(node.inputs) > 1 and node.inputs[1] is not None:
        depth = node.inputs[1].const_value
        if depth is not None and depth.size == 1:
            return int(depth.numpy().reshape(-1)[0])
    return None


def random_feeds(
    model: ir.Model,
    specs: list[InputSpec] | None = None,
    *,
    input_shapes: str | Mapping | None = None,
    attempt: int = 0,
    seed: int = 0,
    unnamed: int | None = None,
    images: bool = True,
) -> dict[str, Any]:
    """One batch of random inputs that a real model can run on.

    Inputs that an op reads as parameters (Reshape targets, Slice and Reduce axes, Resize scales, NMS
    thresholds, Split sizes, Gather indices...) get values valid for that op, made after the data they refer to
    (:mod:`onnxprec._input_contracts`); float inputs of domain-limited ops (Log, Sqrt, Acos...) stay in the
    domain. Integer inputs that index an embedding table get ids inside the table; masks get ones with padding
    (zeros at the end of rows, so the masked path is measured too); position ids get ``0..n-1``; token-type ids
    get zeros; float batches of 1- or 3-channel images get synthetic images (:func:`synthetic_images`, normalized
    as :func:`_normalized_images` says) unless ``images`` is False; other float inputs get standard-normal values
    (BF16 and FP8 included), sequences a list of two
    tensors. Static dims (size 0 included) are kept; dynamic dims get batch 1, 128 for sequence-like dims and 224
    for image-like dims unless ``input_shapes`` sets them; ``attempt`` selects alternative sizes for a retry
    (attempt 1: every dynamic dim 1), ``unnamed`` a size for every dim without a name.
    """
    specs = specs if specs is not None else input_specs(model)
    overrides = parse_input_shapes(input_shapes) if not isinstance(input_shapes, dict) else dict(input_shapes)
    unknown = set(overrides) - {s.name for s in specs}
    if unknown:
        raise InvalidArgumentError(
            f"--input_shapes names unknown inputs {sorted(unknown)}; the model's inputs are {[s.name for s in specs]}."
        )
    rng = np.random.default_rng(seed)
    named: dict[str, int] = {}  # one size per symbolic dim name, so related inputs agree
    shapes: dict[str, tuple[int, ...]] = {}
    for spec in specs:
        if spec.name in overrides:
            shape = overrides[spec.name]
            if spec.dims and len(shape) != len(spec.dims):
                raise InvalidArgumentError(
                    f"--input_shapes gives {spec.name} rank {len(shape)}, the model expects {spec.describe()}."
                )
            for dim, size in zip(spec.dims, shape):
                if isinstance(dim, str):
                    named.setdefault(dim, size)
        else:
            sizes = []
            for axis, dim in enumerate(spec.dims):
                if isinstance(dim, int) and dim >= 0:
                    sizes.append(dim)  # a static size 0 is a size like any other
                elif isinstance(dim, str) and dim in named:
                    sizes.append(named[dim])
                elif unnamed is not None and not isinstance(dim, str):
                    sizes.append(unnamed)
                else:
                    size = _dynamic_size(spec, axis, dim if isinstance(dim, str) else None, attempt)
                    if isinstance(dim, str):
                        named[dim] = size
                    sizes.append(size)
            shape = tuple(sizes)
        shapes[spec.name] = shape
        size = math.prod(shape) * spec.dtype.itemsize
        if size > RANDOM_BYTES_LIMIT:
            dims = "x".join(str(d) for d in shape)
            raise CalibrationDataError(
                f"Random data for input '{spec.name}' ({spec.dtype} [{dims}]) would take {size / 1e9:.1f} GB: pass "
                "real inputs with --calibration_data, or skip the reference run with --data_max inf."
            )
    feeds: dict[str, Any] = {}
    # Data first, then the parameters that refer to it (a Reshape target needs the size of its data).
    for spec in sorted(specs, key=lambda s: _input_contracts.is_parameter(s.value)):
        array = None
        if spec.kind == "tensor" and spec.name not in overrides:
            known = {k: np.shape(v) for k, v in feeds.items() if isinstance(v, np.ndarray)}
            array = _input_contracts.contract_array(spec.value, spec.dims, shapes[spec.name], spec.dtype, known, rng)
        feeds[spec.name] = array if array is not None else _random_value(spec, shapes[spec.name], rng, attempt, images)
    feeds = {spec.name: feeds[spec.name] for spec in specs}
    logger.debug("Random inputs: %s", {k: (np.asarray(v).dtype.name, np.shape(v)) for k, v in feeds.items()})
    return feeds


def _random_value(
    spec: InputSpec, shape: tuple[int, ...], rng: np.random.Generator, attempt: int, images: bool = True
) -> Any:
    if spec.kind == "tensor":
        return _random_array(spec, shape, rng, images)
    # A sequence or an optional: the element shape is not declared, so a small one that broadcasts.
    element = shape or ((3,), (1,), (2, 3))[attempt % 3]
    items = [_random_array(spec, element, rng) for _ in range(2)]
    inner = spec.value.type.elem_type if isinstance(spec.value.type, ir.OptionalType) else None
    if spec.kind == "sequence" or isinstance(inner, ir.SequenceType):
        return items
    return items[0]


def _padded_mask(shape: tuple[int, ...], dtype: np.dtype, rng: np.random.Generator) -> np.ndarray:
    """Ones with padding: each row (the last axis) keeps a random length >= 1 and is zero after it; with one
    row, a quarter of it is padding. Realistic masks exercise the masked path (its fill values get measured)."""
    if not shape or shape[-1] <= 1 or math.prod(shape) == 0:
        return np.ones(shape, dtype=dtype)
    n = shape[-1]
    rows = math.prod(shape[:-1])
    lengths = rng.integers(1, n + 1, size=rows) if rows > 1 else np.array([n - max(1, n // 4)])
    mask = np.arange(n)[None, :] < lengths[:, None]
    return mask.reshape(shape).astype(dtype)


def _random_array(spec: InputSpec, shape: tuple[int, ...], rng: np.random.Generator, images: bool = True) -> np.ndarray:
    name = spec.name.lower()
    if "mask" in name and (spec.dtype == np.bool_ or np.issubdtype(spec.dtype, np.number)):
        return _padded_mask(shape, spec.dtype, rng)
    if spec.dtype == np.bool_:
        return np.ones(shape, dtype=np.bool_) if not shape else rng.random(shape) < 0.5
    if np.issubdtype(spec.dtype, np.integer):
        if "position" in name or name in ("pos", "pos_ids"):
            n = shape[-1] if shape else 1
            return np.broadcast_to(np.arange(n, dtype=spec.dtype), shape).copy()
        if "type" in name or "segment" in name:
            return np.zeros(shape, dtype=spec.dtype)
        rows = gather_table_rows(spec.value)
        high = rows if rows is not None else 2
        return rng.integers(0, high, size=shape).astype(spec.dtype)
    if np.issubdtype(spec.dtype, np.floating) or ir.DataType.from_numpy(spec.dtype).is_floating_point():
        # numpy has no BF16 or FP8 dtype: ml_dtypes arrays, made from FP32 values
        axis = image_channel_axis(shape)
        if axis is not None and images:
            return _normalized_images(spec.value, shape, axis, rng).astype(spec.dtype)
        return rng.standard_normal(shape).astype(np.float32).astype(spec.dtype)
    raise CalibrationDataError(
        f"Cannot make random data for input '{spec.name}' of type {spec.dtype}: pass --calibration_data."
    )


# ---------------------------------------------------------------------------------------------------
# Synthetic images

_IMAGE_MEAN, _IMAGE_STD = 0.45, 0.225  # ImageNet's mean and std, rounded over the channels
_NORMALIZING_OPS = frozenset({"Sub", "Div", "Mul", "Add"})


def image_channel_axis(shape: tuple[int, ...]) -> int | None:
    """1 (NCHW) or 3 (NHWC) for the shape of a batch of 1- or 3-channel images at least 8x8; else None."""
    if len(shape) != 4:
        return None
    for axis, spatial in ((1, shape[2:]), (3, shape[1:3])):
        if shape[axis] in (1, 3) and all(size >= 8 for size in spatial):
            return axis
    return None


def inputs_without_synthetic_form(specs: list[InputSpec]) -> list[InputSpec]:
    """The inputs whose random values stand for no real data: float inputs that are not a batch of 1- or 3-channel
    images (audio, spectrograms, features, tabular rows, recurrent states) and integer inputs other than masks,
    positions and token types (token ids, bytes). Scalars and bools are settings, and have a form."""
    unlike = []
    for spec in specs:
        name = spec.name.lower()
        if not spec.dims or spec.dtype == np.bool_ or spec.kind != "tensor":
            continue
        if np.issubdtype(spec.dtype, np.integer):
            if not any(word in name for word in ("mask", "position", "type", "segment")):
                unlike.append(spec)
            continue
        sizes = tuple(d if isinstance(d, int) and d >= 0 else 8 for d in spec.dims)  # a dynamic size can be one
        if image_channel_axis(sizes) is None:
            unlike.append(spec)
    return unlike


def synthetic_images(count: int, height: int, width: int, channels: int, rng: np.random.Generator) -> np.ndarray:
    """``[count, height, width, channels]`` float32 pixels in ``[0, 1]`` with the statistics of photos rather than
    noise: a smooth colour field, filled rectangles and discs (edges), a grating texture, thin dark strokes in rows
    (text-like) and a little sensor noise."""
    ys = np.linspace(0.0, 1.0, height, dtype=np.float32)[:, None]
    xs = np.linspace(0.0, 1.0, width, dtype=np.float32)[None, :]
    images = np.empty((count, height, width, channels), np.float32)
    for index in range(count):
        coarse = rng.uniform(0.0, 1.0, (4, 4, channels)).astype(np.float32)
        rows = np.minimum((ys[:, 0] * 3).astype(int), 2)
        cols = np.minimum((xs[0] * 3).astype(int), 2)
        fy, fx = (ys[:, 0] * 3 - rows)[:, None, None], (xs[0] * 3 - cols)[None, :, None]
        image = (coarse[rows][:, cols] * (1 - fy) * (1 - fx) + coarse[rows + 1][:, cols] * fy * (1 - fx)
                 + coarse[rows][:, cols + 1] * (1 - fy) * fx + coarse[rows + 1][:, cols + 1] * fy * fx)  # fmt: skip
        for _ in range(int(rng.integers(3, 9))):  # shapes with sharp edges
            colour = rng.uniform(0.0, 1.0, channels).astype(np.float32)
            cy, cx, ry, rx = rng.uniform(0.0, 1.0, 4) * [1, 1, 0.3, 0.3] + [0, 0, 0.03, 0.03]
            if rng.random() < 0.5:
                mask = (np.abs(ys - cy) < ry) & (np.abs(xs - cx) < rx)
            else:
                mask = ((ys - cy) / ry) ** 2 + ((xs - cx) / rx) ** 2 < 1
            image[mask] = colour
        angle, frequency = rng.uniform(0, np.pi), rng.uniform(4, 40)
        grating = np.sin(2 * np.pi * frequency * (ys * np.cos(angle) + xs * np.sin(angle)))
        image += (rng.uniform(0.03, 0.15) * grating)[:, :, None]
        for _ in range(int(rng.integers(0, 6))):  # rows of thin strokes, dark or light
            top, left = int(rng.integers(0, height)), int(rng.integers(0, width))
            tall = max(2, int(height * rng.uniform(0.02, 0.08)))
            long = max(4, int(width * rng.uniform(0.1, 0.6)))
            block = image[top : top + tall, left : left + long]  # a view: written in place
            block[:, rng.random(block.shape[1]) < 0.35] = float(rng.random() < 0.5)
        image += rng.normal(0.0, 0.01, image.shape).astype(np.float32)
        images[index] = np.clip(image, 0.0, 1.0)
    return images


def _pixel_scale(value: ir.Value) -> float | None:
    """255 or 1 when the model normalizes its image input itself (a Sub, Div, Mul or Add with a constant reads it,
    directly or through Cast/Transpose): the pixel range its constants suggest; None when it does not (the input
    is expected normalized)."""
    for use in value.uses():
        node = use.node
        if node.op_type in ("Cast", "Transpose"):
            return _pixel_scale(node.outputs[0])
        if node.op_type in _NORMALIZING_OPS:
            constants = [v.const_value for v in node.inputs if v is not None and v.const_value is not None]
            if constants:
                largest = float(np.max(np.abs(constants[0].numpy().astype(np.float64))))
                return 255.0 if largest > 2.0 else 1.0
    return None


def _normalized_images(value: ir.Value, shape: tuple[int, ...], axis: int, rng: np.random.Generator) -> np.ndarray:
    """Synthetic images in the layout of ``shape`` (channel ``axis`` 1 or 3): raw pixels when the model normalizes
    them itself, else standardized as ImageNet's preprocessing does."""
    count, height, width, channels = (shape[0], *shape[2:], shape[1]) if axis == 1 else shape
    images = synthetic_images(count, height, width, channels, rng)
    scale = _pixel_scale(value)
    images = images * scale if scale is not None else (images - _IMAGE_MEAN) / _IMAGE_STD
    return images.transpose(0, 3, 1, 2) if axis == 1 else images
