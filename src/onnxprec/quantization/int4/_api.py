"""INT4 weight-only quantization: the pipeline and its public functions (re-exported by ``onnxprec.quantization.int4``).

The pipeline, one step each::

    load -> check -> sanitize (names, constants, opset 21 for QDQ) -> select layers
         -> calibrate + decide (per chunk of input groups: one pass over the data, then AWQ / clip / GPTQ)
         -> rewrite (AWQ input scaling, QDQ or MatMulNBits) -> validate -> save (weights quantized while written)

``quantize`` takes ModelOpt's ``int4.quantize`` arguments and returns an ``onnx.ModelProto``; ``quantize_file``
streams path to path (memory-mapped weights in, each weight quantized as it is written) and returns a report.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from onnxprec import _ort
from onnxprec._graph import FLOAT_TYPES, NameAllocator
from onnxprec._io import ModelSource, load_model, to_model_proto, trim_heap
from onnxprec._ops import (
    default_opset,
)
from onnxprec._options import fields_in, log_level_during
from onnxprec._progress import Progress
from onnxprec._report import SUMMARY, Step, add_seconds, timed
from onnxprec._tensors import release
from onnxprec.calibration_data import CalibrationArgs, CalibrationData
from onnxprec.errors import AccuracyGuardError, UnsupportedModelError
from onnxprec.passes import LiftFloatConstantsPass, NameNodesPass, UpgradeOpsetPass, user_error
from onnxprec.quantization._tool import QuantizationTool, check_float_model, check_selection, nothing_to_quantize
from onnxprec.quantization.activation_stats import (
    collect_stats,
    device_gram,
    plan_chunks,
    pruned_copy,
    quiet_onnx_ir,
    streams,
)
from onnxprec.quantization.algorithms.rtn import QuantizedWeight
from onnxprec.quantization.formats import LazyQuantizedWeight, rewrite_matmulnbits, rewrite_qdq
from onnxprec.quantization.formats.matmulnbits import DOMAIN as MS_DOMAIN
from onnxprec.quantization.formats.qdq import MIN_OPSET
from onnxprec.quantization.int4 import _guard
from onnxprec.quantization.int4._budget import (
    choose_precisions,
    holds_most_precise,
    logits_head,
    target_sizes,
    writes_text,
    written_text,
)
from onnxprec.quantization.int4._options import DEFAULT_EXCLUDE, NO_DATA_LLM_METHOD, Int4Options, Int4Plan
from onnxprec.quantization.int4._report import Int4Report, LayerReport
from onnxprec.quantization.methods import CompactWeight, GroupStats, QuantConfig, Recipe, Spill, decide_targets
from onnxprec.quantization.scaling import apply_input_scales
from onnxprec.quantization.select import (
    FLOAT_WEIGHT_TYPES,
    InputGroup,
    Selection,
    WeightGroup,
    pattern_names,
    select_layers,
)
from onnxprec.validate import check_structure, load_in_ort

__all__ = ["Int4Options", "Int4Report", "default_output_path", "quantize", "quantize_file", "quantize_model"]

logger = logging.getLogger(__name__)

# Table types a quantized Gather may have: GatherBlockQuantized has float and float16 CPU kernels only.
GATHER_TYPES = {
    "qdq": FLOAT_WEIGHT_TYPES,
    "matmulnbits": frozenset({ir.DataType.FLOAT, ir.DataType.FLOAT16}),
}


# ---------------------------------------------------------------------------------------------------
# Steps


def _sanitize(model: ir.Model, options: Int4Options) -> None:
    """Names every node, turns float Constant nodes into initializers, and raises the opset for QDQ."""
    with quiet_onnx_ir():
        NameNodesPass()(model)
        LiftFloatConstantsPass()(model)
        if options.format == "qdq" and default_opset(model) < MIN_OPSET:
            _upgrade_opset(model)
    if options.format == "qdq":
        model.ir_version = max(model.ir_version, 10)


def _upgrade_opset(model: ir.Model) -> None:
    """Opset 21 for DequantizeLinear with INT4 and ``block_size``; a failure says how to avoid the upgrade."""
    try:
        UpgradeOpsetPass(MIN_OPSET)(model)
    except Exception as e:
        cause = user_error(e)
        reason = str(cause).split("; ")[0] if cause is not None else str(e).splitlines()[0]
        raise UnsupportedModelError(
            f"{reason}; --output_format matmulnbits needs no opset change, or upgrade the model to opset "
            f"{MIN_OPSET} yourself."
        ) from None


def _owned_targets(groups: list[InputGroup], selection: Selection) -> dict[InputGroup, list[WeightGroup]]:
    """The 4-bit targets each group decides: those whose first layer (in graph order) reads the group's input."""
    target_of = {layer: target for target in selection.targets for layer in target.layers}
    owner: dict[WeightGroup, InputGroup] = {}
    for group in groups:
        for layer in group.layers:
            owner.setdefault(target_of[layer], group)
    owned: dict[InputGroup, list[WeightGroup]] = {group: [] for group in groups}
    for target, group in owner.items():
        if target.bits == 4:
            owned[group].append(target)
    return owned


