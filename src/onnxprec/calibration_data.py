"""The calibration data of a run: one object that every tool reads its batches from.

:class:`CalibrationData` takes any source a user may have (see :mod:`onnxprec.calibration`: ``.npz`` files and
folders, Polygraphy JSON, dicts, lists, ``CalibrationDataReader``s, generators; an ``.npy`` of token windows for a
causal LM; None for realistic random data) and gives validated feed dicts:

- it can be iterated again: a re-readable source is read again on each pass, one batch in memory at a time; a
  one-shot source (a reader, a generator) is spooled to temporary ``.npz`` files on the first pass and read back
  from them later (:meth:`CalibrationData.close`, or garbage collection, removes them);
- its batches are split into runs of ``batch_size`` samples along a dynamic batch axis (an LLM's token windows
  one a run unless told otherwise);
- the first batch is read and checked when the object is made, so a mismatched source fails before any work;
- LLM inputs are completed (:mod:`onnxprec.llm_inputs`): data that gives only token ids gets its attention mask,
  position ids and past keys/values (empty; or, with ``past_length``, the ``present.*`` of a prefix run, so that
  decode-like activations are measured too).

:class:`CalibrationArgs` is a run's data as a tool's options give it (source, sizes of dynamic inputs, batch size):
it builds the :class:`CalibrationData`, and runs a tool's step on the user's data or on random data with retries
(:func:`run_on_data` is the same call in one line).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import re
import tempfile
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import onnx_ir as ir

from onnxprec import _ort, calibration
from onnxprec.calibration import CalibrationSource, InputSpec, input_specs
from onnxprec.errors import CalibrationDataError, InvalidArgumentError
from onnxprec.llm_inputs import LLMInputs, read_token_ids

__all__ = [
    "HELD_OUT_MIN_BATCHES",
    "RANDOM_ATTEMPTS",
    "UNNAMED_ATTEMPTS",
    "BatchStore",
    "CalibrationArgs",
    "CalibrationData",
    "copy_value",
    "run_on_data",
]

logger = logging.getLogger(__name__)

Feeds = dict[str, Any]


def _single_input(specs: Sequence[InputSpec], path: Path) -> str:
    """The name of a model's only input, for an ``.npy`` file that holds that input's batch."""
    if len(specs) != 1:
        raise CalibrationDataError(
            f"'{path.name}' is an .npy, which holds one input, and the model has {len(specs)}: "
            f"{', '.join(s.name for s in specs)}; save an .npz with one key per input name (numpy.savez)."
        )
    return specs[0].name


class CalibrationData:
    """Validated feed dicts from a calibration source, re-iterable, split and completed (see the module docstring).

    Args:
        source: The user's data; None for one batch of realistic random data (``model`` needed).
        model: The model the batches are for (checked against its inputs; LLM inputs completed); None: batches are
            taken as they are (only replayed).
        specs: The inputs to check against (default: the model's).
        batch_size: Split batches into runs of at most this many samples when every input's first axis is dynamic
            (0: as stored; None: one window a run for an LLM, else as stored).
        lenient: Accept any float type for a float input and any integer type for an integer input (cast later).
        past_length: For an LLM with a KV cache and data of token ids only: run the first ``past_length`` tokens of
            each window through the model, and feed its ``present.*`` as the past of the rest: each batch gives the
            prefixes with an empty past, then each window's rest with its filled past (one window a run). 0: empty
            past.
        providers: ONNX Runtime providers of the prefix runs.
        input_shapes, attempt, seed, unnamed: How random data is made (:func:`onnxprec.calibration.random_feeds`).

    Attributes:
        one_shot: The source can be read once (it is spooled).
        completed: The inputs built from the token ids (empty when the data gives every input).
        first: The first batch (checked and completed).
        batches, samples: Runs and samples of the last full pass.
    """

    def __init__(
        self,
        source: CalibrationSource | None,
        model: ir.Model | None = None,
        *,
        specs: list[InputSpec] | None = None,
        batch_size: int | None = None,
        lenient: bool = False,
        past_length: int = 0,
        providers: Sequence[str] | None = None,
        input_shapes: Mapping[str, Any] | str | None = None,
        attempt: int = 0,
        seed: int = 0,
        unnamed: int | None = None,
    ) -> None:
        if past_length < 0:
            raise InvalidArgumentError(f"past_length must be >= 0, got {past_length}.")
        self._model = model
        self._specs = specs if specs is not None else (input_specs(model) if model is not None else None)
        self._llm = LLMInputs.of(model, self._specs) if model is not None and self._specs is not None else None
        dynamic = bool(self._specs) and all(s.dims and not isinstance(s.dims[0], int) for s in self._specs or [])
        if batch_size is None and self._llm is not None:
            batch_size = 1  # an LLM's windows one a run: its logits are [windows, tokens, vocabulary]
        self._batch_size = batch_size if batch_size and batch_size > 0 and dynamic else None
        self._splittable = dynamic
        self._lenient = lenient
        self._past_length = past_length
        self._providers = providers
        self._session: _ort.Session | None = None
        self.completed: frozenset[str] = frozenset()
        self.random = source is None
        self.batches = self.samples = 0
        self._spool: tempfile.TemporaryDirectory[str] | None = None
        self._spooled = 0
        self._live: Iterator[Feeds] | None = None
        self._window: tuple[int, int | None] | None = None  # the runs of a part (:meth:`held_out`), else all
        self._owner = True  # a part shares its whole's spool and leaves closing to it
        if source is None:
            if model is None:
                raise InvalidArgumentError("Random calibration data needs the model.")
            source = [self._random(model, input_shapes, attempt, seed, unnamed)]
            if any(_has_image(batch) for batch in source):
                # and a batch of noise: either alone leaves ranges that real images exceed (a text detector's head
                # fires on noise, not on smooth synthetic images; a classifier's stem the other way round)
                source.append(self._random(model, input_shapes, attempt, seed + 1, unnamed, images=False))
        elif isinstance(source, (str, os.PathLike)) and Path(source).suffix.lower() == ".npy" and self._llm:
            source = {self._llm.ids.name: read_token_ids(Path(source))}  # token windows [N, seq]
        elif isinstance(source, (str, os.PathLike)) and Path(source).suffix.lower() == ".npy" and self._specs:
            source = {_single_input(self._specs, Path(source)): calibration.read_npy(Path(source))}
        static = calibration.static_batch(self._specs) if self._specs else None
        self._source = calibration.Source(source, static)
        self.one_shot = self._source.one_shot
        passes = self._read()
        first = next(passes, None)
        if first is None:
            raise CalibrationDataError("The calibration data holds no batch: give at least one set of inputs.")
        self.first: Feeds = next(calibration.split_batch(first, self._batch_size))
        if self.one_shot:
            self._spool = tempfile.TemporaryDirectory(prefix="onnxprec-calibration-")
            self._live = itertools.chain([first], passes)
        else:
            passes.close()
        logger.debug(
            "Calibration data: %s%s", "a one-shot source (spooled)" if self.one_shot else "a re-readable source",
            f"; built {sorted(self.completed)}" if self.completed else "",
        )  # fmt: skip

    @classmethod
    def of(cls, batches: Iterable[Mapping[str, Any]]) -> CalibrationData:
        """``batches`` as they are if already this object, else replayable as they are (not checked)."""
        return batches if isinstance(batches, CalibrationData) else cls(batches)

    # ----------------------------------------------------------------------------------------------
    # One pass

    def _read(self) -> Generator[Feeds, None, None]:
        """Checked and completed batches of one pass over the source (not split)."""
        for index, raw in enumerate(self._source):
            where = f"batch {index}"
            if self._specs is None:
                yield dict(raw)
                continue
            if index == 0 and self._llm is not None:
                self.completed = self._llm.plan(raw)
            if not self.completed:
                calibration.validate(raw, self._specs, where, lenient=self._lenient)
                ids = raw.get(self._llm.ids.name) if self._llm is not None and not self.random else None
                if self._llm is not None and ids is not None and np.ndim(ids) == 2:
                    self._llm.check_length(int(np.shape(ids)[1]) + _past_length(raw, self._llm))
                yield dict(raw)
                continue
            given = [s for s in self._specs if s.name not in self.completed]
            calibration.validate(raw, given, where, lenient=self._lenient)
            for batch in self._complete(raw):
                calibration.validate(batch, self._specs, where, lenient=self._lenient)
                yield batch

    def _complete(self, raw: Feeds) -> Iterator[Feeds]:
        assert self._llm is not None
        length = int(np.shape(raw[self._llm.ids.name])[1])
        prefix = self._past_length if self._llm.has_past and 0 < self._past_length < length else 0
        if not prefix:
            yield self._llm.complete(raw)
            return
        if set(raw) != {self._llm.ids.name}:
            raise CalibrationDataError(
                f"past_length={prefix} needs data of token ids only; the data also gives "
                f"{sorted(set(raw) - {self._llm.ids.name})}."
            )
        ids = np.asarray(raw[self._llm.ids.name])
        self._llm.check_length(length)
        head = self._llm.complete({self._llm.ids.name: ids[:, :prefix]})
        presents = self._llm.presents()
        if self._session is None:
            assert self._model is not None
            self._session = _ort.create_session(self._model, providers=self._providers, what="the prefix run")
        try:
            arrays = self._session.run(head, list(presents.values()))
        except Exception as e:  # ONNX Runtime's own exception types
            raise CalibrationDataError(f"The model does not run on the prefix windows: {_ort.first_line(e)}") from None
        yield head
        for row in range(ids.shape[0]):  # one window a run: GroupQueryAttention takes a filled past for batch 1 only
            past = {name: array[row : row + 1] for name, array in zip(presents, arrays)}
            yield self._llm.complete({self._llm.ids.name: ids[row : row + 1, prefix:]}, past, prefix)

    def _passes(self) -> Iterator[Feeds]:
        """The checked, completed batches: read again, or (one-shot sources) spooled and read back."""
        if not self.one_shot:
            yield from self._read()
            return
        if self._spool is None:
            raise CalibrationDataError("This calibration data was closed: make a new CalibrationData to read it again.")
        folder = Path(self._spool.name)
        index = 0
        while True:
            if index < self._spooled:  # spooled by an earlier (possibly abandoned) pass
                with np.load(folder / f"{index}.npz", allow_pickle=False) as data:
                    yield {k: data[k] for k in data.files}
            else:
                batch = next(self._live, None) if self._live is not None else None
                if batch is None:
                    self._live = None
                    return
                np.savez(folder / f"{self._spooled}.npz", **batch)
                self._spooled += 1
                yield batch
            index += 1

    def __iter__(self) -> Iterator[Feeds]:
        batches = samples = index = 0
        start, stop = self._window or (0, None)
        for batch in self._passes():
            for piece in calibration.split_batch(batch, self._batch_size):
                index += 1
                if index <= start or (stop is not None and index > stop):
                    continue
                batches += 1
                first = next((v for v in piece.values() if isinstance(v, np.ndarray)), None)
                samples += int(first.shape[0]) if first is not None and first.ndim else 1
                yield piece
        self.batches, self.samples = batches, samples

    def __len__(self) -> int:
        """The number of runs (reads the source once)."""
        return sum(1 for _ in self)

    def __getitem__(self, index: int) -> Feeds:
        for i, batch in enumerate(self):
            if i == index:
                return batch
        raise IndexError(index)

    def held_out(self, split: bool = True) -> tuple[CalibrationData, CalibrationData | None]:
        """The runs to calibrate on and the runs held out to check the result on: with at least
        :data:`HELD_OUT_MIN_BATCHES` runs, the last quarter is held out (rounded down); fewer runs of at least as
        many samples, stored as they are and split along a dynamic batch axis, are first split (``split``) into runs of
        ``samples // HELD_OUT_MIN_BATCHES`` samples (ranges fitted to a few runs fit those runs, and only runs they
        were not fitted to show how far they moved; experiments/design_notes.md, "INT8 accuracy guard"); with
        fewer, every run calibrates and none is held out. Reads the source once (a one-shot source is spooled
        whole); both parts share this object's spool, which :meth:`close` of this object removes.
        """
        whole, count = self, len(self)
        if split and count < HELD_OUT_MIN_BATCHES <= self.samples and self._batch_size is None and self._splittable:
            whole = self._part(0, None)
            whole._batch_size = self.samples // HELD_OUT_MIN_BATCHES
            count = len(whole)
        if count < HELD_OUT_MIN_BATCHES:
            return self, None
        cut = count - count // 4
        return whole._part(0, cut), whole._part(cut, count)

    def _part(self, start: int, stop: int | None) -> CalibrationData:
        import copy

        part = copy.copy(self)
        part._window, part._owner = (start, stop), False
        return part

    def close(self) -> None:
        """Removes the spooled batches (a one-shot source cannot be read again afterwards); a part of a whole
        (:meth:`held_out`) leaves them to the whole."""
        if not self._owner:
            return
        if self._spool is not None:
            self._spool.cleanup()
            self._spool = None
        self._live = None
        self._session = None

    def __enter__(self) -> CalibrationData:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------------------------------------
    # Random data

    def _random(
        self,
        model: ir.Model,
        input_shapes: Mapping[str, Any] | str | None,
        attempt: int,
        seed: int,
        unnamed: int | None,
        images: bool = True,
    ) -> Feeds:
        """Realistic random inputs (synthetic images for image inputs unless ``images`` is False); for an LLM with a
        KV cache, random ids inside the vocabulary (completed later)."""
        specs = self._specs or []
        llm = self._llm if self._llm is not None and self._llm.has_past else None
        if llm is None:
            return calibration.random_feeds(
                model, specs, input_shapes=input_shapes, attempt=attempt, seed=seed, unnamed=unnamed, images=images
            )
        shapes = calibration.parse_input_shapes(input_shapes) if not isinstance(input_shapes, dict) else input_shapes
        data = [s for s in specs if not llm.buildable(s) or s.name in shapes]
        feeds = calibration.random_feeds(
            model, data, input_shapes=input_shapes, attempt=attempt, seed=seed, unnamed=unnamed
        )
        vocab, context = llm.vocab_size(), llm.context()
        shape = np.shape(feeds[llm.ids.name])
        if llm.ids.name not in shapes and len(shape) == 2:
            if context is not None:
                shape = (shape[0], min(shape[1], context[0]))
            rng = np.random.default_rng(seed)
            feeds[llm.ids.name] = rng.integers(0, vocab or 2, size=shape).astype(llm.ids.dtype)
        return feeds


def _has_image(batch: Mapping[str, Any]) -> bool:
    """Whether a batch holds a float batch of 1- or 3-channel images (:func:`calibration.image_channel_axis`)."""
    return any(
        isinstance(value, np.ndarray)
        and np.issubdtype(value.dtype, np.floating)
        and calibration.image_channel_axis(value.shape) is not None
        for value in batch.values()
    )


def _past_length(batch: Mapping[str, Any], llm: LLMInputs) -> int:
    """The past length of complete LLM feeds: the attention mask's width beyond the ids, else 0."""
    ids = np.shape(batch[llm.ids.name])
    mask = next((np.shape(v) for k, v in batch.items() if "mask" in k.lower() and np.ndim(v) == 2), None)
    return max(0, mask[1] - ids[1]) if mask is not None else 0


