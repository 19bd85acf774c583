"""The compare report: its rows, outputs and verification, as JSON, a terminal table and a self-contained HTML page.

:func:`onnxprec.debug.compare_models` fills a :class:`CompareReport`; this module only holds and renders it
(inline CSS, JS and SVG; nothing fetched), so the comparison and its report import each other in one direction.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, ClassVar

from onnxprec._html import BAD_COLOR, LOW_COLOR, LogAxes, e, filters, fmt, num_cell, page, section, svg, table
from onnxprec._report import fields_of, header

__all__ = [
    "CRITERION",
    "CompareReport",
    "CompareRow",
    "OutputError",
    "Verification",
    "exclude_pattern",
    "fmt",
    "render",
    "text_table",
]

CRITERION = (
    "diverged = non-finite values where the reference is finite, or (rel_l2 > rtol and max_abs > atol); "
    "rel_l2 = ||cand - ref|| / ||ref||, over all batches"
)


def exclude_pattern(node_name: str, *more: str) -> str:
    """The ``--nodes_to_exclude`` regex (``re.match``) that selects exactly these node names."""
    if not more:
        return f"^{re.escape(node_name)}$"
    return "^(?:" + "|".join(re.escape(n) for n in (node_name, *more)) + ")$"


def _json_fields(record: Any) -> dict[str, Any]:
    """A dataclass's fields, float values that are not finite as None."""
    return {
        key: None if isinstance(value, float) and not math.isfinite(value) else value
        for key, value in record.__dict__.items()
    }


# --------------------------------------------------------------------------------------------------
# Report


@dataclass
class CompareRow:
    """One reference tensor (a node output), its candidate counterpart and their errors over all batches."""

    index: int
    """Position of the node in the reference's topological order."""
    depth: int
    """1 + the depth of the deepest node feeding it (graph inputs at 0)."""
    node: str
    op_type: str
    tensor: str
    candidate: str | None
    """The matched candidate tensor (None: unmatched)."""
    match: str
    """How it was matched (``name``, ``original name``, ``producer``, ``through Cast``, ``via consumer ...``) or
    why it was not."""
    status: str = "not run"
    """``compared``, ``unmatched``, ``shape mismatch`` or ``not run``."""
    candidate_dtype: str | None = None
    max_abs: float | None = None
    rel_l2: float | None = None
    cosine: float | None = None
    ref_absmax: float | None = None
    nonfinite: int = 0
    """Non-finite candidate values (summed over batches)."""
    ref_nonfinite: int = 0
    diverged: bool = False

    def to_json(self) -> dict[str, Any]:
        """The fields, non-finite numbers as None (JSON has no inf or nan)."""
        return _json_fields(self)


@dataclass
class OutputError:
    """Errors of one final output of the candidate against the reference's."""

    name: str
    candidate: str | None
    max_abs: float | None = None
    rel_l2: float | None = None
    cosine: float | None = None
    top1: float | None = None
    """Fraction of rows (all axes but the last) whose argmax agrees."""
    nonfinite: int = 0

    def to_json(self) -> dict[str, Any]:
        """The fields, non-finite numbers as None (JSON has no inf or nan)."""
        return _json_fields(self)


@dataclass
class Verification:
    """The result of ``verify``: AutoCast re-run with the exclude pattern, and the comparison of its result."""

    pattern: str
    node: str
    low_precision_type: str
    keep_io_types: bool
    before: CompareRow
    after: CompareRow | None
    after_first_divergence: str | None
    outputs_before: dict[str, OutputError]
    outputs_after: dict[str, OutputError]

    @property
    def fixed(self) -> bool:
        """The node no longer diverges."""
        return self.after is not None and self.after.status == "compared" and not self.after.diverged

    @property
    def resolved(self) -> bool:
        """No node diverges any more."""
        return self.fixed and self.after_first_divergence is None

    @property
    def summary(self) -> str:
        after = self.after
        was = f"rel_l2 {fmt(self.before.rel_l2)}"
        now = f"rel_l2 {fmt(after.rel_l2)}" if after is not None else "not compared"
        verdict = "fixed" if self.fixed else "NOT fixed"
        rest = ""
        if self.resolved:
            rest = "no node diverges any more"
        elif self.after_first_divergence:
            rest = f"first divergence now at '{self.after_first_divergence}'"
        outputs = "; ".join(
            f"output {name} rel_l2 {fmt(o.rel_l2)} -> {fmt(self.outputs_after[name].rel_l2)}"
            for name, o in self.outputs_before.items()
            if name in self.outputs_after
        )
        parts = [
            f"verify: AutoCast {self.low_precision_type} keep_io_types={self.keep_io_types} with "
            f"--nodes_to_exclude '{self.pattern}': node '{self.node}' {was} -> {now}: {verdict}"
        ]
        parts += [p for p in (rest, outputs) if p]
        return "; ".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {
            **fields_of(self, "pattern", "node", "low_precision_type", "keep_io_types", "fixed", "resolved"),
            "before": self.before.to_json(),
            "after": None if self.after is None else self.after.to_json(),
            "after_first_divergence": self.after_first_divergence,
            "outputs_before": {k: v.to_json() for k, v in self.outputs_before.items()},
            "outputs_after": {k: v.to_json() for k, v in self.outputs_after.items()},
        }