def _awq_allowed(group: InputGroup, owned: list[WeightGroup], selection: Selection) -> bool:
    """AWQ scales one input: every layer reading it must have its weight decided here, and only here."""
    target_of = {layer: target for target in selection.targets for layer in target.layers}
    members = set(group.layers)
    return all(
        target_of[layer] in owned and all(other in members for other in target_of[layer].layers)
        for layer in group.layers
    )


def _calibrate(run: Int4Run) -> None:
    """Activation statistics per chunk of input groups and the recipes (and AWQ scales) they decide, on the
    calibration data, else on the text an LLM wrote itself, else on random inputs."""
    options, report, written = run.options, run.report, run.written
    calibration = _plan_calibration(run)
    source = options.calibration_data_reader if written is None else written
    if source is None:
        logger.warning(
            "No calibration data: %s runs on realistic random inputs. AWQ and GPTQ fit the statistics of the "
            "calibration data; pass representative inputs (--calibration_data, API: calibration_data_reader=).",
            options.method,
        )
    CalibrationArgs(source, options.input_shapes, options.calibration_batch_size).run(run.model, calibration.run)
    report.calibration.update(
        {"passes": len(calibration.chunks), "random": source is None, "written": written is not None,
         "inputs": len(calibration.groups)}
    )  # fmt: skip
    run.scales = calibration.scales


def _plan_calibration(run: Int4Run) -> _Calibration:
    """The input groups that decide a 4-bit weight, in chunks of one pass over the data each.

    A segmented model is calibrated in one forward walk: each segment runs on the activations the previous one left,
    and the groups whose inputs it computed are decided (and their statistics dropped) before the next segment, so
    the statistics held are one segment's, whatever the depth, and the GPTQ results go to a file as they are made.
    --gptq_sequential needs the earlier layers quantized before the later ones run: one pass per few groups."""
    model, selection, options = run.model, run.selection, run.options
    groups = [g for g in selection.groups() if any(t.bits == 4 for t in _targets_of(g, selection))]
    owned = _owned_targets(groups, selection)
    groups = [g for g in groups if owned[g]]
    budget = options.stats_memory_mb * 1024 * 1024
    streaming = not options.gptq_sequential and streams(model, options.segment_bytes)
    chunks = [groups] if streaming else plan_chunks(groups, options.spec, options.sample_tokens, budget)
    if options.gptq_sequential:
        chunks = [chunk[i : i + SEQUENTIAL_GROUPS] for chunk in chunks for i in range(0, len(chunk), SEQUENTIAL_GROUPS)]
    if len(chunks) > 1:
        logger.info(
            "Activation statistics of %d layer inputs exceed --stats_memory_mb %d: calibrating in %d passes",
            len(groups), options.stats_memory_mb, len(chunks),
        )  # fmt: skip
    spill = Spill() if streaming else None  # a walk's GPTQ results wait for the save in a file, not in memory
    return _Calibration(run, groups, owned, chunks, streaming, spill)