# --------------------------------------------------------------------------------------------------
# Running a tool's step on the data

HELD_OUT_MIN_BATCHES = 8
"""With at least this many calibration runs, the last quarter is held out of calibration and checks the result
(:meth:`CalibrationData.held_out`): 6 runs or more still calibrate, and 2 or more check what calibration did not see.
Fewer runs all calibrate, and the result is checked on them."""
RANDOM_ATTEMPTS = 5
UNNAMED_ATTEMPTS = 8
_COMMON_SIZES = (32, 64, 128, 256, 16, 8, 512, 4, 2, 3)
_T = TypeVar("_T")


@dataclasses.dataclass(frozen=True)
class CalibrationArgs:
    """A run's data as a tool's options give it, built into :class:`CalibrationData` here, in one place (as
    Polygraphy's argument groups build their data loaders; the options themselves are declared once by
    :func:`onnxprec._arg_groups.calibration_data_option` and :func:`~onnxprec._arg_groups.input_shapes_option`).

    Attributes:
        source: The user's data (any :mod:`onnxprec.calibration` source, or a :class:`CalibrationData` already made,
            used as it is and left open); None: realistic random data.
        input_shapes: Sizes of dynamic inputs for random data, ``"name:1x3x224x224,ids:1x128"`` or a mapping; parsed
            when the group is made (:class:`InvalidArgumentError` on a bad entry), None when empty.
        batch_size: Runs of at most this many samples (:class:`CalibrationData`'s ``batch_size``).
        lenient: Accept any float (integer) type for a float (integer) input (:class:`CalibrationData`'s).
    """

    source: Any = None
    input_shapes: Mapping[str, Any] | str | None = None
    batch_size: int | None = None
    lenient: bool = False

    def __post_init__(self) -> None:
        shapes = calibration.parse_input_shapes(self.input_shapes) if self.input_shapes else None
        object.__setattr__(self, "input_shapes", shapes or None)

    @property
    def random(self) -> bool:
        """Whether the run reads realistic random data (no source given)."""
        return self.source is None

    def open(self, model: ir.Model) -> CalibrationData:
        """The :class:`CalibrationData` of ``model``: the source's (as it is when it is one already), or one batch of
        random data (no retries: :meth:`run` retries); the caller closes it."""
        if isinstance(self.source, CalibrationData):
            return self.source
        return CalibrationData(
            self.source, model, batch_size=self.batch_size, lenient=self.lenient, input_shapes=self.input_shapes
        )

    def run(
        self,
        model: ir.Model,
        run: Callable[[CalibrationData], _T],
        *,
        keep: bool = False,
        attempts: int = RANDOM_ATTEMPTS,
    ) -> _T:
        """Calls ``run(data)`` on the user's data, or on realistic random data with retries (any tool).

        The :class:`CalibrationData` made here is closed when ``run`` returns (its spooled batches removed), unless
        ``keep`` (the caller reads it again later and closes it); a ``source`` that is one already is left open.

        Random data is tried again when ``run`` raises :class:`CalibrationDataError` (the model did not run on it):
        each attempt has its own seed and other sizes for the dynamic dims (attempt 1 sets every dynamic dim to 1,
        as ModelOpt does), unless the user fixed the sizes. When a dim has no name, the sizes that the last error
        message and the model's constants suggest are tried for it (at most :data:`UNNAMED_ATTEMPTS`). A causal LM
        with a KV cache gets random token ids inside its vocabulary, completed as its data would be.

        Raises:
            CalibrationDataError: The user's data does not fit, or no random attempt ran; says how to fix it.
        """
        if isinstance(self.source, CalibrationData):
            return run(self.source)
        if self.source is not None:
            return _run(run, self.open(model), keep)
        shapes, batch_size = self.input_shapes, self.batch_size
        last_error: Exception | None = None
        for attempt in range(attempts):
            data = CalibrationData(
                None, model, input_shapes=shapes, attempt=attempt, seed=attempt, batch_size=batch_size
            )
            try:
                return _run(run, data, keep)
            except CalibrationDataError as e:
                last_error = e
                if shapes:
                    break
                logger.info("Random inputs of attempt %d did not run (%s); trying other inputs", attempt, e)
        if not shapes and _has_unnamed_dims(model):
            for i, size in enumerate(_unnamed_candidates(model, str(last_error))[:UNNAMED_ATTEMPTS]):
                data = CalibrationData(None, model, attempt=0, seed=attempts + i, unnamed=size, batch_size=batch_size)
                try:
                    result = _run(run, data, keep)
                except CalibrationDataError as e:
                    logger.info("Random inputs with unnamed dims of size %d did not run (%s)", size, e)
                    continue
                logger.info("The model runs on random inputs whose unnamed dynamic dims have size %d", size)
                return result
        raise CalibrationDataError(
            f"The model does not run on random inputs ({last_error}); {_advice(model)}."
        ) from last_error


