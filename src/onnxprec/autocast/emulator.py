"""The emulation session of AutoCast's accuracy-target search: every configuration is a set of boolean inputs.

:class:`Emulator` builds, once, the FP32 model in which every tensor edge that a candidate node can make low goes
through the low type (``Cast`` to low and back) behind a boolean input, exactly where the converter rounds
(:class:`EmulateRoundingPass` on a clone of the model); trying a configuration is then one ``session.run`` per batch,
never a build or a session (:mod:`onnxprec.autocast.target` runs the search).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Iterable, Sequence

import numpy as np
import onnx_ir as ir

from onnxprec import _ort
from onnxprec._graph import NameAllocator
from onnxprec._report import timed
from onnxprec._tensors import finite_max

__all__ = ["EmulateRoundingPass", "EmulationResult", "Emulator", "float_values"]

logger = logging.getLogger(__name__)

_F = ir.DataType.FLOAT


def float_values(node: ir.Node) -> list[ir.Value]:
    """The FP32 inputs and outputs of a node (what the emulation rounds, what a candidate must have)."""
    return [v for v in (*node.inputs, *node.outputs) if v is not None and v.dtype == _F]


@dataclasses.dataclass
class EmulationResult(ir.passes.PassResult):
    """The result of :class:`EmulateRoundingPass`.

    Attributes:
        switches: Per boolean input ``SWITCH.format(k)``, the candidates (indices) any of which being low rounds
            the edges behind it.
        fetch: Graph output name -> the name to fetch for it (its rounded twin where the output is rounded).
        rounded_edges: How many tensor edges go through the low type.
    """

    switches: list[frozenset[int]] = dataclasses.field(default_factory=list)
    fetch: dict[str, str] = dataclasses.field(default_factory=dict)
    rounded_edges: int = 0


class EmulateRoundingPass(ir.passes.InPlacePass):
    """Rounds every FP32 tensor edge through the low type where a low node would, behind switches (main graph).

    A tensor edge (tensor ``t`` read by node ``c``) is rounded when the producer of ``t`` is low or ``c`` is
    low, as the converter does it (a low node writes the low type; a low node reads a cast of an FP32 tensor).
    Initializers are rounded for their low readers only (the converter gives them a low copy), clamped to the
    finite range as the converter clamps. Edges decided by fixed nodes are rounded unconditionally; the others
    go through ``Where(switch, rounded, exact)``, with one boolean scalar input per distinct set of candidates that
    decides it. A rounded graph output keeps its exact value and gets a rounded twin as an extra output
    (``result.fetch``). The rounding nodes follow the tensor's producer (graph inputs' and initializers' come first).

    Args:
        fixed_low: Main-graph nodes of the model the pass runs on that are low whatever the search does.
        candidates: Its nodes the search may make low or FP32 (switch ``k`` names indices into this list).
        low: FLOAT16 or BFLOAT16.
        keep_io_types: Whether FP32 graph inputs and outputs stay FP32.
    """

    SWITCH = "__onnxprec_low_{}"

    def __init__(
        self, fixed_low: set[ir.Node], candidates: Sequence[ir.Node], low: ir.DataType, *, keep_io_types: bool
    ) -> None:
        super().__init__()
        self.fixed_low = fixed_low
        self.candidates = list(candidates)
        self.low = low
        self.keep_io_types = keep_io_types

    def call(self, model: ir.Model) -> EmulationResult:
        graph = model.graph
        candidate = {node: i for i, node in enumerate(self.candidates)}
        names = NameAllocator(model)
        result = EmulationResult(model, modified=False, fetch={str(v.name): str(v.name) for v in graph.outputs})
        switch_of: dict[frozenset[int], ir.Value] = {}
        first: list[ir.Node] = []
        after: dict[ir.Node, list[ir.Node]] = {}
        io_state = "high" if self.keep_io_types else "low"

        def state(node: ir.Node | None) -> str | int:
            if node is None or node.graph is not graph:
                return "high"
            if node in candidate:
                return candidate[node]
            return "low" if node in self.fixed_low else "high"

        for value in list(_float_tensors(graph)):
            producer = value.producer()
            # the converter copies an initializer for its low readers
            p_state = "high" if value.is_initializer() else io_state if producer is None else state(producer)
            readers: list[tuple[ir.Node | None, int, str | int]] = [
                (u.node, u.idx, state(u.node)) for u in value.uses() if u.node.graph is graph
            ]
            readers += [(None, i, io_state) for i, v in enumerate(graph.outputs) if v is value]
            groups: dict[frozenset[int] | None, list[tuple[ir.Node | None, int]]] = {}
            for node, slot, c_state in readers:
                drivers = None
                if "low" not in (p_state, c_state):
                    drivers = frozenset(s for s in (p_state, c_state) if isinstance(s, int))
                    if not drivers:
                        continue
                groups.setdefault(drivers, []).append((node, slot))
            if not groups:
                continue
            new = _rounding(value, self.low, names, clamp=value.is_initializer())
            where = first if producer is None else after.setdefault(producer, [])
            where += new
            rounded = new[-1].outputs[0]
            for drivers, uses in groups.items():
                out = rounded
                if drivers is not None:
                    switch = switch_of.get(drivers)
                    if switch is None:
                        switch = switch_of[drivers] = ir.Value(
                            name=self.SWITCH.format(len(result.switches)),
                            type=ir.TensorType(ir.DataType.BOOL),
                            shape=ir.Shape([]),
                        )
                        result.switches.append(drivers)
                    out = ir.Value(name=names(f"{value.name}__emu"), type=ir.TensorType(_F))
                    where.append(ir.Node("", "Where", [switch, rounded, value], outputs=[out]))
                for node, slot in uses:
                    if node is None:
                        result.fetch[str(graph.outputs[slot].name)] = str(out.name)
                        if out not in graph.outputs:
                            out.shape = value.shape  # a graph output has a shape, if only of unknown dims
                            graph.outputs.append(out)
                    else:
                        node.replace_input_with(slot, out)
                result.rounded_edges += len(uses)
        if first and graph.num_nodes():
            graph.insert_before(graph.node(0), first)
        elif first:
            graph.extend(first)
        for producer, nodes in after.items():
            graph.insert_after(producer, nodes)
        graph.inputs.extend(switch_of.values())
        result.modified = bool(result.rounded_edges)
        return result


class Emulator:
    """The FP32 model with switchable rounding through the low type; one ORT session for every configuration.

    The session runs a clone of the model rounded by :class:`EmulateRoundingPass` (the model is unchanged; the
    clone shares its weights and is serialized once for ONNX Runtime).

    Args:
        model: The FP32 model after sanitizing (unchanged).
        fixed_low: Main-graph nodes that are low whatever the search does.
        candidates: The nodes the search may make low or FP32.
        low: FLOAT16 or BFLOAT16.
        keep_io_types: Whether FP32 graph inputs and outputs stay FP32.
        providers: ONNX Runtime providers.
    """

    SWITCH = EmulateRoundingPass.SWITCH

    def __init__(
        self,
        model: ir.Model,
        fixed_low: set[ir.Node],
        candidates: Sequence[ir.Node],
        low: ir.DataType,
        *,
        keep_io_types: bool,
        providers: Sequence[str] | None = None,
    ) -> None:
        self.candidates = list(candidates)
        self.low = low
        with timed() as clock:
            clone, result = self._rounded(model, fixed_low, keep_io_types)
            self.switches = result.switches
            self.fetch = result.fetch
            edges = result.rounded_edges
            self.nodes = sum(1 for _ in clone.graph.all_nodes())  # the emulation model's, its Casts included
            self._stack = contextlib.ExitStack()
            payload, folder = self._stack.enter_context(_ort.ort_model(clone))
            del clone, result
            self.session = _ort.create_session(
                payload,
                providers=providers,
                optimization="basic",
                external_data_folder=folder,
                what="the emulation model",
                spinning=False,  # many short runs: CPU seconds, not latency
            )
        self.runs = 0
        self.sessions = 1
        logger.info(
            "Emulation session: %d candidates, %d switches, %d rounded edges (%.1f s)",
            len(self.candidates),
            len(self.switches),
            edges,
            clock.seconds,
        )

    def _rounded(
        self, model: ir.Model, fixed_low: set[ir.Node], keep_io_types: bool
    ) -> tuple[ir.Model, EmulationResult]:
        """A clone of ``model`` with the rounding of ``fixed_low`` and a switched rounding of each candidate
        (:class:`EmulateRoundingPass`), and what the pass added."""
        clone = model.clone()
        twin = dict(zip(model.graph.all_nodes(), clone.graph.all_nodes()))  # a clone keeps the graph's order
        rounding = EmulateRoundingPass(
            {twin[node] for node in fixed_low if node in twin},
            [twin[node] for node in self.candidates],
            self.low,
            keep_io_types=keep_io_types,
        )
        result = rounding(clone)
        assert isinstance(result, EmulationResult)
        return clone, result

    def close(self) -> None:
        """Releases the session and the temporary files."""
        self.session = None  # type: ignore[assignment]
        self._stack.close()

    def feeds(self, low: Iterable[int]) -> dict[str, np.ndarray]:
        """The switch inputs of a configuration (candidate indices that are low)."""
        chosen = set(low)
        return {
            self.SWITCH.format(k): np.array(not drivers.isdisjoint(chosen)) for k, drivers in enumerate(self.switches)
        }

    def run(self, low: Iterable[int]) -> Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]:
        """A function running one batch in the configuration where the candidates ``low`` are low."""
        switches = self.feeds(low)
        fetch = list(self.fetch.values())

        def one(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            self.runs += 1
            results = self.session.run({**batch, **switches}, fetch)
            return dict(zip(self.fetch, results))

        return one


def _float_tensors(graph: ir.Graph) -> Iterable[ir.Value]:
    yield from (v for v in graph.inputs if v.dtype == _F and not v.is_initializer())
    yield from (v for v in graph.initializers.values() if v.dtype == _F)
    for node in graph:
        yield from (v for v in node.outputs if v.dtype == _F and v.name)


def _rounding(value: ir.Value, low: ir.DataType, names: NameAllocator, *, clamp: bool) -> list[ir.Node]:
    """``Cast(Cast(x, low), FLOAT)`` (clamped first for weights, as the converter clamps them)."""
    nodes = []
    source = value
    if clamp:
        limit = finite_max(low)
        bounds = []
        for suffix, bound in (("lo", -limit), ("hi", limit)):
            out = ir.Value(name=names(f"{value.name}__{suffix}"), type=ir.TensorType(_F))
            tensor = ir.tensor(np.float32(bound))
            nodes.append(ir.Node("", "Constant", [], attributes=[ir.AttrTensor("value", tensor)], outputs=[out]))
            bounds.append(out)
        source = ir.Value(name=names(f"{value.name}__clip"), type=ir.TensorType(_F))
        nodes.append(ir.Node("", "Clip", [value, *bounds], outputs=[source]))
    down = ir.Value(name=names(f"{value.name}__low"), type=ir.TensorType(low))
    up = ir.Value(name=names(f"{value.name}__round"), type=ir.TensorType(_F))
    nodes += [
        ir.Node("", "Cast", [source], attributes=[ir.AttrInt64("to", low)], outputs=[down]),
        ir.Node("", "Cast", [down], attributes=[ir.AttrInt64("to", _F)], outputs=[up]),
    ]
    return nodes