@dataclasses.dataclass
class _Calibration:
    """One calibration (:func:`_plan_calibration`): its runs over the data, chunk by chunk, and the decisions each
    group's statistics make as they are ready; fills the run's ``recipes`` and ``entries``, and :attr:`scales`."""

    state: Int4Run
    groups: list[InputGroup]
    owned: dict[InputGroup, list[WeightGroup]]
    chunks: list[list[InputGroup]]
    streaming: bool
    """One forward walk: each group is decided as soon as the segments that compute its input have run."""
    spill: Spill | None
    """Where a walk's GPTQ results wait for the save (a file), or None (in memory)."""
    scales: dict[InputGroup, np.ndarray] = dataclasses.field(default_factory=dict)
    floats: dict[WeightGroup, ir.TensorProtocol] = dataclasses.field(default_factory=dict)
    """--gptq_sequential: the float weights while dequantized ones stand in."""
    stand_ins: tempfile.TemporaryDirectory[str] | None = None
    bar: Progress | None = None
    decided: float = 0.0
    """Seconds spent deciding during the runs (on_ready), not counted as calibration runs."""
    walk: dict[str, float] = dataclasses.field(default_factory=dict)
    """Seconds of the statistics passes' parts (``collect_stats(seconds=)``)."""

    def run(self, replay: CalibrationData) -> None:
        """Each chunk's pass over ``replay`` and its decisions; the float weights are put back at the end."""
        options, report = self.state.options, self.state.report
        self.bar = Progress(f"Calibrating ({options.method})", "input", len(self.groups), leave=True).open()
        if options.gptq_sequential:
            self.stand_ins = tempfile.TemporaryDirectory(prefix="onnxprec-sequential-")
        try:
            for chunk in self.chunks:
                before = self.decided
                with timed() as running:
                    left = collect_stats(
                        self.state.model, chunk, replay, options.spec, sample_tokens=options.sample_tokens,
                        providers=options.calibration_eps, segment_bytes=options.segment_bytes,
                        on_ready=self.decide if self.streaming else None,
                        backend=self.state.config.backend, seconds=self.walk,  # Grams made where GPTQ runs
                    )  # fmt: skip
                runs = running.seconds - (self.decided - before)  # less the deciding done while they ran
                add_seconds(report.seconds, "calibration runs", runs)
                self.decide(left)
            report.add_walk_seconds(self.walk, self.decided)
        finally:
            for target, tensor in self.floats.items():
                target.weight.const_value = tensor
            if self.stand_ins is not None:
                self.stand_ins.cleanup()
            self.bar.close()
            report.calibration.update({"batches": replay.batches, "samples": replay.samples})
            replay.close()

    def decide(self, stats: dict[InputGroup, GroupStats]) -> None:
        """The recipes (and AWQ scales) of the groups whose statistics are ready, in graph order."""
        run, recipes = self.state, self.state.recipes
        with timed() as deciding:
            for group in [g for g in self.groups if g in stats]:
                owned = self.owned[group]
                group_scales = _decide(
                    group, owned, stats.pop(group), run.selection, run.options, recipes, run.entries, run.report.seconds
                )
                if group_scales is not None:
                    self.scales[group] = group_scales
                for target in owned:
                    result = recipes[target].result
                    if self.spill is not None and isinstance(result, CompactWeight):
                        recipes[target].result = result.spill(self.spill)
                if self.stand_ins is not None:  # the next chunks see this group's weights quantized
                    for target in owned:
                        file = Path(self.stand_ins.name) / f"w{len(self.floats)}.bin"
                        self.floats[target] = _set_dequantized(target, recipes[target], file)
                assert self.bar is not None
                self.bar.update()
            trim_heap(collect=False)  # the segment's activations and arrays, freed in blocks the heap keeps
        self.decided += deciding.seconds


# --gptq_sequential: layer inputs calibrated per pass (q/k/v, o, gate/up and down: one transformer block).
SEQUENTIAL_GROUPS = 4


def _set_dequantized(target: WeightGroup, recipe: Recipe, file: Path) -> ir.TensorProtocol:
    """Puts ``target``'s quantized-then-dequantized weight (AWQ scales undone) in place of its initializer, as
    ``file`` (a new file, mapped like the model's own weights, not copied by each pass); returns the tensor it
    replaced."""
    original = target.weight.const_value
    assert original is not None
    w = target.read()
    dq = recipe.dequantized(recipe.quantize(w)).astype(target.dtype.numpy())
    del w
    np.ascontiguousarray(dq.T if target.transposed else dq).tofile(file)
    target.weight.const_value = ir.ExternalTensor(
        file.name,
        0,
        dq.nbytes,
        original.dtype,
        shape=ir.Shape(dq.T.shape if target.transposed else dq.shape),
        name=str(target.weight.name),
        base_dir=file.parent,
    )
    return original


