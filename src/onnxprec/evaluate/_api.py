"""Evaluation: models side by side on the same data, batch by batch, with task metrics and latency.

The loop, for each batch of the data (split to ``batch_size``)::

    reference model -> outputs -> (perplexity, accuracy)
    each other model -> outputs -> (perplexity, accuracy) + agreement with the reference outputs -> dropped

so at most two models' outputs for one batch are in memory. Latency is measured afterwards on the first batch:
warm-up runs, then ``latency_runs`` rounds in which every model runs once (the order rotates each round), so
that all models see the same machine state. Last, each model runs ``profile_runs`` times on the first batch in a
session of its own with ONNX Runtime's profiler on (:func:`onnxprec._ort_profile.profile_kernels`), so that the
report says which kernels ran (nodes in integer kernels, Q/DQ left unfused) while the timed sessions stay
unprofiled.

Causal LMs are recognised by an ``input_ids`` input and ``[batch, seq, vocab]`` logits. The data is read, checked
and split by :class:`onnxprec.calibration_data.CalibrationData`; inputs the data does not hold are built for each
model by :class:`onnxprec.llm_inputs.LLMInputs`: empty past keys/values (their layout read from the model),
``attention_mask`` as ones, ``position_ids`` from the mask.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from onnxprec import _ort, calibration, metrics
from onnxprec._io import load_model
from onnxprec._latency import time_alternating
from onnxprec._options import fields_in
from onnxprec._ort_profile import profile_kernels
from onnxprec._report import SUMMARY, timed
from onnxprec.calibration import InputSpec
from onnxprec.calibration_data import CalibrationArgs
from onnxprec.errors import CalibrationDataError, InvalidArgumentError, ModelLoadError, UnsupportedModelError
from onnxprec.evaluate._options import EvaluateOptions
from onnxprec.evaluate._report import EvaluationReport, ModelResult, ModelsReport, fmt, integer_nodes
from onnxprec.llm_inputs import LLMInputs

__all__ = ["EvaluateOptions", "EvaluationReport", "ModelResult", "ModelsReport", "evaluate_models"]

logger = logging.getLogger(__name__)

_WARMUP_RUNS = 2
_PRESENT = re.compile(r"present", re.IGNORECASE)
_SCORES = re.compile(r"logit|score|prob", re.IGNORECASE)
ModelLike = str | os.PathLike | onnx.ModelProto | ir.Model


# --------------------------------------------------------------------------------------------------
# Models


@dataclass
class _Model:
    """A model under evaluation: its session, what is fed and fetched, and its running metrics."""

    result: ModelResult
    session: _ort.Session | None  # None once the timed runs are done and the profile needs the memory
    graph: ir.Model
    inputs: dict[str, InputSpec]
    fetch: list[str]
    llm: LLMInputs | None = None
    logits: str | None = None
    ids: str | None = None
    scores: str | None = None
    ppl: metrics.Perplexity | None = None
    agreement: dict[str, metrics.ErrorStats] = field(default_factory=dict)
    top1: int = 0
    top5: int | None = 0  # None when a model has fewer than 5 classes
    labelled: int = 0
    first_feeds: dict[str, np.ndarray] | None = None


def _name_of(source: ModelLike, index: int) -> tuple[str, str | None]:
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        name = path.name[: -len(".onnx")] if path.name.endswith(".onnx") else path.name
        return name, str(path)
    return f"model{index}", None


def _open(source: ModelLike, name: str, options: EvaluateOptions) -> tuple[_ort.Session, ir.Model]:
    """The model's session and its graph (weights stay mapped: only the inputs and their consumers are read)."""
    if isinstance(source, (str, os.PathLike)) and not Path(source).exists():
        raise ModelLoadError(f"Model file '{source}' does not exist: check the model paths.")
    graph = load_model(source)  # one-line errors for a corrupt or truncated file
    session = _ort.create_session(
        source,
        providers=list(options.providers),
        optimization=options.optimization,  # type: ignore[arg-type]
        custom_op_libraries=list(options.custom_op_libs),
        what=f"model '{name}'",
    )
    return session, graph


