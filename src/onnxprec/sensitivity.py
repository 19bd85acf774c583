"""The sensitivity engine: how much each layer (weight, node) costs the outputs, and the searches that promote the
most sensitive first under a constraint. INT4's ``size_budget_mb``, AutoCast's ``--target_accuracy`` and INT8's float
fallback are built on it.

**Estimates** (one number per item, larger: more sensitive):

- :func:`hessian_loss`: the relative output error a weight change adds on the calibration data, weighted by the
  ``XᵀX`` of the layer's input that the observers collect (the statistic GPTQ uses)::

      loss = tr(ΔWᵀ H ΔW) / tr(Wᵀ H W),  ΔW = W - Q(W),  H = XᵀX

  (``H`` None: the identity, every input equally likely, as for an embedding table read by a Gather).
- :func:`structural`: where no statistic applies (a node's FP16 rounding), the readers of a node's outputs over its
  distance to the graph outputs.
- :func:`isolated_gains`: measured, one real check per item (the error removed when that item alone is promoted).
- :func:`calibrate`: estimates checked by a few real runs: each set of items is measured once and its estimates
  are scaled by measured over estimated, so every estimate is in the measured unit.

**Searches** (promote the most sensitive first):

- under a cost budget, several precisions per item: :func:`allocate` (greedy on each item's (bytes, loss) lower
  convex hull: the most loss removed per byte first);
- under an accuracy constraint checked for real: :func:`rank` orders the items, :func:`within` keeps the prefix that
  fits a cost cap, and :func:`fewest` finds how many of the most sensitive to promote (galloping 1, 2, 4... then a
  bisection) or :func:`bisect_count` between two known counts.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import numpy as np
import onnx_ir as ir

from onnxprec._progress import progress as counted

__all__ = [
    "Allocation",
    "Candidate",
    "Probe",
    "allocate",
    "bisect_count",
    "calibrate",
    "distance_to_outputs",
    "fewest",
    "hessian_energy",
    "hessian_loss",
    "isolated_gains",
    "multiply_adds",
    "rank",
    "structural",
    "within",
]

Key = TypeVar("Key", bound=Hashable)


# --------------------------------------------------------------------------------------------------
# Work


def multiply_adds(graph: ir.Graph, shapes: Mapping[str, Sequence[int]]) -> float:
    """The multiply-adds of one run of ``graph``'s MatMul, Gemm and Conv nodes (its subgraphs' left out): each
    output element of a node costs the length of its reduction, read from the second input's shape (a MatMul's
    ``K``, a Gemm's ``K``, a Conv's ``C/group x kernel``). Shapes come from ``shapes`` (by value name: measured on a
    batch), else from the static shapes the graph declares; a node with either shape unknown counts nothing."""
    total = 0.0
    for node in graph:
        if node.op_type not in ("MatMul", "Gemm", "Conv") or len(node.inputs) < 2 or not node.outputs:
            continue
        out, weight = _shape(node.outputs[0], shapes), _shape(node.inputs[1], shapes)
        if out is None or not weight:
            continue
        if node.op_type == "Conv":
            reduction = math.prod(weight) // max(weight[0], 1)
        elif node.op_type == "Gemm":
            trans_b = node.attributes.get_int("transB", 0)
            reduction = weight[-1] if trans_b and len(weight) > 1 else weight[0]
        else:
            reduction = weight[-2] if len(weight) > 1 else weight[0]
        total += float(math.prod(out)) * float(reduction)
    return total


def _shape(value: ir.Value | None, shapes: Mapping[str, Sequence[int]]) -> tuple[int, ...] | None:
    """``value``'s shape from ``shapes``, else its declared static shape (None: unknown)."""
    if value is None:
        return None
    known = shapes.get(str(value.name))
    if known is not None:
        return tuple(int(d) for d in known)
    if value.shape is None or not all(isinstance(d, int) for d in value.shape):
        return None
    return tuple(int(d) for d in value.shape)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------------
# Estimates


def hessian_energy(x: np.ndarray, gram: np.ndarray | None) -> float:
    """``tr(Xᵀ H X)`` of a ``[K, N]`` matrix (``H`` ``[K, K]``; None: the identity)."""
    x = np.asarray(x, np.float32)
    product = x if gram is None else np.asarray(gram, np.float32) @ x
    return float(np.einsum("kn,kn->", product, x, dtype=np.float64))