def _decide(
    group: InputGroup,
    targets: list[WeightGroup],
    stats: GroupStats,
    selection: Selection,
    options: Int4Options,
    recipes: dict[WeightGroup, Recipe],
    entries: dict[WeightGroup, LayerReport],
    seconds: dict[str, float],
) -> np.ndarray | None:
    """Recipes for the weights one input group decides; returns the group's AWQ scales (None without AWQ). The
    seconds of the decision's parts are added to ``seconds`` (``calibration: awq``...)."""
    with timed() as clock:
        allowed = _awq_allowed(group, targets, selection)
        if options.spec.awq_scales and not allowed:
            logger.info("No AWQ scaling for '%s': a weight it reads is shared with other inputs", group.name)
        decision = decide_targets(
            targets, stats, options.method, options.quant_config(), awq_allowed=allowed,
            block_sizes=[options.block_of(t) for t in targets],
        )  # fmt: skip
    for part, spent in decision.seconds.items():
        add_seconds(seconds, f"calibration: {part}", spent)
    share = clock.seconds / len(targets)
    for target, recipe in zip(targets, decision.recipes):
        recipes[target] = recipe
        entries[target].info.update(recipe.info)
        entries[target].info["seconds"] = share
    return decision.scales


def _targets_of(group: InputGroup, selection: Selection) -> list[WeightGroup]:
    target_of = {layer: target for target in selection.targets for layer in target.layers}
    return [target_of[layer] for layer in group.layers]


def _layer_entry(target: WeightGroup, method: str, options: Int4Options) -> LayerReport:
    if (not target.matmuls and options.spec.needs_data) or target.bits == 8:
        method = "rtn"  # an embedding table has no input activations to calibrate on
    return LayerReport(
        weight=target.name,
        layers=[layer.name for layer in target.layers],
        k=target.k,
        n=target.n,
        bits=target.bits,
        method=method,
        block_size=options.block_of(target),
        dtype=target.dtype.name.lower(),
    )


def _llm_head_bits(model: ir.Model, selection: Selection) -> None:
    """An LLM's default: the weight of the MatMul that writes the logits at 8 bits, where 4 bits cost the most,
    unless the embedding shares it (a tied table at 8 bits would take about twice the bytes of onnxruntime-genai's
    builder's INT4 table: experiments/design_notes.md, "INT4 methods")."""
    head = logits_head(model)
    target = next((t for t in selection.targets for layer in t.layers if layer.name == head), None)
    if target is not None and not target.gathers:
        target.bits = 8
    logger.info(
        "An LLM without layer options: the embedding and the head are quantized too%s; --nodes_to_exclude '.*/lm_head' "
        "keeps ModelOpt's default (head and embedding in float)",
        "" if target is None else f", '{head}' at {target.bits} bits{' (tied)' if target.gathers else ''}",
    )  # fmt: skip


@dataclasses.dataclass
class Int4Run:
    """One INT4 run's state, which the steps of :data:`STEPS` fill in order."""

    source: ModelSource
    plan: Int4Plan
    """The caller's options with the defaults chosen for this model (an LLM's, the method without data): a value
    the steps replace, never the caller's object changed."""
    report: Int4Report
    model: ir.Model = dataclasses.field(init=False)
    selection: Selection = dataclasses.field(init=False)
    written: dict[str, np.ndarray] | None = None
    """Without calibration data, the text an LLM wrote itself."""
    recipes: dict[WeightGroup, Recipe] = dataclasses.field(default_factory=dict)
    entries: dict[WeightGroup, LayerReport] = dataclasses.field(default_factory=dict)
    scales: dict[InputGroup, np.ndarray] = dataclasses.field(default_factory=dict)
    precisions: Mapping[str, int] = dataclasses.field(default_factory=dict)
    """Weights the accuracy guard set to 8 bits (8) or kept in float (0), by name."""
    guardable: bool = False
    """Whether the accuracy guard may run (:mod:`onnxprec.quantization.int4._guard`): not a language model, at most
    ``MAX_GUARD_BYTES`` of float weights."""

    @property
    def options(self) -> Int4Options:
        """The settings the steps read: the plan's."""
        return self.plan.options

    @property
    def config(self) -> QuantConfig:
        """The numerics of the plan's options."""
        return self.plan.config

    @property
    def needs_data(self) -> bool:
        """Whether the method calibrates (AWQ, GPTQ...) and some weight goes to 4 bits."""
        return self.options.spec.needs_data and any(t.bits == 4 for t in self.selection.targets)

    @property
    def writes_its_data(self) -> bool:
        """Whether the model writes the text it calibrates on: no data, and the size budget (unless it holds every
        weight at its most precise candidate) or the method needs some."""
        options = self.options
        if options.calibration_data_reader is not None:
            return False
        if options.size_budget_mb is not None:
            return not holds_most_precise(self.model, self.selection, options)
        return self.needs_data