def _setup(
    result: ModelResult, session: _ort.Session, graph: ir.Model, options: EvaluateOptions, labels: bool
) -> _Model:
    specs = calibration.input_specs(graph)
    inputs = {s.name: s for s in specs}
    outputs = {o.name: o for o in session.inner.get_outputs()}
    llm = LLMInputs.of(graph, specs)
    fetch = [name for name in session.output_names if not (llm and llm.has_past and _PRESENT.search(name))]
    model = _Model(result, session, graph, inputs, fetch, llm)
    ids = "input_ids" if "input_ids" in inputs else None
    rank3 = [n for n in fetch if len(outputs[n].shape or []) == 3 and "float" in outputs[n].type]
    # By name: an encoder's [batch, seq, hidden] states look like logits; --perplexity takes any rank-3 output.
    logits = next((n for n in rank3 if "logit" in n.lower()), rank3[0] if options.perplexity and rank3 else None)
    if options.perplexity is not False and ids is not None and logits is not None:
        model.ids, model.logits, model.ppl = ids, logits, metrics.Perplexity()
    elif options.perplexity:
        raise InvalidArgumentError(
            f"Model '{result.name}' is not a causal LM (perplexity needs an input_ids input and [batch, seq, vocab] "
            f"logits; its inputs are {list(inputs)}, its outputs {fetch}): drop --perplexity."
        )
    floats = [n for n in fetch if "float" in outputs[n].type]
    model.scores = model.logits or (floats[0] if floats else None)
    if labels and model.scores is None:
        raise InvalidArgumentError(f"Model '{result.name}' has no float output to score --labels against.")
    result.main_output = model.scores or (fetch[0] if fetch else None)
    return model


def _synthesizable(model: _Model, name: str) -> bool:
    return model.llm is not None and model.llm.buildable(model.inputs[name])


def _feeds(model: _Model, batch: Mapping[str, np.ndarray], built: frozenset[str]) -> dict[str, np.ndarray]:
    """The model's feeds: the batch's arrays (integers cast to the declared type; inputs built for the reference
    that this model does not take left out) and the inputs this model needs that are built from the token ids."""
    feeds: dict[str, np.ndarray] = {}
    for name, array in batch.items():
        spec = model.inputs.get(name)
        if spec is None:
            if name in built:
                continue
            raise InvalidArgumentError(
                f"Model '{model.result.name}' has no input '{name}' (its inputs are {list(model.inputs)}): "
                "evaluate models with the same inputs."
            )
        wanted = spec.dtype
        if array.dtype != wanted and array.dtype.kind in "iub" and wanted.kind in "iub":
            array = array.astype(wanted)
        feeds[name] = array
    llm = model.llm
    if llm is not None and llm.ids.name in feeds and any(name not in feeds for name in model.inputs):
        feeds = llm.complete(feeds)
    return feeds


# --------------------------------------------------------------------------------------------------
# Metrics


def _run(model: _Model, feeds: dict[str, np.ndarray]) -> tuple[list[np.ndarray], float]:
    try:
        assert model.session is not None
        with timed() as clock:
            outputs = model.session.run(feeds, model.fetch)
    except Exception as e:  # ONNX Runtime's own exception types
        shapes = {k: list(v.shape) for k, v in feeds.items()}
        raise UnsupportedModelError(
            f"ONNX Runtime cannot run model '{model.result.name}' on inputs {shapes}: {_ort.first_line(e)}"
        ) from None
    return outputs, clock.seconds


