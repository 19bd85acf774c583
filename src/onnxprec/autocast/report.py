"""AutoCast's report: :class:`AutoCastReport` (what ``--report_json`` writes) and its per-node details.

The per-node details feed the reports: ranges, casts, errors along the graph, suggestions, command.

:class:`Details` is collected by the pipeline when a report is asked for (``--report_html``): the measured range of
each node's tensors (past attention-mask sentinels, as ``data_max`` saw it), the casts inserted next to it, and,
on the first sample of the first calibration batch, the error of each tensor of the converted model against
FP32 (:func:`layer_errors`: both models in one ONNX Runtime session, each pair of tensors reduced to two sums
inside the runtime). :func:`suggestions` turns the decisions into ``--nodes_to_exclude``/``--nodes_to_include``
patterns and :func:`command_line` writes the command that reproduces the run.
"""

from __future__ import annotations

import collections
import logging
import math
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import onnx
import onnx_ir as ir

from onnxprec import _ort
from onnxprec._graph import FLOAT_TYPES, original_name
from onnxprec._io import PROTOBUF_LIMIT
from onnxprec._report import SYNTHETIC_CHECK, TimedSteps, header
from onnxprec._tensors import finite_max
from onnxprec.autocast.convert import ConversionStats
from onnxprec.observers import TensorStats

if TYPE_CHECKING:
    from onnxprec._genai import GenaiCarry
    from onnxprec.autocast._options import AutoCastOptions
    from onnxprec.autocast.classify import Decision
    from onnxprec.autocast.masks import MaskRegion
    from onnxprec.autocast.target import TargetReport
    from onnxprec.validate import NumericReport

__all__ = [
    "LOW_TYPES",
    "MOVES_ONLY",
    "AutoCastReport",
    "Details",
    "command_line",
    "first_sample",
    "layer_errors",
    "suggestions",
]

logger = logging.getLogger(__name__)

_F = ir.DataType.FLOAT
# Both models together in one session up to this many bytes of serialized weights (90% of protobuf's limit).
_MERGE_LIMIT = PROTOBUF_LIMIT * 9 // 10


@dataclass
class Details:
    """What the reports show per node besides its decision.

    Attributes:
        index: Position in topological order (subgraph nodes follow their parent).
        ranges: Largest magnitude of the node's non-constant float tensors as ``data_max`` saw it (past masking
            sentinels), and as measured (None when not measured).
        casts: Casts inserted next to the node (on the tensors it reads or writes), after the cleanup.
        errors: Tensor name -> relative L2 error against FP32 (first sample of the first batch).
        error_note: Why there are no errors, when there are none.
    """

    index: dict[ir.Node, int] = field(default_factory=dict)
    ranges: dict[ir.Node, tuple[float | None, float | None]] = field(default_factory=dict)
    casts: collections.Counter[ir.Node] = field(default_factory=collections.Counter)
    outputs: dict[ir.Node, str] = field(default_factory=dict)  # the tensor whose error stands for the node
    errors: dict[str, float] = field(default_factory=dict)
    error_note: str = ""

    @classmethod
    def of(
        cls,
        model: ir.Model,
        seen: Mapping[str, TensorStats] | None,
        measured: Mapping[str, TensorStats] | None,
    ) -> Details:
        """Indices, ranges and representative outputs of every node (before conversion: original names)."""
        details = cls()
        for i, node in enumerate(model.graph.all_nodes()):
            details.index[node] = i
            values = [v for v in (*node.inputs, *node.outputs) if v is not None and not v.is_initializer()]
            details.ranges[node] = (_absmax(values, seen), _absmax(values, measured))
            out = next((v for v in node.outputs if v.dtype in FLOAT_TYPES and v.name), None)
            if out is not None:
                details.outputs[node] = str(out.name)
        return details

    def count_casts(self, casts: Iterable[ir.Node]) -> None:
        """Counts each surviving inserted Cast for the nodes it connects."""
        for cast in casts:
            if cast.graph is None:
                continue
            source = cast.inputs[0]
            producer = source.producer() if source is not None else None
            if producer is not None and producer in self.index:
                self.casts[producer] += 1
            for use in cast.outputs[0].uses():
                if use.node in self.index:
                    self.casts[use.node] += 1

    def node_json(self, node: ir.Node) -> dict[str, Any]:
        seen, measured = self.ranges.get(node, (None, None))
        out = self.outputs.get(node)
        error = self.errors.get(out) if out is not None else None
        return {
            "index": self.index.get(node),
            "range": _number(seen),
            "measured_range": _number(measured),
            "casts": self.casts.get(node, 0),
            "output": out,
            "error": _number(error),
        }