def _load_and_select(run: Int4Run) -> None:
    """Loads and sanitizes the model, takes an LLM's defaults, selects the layers and the method without data."""
    options, report = run.options, run.report
    _ort.resolve_providers(options.calibration_eps)  # an EP that is not installed fails now, not after the work
    run.model = model = load_model(run.source)
    check_float_model(model)
    llm = options.llm_defaults and writes_text(model)
    if llm:
        run.plan = run.plan.for_llm()
        options = run.options
        report.output_format, report.block_size = options.format, run.config.block_size
    _sanitize(model, options)
    run.selection = selection = select_layers(
        model,
        exclude=options.exclude_patterns,
        eight_bit=options.eight_bit_patterns,
        gathers=options.quantize_embeddings or options.size_budget_mb is not None,
        gather_types=GATHER_TYPES[options.format],
    )
    default = tuple(options.nodes_to_exclude or ()) == DEFAULT_EXCLUDE  # a model without an lm_head is no mistake
    patterns = {"nodes_to_exclude": [] if default else options.exclude_patterns,
                "layers_8bit": options.eight_bit_patterns}  # fmt: skip
    check_selection(model, patterns, {}, ("MatMul", "Gemm", "Gather"), pattern_names)
    if llm:
        _llm_head_bits(model, selection)
    _set_precisions(selection, run.precisions)
    weights = sum(v.const_value.nbytes for v in model.graph.initializers.values() if v.const_value is not None)
    run.guardable = not writes_text(model) and weights <= _guard.MAX_GUARD_BYTES
    report.excluded, report.skipped = selection.excluded, selection.skipped
    report.in_subgraphs = dict(selection.in_subgraphs)
    if not selection.targets:
        layers = "MatMul or Gemm whose weight is a 2-D float initializer and whose other input is computed"
        skipped = f"{len(selection.skipped)} MatMul/Gemm skipped"
        if selection.in_subgraphs:
            skipped += f", of which {report.subgraph_text()}"
        raise nothing_to_quantize(layers, skipped, "nodes_to_exclude" if selection.excluded else None,
                                  selection.skipped)  # fmt: skip
    if run.plan.default_method and options.calibration_data_reader is None and writes_text(model):
        # without data, an LLM calibrates on text it writes itself
        widest = max((t.k for t in selection.targets if t.bits == 4), default=0)
        on_host = not device_gram(run.config.backend, widest)  # where GPTQ's Hessians and their factors would live
        method, why = options.no_data_llm_method(widest) if on_host else (NO_DATA_LLM_METHOD, "")
        run.plan = run.plan.with_method(method)
        if why:
            logger.info("No calibration data: %s, not %s: %s", method, NO_DATA_LLM_METHOD, why)


def _set_precisions(selection: Selection, precisions: Mapping[str, int]) -> None:
    """The accuracy guard's choices: its weights at 8 bits, or kept in float (excluded, the pattern naming the
    guard)."""
    if not precisions:
        return
    kept = []
    for target in selection.targets:
        bits = precisions.get(target.name)
        if bits == 0:
            selection.excluded.extend((layer.name, "accuracy guard") for layer in target.layers)
            continue
        if bits == 8:
            target.bits = 8
        kept.append(target)
    selection.targets[:] = kept