def _score(
    model: _Model, feeds: Mapping[str, np.ndarray], outputs: dict[str, np.ndarray], labels: np.ndarray | None
) -> None:
    """Perplexity and accuracy of one batch."""
    if model.ppl is not None:
        assert model.ids is not None and model.logits is not None
        logits, ids = outputs[model.logits], feeds[model.ids]
        if logits.shape[:2] != ids.shape:
            raise UnsupportedModelError(
                f"Model '{model.result.name}': logits {list(logits.shape)} do not match input_ids "
                f"{list(ids.shape)} as [batch, seq, vocab] and [batch, seq]: drop --perplexity."
            )
        mask = feeds.get("attention_mask")
        model.ppl.update(logits, ids, None if mask is None else mask[:, -ids.shape[1] :])  # past tokens not scored
    if labels is not None:
        assert model.scores is not None
        scores = np.asarray(outputs[model.scores])
        if scores.shape[:-1] != labels.shape:
            raise CalibrationDataError(
                f"--labels of shape {list(labels.shape)} for this batch do not match output '{model.scores}' of "
                f"shape {list(scores.shape)} (one label per row of the last axis)."
            )
        flat = scores.reshape(-1, scores.shape[-1]).astype(np.float32)
        target = labels.reshape(-1)
        keep = target >= 0
        flat, target = flat[keep], target[keep]
        if len(target):
            model.top1 += int((flat.argmax(-1) == target).sum())
            if flat.shape[-1] < 5:
                model.top5 = None
            elif model.top5 is not None:
                top = np.argpartition(-flat, 4, axis=-1)[:, :5]
                model.top5 += int((top == target[:, None]).any(-1).sum())
        model.labelled += len(target)


def _agree(model: _Model, reference: dict[str, np.ndarray], outputs: dict[str, np.ndarray]) -> None:
    """Adds one batch to the agreement statistics of ``model``'s outputs with the reference outputs."""
    ref_names = list(reference)
    for position, (name, got) in enumerate(outputs.items()):
        ref_name = name if name in reference else (ref_names[position] if position < len(ref_names) else None)
        if ref_name is None:
            continue
        expected = reference[ref_name]
        if expected.dtype.kind not in "fiubV" or got.dtype.kind not in "fiubV":
            continue
        if expected.shape != got.shape:
            raise UnsupportedModelError(
                f"Output '{name}' of model '{model.result.name}' has shape {list(got.shape)}, the reference's "
                f"'{ref_name}' {list(expected.shape)}: compare models with the same outputs."
            )
        stats = model.agreement.get(name)
        if stats is None:
            scores = name in (model.scores, model.logits) and expected.ndim >= 2
            stats = model.agreement[name] = metrics.ErrorStats(
                track_top1=scores and (bool(_SCORES.search(name)) or expected.ndim == 2 or name == model.logits),
                track_kl=name == model.logits,  # a causal LM's logits: KL divergence of the next-token distributions
            )
        stats.update(expected, got)


def _latency(models: list[_Model], runs: int) -> None:
    """Median/p90 latency per batch on the first batch: warm-up, then rounds in which every model runs once
    (:func:`onnxprec._latency.time_alternating`)."""

    def runnable(model: _Model) -> Callable[[], object]:
        feeds = model.first_feeds
        assert feeds is not None
        return lambda: _run(model, feeds)

    latencies = time_alternating([runnable(model) for model in models], runs, warmup=_WARMUP_RUNS)
    for index, model in enumerate(models):
        model.result.latency_ms = latencies.stats_ms(index)


# --------------------------------------------------------------------------------------------------
# Public API


def _reference_index(models: list[ModelLike], names: list[str], reference: Any) -> int | None:
    """Index of the reference among the models, or None when it is another model."""
    if reference is None:
        return 0
    if isinstance(reference, int) and not isinstance(reference, bool):
        if not 0 <= reference < len(models):
            raise InvalidArgumentError(f"reference={reference} is not the index of one of the {len(models)} models.")
        return reference
    if isinstance(reference, str) and reference in names:
        return names.index(reference)
    if isinstance(reference, (str, os.PathLike)):
        wanted = Path(reference).resolve()
        for i, source in enumerate(models):
            if isinstance(source, (str, os.PathLike)) and Path(source).resolve() == wanted:
                return i
        return None
    for i, source in enumerate(models):
        if source is reference:
            return i
    return None