def hessian_loss(w: np.ndarray, dequantized: np.ndarray, gram: np.ndarray | None, energy: float | None = None) -> float:
    """``tr(ΔWᵀ H ΔW) / tr(Wᵀ H W)`` for ``[K, N]`` weights and ``H`` ``[K, K]`` (None: the identity).

    ``energy``: ``tr(Wᵀ H W)`` when already known (:func:`hessian_energy`), to score several candidates of one weight.
    """
    den = hessian_energy(w, gram) if energy is None else energy
    if den <= 0:
        return 0.0
    diff = np.asarray(w, np.float32) - np.asarray(dequantized, np.float32)
    return max(hessian_energy(diff, gram), 0.0) / den


def distance_to_outputs(model: ir.Model) -> dict[ir.Node, int]:
    """The longest path, in nodes, from each main-graph node to a graph output (1: it writes one)."""
    graph = model.graph
    distance: dict[ir.Node, int] = {}
    for node in reversed(list(graph)):
        below = [distance.get(use.node, 0) for out in node.outputs for use in out.uses() if use.node.graph is graph]
        distance[node] = 1 + max(below, default=0)
    return distance


def structural(model: ir.Model) -> dict[ir.Node, float]:
    """The structural sensitivity of each main-graph node: readers of its outputs over its distance to the outputs.

    An error injected near the outputs is diluted by fewer nodes; one in a tensor that many nodes read (a residual
    stream) reaches the outputs along many paths. For a node's FP16 rounding this ranks better than the node's own
    rounding error, which is nearly the same for every node (``python -m experiments.target_proxy``).
    """
    distance = distance_to_outputs(model)
    result = {}
    for node, d in distance.items():
        readers = sum(len(out.uses()) + out.is_graph_output() for out in node.outputs)
        result[node] = max(readers, 1) / d
    return result


def isolated_gains(
    items: Sequence[Key], badness: Callable[[Key], float], base: float, squared: bool, progress: str = ""
) -> dict[Key, float]:
    """What promoting each item alone gains, measured: ``base`` (the error with none promoted) less ``badness(item)``
    (the error with that item alone promoted), in squares when ``squared`` (errors of independent items add up in
    squares: a relative L2 or max error), else in the metric itself (1 - cosine is already a squared error)."""
    gains = {}
    for item in counted(items, progress or "Sensitivity", "layer"):
        after = badness(item)
        gains[item] = base * base - after * after if squared else base - after
    return gains


@dataclass(frozen=True)
class Probe(Generic[Key]):
    """One real run that checked the estimates of a set of items."""

    items: tuple[Key, ...]
    estimated: float
    measured: float

    @property
    def gain(self) -> float:
        """Measured over estimated (the factor the set's estimates are scaled by)."""
        return max(self.measured, 1e-9) / max(self.estimated, 1e-12)


def calibrate(
    sets: Sequence[Sequence[Key]],
    estimated: Callable[[Sequence[Key]], float],
    measure: Callable[[Sequence[Key]], float],
) -> list[Probe[Key]]:
    """Checks estimates by real runs: ``measure`` each set once and compare with its summed estimate.

    Returns one :class:`Probe` per set; scale the set's estimates by its :attr:`Probe.gain` to put them in the
    measured unit.
    """
    probes = []
    for items in sets:
        estimate = estimated(items)
        probes.append(Probe(tuple(items), estimate, measure(items)))
    return probes


# --------------------------------------------------------------------------------------------------
# Searches


def rank(sensitivity: Mapping[Key, float], items: Sequence[Key] | None = None, *, least_first: bool = False,
         positive: bool = False) -> list[Key]:  # fmt: skip
    """``items`` (default: every key) by sensitivity, the most sensitive first (``least_first``: the least), ties in
    the given order; ``positive``: only those whose sensitivity is above 0 (promoting the others gains nothing)."""
    keys = list(sensitivity) if items is None else list(items)
    ordered = sorted(keys, key=lambda k: sensitivity[k], reverse=not least_first)
    return [k for k in ordered if sensitivity[k] > 0] if positive else ordered


def within(order: Sequence[Key], cost: Mapping[Key, float], limit: float) -> list[Key]:
    """The items of ``order``, in order, whose summed ``cost`` stays within ``limit`` (an item that does not fit is
    skipped; later, cheaper ones may still fit)."""
    used, kept = 0.0, []
    for item in order:
        if used + cost.get(item, 0.0) <= limit:
            kept.append(item)
            used += cost.get(item, 0.0)
    return kept


