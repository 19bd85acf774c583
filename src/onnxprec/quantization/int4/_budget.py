"""The ``size_budget_mb`` step of the INT4 pipeline: each weight's precision, from measured sensitivity.

One pass over the calibration data (random data without it) collects every layer input's ``XᵀX``, chunk by chunk in
a bounded memory; each weight's candidates (INT4 at block 128/64/32, INT8, float) are quantized with RTN and scored by
their Hessian-weighted output error (:func:`onnxprec.sensitivity.hessian_loss`), and the sensitivity engine's
:func:`~onnxprec.sensitivity.allocate` chooses within the budget; the weights' choices are then set on the
selection (``WeightGroup.bits``, ``WeightGroup.block_size``; a weight left in float is dropped from it) and the
run's method quantizes them. The bytes outside the quantized weights (other initializers, the graph, AWQ scale
vectors) are counted against the budget first.

The estimate is checked by a few real runs on the same data. A relative output error does not cost the same
everywhere (an lm_head's error lands on the logits), so for a model with a ``logits`` output each weight above a
tenth of the quantized bytes, and the others by shape ``[K, N]`` (one part of every transformer block), are
quantized at their smallest candidate in a copy of the model (RTN, MatMulNBits, every other weight at INT8), and
the KL divergence of its logits from those of the model with every weight at INT8 is measured. Each set's estimates
are scaled by its measured KL over its estimated loss, so the loss is in nats per position: the curve in the report
is an estimated KL divergence.
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx_ir as ir

from onnxprec._io import trim_heap
from onnxprec._progress import Progress
from onnxprec._protobuf import structure_proto
from onnxprec._report import add_seconds, timed
from onnxprec.calibration_data import CalibrationArgs, CalibrationData
from onnxprec.errors import CalibrationDataError, InvalidArgumentError
from onnxprec.quantization.activation_stats import collect_stats, plan_chunks, streams
from onnxprec.quantization.algorithms.rtn import quantize_rtn
from onnxprec.quantization.budget import FLOAT, Precision, stored_bytes
from onnxprec.quantization.int4._options import Int4Options
from onnxprec.quantization.methods import GroupStats, MethodSpec
from onnxprec.quantization.select import InputGroup, Selection, WeightGroup
from onnxprec.sensitivity import Allocation, Candidate, allocate, calibrate, hessian_energy

__all__ = [
    "BLOCK_CHOICES", "TINY_ELEMENTS", "WRITTEN_LENGTH", "WRITTEN_WINDOWS", "BudgetReport", "choose_precisions",
    "holds_most_precise", "logits_head", "writes_text", "written_text",
]  # fmt: skip

logger = logging.getLogger(__name__)

BLOCK_CHOICES = (128, 64, 32)
"""INT4 block sizes a weight may get under a budget."""

TINY_ELEMENTS = 16384
"""Weights of at most this many values may also stay in float under a budget."""

# Bytes kept free of the budget for what the estimate does not see: the new nodes, the names and external-data
# entries of each quantized weight's initializers (a few hundred bytes a weight), and a margin of a few KB
# and 0.05 % of the weights.
_BYTES_PER_WEIGHT = 640
_MARGIN_BYTES = 4096
_MARGIN_SHARE = 5e-4


@dataclass
class BudgetReport:
    """What the budget step chose and estimated (``--report_json``'s ``size_budget``)."""

    budget_bytes: int
    fixed_bytes: int
    estimated_bytes: int = 0
    estimated_loss: float = 0.0
    curve: list[tuple[int, float]] = field(default_factory=list)
    layers: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per weight: ``precision``, ``bytes``, ``sensitivity`` (its estimated loss at that precision) and the
    estimated loss of every candidate."""
    seconds: float = 0.0
    steps: dict[str, float] = field(default_factory=dict)
    """Seconds of the statistics pass, the candidates' quantization and the real runs."""
    probes: dict[str, Any] = field(default_factory=dict)
    """The real runs: the float model's cross-entropy and, per weight set, estimated and measured loss."""

    def to_json(self, points: int = 200) -> dict[str, Any]:
        step = max(1, len(self.curve) // points)
        curve = self.curve[::step] + ([self.curve[-1]] if self.curve and (len(self.curve) - 1) % step else [])
        return {
            "budget_mb": self.budget_bytes / 1e6,
            "fixed_mb": round(self.fixed_bytes / 1e6, 6),
            "estimated_mb": round((self.estimated_bytes + self.fixed_bytes) / 1e6, 6),
            "estimated_loss": round(self.estimated_loss, 8),
            "real_runs": self.probes,
            "seconds": {step: round(value, 3) for step, value in self.steps.items()},
            "curve": [{"mb": round((b + self.fixed_bytes) / 1e6, 6), "loss": round(v, 8)} for b, v in curve],
        }


def _owner_groups(selection: Selection, groups: list[InputGroup]) -> dict[WeightGroup, InputGroup]:
    """The input group of each weight's first layer in graph order (weights read only by Gathers have none)."""
    target_of = {layer: target for target in selection.targets for layer in target.layers}
    owner: dict[WeightGroup, InputGroup] = {}
    for group in groups:
        for layer in group.layers:
            owner.setdefault(target_of[layer], group)
    return owner


def _precisions(target: WeightGroup, options: Int4Options) -> list[Precision]:
    if target.bits == 8:  # asked for by --layers_8bit
        return [Precision(8, options.block_8bit(target.k))]
    blocks = dict.fromkeys(min(b, 1 << max(target.k - 1, 1).bit_length()) for b in BLOCK_CHOICES)
    tiny = [FLOAT] if target.k * target.n <= TINY_ELEMENTS else []
    return [*(Precision(4, b) for b in blocks), Precision(8, options.block_8bit(target.k)), *tiny]


def _candidates(target: WeightGroup, gram: np.ndarray | None, options: Int4Options) -> list[Candidate]:
    """Every precision of ``target`` with its bytes and loss (RTN; the table part of a tied weight unweighted).

    Blocks run along K, so output columns are quantized independently: the losses are summed over slices of about
    ``_SLICE_BYTES`` of columns, each read on its own: a 262k-row tied table is never all in memory."""
    config = options.quant_config()
    precisions = _precisions(target, options)
    errors = np.zeros((len(precisions), 2))  # per precision: tr(ΔWᵀ H ΔW), tr(ΔWᵀ ΔW)
    energy = np.zeros(2)  # tr(Wᵀ H W), tr(Wᵀ W)
    if gram is not None:  # the float32 copy each product reads, made once (a [K, K] float32 array)
        gram = np.asarray(gram, np.float32)
    step = max(1, _SLICE_BYTES // (4 * target.k))
    for start in range(0, target.n, step):
        part = target.read(slice(start, start + step))  # one slice in memory, however large the weight
        energy += [hessian_energy(part, gram) if target.matmuls else 0.0, hessian_energy(part, None)]
        for i, precision in enumerate(precisions):
            if not precision.bits:
                continue
            diff = part - quantize_rtn(
                part, precision.block_size, symmetric=config.symmetric, bits=precision.bits,
                positive_scales=config.positive_scales,
            ).dequantize()  # fmt: skip
            errors[i] += [hessian_energy(diff, gram) if target.matmuls else 0.0, hessian_energy(diff, None)]
            del diff
        del part
    result = []
    for precision, (weighted, plain) in zip(precisions, errors):
        size = _stored(target, precision, options)
        loss = 0.0
        if target.matmuls and energy[0] > 0:
            loss += max(weighted, 0.0) / energy[0]
        if target.gathers and energy[1] > 0:
            loss += plain / energy[1]
        result.append(Candidate(precision, size, loss))
    return result


# Output columns of a weight scored at once (float32 bytes).
_SLICE_BYTES = 64 << 20


def _most_precise(selection: Selection, options: Int4Options) -> dict[WeightGroup, Candidate]:
    """Each weight's most precise candidate (float for a tiny weight, else INT8) with its bytes; its loss is not
    measured (0)."""
    result = {}
    for target in selection.targets:
        precision = _precisions(target, options)[-1]
        result[target] = Candidate(precision, _stored(target, precision, options), 0.0)
    return result


def _stored(target: WeightGroup, precision: Precision, options: Int4Options) -> int:
    """Bytes of ``target`` written at ``precision`` in the run's output format."""
    symmetric = not options.use_zero_point
    return target_sizes(target, precision.bits, precision.block_size, symmetric, options.format)[1]


def target_sizes(target: WeightGroup, bits: int, block_size: int, symmetric: bool, output_format: str
                 ) -> tuple[int, int, int]:  # fmt: skip
    """(float bytes, stored bytes, ideal bytes) of ``target`` written at ``bits`` in blocks of ``block_size``."""
    stored, ideal = stored_bytes(
        target.k, target.n, int(target.dtype.itemsize), Precision(bits, block_size), symmetric=symmetric,
        output_format=output_format,
    )  # fmt: skip
    return target.k * target.n * int(target.dtype.itemsize), stored, ideal


def _holds(fixed: int, ceiling: dict[WeightGroup, Candidate], budget: int) -> bool:
    return fixed + sum(c.bytes for c in ceiling.values()) <= budget


def holds_most_precise(model: ir.Model, selection: Selection, options: Int4Options) -> bool:
    """Whether ``options.size_budget_mb`` holds every selected weight at its most precise candidate: nothing to
    choose, so no sensitivity is measured and no calibration text is needed."""
    assert options.size_budget_mb is not None
    budget = round(options.size_budget_mb * 1e6)
    return _holds(_fixed_bytes(model, selection, options), _most_precise(selection, options), budget)


def _fixed_bytes(model: ir.Model, selection: Selection, options: Int4Options) -> int:
    """Bytes of the output that are not quantized weights: the graph, the other initializers, AWQ scale vectors."""
    replaced = {target.weight for target in selection.targets} | {
        value for target in selection.targets for value in target.duplicates
    }
    size = structure_proto(model).ByteSize()  # the graph with initializers above 1 KB stripped
    for value in model.graph.initializers.values():
        tensor = value.const_value
        if value in replaced or tensor is None:
            continue
        if tensor.nbytes > 1024:
            size += tensor.nbytes
    if options.spec.awq_scales:
        size += sum(group.k * 4 for group in selection.groups())
    weights = sum(target.k * target.n for target in selection.targets)
    return size + _BYTES_PER_WEIGHT * len(selection.targets) + _MARGIN_BYTES + round(_MARGIN_SHARE * weights)


# Weights whose smallest form is at least this share of all the quantized bytes get a real run of their own.
_OWN_PROBE_SHARE = 0.1


def _probe_sets(candidates: dict[WeightGroup, list[Candidate]]) -> list[list[WeightGroup]]:
    """The weight sets measured by real runs: each large weight alone, the others by shape ``[K, N]`` (weights of one
    shape play one part in every block of a transformer, whatever their names)."""
    smallest = {target: min(c.bytes for c in options) for target, options in candidates.items()}
    total = sum(smallest.values())
    sets: dict[object, list[WeightGroup]] = {}
    for target, size in smallest.items():
        key = target if size >= _OWN_PROBE_SHARE * total else (target.k, target.n, bool(target.gathers))
        sets.setdefault(key, []).append(target)
    return list(sets.values())


def _has_logits(model: ir.Model) -> bool:
    return any(v.name == "logits" for v in model.graph.outputs)


# Tokens' float distributions are kept as their top-k probabilities (KL to the rest of the vocabulary as one bucket).
_TOP_K = 32

# Positions the real runs score (the first calibration batches that hold this many).
_PROBE_POSITIONS = 1024

# Positions whose logits are reduced at once: a [rows, vocabulary] float32 temporary (64 MB at 262k tokens).
_ROWS = 64


def _logits(model: ir.Model, data: CalibrationData, options: Int4Options) -> Generator[np.ndarray, None, None]:
    """The logits of ``model`` on the first calibration batches (about ``_PROBE_POSITIONS`` positions), one batch
    at a time as ``[positions, vocabulary]``; the probe session computes no output but the logits."""
    from onnxprec._ort import create_session

    session = create_session(model, providers=options.calibration_eps, optimization="basic", what="the probe model",
                             spinning=False)  # fmt: skip
    try:
        positions = 0
        for feeds in data:
            (logits,) = session.run(feeds, ["logits"])
            flat = logits.reshape(-1, logits.shape[-1])
            positions += flat.shape[0]
            yield flat
            del logits, flat
            if positions >= _PROBE_POSITIONS:
                break
    finally:
        del session


def _log_normalizer(logits: np.ndarray) -> np.ndarray:
    """``log(sum(exp(logits)))`` of each row, in float64, ``_ROWS`` rows at a time (no log-softmax of the whole
    ``[positions, vocabulary]`` array is made)."""
    out = np.empty(logits.shape[0], np.float64)
    for start in range(0, logits.shape[0], _ROWS):
        rows = logits[start : start + _ROWS]
        top = rows.max(axis=1, keepdims=True).astype(np.float32)
        shifted = np.subtract(rows, top, dtype=np.float32)
        np.exp(shifted, out=shifted)
        out[start : start + _ROWS] = top[:, 0] + np.log(shifted.sum(axis=1).astype(np.float64))  # pairwise sums
    return out


def _reference_top(model: ir.Model, data: CalibrationData, options: Int4Options) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per batch: the float model's top-k token indices and log-probabilities of every position."""
    tops = []
    for logits in _logits(model, data, options):
        top_k = min(_TOP_K, logits.shape[1])  # a classifier's few classes: all of them
        index = np.empty((logits.shape[0], top_k), np.int64)
        for start in range(0, logits.shape[0], _ROWS):
            index[start : start + _ROWS] = np.argpartition(logits[start : start + _ROWS], -top_k, axis=1)[:, -top_k:]
        top = np.take_along_axis(logits, index, axis=1).astype(np.float64) - _log_normalizer(logits)[:, None]
        tops.append((index, top))
    return tops


def _kl(model: ir.Model, data: CalibrationData, reference: list[tuple[np.ndarray, np.ndarray]],
        options: Int4Options) -> float:  # fmt: skip
    """Mean KL divergence (nats per position) of ``model``'s logits from the reference's, over the reference's top-k
    tokens and the rest of the vocabulary as one bucket (a lower bound of the full KL)."""
    total, count = 0.0, 0
    with contextlib.closing(_logits(model, data, options)) as batches:  # closing frees the session at once
        for (index, ref), logits in zip(reference, batches):
            q = np.take_along_axis(logits, index, axis=1).astype(np.float64) - _log_normalizer(logits)[:, None]
            p = np.exp(ref)
            rest_p = np.clip(1 - p.sum(axis=1), 1e-12, 1)
            rest_q = np.clip(1 - np.exp(q).sum(axis=1), 1e-12, 1)
            kl = (p * (ref - q)).sum(axis=1) + rest_p * (np.log(rest_p) - np.log(rest_q))
            total += float(np.maximum(kl, 0).sum())
            count += kl.size
    return total / max(count, 1)


def _probe_model(
    model: ir.Model, chosen: dict[str, Precision], options: Int4Options
) -> tuple[ir.Model, dict[str, list[ir.Value]]]:
    """A copy of ``model`` whose weights named in ``chosen`` are RTN-quantized at that precision (MatMulNBits at
    ``--accuracy_level``, as the output computes: at 0, ONNX Runtime's CPU kernel dequantizes an 8-bit weight whole
    for every run, a float copy of a large head or tied table), and the initializers each quantized weight became, by
    weight name."""
    from onnxprec._graph import NameAllocator
    from onnxprec._pieces import gather_model_columns
    from onnxprec.quantization.activation_stats import pruned_copy
    from onnxprec.quantization.formats import LazyQuantizedWeight, rewrite_matmulnbits
    from onnxprec.quantization.formats.matmulnbits import DOMAIN
    from onnxprec.quantization.methods import Recipe
    from onnxprec.quantization.select import select_layers

    copy = pruned_copy(model, ["logits"])  # the probes measure the logits only
    config = options.quant_config()
    names = NameAllocator(copy)
    pieces: dict[str, list[ir.Value]] = {}
    for target in select_layers(copy).targets:
        precision = chosen.get(target.name)
        if precision is None or precision.bits == 0:
            continue
        recipe = Recipe(
            "rtn", bits=precision.bits, block_size=precision.block_size, symmetric=config.symmetric,
            positive_scales=config.positive_scales,
        )  # fmt: skip
        assert target.weight.const_value is not None
        lazy = LazyQuantizedWeight(target.weight.const_value, recipe, transposed=target.transposed)
        nodes = rewrite_matmulnbits(copy.graph, target, lazy, names, accuracy_level=options.accuracy_level)
        inputs = (v for node in nodes for v in node.inputs if v is not None and v.is_initializer())
        pieces[target.name] = list({id(v): v for v in inputs}.values())
        for value in (target.weight, *target.duplicates):
            if not value.uses() and value.name in copy.graph.initializers:
                copy.graph.initializers.pop(str(value.name))
    copy.opset_imports.setdefault(DOMAIN, 1)
    gather_model_columns(copy)  # no folded transposed copy of a float table tied through a Transpose
    return copy, pieces


def _saved(model: ir.Model, folder: Path, name: str) -> ir.Model:
    """``model`` saved as ``folder/name.onnx`` (each initializer of 1 KB or more in ``name.onnx.data``), loaded back
    with its weights mapped from there."""
    path = folder / f"{name}.onnx"
    ir.save(model, path, external_data=f"{name}.onnx.data", size_threshold_bytes=1024)
    return ir.load(path)


def _on_base(probe: ir.Model, pieces: dict[str, list[ir.Value]], own: set[str], base: ir.Model, folder: Path) -> None:
    """Points the quantized weights of ``probe`` but those named in ``own`` (quantized its own way), and its weights
    read from files, at ``base``'s saved tensors of the same name, type and shape, and writes the ``own`` weights to
    ``folder/probe.data``: ONNX Runtime then maps every large weight from ``folder``, and no weight of the base is
    quantized or written again."""
    shared = [v for name, values in pieces.items() if name not in own for v in values]
    shared += [v for v in probe.graph.initializers.values() if isinstance(v.const_value, ir.ExternalTensor)]
    for value in shared:
        tensor, saved = value.const_value, base.graph.initializers.get(str(value.name))
        if tensor is None or saved is None or saved.const_value is None:
            continue
        if (saved.const_value.dtype, tuple(saved.const_value.shape)) == (tensor.dtype, tuple(tensor.shape)):
            value.const_value = saved.const_value
    mine = [(v, v.const_value) for name in own for v in pieces.get(name, ()) if v.const_value is not None]
    written = ir.external_data.convert_tensors_to_external([t for _, t in mine], folder, "probe.data")
    for (value, _), tensor in zip(mine, written):
        value.const_value = tensor


def _calibrate_gains(
    model: ir.Model, data: CalibrationData, candidates: dict[WeightGroup, list[Candidate]], options: Int4Options,
    report: BudgetReport,
) -> None:  # fmt: skip
    """Scales each weight's estimated losses by the measured KL divergence of its probe set (in place).

    The reference is the model with every weight at INT8 (near the float model's logits, at a quarter of its memory),
    quantized and saved once; each probe quantizes one set at its smallest precision and reads every other weight
    from the saved reference.
    """
    eight = {t.name: Precision(8, options.block_8bit(t.k)) for t in candidates}

    def smallest(targets: Sequence[WeightGroup]) -> dict[WeightGroup, Candidate]:
        return {t: min(candidates[t], key=lambda c: c.bytes) for t in targets}

    with tempfile.TemporaryDirectory(prefix="onnxprec-probes-") as tmp:
        folder = Path(tmp)
        base = _saved(_probe_model(model, eight, options)[0], folder, "int8")
        reference = _reference_top(base, data, options)

        def measure(targets: Sequence[WeightGroup]) -> float:
            chosen = {t.name: c.precision for t, c in smallest(targets).items()}
            probe, pieces = _probe_model(model, {**eight, **chosen}, options)
            _on_base(probe, pieces, {t.name for t in targets}, base, folder)
            try:
                return _kl(probe, data, reference, options)
            finally:
                del probe
                (folder / "probe.data").unlink(missing_ok=True)

        checked = calibrate(_probe_sets(candidates), lambda ts: sum(c.loss for c in smallest(ts).values()), measure)
        for value in base.graph.initializers.values():  # unmapped before the folder goes
            if isinstance(value.const_value, ir.ExternalTensor):
                value.const_value.release()
    probes = []
    for probe in checked:
        targets = probe.items
        for target in targets:
            candidates[target] = [Candidate(c.precision, c.bytes, c.loss * probe.gain) for c in candidates[target]]
        names = [t.name for t in targets]
        probes.append({"weights": names if len(names) <= 3 else f"{len(names)} weights", "estimated": probe.estimated,
                       "measured_kl": probe.measured, "gain": probe.gain})  # fmt: skip
        logger.info(
            "Real run: %s at the smallest precision: KL divergence of the logits %.4g nats (estimate %.4g)",
            names[0] if len(names) == 1 else f"{len(names)} weights of shape {targets[0].k}x{targets[0].n}",
            probe.measured, probe.estimated,
        )  # fmt: skip
    report.probes = {"sets": probes}


# Ops between an LLM's head MatMul and its logits output that keep the head's values as they are.
_PASS_THROUGH = frozenset({"Cast", "Reshape", "Identity", "Squeeze", "Unsqueeze", "Flatten", "Add"})


def logits_head(model: ir.Model) -> str | None:
    """The name of the MatMul or Gemm that writes the ``logits`` output (through casts, reshapes or a bias Add);
    None when there is no such single node."""
    value = next((v for v in model.graph.outputs if v.name == "logits"), None)
    while value is not None and (node := value.producer()) is not None:
        if node.op_type in ("MatMul", "Gemm") and node.domain in ("", "ai.onnx"):
            return node.name
        if node.op_type not in _PASS_THROUGH or node.domain not in ("", "ai.onnx"):
            return None
        computed = [v for v in node.inputs if v is not None and v.const_value is None and not v.is_initializer()]
        value = computed[0] if len(computed) == 1 else None
    return None


def writes_text(model: ir.Model) -> bool:
    """Whether ``model`` is an LLM that can write its own calibration text (:func:`written_text`)."""
    from onnxprec.llm_inputs import LLMInputs

    return LLMInputs.of(model) is not None and _has_logits(model)


def written_text(model: ir.Model, options: Int4Options, writer: ir.Model | None = None) -> dict[str, np.ndarray] | None:
    """Without calibration data: token windows the LLM writes itself, or None (random data) for other models.

    Used for the size budget's sensitivities and for the methods that calibrate (AWQ, GPTQ): the model's own text is
    in its distribution, random token ids are not text. ``writer``: a quantized copy of ``model`` that samples the
    tokens in its place (:func:`~onnxprec.quantization.generated.generated_token_windows`).
    """
    from onnxprec.llm_inputs import LLMInputs
    from onnxprec.quantization.generated import generated_token_windows

    llm = LLMInputs.of(model)
    if llm is not None and _has_logits(model):
        try:
            ids = generated_token_windows(
                model, WRITTEN_WINDOWS, WRITTEN_LENGTH, providers=options.calibration_eps, writer=writer
            )
        except CalibrationDataError as e:
            logger.warning("The model cannot write its own calibration text (%s)", e)
        else:
            logger.warning(
                "No calibration data: %s calibrates on %d windows of %d tokens the model wrote itself; "
                "representative inputs (--calibration_data) may do better.",
                "--size_budget_mb" if options.size_budget_mb is not None and not options.spec.needs_data
                else options.method, WRITTEN_WINDOWS, WRITTEN_LENGTH,
            )  # fmt: skip
            return {llm.ids.name: ids}
    return None


# Without calibration data, an LLM writes this many windows of this many tokens to calibrate on.
WRITTEN_WINDOWS = 8
WRITTEN_LENGTH = 256


def _measure_candidates(
    model: ir.Model,
    selection: Selection,
    options: Int4Options,
    written: dict[str, np.ndarray] | None,
    report: BudgetReport,
) -> dict[WeightGroup, list[Candidate]]:
    """Each weight's candidate precisions with their estimated loss: one pass over the data for the ``XᵀX`` of
    each layer input (then, for an LLM, real runs that calibrate the estimate), their times in ``report.steps``."""
    all_groups = selection.groups()  # new objects on each call: keep one list
    owner = _owner_groups(selection, all_groups)
    owned: dict[InputGroup, list[WeightGroup]] = {}
    for target, group in owner.items():
        owned.setdefault(group, []).append(target)
    candidates: dict[WeightGroup, list[Candidate]] = {}
    spec = MethodSpec(gptq=True)  # XᵀX only
    groups = [group for group in all_groups if group in owned]
    if streams(model, options.segment_bytes):  # one pass: each segment's Gram matrices are used and freed as it ends
        chunks = [groups] if groups else []
    else:
        chunks = plan_chunks(groups, spec, options.sample_tokens, options.stats_memory_mb * 1024 * 1024)
    source = options.calibration_data_reader
    if source is None:
        source = written
        if written is None:
            logger.warning(
                "No calibration data: layer sensitivities under --size_budget_mb are measured on random inputs; "
                "pass representative inputs (--calibration_data) for a better choice."
            )
    llm = _has_logits(model)

    def run(replay: CalibrationData) -> None:
        bar = Progress("Measuring sensitivity", "input", len(groups), leave=True).open()
        try:

            def score(stats: dict[InputGroup, GroupStats]) -> None:
                with timed() as scoring:
                    for group in list(stats):
                        gram = stats.pop(group).gram
                        for target in owned[group]:
                            candidates[target] = _candidates(target, gram, options)
                        del gram
                        bar.update()
                    trim_heap(collect=False)  # the scoring's slices, freed in blocks the heap (of any thread) keeps
                add_seconds(report.steps, "candidates", scoring.seconds)

            for chunk in chunks:
                scored = report.steps.get("candidates", 0.0)
                with timed() as running:
                    left = collect_stats(
                        model, chunk, replay, spec, providers=options.calibration_eps,
                        segment_bytes=options.segment_bytes, on_ready=score,
                    )  # fmt: skip
                # the runs' time, less the scoring done while they ran
                add_seconds(
                    report.steps, "statistics", running.seconds - (report.steps.get("candidates", 0.0) - scored)
                )
                score(left)
            bar.close()
            with timed() as scoring:
                for target in selection.targets:
                    if target not in candidates:
                        candidates[target] = _candidates(target, None, options)
            add_seconds(report.steps, "candidates", scoring.seconds)
            if llm:
                with timed() as real_runs:
                    _calibrate_gains(model, replay, candidates, options, report)
                add_seconds(report.steps, "real runs", real_runs.seconds)
        finally:
            bar.close()
            replay.close()

    CalibrationArgs(source, options.input_shapes, options.calibration_batch_size).run(model, run)
    if not llm:
        logger.info("No real runs to check the estimate: the model has no 'logits' output")
    return candidates


def _allocate(
    candidates: dict[WeightGroup, list[Candidate]], budget: int, fixed: int, options: Int4Options
) -> Allocation[WeightGroup]:
    """The candidates' allocation within ``budget`` bytes, ``fixed`` of which the rest of the model takes."""
    try:
        return allocate(candidates, budget - fixed)
    except ValueError:
        smallest = fixed + sum(min(c.bytes for c in options_) for options_ in candidates.values())
        raise InvalidArgumentError(
            f"size_budget_mb {options.size_budget_mb:g} is below the smallest reachable size, {smallest / 1e6:.2f} MB "
            "(every weight at INT4 block 128, the rest of the model as it is): raise the budget, or let more layers "
            "be quantized (--nodes_to_exclude)."
        ) from None


def choose_precisions(
    model: ir.Model, selection: Selection, options: Int4Options, written: dict[str, np.ndarray] | None = None
) -> BudgetReport:
    """Sets each selected weight's precision within ``options.size_budget_mb``; returns what was chosen.

    ``written``: without calibration data, the text the model wrote itself (:func:`written_text`), else random data.

    Raises:
        InvalidArgumentError: The budget is below the smallest reachable size (named in the message).
    """
    assert options.size_budget_mb is not None
    with timed() as clock:
        budget = round(options.size_budget_mb * 1e6)
        fixed = _fixed_bytes(model, selection, options)
        report = BudgetReport(budget, fixed)
        ceiling = _most_precise(selection, options)
        measured = not _holds(fixed, ceiling, budget)
        if measured:
            candidates = _measure_candidates(model, selection, options, written, report)
        else:  # nothing to choose: no statistics, no real runs
            candidates = {target: [candidate] for target, candidate in ceiling.items()}
            report.probes = {"skipped": "the budget holds every weight at its most precise candidate"}
        allocation = _allocate(candidates, budget, fixed, options)
        report.estimated_bytes, report.estimated_loss, report.curve = (
            allocation.bytes,
            allocation.loss,
            allocation.curve,
        )
        for target, candidate in allocation.choice.items():
            report.layers[target.name] = {
                "precision": candidate.precision.label,
                "bytes": candidate.bytes,
                "sensitivity": candidate.loss if measured else None,
                "candidates": {c.precision.label: c.loss for c in candidates[target]} if measured else {},
            }
            if candidate.precision.bits == 0:
                selection.targets.remove(target)
                selection.skipped.append((target.name, "kept in float by the size budget"))
            else:
                target.bits = candidate.precision.bits
                target.block_size = candidate.precision.block_size
    report.seconds = clock.seconds
    counts: dict[str, int] = {}
    for candidate in allocation.choice.values():
        counts[candidate.precision.label] = counts.get(candidate.precision.label, 0) + 1
    chosen = ", ".join(f"{n} {label}" for label, n in sorted(counts.items()))
    logger.info(
        "Size budget %.2f MB: estimated %.2f MB (%s)%s", budget / 1e6, (allocation.bytes + fixed) / 1e6, chosen,
        f", estimated loss {allocation.loss:.4g}" if measured
        else ": it holds every weight at its most precise candidate, no sensitivity measured",
    )  # fmt: skip
    return report