def _load_labels(labels: Any) -> np.ndarray:
    if isinstance(labels, (str, os.PathLike)):
        try:
            labels = np.load(labels, allow_pickle=False)
        except Exception as e:
            raise CalibrationDataError(
                f"Cannot read labels from '{labels}' ({type(e).__name__}): save class ids with np.save."
            ) from None
    array = np.asarray(labels)
    if array.dtype.kind not in "iu" or array.ndim < 1:
        raise CalibrationDataError(
            f"Labels must be integer class ids, one per sample (got {array.dtype} {list(array.shape)})."
        )
    return array.astype(np.int64)


def _describe(data: Any) -> str | None:
    """The data as the report names it: a path, or the type of an in-memory source."""
    if data is None or isinstance(data, (str, os.PathLike)):
        return None if data is None else str(data)
    return type(data).__name__


def evaluate_models(
    models: ModelLike | Sequence[ModelLike],
    data: Any,
    *,
    reference: Any = None,
    labels: Any = None,
    providers: Sequence[str] | None = None,
    batch_size: int | None = None,
    perplexity: bool | None = None,
    latency_runs: int = 0,
    profile_runs: int = 0,
    custom_op_libs: Sequence[str] = (),
    optimization: str = "all",
) -> EvaluationReport:
    """Runs models side by side on the same data and reports task metrics, batch by batch.

    Args:
        models: One model or several (paths, ``onnx.ModelProto`` or ``onnx_ir.Model``), e.g. an FP32 original and
            its FP16/BF16/INT4 versions. Paths are mapped by ONNX Runtime, never copied through Python.
        data: Inputs: an ``.npy`` of token ids ``[N, seq]`` (token windows), a path (an ``.npz`` file, a folder of
            ``.npz`` files, a Polygraphy ``.json``), a dict of arrays, a list or iterator of feed dicts, or an ONNX
            Runtime ``CalibrationDataReader``; None: one batch of realistic random data.
        reference: The model the others are compared with: one of the models (path or name) or another model
            file, e.g. the float model of quantized ones: agreement, and for causal LMs the KL divergence of the
            logits and top-1 agreement (default: the first model).
        labels: Class ids (a path to an ``.npy`` or an array), one per sample in data order (negative ids are
            ignored): top-1/top-5 accuracy of the first float output.
        providers: ONNX Runtime providers for the evaluation: ``cpu``, ``cuda:N``, ``trt``, ``dml``.
        batch_size: Split each batch of the data into runs of at most this many samples (default: as stored).
        perplexity: Report perplexity: True requires causal LMs, False never, None (default) for every model with
            ``input_ids`` and ``[batch, seq, vocab]`` logits (an output whose name contains ``logits``).
        latency_runs: Timed runs of each model on the first batch, interleaved, after warm-up (default 0: no
            latency; 10 gives a stable median).
        profile_runs: Runs of each model on the first batch in a session of its own with ONNX Runtime's profiler
            on, after one warm-up: per kernel op type the nodes and kernel time, the nodes that ran in integer
            kernels (QLinearConv, MatMulIntegerToFloat...) with their share of kernel time, and the Q/DQ nodes
            left unfused (default 0: no profile; 3 is enough).
        custom_op_libs: Custom op libraries (.so/.dll) registered on every session.
        optimization: ONNX Runtime graph optimization level of the sessions (all: as deployed).

    Returns:
        The report: per model perplexity, accuracy, agreement with the reference, latency and the kernels ONNX
        Runtime ran; ``table()`` for a terminal and ``to_json()`` for scripts.

    Raises:
        OnnxprecError: A bad model, data, labels or argument; the message says how to fix it.
    """
    values = fields_in(EvaluateOptions, locals())
    if providers is None:
        del values["providers"]
    options = EvaluateOptions(**values)
    return run_evaluation(models, options)