def bisect_count(holds: Callable[[int], bool], good: int, bad: int) -> int:
    """The count next to ``bad`` that still holds, by bisection between ``good`` (assumed to hold) and ``bad``
    (assumed to miss); ``good`` may be above or below ``bad``. ``holds`` is called about ``log2 |good - bad|``
    times."""
    while abs(good - bad) > 1:
        middle = (good + bad) // 2
        if holds(middle):
            good = middle
        else:
            bad = middle
    return good


def fewest(holds: Callable[[int], bool], count: int) -> int:
    """The fewest of ``count`` ranked items to promote so that ``holds``: galloping from the fewest (1, 2, 4...)
    until it holds, then a bisection in between, so a constraint that a few items meet is found in a few checks
    (about ``2 log2`` of the answer). ``count`` itself is assumed to hold and not checked."""
    low, high, step = 0, count, 1
    while step < high:
        if holds(step):
            high = step
            break
        low, step = step, step * 2
    return bisect_count(holds, high, low)


# --------------------------------------------------------------------------------------------------
# Several precisions per item under a cost budget


@dataclass(frozen=True)
class Candidate:
    """One precision of one item: its stored bytes and estimated loss (``precision`` is the caller's label)."""

    precision: Any
    bytes: int
    loss: float


@dataclass
class Allocation(Generic[Key]):
    """The outcome of :func:`allocate`."""

    choice: dict[Key, Candidate]
    bytes: int
    loss: float
    curve: list[tuple[int, float]] = field(default_factory=list)
    """(bytes, estimated loss) from the smallest configuration through every promotion to the largest."""


def _hull(candidates: Sequence[Candidate]) -> list[Candidate]:
    """The lower convex hull of (bytes, loss), from the fewest bytes on, loss strictly decreasing."""
    points: list[Candidate] = []
    for candidate in sorted(candidates, key=lambda c: (c.bytes, c.loss)):
        if points and candidate.loss >= points[-1].loss:
            continue  # more bytes for no less loss
        if points and candidate.bytes == points[-1].bytes:
            points.pop()
        while len(points) >= 2:
            a, b = points[-2], points[-1]
            # b is above the segment a -> candidate: not on the hull
            if (b.loss - a.loss) * (candidate.bytes - a.bytes) >= (candidate.loss - a.loss) * (b.bytes - a.bytes):
                points.pop()
            else:
                break
        points.append(candidate)
    return points


def allocate(candidates: Mapping[Key, Sequence[Candidate]], budget: int | None) -> Allocation[Key]:
    """The candidate of each key that minimises the summed loss within ``budget`` bytes (greedy on convex hulls).

    Every key starts at its smallest candidate; promotions (to the next hull point of a key) are taken in order of
    loss removed per byte added: the most sensitive bytes first. With a budget, a promotion that does not fit is
    skipped and the later ones of that key with it; smaller promotions of other keys may still fit. Raises
    ``ValueError`` when even the smallest candidates exceed ``budget``.
    """
    hulls = {key: _hull(options) for key, options in candidates.items() if options}
    level = dict.fromkeys(hulls, 0)
    total = sum(h[0].bytes for h in hulls.values())
    loss = sum(h[0].loss for h in hulls.values())
    if budget is not None and total > budget:
        raise ValueError(f"the smallest configuration takes {total} bytes, above the budget of {budget}")
    order = {key: i for i, key in enumerate(hulls)}
    heap: list[tuple[float, int, Key]] = []

    def push(key: Key) -> None:
        hull, i = hulls[key], level[key]
        if i + 1 < len(hull):
            step, now = hull[i + 1], hull[i]
            slope = (now.loss - step.loss) / max(step.bytes - now.bytes, 1)
            heapq.heappush(heap, (-slope, order[key], key))

    for key in hulls:
        push(key)
    curve = [(total, loss)]
    chosen_total, chosen_loss, chosen = total, loss, {key: h[0] for key, h in hulls.items()}
    blocked: set[Key] = set()
    while heap:
        _, _, key = heapq.heappop(heap)
        hull, i = hulls[key], level[key]
        added = hull[i + 1].bytes - hull[i].bytes
        total += added
        loss -= hull[i].loss - hull[i + 1].loss
        level[key] = i + 1
        curve.append((total, loss))
        if key not in blocked and (budget is None or chosen_total + added <= budget):
            chosen_total += added
            chosen_loss -= hull[i].loss - hull[i + 1].loss
            chosen[key] = hull[i + 1]
        else:
            blocked.add(key)
        push(key)
    return Allocation(chosen, chosen_total, max(chosen_loss, 0.0), curve)