def _write_text(run: Int4Run) -> None:
    """The text the LLM writes itself to calibrate on (if it cannot, the no-data default method)."""
    writer = _text_writer(run.model, run.options) if writes_text(run.model) else None
    run.written = written_text(run.model, run.options, writer=writer)
    if writer is not None:  # the copy's session freed its weights in blocks the heap keeps: give them back
        del writer
        trim_heap()
    if run.written is None and run.plan.default_method:
        run.plan = run.plan.with_method("kquant")


WRITER_FLOAT_BYTES = 1 << 30
"""An LLM whose float weights take more bytes than this writes its calibration text through an INT4 copy of itself:
a session of the float model would hold all its weights at once."""


WRITER_BLOCK_SIZE = 128
"""The block size of the INT4 copy that writes the text (every MatMul at 4 bits, the head included): block 32's scales
and ONNX Runtime's pre-packed block sums would take more memory than its 4-bit levels."""


def _text_writer(model: ir.Model, options: Int4Options) -> ir.Model | None:
    """A copy of ``model`` with RTN INT4 weights as an LLM's defaults write them (MatMulNBits, embedding and head
    quantized; weights quantized while its session is made, one at a time) when its float weights exceed
    :data:`WRITER_FLOAT_BYTES`; else None (the model writes with its own weights)."""
    floats = [v.const_value for v in model.graph.initializers.values() if v.const_value is not None]
    size = sum(t.nbytes for t in floats if t.dtype in FLOAT_TYPES)
    if size <= WRITER_FLOAT_BYTES:
        return None
    logger.info(
        "The model writes its calibration text through an INT4 (RTN) copy: %.2f GB of float weights", size / 1e9
    )
    copy = pruned_copy(model, [str(v.name) for v in model.graph.outputs])  # the graph copied, weights file references
    with log_level_during("WARNING"):
        writer, _ = quantize_model(copy, Int4Options(
            calibration_method="rtn", calibration_eps=options.calibration_eps, nodes_to_exclude=(),
            quantize_embeddings=True, block_size=WRITER_BLOCK_SIZE, output_format="matmulnbits",
        ))  # fmt: skip
    for value in model.graph.initializers.values():  # pages of the float weights read so far stop counting
        if value.const_value is not None:
            release(value.const_value)
    return writer


def _size_budget(run: Int4Run) -> None:
    """The precision of each layer under ``size_budget_mb`` (the most sensitive at 8 bits)."""
    run.report.budget = choose_precisions(run.model, run.selection, run.options, run.written)
    run.report.excluded, run.report.skipped = run.selection.excluded, run.selection.skipped


def _plan_layers(run: Int4Run) -> None:
    """Each layer's report entry, with the size budget's choice."""
    options, report, selection = run.options, run.report, run.selection
    report.method = run.plan.method
    logger.info(
        "Quantizing %d weights of %d layers with %s (block %s, %s)",
        len(selection.targets), len(selection.layers), options.method, run.config.block_size,
        "zero points" if options.use_zero_point else "symmetric",
    )  # fmt: skip
    run.entries = {t: _layer_entry(t, options.method, options) for t in selection.targets}
    if report.budget is not None:
        for target, entry in run.entries.items():
            chosen = report.budget.layers[target.name]
            entry.info.update(sensitivity=chosen["sensitivity"], bytes=chosen["bytes"])


def _recipe(target: WeightGroup, options: Int4Options, config: QuantConfig) -> Recipe:
    """The recipe of a weight calibration did not decide: RTN at 8 bits, else the method's without statistics."""
    if target.bits == 8:
        return Recipe("rtn", bits=8, block_size=options.block_of(target), symmetric=config.symmetric,
                      positive_scales=config.positive_scales, backend=config.backend)  # fmt: skip
    return Recipe(options.method, block_size=options.block_of(target), symmetric=config.symmetric,
                  positive_scales=config.positive_scales, clip_search=options.spec.clip == "mse",
                  search=options.spec.search, backend=config.backend)  # fmt: skip