def run_evaluation(models: ModelLike | Sequence[ModelLike], options: EvaluateOptions) -> EvaluationReport:
    """:func:`evaluate_models` with the settings as one object (e.g. built from command-line flags)."""
    sources, names, named, index = _sources(models, options)
    for what, path in (("--calibration_data", options.data), ("--labels", options.labels)):
        if isinstance(path, (str, os.PathLike)) and not Path(path).exists():
            raise CalibrationDataError(f"{what} '{path}' does not exist: check the path.")
    labels = _load_labels(options.labels) if options.labels is not None else None
    report = EvaluationReport(data=_describe(options.data), providers=list(options.providers))
    loaded: list[_Model] = []
    for i, (source, name) in enumerate(zip(sources, names)):
        result = ModelResult(name, named[i][1], is_reference=i == index)
        loaded.append(_setup(result, *_open(source, name, options), options, labels is not None))
        report.models.append(result)
        logger.debug("Model %s: fetch %s%s", name, loaded[-1].fetch, " (causal LM)" if loaded[-1].ppl else "")
    ref = loaded[index]
    order = [ref] + [m for m in loaded if m is not ref]
    _check_inputs(order, ref)
    _evaluate_data(order, ref, labels, options)
    for model in loaded:
        _collect(model, labels)
    if options.latency_runs:
        _latency(order, int(options.latency_runs))
        assert ref.first_feeds is not None
        report.latency_batch = {k: list(v.shape) for k, v in ref.first_feeds.items()}
    if options.profile_runs:
        for model in loaded:
            model.session = None  # the profiled sessions do not sit beside the timed ones (an LLM's weights twice)
        for source, model in zip(sources, loaded):
            _profile(source, model, options)
    for model in loaded:
        logger.info("%s", _summary(model.result), extra=SUMMARY)  # the table says it too
    return report


def _sources(
    models: ModelLike | Sequence[ModelLike], options: EvaluateOptions
) -> tuple[list[Any], list[str], list[tuple[str, str | None]], int]:
    """The models to evaluate (the reference first when it is another model), their unique names, their
    ``(name, description)`` pairs and the reference's index."""
    sources = [models] if isinstance(models, (str, os.PathLike, onnx.ModelProto, ir.Model)) else list(models)
    if not sources:
        raise InvalidArgumentError("No model to evaluate: pass at least one model.")
    named = [_name_of(source, i) for i, source in enumerate(sources)]
    index = _reference_index(sources, [n for n, _ in named], options.reference)
    if index is None:  # another model: evaluated first, as the reference
        sources.insert(0, options.reference)
        named.insert(0, _name_of(options.reference, len(sources)))
        index = 0
    names = [n for n, _ in named]
    for i, name in enumerate(names):
        if names.count(name) > 1:
            names[i] = f"{name}#{i}"
    return sources, names, named, index


def _check_inputs(order: Sequence[_Model], ref: _Model) -> None:
    """Raises when a model needs an input the reference does not have (and cannot be synthesized)."""
    for model in order:
        missing = [n for n in model.inputs if n not in ref.inputs and not _synthesizable(model, n)]
        if missing:
            raise InvalidArgumentError(
                f"Model '{model.result.name}' needs inputs {missing} that the reference "
                f"'{ref.result.name}' does not have: evaluate models with the same inputs."
            )


def _evaluate_data(order: list[_Model], ref: _Model, labels: np.ndarray | None, options: EvaluateOptions) -> None:
    """Runs every model on every batch of the data (one batch of realistic random inputs without data)."""
    if options.data is None:
        logger.info("No --data: one batch of realistic random inputs")
    offset = 0
    with CalibrationArgs(options.data, batch_size=options.batch_size, lenient=True).open(ref.graph) as data:
        for number, batch in enumerate(data):
            _evaluate_batch(order, batch, labels, offset, data.completed)
            first = next(iter(batch.values()))
            offset += first.shape[0] if first.ndim else 1
            logger.debug("Batch %d done (%d samples so far)", number, offset)
    if labels is not None and offset != labels.shape[0]:
        raise CalibrationDataError(
            f"--labels has {labels.shape[0]} entries but the data has {offset} samples: give one label per sample."
        )