@dataclass
class CompareReport:
    """The per-node comparison of a candidate model against its reference.

    ``rows`` are in the reference's topological order; ``first_divergence`` is the node name of the first row
    that diverges (see the module docstring for the criterion), ``exclude_nodes`` the nodes to keep in high
    precision for it (in a quantized candidate, the quantized nodes behind the divergence; empty: the first
    divergent node itself) and ``exclude_pattern`` the ``--nodes_to_exclude`` regex that selects them.
    """

    TOOL: ClassVar[str] = "compare"

    rows: list[CompareRow]
    outputs: dict[str, OutputError]
    atol: float
    rtol: float
    batches: int = 0
    chunks: int = 0
    reference: str | None = None
    candidate: str | None = None
    verification: Verification | None = None
    notes: list[str] = field(default_factory=list)
    exclude_nodes: list[str] = field(default_factory=list)

    @property
    def first_divergence_row(self) -> CompareRow | None:
        return next((row for row in self.rows if row.diverged), None)

    @property
    def first_divergence(self) -> str | None:
        """The name of the first node (topological order) whose output diverges beyond tolerance, or None."""
        row = self.first_divergence_row
        return row.node if row is not None else None

    @property
    def exclude_pattern(self) -> str | None:
        """``--nodes_to_exclude`` regex for ``exclude_nodes`` (default: the first divergent node; None: none)."""
        node = self.first_divergence
        if node is None:
            return None
        return exclude_pattern(*self.exclude_nodes) if self.exclude_nodes else exclude_pattern(node)

    @property
    def advice(self) -> str | None:
        """The line that says what to keep in high precision (None: no divergence)."""
        first, pattern = self.first_divergence, self.exclude_pattern
        if first is None:
            return None
        if self.exclude_nodes and self.exclude_nodes != [first]:
            which = ", ".join(f"'{n}'" for n in self.exclude_nodes)
            return f"keep the quantized node(s) behind it in high precision ({which}): --nodes_to_exclude '{pattern}'"
        return f"keep it in high precision: --nodes_to_exclude '{pattern}'"

    def row(self, node: str) -> CompareRow | None:
        """The first row of the node named ``node``."""
        return next((r for r in self.rows if r.node == node), None)

    @property
    def counts(self) -> dict[str, int]:
        statuses = [r.status for r in self.rows]
        return {
            "tensors": len(self.rows),
            "compared": statuses.count("compared"),
            "unmatched": statuses.count("unmatched"),
            "shape_mismatch": statuses.count("shape mismatch"),
            "diverged": sum(1 for r in self.rows if r.diverged),
        }

    @property
    def summary(self) -> str:
        c = self.counts
        first = self.first_divergence_row
        where = (
            f"first divergence at node '{first.node}' ({first.op_type}, tensor '{first.tensor}', rel_l2 "
            f"{fmt(first.rel_l2)}, max_abs {fmt(first.max_abs)})"
            if first is not None
            else f"no node diverges (rtol {self.rtol:g}, atol {self.atol:g})"
        )
        return (
            f"Compared {c['compared']}/{c['tensors']} tensors over {self.batches} batch(es) "
            f"({c['unmatched']} unmatched, {c['diverged']} diverged); {where}"
        )

    def to_json(self) -> dict[str, Any]:
        """JSON-ready data: settings, counts, the first divergence and its pattern, outputs, rows, verification."""
        first = self.first_divergence_row
        return {
            **header(self),
            "reference": self.reference,
            "candidate": self.candidate,
            "atol": self.atol,
            "rtol": self.rtol,
            "criterion": CRITERION,
            "batches": self.batches,
            "chunks": self.chunks,
            "counts": self.counts,
            "first_divergence": None
            if first is None
            else {
                "node": first.node,
                "op_type": first.op_type,
                "tensor": first.tensor,
                "index": first.index,
                "exclude_nodes": list(self.exclude_nodes) or [first.node],
                "exclude_pattern": self.exclude_pattern,
            },
            "outputs": {name: o.to_json() for name, o in self.outputs.items()},
            "rows": [r.to_json() for r in self.rows],
            "verification": None if self.verification is None else self.verification.to_json(),
            "notes": list(self.notes),
        }

    def to_html(self) -> str:
        """A self-contained HTML page (inline CSS, JS and SVG; nothing fetched): summary, plot, per-node table."""
        return render(self)

    def table(self, max_rows: int = 40) -> str:
        """The terminal table: every row when there are few, else the first divergence's neighbourhood."""
        return text_table(self, max_rows)


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else "…" + text[-(width - 1) :]