def _advice(model: ir.Model) -> str:
    """How to make a model that did not run on random inputs run: the sizes of its dynamic inputs, or real data."""
    dynamic = [s.describe() for s in input_specs(model) if any(not (isinstance(d, int) and d >= 0) for d in s.dims)]
    if not dynamic:  # every size is fixed: only real values can help
        return "pass real inputs with --calibration_data (or skip the reference run with --data_max inf)"
    named = ", ".join(dynamic[:3]) + (f" and {len(dynamic) - 3} more" if len(dynamic) > 3 else "")
    return (
        f"set the sizes of the dynamic inputs ({named}) with --input_shapes name:1x3x320x320,... (API: "
        "input_shapes=) or pass real inputs with --calibration_data"
    )


def run_on_data(
    model: ir.Model,
    source: CalibrationSource | CalibrationData | None,
    run: Callable[[CalibrationData], _T],
    *,
    input_shapes: Mapping[str, Any] | str | None = None,
    attempts: int = RANDOM_ATTEMPTS,
    batch_size: int | None = None,
    keep: bool = False,
) -> _T:
    """``CalibrationArgs(source, input_shapes, batch_size).run(model, run, keep=keep, attempts=attempts)``
    (:meth:`CalibrationArgs.run`)."""
    return CalibrationArgs(source, input_shapes, batch_size).run(model, run, keep=keep, attempts=attempts)