def _collect(model: _Model, labels: np.ndarray | None) -> None:
    """Writes a model's accumulated perplexity, label accuracy and agreement into its result."""
    result = model.result
    if model.ppl is not None:
        result.perplexity, result.tokens = model.ppl.value, model.ppl.tokens
    if labels is not None and model.labelled:
        result.top1_accuracy = model.top1 / model.labelled
        result.top5_accuracy = None if model.top5 is None else model.top5 / model.labelled
        result.labelled = model.labelled
    if not result.is_reference:
        result.agreement = {name: stats.as_dict() for name, stats in model.agreement.items()}


def _profile(source: ModelLike, model: _Model, options: EvaluateOptions) -> None:
    """The kernels ONNX Runtime runs for the model on its first batch, from a profiled session of the evaluation's
    settings (a session of its own, so that the timed sessions run unprofiled)."""
    assert model.first_feeds is not None
    profile = profile_kernels(
        source,
        model.first_feeds,
        fetches=model.fetch,
        runs=int(options.profile_runs),
        providers=list(options.providers),
        optimization=options.optimization,  # type: ignore[arg-type]
        custom_op_libraries=list(options.custom_op_libs),
        what=f"model '{model.result.name}'",
    )
    model.result.kernels = profile
    logger.debug(
        "Kernels of %s per run: %s",
        model.result.name,
        ", ".join(f"{k.op_type} x{k.nodes} {k.microseconds:.0f} us ({k.provider})" for k in profile.kernels),
    )


def _evaluate_batch(
    order: list[_Model], batch: dict[str, np.ndarray], labels: np.ndarray | None, offset: int, built: frozenset[str]
) -> None:
    first = next(iter(batch.values()))
    size = first.shape[0] if first.ndim else 1
    batch_labels = None
    if labels is not None:
        batch_labels = labels[offset : offset + size]
        if batch_labels.shape[0] != size:
            raise CalibrationDataError(
                f"--labels has {labels.shape[0]} entries but the data has more samples: give one label per sample."
            )
    reference: dict[str, np.ndarray] | None = None
    for model in order:
        feeds = _feeds(model, batch, built)
        if model.first_feeds is None:
            model.first_feeds = feeds
        arrays, seconds = _run(model, feeds)
        outputs = dict(zip(model.fetch, arrays))
        model.result.seconds += seconds
        model.result.batches += 1
        model.result.samples += size
        _score(model, feeds, outputs, batch_labels)
        if reference is None:
            reference = outputs
        else:
            _agree(model, reference, outputs)
        del arrays, outputs


def _summary(result: ModelResult) -> str:
    parts = [f"{result.name}{' (reference)' if result.is_reference else ''}: {result.samples} samples"]
    if result.perplexity is not None:
        parts.append(f"perplexity {result.perplexity:.4f} over {result.tokens} tokens")
    if result.top1_accuracy is not None:
        parts.append(f"top-1 {result.top1_accuracy:.2%}, top-5 {fmt(result.top5_accuracy, '{:.2%}')}")
    main = result.main_agreement
    if main is not None:
        agree = f"KL divergence {main['kl']:.4g}, " if main.get("kl") is not None else ""
        agree += f"top-1 agreement {main['top1']:.2%}, " if main.get("top1") is not None else ""
        parts.append(f"{agree}max abs {main['max_abs']:.3g}, rel L2 {main['rel_l2']:.3g}, cosine {main['cosine']:.6f}")
    if result.latency_ms:
        parts.append(f"latency median {result.latency_ms['median']:.2f} ms, p90 {result.latency_ms['p90']:.2f} ms")
    profile = result.kernels
    if profile is not None:
        parts.append(
            f"{integer_nodes(profile)} kernel nodes integer ({fmt(profile.integer_share, '{:.1%}')} of kernel "
            f"time), {profile.qdq_nodes} Q/DQ unfused"
        )
    return "; ".join(parts)