# --------------------------------------------------------------------------------------------------
# Terminal


def _selection(report: CompareReport, max_rows: int) -> list[CompareRow | None]:
    """All rows when they fit; else those around the first divergence and the worst ones (None marks a gap)."""
    rows = report.rows
    if len(rows) <= max_rows:
        return list(rows)
    keep: set[int] = set()
    first = report.first_divergence_row
    if first is not None:
        at = rows.index(first)
        keep.update(range(max(0, at - 5), min(len(rows), at + 10)))
    worst = sorted(
        (i for i, r in enumerate(rows) if r.rel_l2 is not None),
        key=lambda i: -(rows[i].rel_l2 if math.isfinite(rows[i].rel_l2 or 0.0) else math.inf),  # type: ignore[operator]
    )
    for i in worst:
        if len(keep) >= max_rows:
            break
        keep.add(i)
    keep.update(range(len(rows) - 1, len(rows)))  # the last node: the model's output
    picked: list[CompareRow | None] = []
    previous = -1
    for i in sorted(keep):
        if i != previous + 1:
            picked.append(None)
        picked.append(rows[i])
        previous = i
    if previous != len(rows) - 1:
        picked.append(None)
    return picked


def text_table(report: CompareReport, max_rows: int = 40) -> str:
    """A fixed-width table of the rows (flag ``!`` marks diverged rows, ``>`` the first divergence)."""
    head = f"{'':1} {'#':>5} {'depth':>5}  {'node':<44} {'op':<14} {'max_abs':>9} {'rel_l2':>9} {'cosine':>9}  match"
    lines = [head, "-" * len(head)]
    first = report.first_divergence_row
    for row in _selection(report, max_rows):
        if row is None:
            lines.append(f"{'':1} {'...':>5}")
            continue
        flag = ">" if row is first else "!" if row.diverged else " "
        how = row.match if row.status == "compared" else row.status
        lines.append(
            f"{flag:1} {row.index:>5} {row.depth:>5}  {_short(row.node, 44):<44} {_short(row.op_type, 14):<14} "
            f"{fmt(row.max_abs):>9} {fmt(row.rel_l2):>9} {fmt(row.cosine, 6):>9}  {_short(how, 30)}"
        )
    shown = sum(1 for r in _selection(report, max_rows) if r is not None)
    if shown < len(report.rows):
        lines.append(f"({shown} of {len(report.rows)} rows shown: write them all with --report_json or --report_html)")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# HTML (the kit of onnxprec._html)