def _run(run: Callable[[CalibrationData], _T], data: CalibrationData, keep: bool) -> _T:
    try:
        result = run(data)
    except BaseException:
        data.close()
        raise
    if not keep:
        data.close()
    return result


def _has_unnamed_dims(model: ir.Model) -> bool:
    return any(d is None or (isinstance(d, int) and d < 0) for spec in input_specs(model) for d in spec.dims)


def _unnamed_candidates(model: ir.Model, error: str) -> list[int]:
    """Sizes worth trying for unnamed dims: numbers in the runtime's error message (a MatMul or broadcast that
    names the size it wanted), then small integer constants of the model, then common sizes."""
    found: list[int] = [int(n) for n in re.findall(r"(?<![\w.])(\d{1,4})(?![\w.])", error)]
    for graph in model.graphs():
        for value in graph.initializers.values():
            tensor = value.const_value
            if tensor is None or tensor.dtype not in (ir.DataType.INT64, ir.DataType.INT32) or tensor.size > 16:
                continue
            found += [int(v) for v in np.asarray(tensor.numpy()).reshape(-1)]
    found += _COMMON_SIZES
    candidates: list[int] = []
    for size in found:
        if 1 < size <= 4096 and size not in candidates:
            candidates.append(size)
    return candidates


class BatchStore:
    """Named arrays of each batch (the activations a segmented run carries from one piece to the next): in memory
    while they take at most ``memory_bytes`` in all, the rest in ``.npy`` files of a temporary folder, read back
    whole when asked for. Anything but an array (a sequence, an empty optional) stays in memory.
    """

    def __init__(self, memory_bytes: int) -> None:
        self.memory_bytes = memory_bytes
        self._memory: dict[tuple[int, str], Any] = {}
        self._files: dict[tuple[int, str], Path] = {}
        self._held = 0
        self._written = 0  # files written so far: each has a name of its own
        self._folder: tempfile.TemporaryDirectory[str] | None = None

    def put(self, batch: int, name: str, value: Any) -> None:
        """Stores a copy of ``value`` as ``name`` of batch ``batch``."""
        self.drop(batch, name)
        size = value.nbytes if isinstance(value, np.ndarray) else 0
        if size and self._held + size > self.memory_bytes:
            if self._folder is None:
                self._folder = tempfile.TemporaryDirectory(prefix="onnxprec-carried-")
            self._written += 1
            path = Path(self._folder.name) / f"{self._written}.npy"
            np.save(path, value)
            self._files[(batch, name)] = path
            return
        self._held += size
        self._memory[(batch, name)] = np.array(value, copy=True) if size else copy_value(value)

    def get(self, batch: int, name: str) -> Any:
        key = (batch, name)
        return np.load(self._files[key]) if key in self._files else self._memory[key]

    def names(self, batch: int) -> list[str]:
        return [name for b, name in (*self._memory, *self._files) if b == batch]

    def drop(self, batch: int, name: str) -> None:
        value = self._memory.pop((batch, name), None)
        if isinstance(value, np.ndarray):
            self._held -= value.nbytes
        path = self._files.pop((batch, name), None)
        if path is not None:
            path.unlink()

    @property
    def spilled(self) -> int:
        """Arrays held in files now."""
        return len(self._files)

    def close(self) -> None:
        self._memory.clear()
        self._files.clear()
        self._held = 0
        if self._folder is not None:
            self._folder.cleanup()
            self._folder = None


def copy_value(value: Any) -> Any:
    """A copy of a fetched value: an array, a list of arrays (a sequence) or None (an empty optional)."""
    if isinstance(value, list):
        return [copy_value(item) for item in value]
    return None if value is None else np.array(value, copy=True)
