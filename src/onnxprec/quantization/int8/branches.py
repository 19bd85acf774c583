"""The ``If`` branches the calibration data takes, and the copy of the model that calibration runs on.

A run hands out tensors of the main graph only, and the layers of a model such as Silero VAD live inside the
branches of an ``If`` on its sample rate. Each ``If`` whose branches hold a layer is run for its condition on the
calibration data; where the condition is the same on every batch, the copy gets that branch inlined
(:class:`~onnxprec.passes.inline_taken_branches.InlineTakenBranchesPass`), which brings the nested ``If`` nodes of
the branch into the main graph for the next round (one run of the copy per level of nesting). The copy's tensors keep
their names, so the statistics of a branch's tensors are those of the model's own values; the model itself keeps
its ``If`` nodes, and the layers of a branch the data never takes, or of an ``If`` whose condition changes from batch
to batch, stay float (there is no range for them).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from onnxprec._graph import bodies_of
from onnxprec._ops import is_default_domain
from onnxprec.calibration_data import CalibrationData
from onnxprec.passes.inline_taken_branches import InlineTakenBranchesPass
from onnxprec.reference import run_reference

__all__ = ["BranchView", "branch_view"]

logger = logging.getLogger(__name__)


def _holds(node: ir.Node, wanted: Callable[[ir.Node], bool]) -> bool:
    """Whether a body of ``node`` holds (at any depth) a node for which ``wanted`` is true."""
    return any(wanted(inner) or _holds(inner, wanted) for _, body in bodies_of(node) for inner in body)


@dataclass
class BranchView:
    """The copy calibration runs on and what it inlined."""

    model: ir.Model
    taken: dict[str, bool] = field(default_factory=dict)
    """The ``If`` nodes inlined, by name: the condition the data gave on every batch (True: ``then_branch``)."""
    varying: list[str] = field(default_factory=list)
    """The ``If`` nodes with a layer below whose condition changed from batch to batch (not inlined)."""

    def calibrated(self) -> set[tuple[str, str]]:
        """The bodies whose tensors calibration sees: ``(If name, branch attribute)``."""
        return {(name, "then_branch" if cond else "else_branch") for name, cond in self.taken.items()}


class _Conditions:
    """Observer: the truth values each condition took."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = frozenset(names)
        self.seen: dict[str, set[bool]] = {}

    def update(self, name: str, array: np.ndarray) -> None:
        values = np.asarray(array).reshape(-1)
        if values.size == 1:
            self.seen.setdefault(name, set()).add(bool(values[0]))
        else:
            self.seen.setdefault(name, set()).update((True, False))  # not a condition ONNX accepts: never inlined


def branch_view(
    model: ir.Model, data: CalibrationData, wanted: Callable[[ir.Node], bool], providers: Sequence[str]
) -> BranchView:
    """The copy of ``model`` with the branch of each ``If`` above a ``wanted`` node inlined where ``data`` takes
    the same branch on every batch (see the module docstring)."""
    view = BranchView(model.clone())
    decided: set[str] = set()
    while True:
        pending = [
            node for node in view.model.graph
            if node.op_type == "If" and is_default_domain(node.domain) and str(node.name) not in decided
            and node.inputs and node.inputs[0] is not None and _holds(node, wanted)
        ]  # fmt: skip
        if not pending:
            break
        seen = _conditions(view.model, pending, data, providers)
        taken = {}
        for node in pending:
            name = str(node.name)
            decided.add(name)
            values = seen.get(name, {True, False})
            if len(values) == 1:
                taken[name] = values.pop()
            else:
                view.varying.append(name)
        view.taken.update(taken)
        if taken:
            InlineTakenBranchesPass(taken)(view.model)
    logger.info(
        "Calibration runs %d If branches inlined (%d If nodes take both branches on the data)",
        len(view.taken), len(view.varying),
    )  # fmt: skip
    return view


def _conditions(
    model: ir.Model, nodes: Sequence[ir.Node], data: CalibrationData, providers: Sequence[str]
) -> dict[str, set[bool]]:
    """The truth values the condition of each ``If`` of ``nodes`` took on ``data``, by the ``If``'s name."""
    values = {str(node.name): node.inputs[0] for node in nodes}
    result: dict[str, set[bool]] = {}
    computed: list[ir.Value] = []
    for name, value in values.items():
        assert value is not None
        if value.const_value is not None:
            result[name] = {bool(np.asarray(value.const_value.numpy()).reshape(-1)[0])}
        elif not value.is_graph_input():
            computed.append(value)
    observer = _Conditions([str(v.name) for v in values.values() if v is not None])
    inputs = any(v is not None and v.is_graph_input() for v in values.values())
    run_reference(model, data, select=computed, observers=[observer], providers=list(providers), observe_inputs=inputs)
    for name, value in values.items():
        if name not in result and value is not None:
            result[name] = observer.seen.get(str(value.name), {True, False})
    return result