def _absmax(values: Sequence[ir.Value], stats: Mapping[str, TensorStats] | None) -> float | None:
    if not stats:
        return None
    found = [s.absmax for v in values if (s := stats.get(str(v.name))) is not None and s.is_float and s.size]
    return max(found) if found else None


def _number(value: float | None) -> float | None:
    return float(value) if value is not None and math.isfinite(value) else None


# --------------------------------------------------------------------------------------------------
# Errors along the graph


def first_sample(feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The first sample of a batch when every input has the same leading size above 1; else the batch."""
    arrays = {k: np.asarray(v) for k, v in feeds.items()}
    sizes = {a.shape[0] if a.ndim else 0 for a in arrays.values()}
    if len(sizes) == 1 and next(iter(sizes)) > 1:
        return {k: a[:1] for k, a in arrays.items()}
    return arrays


def layer_errors(
    model: ir.Model, converted: ir.Model, feeds: Mapping[str, np.ndarray], providers: Sequence[str] | None = None
) -> tuple[dict[str, float], str]:
    """The relative L2 error of every FP32 tensor of ``converted`` against ``model``, on ``feeds``.

    Both graphs go into one session (the converted one's names prefixed), sharing the inputs and the mapped
    FP32 weights; for every pair the runtime reduces ``sum((low - fp32)^2)`` and ``sum(fp32^2)``, so no
    activation leaves it.

    Returns:
        Tensor name (as in ``model``) -> relative L2 error; and a note when nothing could be measured.
    """
    if any(node.op_type in ("If", "Loop", "Scan") for node in converted.graph):
        return {}, "errors along the graph are not measured for models with control flow"
    with _ort.ort_model(model) as (payload, folder):
        if not isinstance(payload, bytes):
            return {}, "errors along the graph not measured: the model holds large in-memory weights"
        base = onnx.ModelProto()
        base.ParseFromString(payload)
        low = ir.serde.serialize_model(converted)
        if base.ByteSize() + low.ByteSize() > _MERGE_LIMIT:
            return {}, "errors along the graph not measured: the two models exceed protobuf's 2 GB"
        pairs = _merge(base, low, model, converted)
        try:
            session = _ort.create_session(
                base.SerializeToString(),
                providers=providers,
                optimization="none",
                external_data_folder=folder,
                what="the error model",
            )
            names = [n for pair in pairs.values() for n in pair]
            results = dict(zip(names, session.run(dict(feeds), names)))
        except Exception as e:  # the report goes on without the errors
            return {}, f"errors along the graph not measured: {_ort.first_line(e, 200)}"
    errors = {}
    for name, (diff, norm) in pairs.items():
        d, n = float(results[diff]), float(results[norm])
        errors[name] = math.sqrt(d / n) if n > 0 else (0.0 if d == 0 else math.inf)
    return errors, ""


def _merge(
    base: onnx.ModelProto, low: onnx.ModelProto, model: ir.Model, converted: ir.Model
) -> dict[str, tuple[str, str]]:
    """Adds the converted graph (names prefixed) to ``base``'s and, per tensor pair, the outputs
    ``sum((low - fp32)^2)`` and ``sum(fp32^2)``; returns tensor name -> those two output names."""
    prefix = "__low__/"
    rename = {t.name: prefix + t.name for t in low.graph.initializer}
    rename.update({out: prefix + out for node in low.graph.node for out in node.output if out})
    fed = {i.name: i.type.tensor_type.elem_type for i in base.graph.input}
    extra: list[onnx.NodeProto] = []
    for inp in low.graph.input:
        want = inp.type.tensor_type.elem_type
        if inp.name not in rename and fed.get(inp.name, want) != want:  # no keep_io_types: it reads the low type
            rename[inp.name] = prefix + inp.name
            extra.append(onnx.helper.make_node("Cast", [inp.name], [prefix + inp.name], to=want))
    for node in low.graph.node:
        node.name = prefix + node.name
        node.input[:] = [rename.get(i, i) for i in node.input]
        node.output[:] = [rename.get(o, o) for o in node.output]
    for tensor in low.graph.initializer:
        tensor.name = rename[tensor.name]
    base.graph.node.extend([*extra, *low.graph.node])
    base.graph.initializer.extend(low.graph.initializer)
    domains = {o.domain for o in base.opset_import}
    base.opset_import.extend(o for o in low.opset_import if o.domain not in domains)
    fp32 = {str(v.name) for node in model.graph for v in node.outputs if v.dtype == _F and v.name}
    pairs: dict[str, tuple[str, str]] = {}
    for node in converted.graph:
        for value in node.outputs:
            name = original_name(value)
            if name is None or name not in fp32 or value.dtype not in FLOAT_TYPES or name in pairs:
                continue
            up, diff, d2, r2 = (f"{prefix}err/{name}/{s}" for s in ("up", "diff", "d2", "r2"))
            base.graph.node.extend(
                [
                    onnx.helper.make_node("Cast", [prefix + str(value.name)], [up], to=onnx.TensorProto.FLOAT),
                    onnx.helper.make_node("Sub", [up, name], [diff]),
                    onnx.helper.make_node("ReduceSumSquare", [diff], [d2], keepdims=0),
                    onnx.helper.make_node("ReduceSumSquare", [name], [r2], keepdims=0),
                ]
            )
            base.graph.output.extend(
                onnx.helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, []) for n in (d2, r2)
            )
            pairs[name] = (d2, r2)
    return pairs


# --------------------------------------------------------------------------------------------------
# Suggestions and the command line


def patterns(names: Iterable[str], everything: Iterable[str], limit: int = 12) -> list[dict[str, Any]]:
    """Regexes (``re.match``, anchored with ``$``) that select ``names`` and nothing else among ``everything``.

    Names that differ only in their numbers (``layers.3`` / ``layers.17``) share one pattern; a pattern that
    would also select another node falls back to the exact names. Most matches first, at most ``limit``.
    """
    wanted = [n for n in dict.fromkeys(names) if n]
    others = [n for n in everything if n and n not in set(wanted)]
    groups: dict[str, list[str]] = collections.defaultdict(list)
    for name in wanted:
        groups[re.sub(r"\d+", r"\\d+", re.escape(name)) + "$"].append(name)
    found: list[tuple[str, int]] = []
    for pattern, members in groups.items():
        compiled = re.compile(pattern)
        if len(members) > 1 and not any(compiled.match(o) for o in others):
            found.append((pattern, len(members)))
        else:
            found += [(re.escape(m) + "$", 1) for m in members]
    found.sort(key=lambda item: (-item[1], item[0]))
    result = [{"pattern": pattern, "nodes": count} for pattern, count in found]
    return result[:limit]


def suggestions(decisions: Mapping[ir.Node, Decision], details: Details | None, low: ir.DataType) -> dict[str, Any]:
    """``--nodes_to_include`` and ``--nodes_to_exclude`` patterns worth trying, with why.

    Include: nodes that only ``data_max`` keeps in FP32 although their range fits the low type with room to
    spare (``--target_accuracy`` tries exactly these). Exclude: the nodes the accuracy target kept in FP32 (to
    reproduce the result without the search), else the low nodes whose outputs show the largest error against
    FP32 (to try first when the output error is too high).
    """
    everything = [n.name for n in decisions if n.name]
    fits = finite_max(low) / 4
    include = [
        n.name
        for n, d in decisions.items()
        if not d.low
        and "data_max" in d.reason
        and n.name
        and details is not None
        and (r := details.ranges.get(n, (None, None))[0]) is not None
        and r < fits
    ]
    kept = [n.name for n, d in decisions.items() if not d.low and d.reason.startswith("target accuracy") and n.name]
    why_exclude = "nodes the accuracy target kept in FP32: reproduces its result without the search"
    exclude = kept
    if not kept and details is not None and details.errors:
        scored = []
        for node, decision in decisions.items():
            out = details.outputs.get(node)
            if decision.low and node.name and out is not None and math.isfinite(details.errors.get(out, math.nan)):
                scored.append((details.errors[out], node.name))
        scored.sort(reverse=True)
        exclude = [name for _, name in scored[:5]]
        why_exclude = "low nodes with the largest error against FP32: keep these first if the outputs are off"
    return {
        "nodes_to_include": {
            "why": f"kept in FP32 only by data_max, yet their range is below {fits:g}: candidates to convert",
            "patterns": patterns(include, everything),
        },
        "nodes_to_exclude": {"why": why_exclude, "patterns": patterns(exclude, everything)},
    }


def command_line(options: AutoCastOptions, onnx_path: str | Path | None, output_path: str | Path | None) -> str:
    """The ``python -m onnxprec.autocast`` command with every setting that differs from its default."""
    import dataclasses

    from onnxprec._options import option_fields

    parts = ["python", "-m", "onnxprec.autocast", "--onnx_path", str(onnx_path or "MODEL.onnx")]
    if output_path is not None:
        parts += ["--output_path", str(output_path)]
    notes = []
    for f, spec in option_fields(type(options)):
        value = getattr(options, f.name)
        default = f.default if f.default is not dataclasses.MISSING else None
        if value == default or (spec.nargs and tuple(value or ()) == tuple(default or ())):
            continue
        if spec.api_only:
            notes.append(f"{f.name} (API only)")
            continue
        flag = spec.flags[-1]
        if isinstance(value, bool):
            parts.append(flag)
        elif spec.nargs:
            parts += [flag, *(str(v) for v in value)]
        elif callable(value) or (f.name == "calibration_data" and not isinstance(value, (str, Path))):
            notes.append(f"{f.name} (in memory: {type(value).__name__})")
        else:
            parts += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
    command = " ".join(shlex.quote(p) for p in parts)
    return command + (f"  # plus {', '.join(notes)}" if notes else "")


# --------------------------------------------------------------------------------------------------
# The report

LOW_TYPES = {"fp16": ir.DataType.FLOAT16, "bf16": ir.DataType.BFLOAT16}
MOVES_ONLY = "only moves data between casts from and to FP32"
"""The reason of the nodes :class:`onnxprec.passes.WidenMovementIslandsPass` returned to FP32 after conversion."""


@dataclass
class AutoCastReport(TimedSteps):
    """What a conversion did and measured; :meth:`to_json` is the ``--report_json`` file."""

    TOOL: ClassVar[str] = "autocast"

    low_precision_type: str
    decisions: dict[ir.Node, Decision] = field(default_factory=dict)
    stats: ConversionStats = field(default_factory=ConversionStats)
    numeric: NumericReport | None = None
    reference_batches: int = 0
    seconds: dict[str, float] = field(default_factory=dict)
    output_path: Path | None = None
    input_path: Path | None = None
    mask_regions: list[MaskRegion] = field(default_factory=list)
    target_search: TargetReport | None = None
    details: Details | None = None
    settings: dict[str, Any] = field(default_factory=dict)  # data_max, init_max... as the reports show them
    command: str = ""
    genai: GenaiCarry | None = None  # the onnxruntime-genai files carried beside the output
    ort_only: dict[str, int] = field(default_factory=dict)  # nodes only ONNX Runtime can check, by op
    no_kernel: dict[str, int] = field(default_factory=dict)  # op -> nodes kept FP32 without a low-type kernel
    random_data: bool = False  # no calibration data was given: the reference run and the check ran on random data

    @property
    def summary(self) -> str:
        s = self.stats
        pct = 100.0 * s.low_nodes / s.nodes if s.nodes else 0.0
        text = (
            f"Converted {s.low_nodes}/{s.nodes} nodes ({pct:.1f}%) to {self.low_precision_type}; "
            f"{s.casts} casts inserted"
        )
        if self.no_kernel:
            text += f"; {sum(self.no_kernel.values())} kept in FP32 without a {self.low_precision_type} kernel"
        moves = sum(1 for d in self.decisions.values() if d.reason == MOVES_ONLY)
        if moves:
            text += f"; {moves} data-movement node{'s' * (moves > 1)} left in FP32 between casts"
        task = self.numeric.task if self.numeric is not None else None
        if task is not None:
            where = "no calibration data: checked on random data" if self.random_data else "checked on calibration data"
            text += f"; {where} (first run): {task.describe()}"
            if self.random_data:
                text += f" ({SYNTHETIC_CHECK})"
        return text

    def to_json(self) -> dict[str, Any]:
        """The report as JSON-ready data (what ``--report_json`` writes).

        Returns:
            ``tool``, ``onnxprec_version``, ``summary``, ``input`` and ``output`` (paths, None for in-memory models),
            ``low_precision_type``, ``counts`` (nodes, low_nodes, casts, initializers_converted,
            initializers_copied, initializers_cast_at_runtime), ``seconds`` per step, ``reference_batches``,
            ``numeric`` (None without a numeric check, else ``skipped`` and per-output errors against FP32;
            non-finite errors are None), ``ort_only_nodes`` (the nodes only ONNX Runtime can check, by op, which
            validation proved in ONNX Runtime) and ``nodes``: every classified node (subgraph nodes included) with
            its ``name``, ``op_type``, ``precision`` (fp16, bf16 or fp32) and the ``reason`` of that decision.
        """

        def number(value: float) -> float | None:
            return float(value) if math.isfinite(value) else None

        numeric: dict[str, Any] | None = None
        if self.numeric is not None:
            numeric = {
                "skipped": self.numeric.skipped,
                "random_data": self.random_data,
                "task": None if self.numeric.task is None else self.numeric.task.to_json(),
                "outputs": {
                    name: {k: bool(v) if k == "finite" else number(v) for k, v in errors.items()}
                    for name, errors in self.numeric.errors.items()
                },
            }
        return {
            **header(self),
            "input": None if self.input_path is None else str(self.input_path),
            "output": None if self.output_path is None else str(self.output_path),
            "low_precision_type": self.low_precision_type,
            "counts": asdict(self.stats),
            "no_kernel_fp32": dict(self.no_kernel),
            "seconds": {step: round(seconds, 4) for step, seconds in self.seconds.items()},
            "reference_batches": self.reference_batches,
            "numeric": numeric,
            "ort_only_nodes": self.ort_only,
            "masks": [region.to_json() for region in self.mask_regions],
            "target": None if self.target_search is None else self.target_search.to_json(),
            "settings": self.settings,
            "command": self.command,
            "genai": None if self.genai is None else self.genai.to_json(),
            "by_op_type": _by_op_type_counts(self),
            "errors_note": "" if self.details is None else self.details.error_note,
            "suggestions": suggestions(self.decisions, self.details, LOW_TYPES[self.low_precision_type]),
            "nodes": [
                {
                    "name": node.name or "",
                    "op_type": node.op_type,
                    "precision": self.low_precision_type if decision.low else "fp32",
                    "reason": decision.reason,
                    **({} if self.details is None else self.details.node_json(node)),
                }
                for node, decision in self.decisions.items()
            ],
        }


def _by_op_type_counts(report: AutoCastReport) -> dict[str, dict[str, int]]:
    counts: dict[str, dict[str, int]] = {}
    for node, decision in report.decisions.items():
        entry = counts.setdefault(node.op_type, {"fp32": 0, report.low_precision_type: 0})
        entry[report.low_precision_type if decision.low else "fp32"] += 1
    return dict(sorted(counts.items(), key=lambda item: -sum(item[1].values())))