def _rewrite(run: Int4Run) -> None:
    """AWQ input scales, then each weight replaced by its quantized form (QDQ or MatMulNBits), quantized lazily."""
    options, report, graph = run.options, run.report, run.model.graph
    names = NameAllocator(run.model)
    applied = {group: apply_input_scales(graph, group, s, names) for group, s in run.scales.items()}
    target_of = {layer: target for target in run.selection.targets for layer in target.layers}
    for group, how in applied.items():
        for layer in group.layers:
            run.entries[target_of[layer]].awq = how
    for target in run.selection.targets:
        recipe = run.recipes.get(target) or _recipe(target, options, run.config)
        entry = run.entries[target]
        tensor = target.weight.const_value
        assert tensor is not None

        def done(w: np.ndarray, qw: QuantizedWeight, seconds: float, entry: LayerReport = entry,
                 recipe: Recipe = recipe) -> None:  # fmt: skip
            entry.record(w, qw, recipe.dequantized(qw), seconds)  # the whole weight, or a chunk of its columns
            if report.progress is not None and entry.recorded:
                report.progress()

        lazy = LazyQuantizedWeight(tensor, recipe, transposed=target.transposed, on_done=done)
        if options.format == "qdq":
            rewrite_qdq(graph, target, lazy, names)
        else:
            rewrite_matmulnbits(graph, target, lazy, names, accuracy_level=options.accuracy_level)
        for value in (target.weight, *target.duplicates):
            if not value.uses() and value.name in graph.initializers:
                graph.initializers.pop(str(value.name))
        float_bytes, stored, ideal = target_sizes(
            target, recipe.bits, recipe.block_size, recipe.symmetric, options.format
        )
        report.float_bytes += float_bytes * (1 + len(target.duplicates))
        report.quantized_bytes += stored
        report.ideal_bytes += ideal
        report.layers.append(entry)
    if options.format == "matmulnbits":
        run.model.opset_imports.setdefault(MS_DOMAIN, 1)


def _validate(run: Int4Run) -> None:
    """The nodes only ONNX Runtime can check (the output is loaded in it when written)."""
    run.report.ort_only = check_structure(run.model)


STEPS: tuple[Step[Int4Run], ...] = (
    Step("load+select", _load_and_select),
    Step("written text", _write_text, when=lambda run: run.writes_its_data),
    Step("size budget", _size_budget, when=lambda run: run.options.size_budget_mb is not None),
    Step("layers", _plan_layers),
    Step("calibration", _calibrate, when=lambda run: run.needs_data),
    Step("rewrite", _rewrite),
    Step("validate", _validate),
)
"""INT4's pipeline, each step timed in the report under its name."""


def quantize_model(source: ModelSource, options: Int4Options) -> tuple[ir.Model, Int4Report]:
    """Runs the pipeline (:data:`STEPS`) up to (not including) saving, and the accuracy guard where it applies
    (:mod:`onnxprec.quantization.int4._guard`: a model file that is not a language model, at most 1 GiB of weights);
    the returned model's quantized weights are lazy tensors. ``options`` is left as given: the defaults chosen for
    this model go into the run's :class:`Int4Plan`, whose method, block size and format the report names."""
    run = _pipeline(source, options, {})
    if options.accuracy_guard and run.guardable and isinstance(source, (str, os.PathLike)):
        return _guard.guarded(source, options, run.model, run.report, _run_pipeline)
    return run.model, run.report


def _pipeline(source: ModelSource, options: Int4Options, precisions: Mapping[str, int]) -> Int4Run:
    plan = Int4Plan.of(options)
    report = Int4Report(plan.method, plan.config.block_size, options.use_zero_point, options.format)
    run = Int4Run(source, plan, report, precisions=precisions)
    run.report.run_steps(STEPS, run)
    return run


def _run_pipeline(
    source: ModelSource, options: Int4Options, precisions: Mapping[str, int]
) -> tuple[ir.Model, Int4Report]:
    run = _pipeline(source, options, precisions)
    return run.model, run.report


# ---------------------------------------------------------------------------------------------------
# Public functions


