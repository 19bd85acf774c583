"""An issue's goals as data (:class:`Goal`), and the one function that evaluates them (:func:`evaluate`).

A tool's issue lists its targets (``report_autocast.TARGETS`` for AutoCast); each names a metric of
:data:`METRICS`, how it compares with a bound, and the words of its row. A new issue adds its own list (and, if
it measures something new, a metric here), never a copy of the evaluation or of the table.

Metrics:

* ``speedup``, ``time_ratio``, ``rss_ratio`` - the tool's ratios against ``anchor`` (round by round, or
  † ratios of medians from different runs); the row shows ``**median×** [min–max]``.
* ``wall_s``, ``peak_rss_mb`` - the tool's own whole-process wall time (s) and peak RSS (MiB); a tool that ran
  but has no number (failed, timed out, stopped at the memory limit) has not reached the target.
* ``low_nodes``, ``casts``, ``rel_l2`` - the tool's result against the anchor's (the same metric of the
  anchor's result, times ``bound``); ``rel_l2`` also needs no more non-finite outputs than the anchor's.
* ``perplexity_change`` - ``|perplexity / FP32 perplexity - 1|`` (the FP32 one measured, else ``reference``).
* ``own_rel_l2`` - the tool's own relative L2 error against FP32 on the real inputs, against the bound itself.
* ``low_nodes_at_target`` - the tool's low-precision nodes against the anchor's times ``bound``, when the
  anchor's own relative L2 error meets the tool's accuracy target (``Goal.reference``); not applicable else.

Context fragments (:attr:`Goal.context`) are ``str.format`` templates; a fragment whose fields are missing is
left out. Fields: ``anchor_wall_s``, ``anchor_rss_gib`` (the anchor's medians) and the metric's own
(``float_nodes``, ``fp32_nodes``, ``max_abs``, ``fp32_perplexity``, ``reference``).
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from string import Formatter
from typing import Any, Literal

from .report_common import Merged, median, model_label, model_sort_key, num, ratio, stat, status_text, table

Compare = Literal[">=", "<=", "<", ">"]
_COMPARE: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge,
    "<=": operator.le,
    "<": operator.lt,
    ">": operator.gt,
}
EVERY_MODEL = "*"


@dataclass(frozen=True)
class Goal:
    """One goal of an issue.

    Attributes:
        description: The row's first cell; ``{model}`` becomes the model's label.
        metric: A key of :data:`METRICS`.
        compare: How the measured value must compare with the limit: ``>=``, ``<=``, ``<`` or ``>``.
        bound: The limit; for the metrics measured against the anchor's result, a factor of the anchor's value.
        goal: The Goal cell (a template: ``{fp32_perplexity}``...).
        model: A zoo model, or ``*``: every model on which the tool and the anchor both have the numbers
            (consecutive ``*`` targets are evaluated model by model, in their list order for each model).
        tool: The tool measured.
        anchor: The tool it is compared with (ratios, result-against-result metrics and the context's
            ``anchor_*`` fields).
        context: Fragments of the Context cell (templates; see the module docstring).
        digits: Digits of the measured ratio or statistic.
        reference: The published value, where the metric uses one (perplexity).
    """

    description: str
    metric: str
    compare: Compare
    bound: float
    goal: str
    model: str = EVERY_MODEL
    tool: str = "onnxprec"
    anchor: str | None = "modelopt"
    context: tuple[str, ...] = ()
    digits: int = 2
    reference: float | None = None


@dataclass
class GoalRow:
    """One target evaluated on the newest numbers: reached True/False, None when not measured."""

    target: str
    measured: str
    goal: str
    reached: bool | None
    context: str = ""
    run: str = ""


@dataclass
class Measure:
    """What a metric found for one target on one model.

    Attributes:
        value: The number compared with ``limit`` (None: not measured).
        limit: What ``value`` must compare with (the bound, or the bound times the anchor's value).
        measured: The Measured cell.
        fields: Context and goal template fields.
        failed: The tool ran but gave no number: the target is not reached.
        also: A further condition that must hold for the target to be reached.
    """

    value: float | None
    limit: float
    measured: str
    fields: dict[str, str]
    failed: bool = False
    also: bool = True


Metric = Callable[[Goal, str, Merged], Measure | None]  # None: nothing to show (a * target skips the model)


def _entry(merged: Merged, model: str, tool: str | None) -> dict[str, Any] | None:
    return merged.models.get(model, {}).get("tools", {}).get(tool) if tool else None


def _anchor_fields(merged: Merged, model: str, anchor: str | None) -> dict[str, str]:
    e = _entry(merged, model, anchor)
    fields = {}
    if e and (w := median(e, "wall_s")):
        fields["anchor_wall_s"] = num(w)
    if e and (r := median(e, "peak_rss_mb")):
        fields["anchor_rss_gib"] = num(r / 1024)
    return fields


def _ratio_metric(key: str) -> Metric:
    """``speedup``, ``time_ratio`` or ``rss_ratio`` of the tool against the anchor."""

    def measure(t: Goal, model: str, merged: Merged) -> Measure:
        e = _entry(merged, model, t.tool)
        v = e.get("_vs", {}).get(t.anchor) if e else None
        s = v.get(key) if v else None
        shown = ratio(s, v.get("paired", True), t.digits) if v and s else "not measured"
        return Measure(s["median"] if s else None, t.bound, shown, _anchor_fields(merged, model, t.anchor))

    return measure


def _summary_metric(key: str, unit: str) -> Metric:
    """A summary statistic of the tool's own runs (median [min–max])."""

    def measure(t: Goal, model: str, merged: Merged) -> Measure:
        e = _entry(merged, model, t.tool)
        s = e.get("summary", {}).get(key) if e else None
        shown = f"{stat(s, t.digits)}{unit}" if s else ("not measured" if not e else status_text(e))
        fields = _anchor_fields(merged, model, t.anchor)
        return Measure(s["median"] if s else None, t.bound, shown, fields, failed=e is not None and s is None)

    return measure


def _pair(t: Goal, model: str, merged: Merged) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The tool's and the anchor's results' structures and accuracies, when both have a structure."""
    ours, theirs = _entry(merged, model, t.tool), _entry(merged, model, t.anchor)
    if not ours or not theirs or "structure" not in ours or "structure" not in theirs:
        return None
    return ours, theirs


def _structure_metric(key: str) -> Metric:
    """A structure count (``low_nodes``, ``casts``) of the tool's result against the anchor's."""

    def measure(t: Goal, model: str, merged: Merged) -> Measure | None:
        pair = _pair(t, model, merged)
        if pair is None:
            return None
        so, st = pair[0]["structure"], pair[1]["structure"]
        fields = {
            "float_nodes": f"{so.get('float_nodes', so['nodes'])} / {st.get('float_nodes', st['nodes'])}",
            "fp32_nodes": f"{so.get('fp32_nodes', '?')} vs {st.get('fp32_nodes', '?')}",
        }
        return Measure(so[key], t.bound * st[key], f"{so[key]} vs {st[key]}", fields)

    return measure


_low_nodes = _structure_metric("low_nodes")


def _rel_l2(t: Goal, model: str, merged: Merged) -> Measure | None:
    pair = _pair(t, model, merged)
    ao, at = (e.get("accuracy", {}) for e in pair) if pair else ({}, {})
    if "rel_l2" not in ao or "rel_l2" not in at:
        return None
    return Measure(
        ao["rel_l2"],
        at["rel_l2"] * t.bound + 1e-9,  # rounding-order noise
        f"rel L2 {num(ao['rel_l2'], 2)} vs {num(at['rel_l2'], 2)}",
        {"max_abs": f"{num(ao.get('max_abs'))} vs {num(at.get('max_abs'))}"},
        also=ao.get("nonfinite", 0) <= at.get("nonfinite", 0),
    )


def _perplexity_change(t: Goal, model: str, merged: Merged) -> Measure:
    e = _entry(merged, model, t.tool)
    ppl = e.get("accuracy", {}).get("perplexity") if e else None
    base = merged.models.get(model, {}).get("fp32", {}).get("perplexity") or t.reference
    fields = {"fp32_perplexity": num(base, 3), "reference": f"{t.reference}"}
    if ppl is None or not base:
        return Measure(None, t.bound, "not measured", fields)
    change = abs(ppl - base) / base
    return Measure(change, t.bound, f"{num(ppl, 3)} ({change * 100:+.2f} %)", fields)


def _own_rel_l2(t: Goal, model: str, merged: Merged) -> Measure | None:
    e = _entry(merged, model, t.tool)
    acc = e.get("accuracy", {}) if e else {}
    if "rel_l2" not in acc:
        return None
    return Measure(acc["rel_l2"], t.bound, f"rel L2 {num(acc['rel_l2'], 2)}", {}, also=acc.get("nonfinite", 0) == 0)


def _low_nodes_at_target(t: Goal, model: str, merged: Merged) -> Measure | None:
    pair = _pair(t, model, merged)
    if pair is None or t.reference is None:
        return None
    theirs = pair[1].get("accuracy", {}).get("rel_l2")
    low = _low_nodes(t, model, merged)
    if low is None or theirs is None:
        return None
    if theirs > t.reference:
        return Measure(None, 0, f"n/a: the default misses it (rel L2 {num(theirs, 2)})", low.fields)
    return low


METRICS: dict[str, Metric] = {
    "speedup": _ratio_metric("speedup"),
    "time_ratio": _ratio_metric("time_ratio"),
    "rss_ratio": _ratio_metric("rss_ratio"),
    "wall_s": _summary_metric("wall_s", " s"),
    "peak_rss_mb": _summary_metric("peak_rss_mb", " MiB"),
    "low_nodes": _low_nodes,
    "casts": _structure_metric("casts"),
    "rel_l2": _rel_l2,
    "perplexity_change": _perplexity_change,
    "own_rel_l2": _own_rel_l2,
    "low_nodes_at_target": _low_nodes_at_target,
}


def _fill(fragments: Sequence[str], fields: dict[str, str]) -> str:
    """The fragments whose fields are all known, filled in and joined."""
    known = lambda f: {name for _, name, _, _ in Formatter().parse(f) if name} <= fields.keys()  # noqa: E731
    return "".join(f.format(**fields) for f in fragments if known(f))


def _row(t: Goal, model: str, merged: Merged) -> GoalRow | None:
    m = METRICS[t.metric](t, model, merged)
    if m is None:
        if t.model == EVERY_MODEL:
            return None
        m = Measure(None, t.bound, "not measured", {})
    if m.value is None:
        reached = False if m.failed else None
    else:
        reached = _COMPARE[t.compare](m.value, m.limit) and m.also
    e = _entry(merged, model, t.tool)
    return GoalRow(
        t.description.format(model=model_label(model)),
        m.measured,
        _fill((t.goal,), m.fields) or t.goal,
        reached,
        _fill(t.context, m.fields),
        f"[{merged.run_number(e['_run'])}]" if e else "",
    )


def evaluate(targets: Sequence[Goal], merged: Merged) -> list[GoalRow]:
    """Every target's row, in list order; a ``*`` target has one row per model that has its numbers."""
    rows: list[GoalRow] = []
    for every, group in itertools.groupby(targets, key=lambda t: t.model == EVERY_MODEL):
        run = list(group)
        for model in sorted(merged.models, key=model_sort_key) if every else [None]:
            rows += [row for t in run if (row := _row(t, model or t.model, merged))]
    return rows


def targets_table(rows: Sequence[GoalRow]) -> str:
    """The Target / Measured / Goal / ✅❌– / Context / run table."""
    marks = {True: "✅", False: "❌", None: "–"}
    cells = [[r.target, r.measured, r.goal, marks[r.reached], r.context.strip(), r.run] for r in rows]
    return table(["Target", "Measured", "Goal", "", "Context", "run"], cells)