def _plot(report: CompareReport) -> str:
    """Relative L2 error (log scale) against depth: the worst inexact tensor per depth as a line, every tensor a dot."""
    rows = [r for r in report.rows if r.rel_l2 is not None]
    if not rows:
        return "<p>No tensor was compared.</p>"
    width, height, left, bottom, top = 900, 300, 60, 30, 10
    deepest = max(r.depth for r in rows)
    axes = LogAxes((0, max(deepest, 1)), (-8, 2), (left, top, width - left - 10, height - top - bottom))
    ceiling = 10.0**axes.hi
    worst: dict[int, float] = {}
    for r in rows:
        value = r.rel_l2 if r.rel_l2 is not None and math.isfinite(r.rel_l2) else ceiling
        if r.nonfinite > r.ref_nonfinite:
            value = ceiling
        if value > 0:  # exact tensors (shape ops, FP32 islands) would pull the line to the floor
            worst[r.depth] = max(worst.get(r.depth, 0.0), value)
    line = " ".join(f"{axes.x(d):.1f},{axes.y(v):.1f}" for d, v in sorted(worst.items()))
    parts = [axes.frame(every=2, background=False), axes.hline(report.rtol, BAD_COLOR, f"rtol {report.rtol:g}")]
    first = report.first_divergence_row
    if first is not None:
        parts.append(axes.vline(first.depth, BAD_COLOR, f"first divergence: {first.node}"))
    parts.append(f'<polyline fill="none" stroke="{LOW_COLOR}" stroke-width="1.5" points="{line}"/>')
    for r in rows:
        color = BAD_COLOR if r.diverged else LOW_COLOR
        label = e(f"{r.node} ({r.op_type}) depth {r.depth}: rel_l2 {fmt(r.rel_l2)}")
        parts.append(
            f'<circle cx="{axes.x(r.depth):.1f}" cy="{axes.y(r.rel_l2 or 0.0):.1f}" r="2" fill="{color}" '
            f'fill-opacity="0.5"><title>{label}</title></circle>'
        )
    parts += [
        f'<line x1="{left}" x2="{axes.right}" y1="{axes.bottom}" y2="{axes.bottom}" stroke="#999"/>',
        f'<text x="{(width + left) / 2:.0f}" y="{height - 6}" text-anchor="middle">depth (node level from the inputs)'
        "</text>",
        f'<text x="{left}" y="{axes.bottom + 14}" text-anchor="middle">0</text>',
        f'<text x="{axes.right}" y="{axes.bottom + 14}" text-anchor="end">{deepest}</text>',
        f'<text x="12" y="{top + 10}" transform="rotate(-90 12 {top + 10})" text-anchor="end">rel L2 error</text>',
    ]
    return svg(width, height, parts, svg_id="plot", label="relative L2 error along the graph")


def render(report: CompareReport) -> str:
    """The whole page as a string."""
    first = report.first_divergence_row
    summary = [f"<p>{e(report.summary)}.</p>"]
    if first is not None:
        advice, _, pattern = (report.advice or "").partition(": --nodes_to_exclude ")
        advice = advice[:1].upper() + advice[1:]
        summary.append(f"<p>{e(advice)} with <code>--nodes_to_exclude {e(pattern)}</code>.</p>")
    if report.verification is not None:
        v = report.verification
        summary.append(f'<p class="{"ok" if v.fixed else "miss"}">{e(v.summary)}</p>')
    summary += [f"<p>{e(note)}</p>" for note in report.notes]
    settings = json.dumps({"atol": report.atol, "rtol": report.rtol, "batches": report.batches})
    summary.append(
        '<p class="muted">Criterion: a tensor diverges when the candidate has non-finite values where the reference '
        f"has none, or when rel L2 &gt; rtol and max abs &gt; atol. Settings: <code>{e(settings)}</code></p>"
    )
    outputs = table(
        ["output", "max abs", "rel L2", "cosine", "top-1", "non-finite"],
        [
            [f"<code>{e(o.name)}</code>", num_cell(o.max_abs), num_cell(o.rel_l2), num_cell(o.cosine, 6),
             num_cell(o.top1, 4), num_cell(o.nonfinite)]
            for o in report.outputs.values()
        ],
        attrs='id="outputs"',
    )  # fmt: skip
    rows = []
    for r in report.rows:
        css = "first div" if r is first else "div" if r.diverged else "un" if r.status != "compared" else ""
        how = r.match if r.status == "compared" else f"{r.status}: {r.match}"
        rows.append(
            f'<tr class="{css}">{num_cell(r.index)}{num_cell(r.depth)}<td>{e(r.node)}</td><td>{e(r.op_type)}</td>'
            f"<td>{e(r.tensor)}</td><td>{e(r.candidate or '-')}</td><td>{e(how)}</td>{num_cell(r.max_abs)}"
            f"{num_cell(r.rel_l2)}{num_cell(r.cosine, 6)}{num_cell(r.ref_absmax)}{num_cell(r.nonfinite)}</tr>"
        )
    headers = ["#", "depth", "node", "op", "tensor", "candidate", "match", "max abs", "rel L2", "cosine", "|ref| max",
               "non-finite"]  # fmt: skip
    every = (
        filters("rows", checkbox=("div", "diverged only"), count_id="shown")
        + '<div class="scroll">'
        + table(headers, rows, numeric=(0, 1, 7, 8, 9, 10, 11), attrs='id="rows"')
        + "</div>"
    )
    title = f"onnxprec compare: {report.candidate or 'candidate'} vs {report.reference or 'reference'}"
    return page(
        title,
        f"{report.reference} → {report.candidate}",
        [
            section("summary", "Summary", "".join(summary)),
            section("outputs-section", "Final outputs", outputs),
            section("along", "Error along the graph", _plot(report)),
            section("every", "Every tensor, in topological order", every),
        ],
    )