def quantize(
    onnx_path: ModelSource,
    calibration_method: str | None = None,
    calibration_data_reader: Any = None,
    calibration_eps: Sequence[str] = ("cpu",),
    use_external_data_format: bool = False,
    use_zero_point: bool = False,
    block_size: int | None = None,
    nodes_to_exclude: Sequence[str] | None = None,
    log_level: str = "INFO",
    **kwargs: Any,
) -> onnx.ModelProto:
    """Quantizes the weights of MatMul/Gemm layers to INT4; ModelOpt's ``int4.quantize`` signature and defaults.

    Args:
        onnx_path: Path to the float model, an ``onnx.ModelProto`` or an ``onnx_ir.Model`` (modified in place).
        calibration_method: rtn (no data), rtn_clip (RTN with a per-block MSE clip search, no data), kquant
            (llama.cpp's least-squares scale search, no data), hqq (half-quadratic lp fit, no data), awq_lite (AWQ
            scale search), awq_clip (output-aware clip search), awq_full (awq_lite then awq_clip), gptq (GPTQ with
            error propagation), awq_gptq (awq_lite scales then GPTQ); rtn_dq, rtn_trt, rtn_trt_dq and awq_clip_trt
            are ModelOpt aliases; None: awq_lite with calibration data (as ModelOpt); without data, awq_gptq on
            text an LLM writes itself (:data:`NO_DATA_LLM_METHOD`; :data:`NO_DATA_LARGE_LLM_METHOD` when GPTQ's
            Hessian, held on the host, would exceed ``stats_memory_mb``), kquant for other models.
        calibration_data_reader: Calibration inputs: a path (an ``.npz`` file, a folder of ``.npz`` files, a Polygraphy
            ``.json``), a dict of arrays, a list or iterator of feed dicts, or an ONNX Runtime
            ``CalibrationDataReader``; None: text an LLM writes itself (AWQ, GPTQ, size budget), else realistic
            random data.
        calibration_eps: ONNX Runtime providers for calibration: ``cpu``, ``cuda:N``, ``trt``, ``dml``.
        use_external_data_format: Save the weights in ``<output>.data`` (``quantize_file``; automatic above 2 GB).
            ``quantize`` returns a ModelProto: save it with ``onnx.save(..., save_as_external_data=True)``.
        use_zero_point: Asymmetric quantization: UINT4 weights with UINT4 zero points (default: symmetric INT4, all
            16 levels).
        block_size: Weights per scale along K: a power of two >= 16, or -1 for one scale per output channel
            (default: 128).
        nodes_to_exclude: Regexes (re.search) of layers to keep in float, matched against the node name, its output
            name and its weight name; an empty list quantizes every layer; None: ``.*/lm_head``, or nothing under
            ``size_budget_mb``.
        log_level: Log level of the ``onnxprec`` logger during the call: DEBUG, INFO, WARNING, ERROR.
        **kwargs: Any other :class:`Int4Options` field: ``output_format`` (qdq, matmulnbits), ``accuracy_level``,
            ``awqlite_alpha_step``, ``awqclip_alpha_step``, ``awqclip_alpha_min``, ``awqclip_bsz_col``,
            ``gptq_damp``, ``gptq_act_order``, ``gptq_sequential``, ``layers_8bit``, ``block_size_8bit``,
            ``size_budget_mb``, ``calibration_batch_size``, ``sample_tokens``,
            ``stats_memory_mb``, ``segment_mb``, ``input_shapes``.

    Returns:
        The quantized model.

    Raises:
        AccuracyGuardError: The result misses the accuracy guard's bounds (:mod:`onnxprec.quantization.int4._guard`,
            a model file that is not a language model); the error carries the report.
        OnnxprecError: A bad argument, model or calibration data; the message says how to fix it.
    """
    options = Int4Options.from_call(None, kwargs, fields_in(Int4Options, locals()))
    with log_level_during(options.log_level):
        model, report = quantize_model(onnx_path, options)
        if report.guard_failure:
            raise AccuracyGuardError(report.guard_failure, report)
        with report.step("quantize weights"):
            proto = to_model_proto(model)
        logger.info(report.summary, extra=SUMMARY)
        if report.ort_only and proto.ByteSize() < 2_000_000_000:
            load_in_ort(proto.SerializeToString(), report.ort_only, providers=list(options.calibration_eps))
    return proto


TOOL: QuantizationTool[Int4Options, Int4Report] = QuantizationTool(
    Int4Options, quantize_model, progress=True, check_written=_guard.check_written
)
default_output_path = TOOL.default_output_path
quantize_file = TOOL.quantize_file
