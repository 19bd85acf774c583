"""The emulation session of AutoCast's accuracy-target search: every configuration is a set of boolean inputs.

:class:`Emulator` builds, once, the FP32 model in which every tensor edge that a candidate node can make low goes
through the low type (``Cast`` to low and back) behind a boolean input, exactly where the converter rounds; trying
a configuration is then one ``session.run`` per batch, never a build or a session (:mod:`onnxprec.autocast.target`
runs the search).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Sequence

import numpy as np
import onnx
import onnx_ir as ir

from onnxprec import _ort
from onnxprec._graph import unique_name
from onnxprec._tensors import finite_max

__all__ = ["Emulator", "float_values"]

logger = logging.getLogger(__name__)

_F = ir.DataType.FLOAT


def float_values(node: ir.Node) -> list[ir.Value]:
    """The FP32 inputs and outputs of a node (what the emulation rounds, what a candidate must have)."""
    return [v for v in (*node.inputs, *node.outputs) if v is not None and v.dtype == _F]


class Emulator:
    """The FP32 model with switchable rounding through the low type; one ORT session for every configuration.

    A tensor edge (tensor ``t`` read by node ``c``) is rounded when the producer of ``t`` is low or ``c`` is
    low, as the converter does it (a low node writes the low type; a low node reads a cast of an FP32 tensor).
    Initializers are rounded for their low readers only (the converter gives them a low copy), clamped to the
    finite range as the converter clamps. Edges decided by fixed nodes are rounded unconditionally; the others
    go through ``Where(switch, rounded, exact)``, with one boolean input per distinct set of candidates that
    decides it.

    Args:
        model: The FP32 model after sanitizing (unchanged).
        fixed_low: Main-graph nodes that are low whatever the search does.
        candidates: The nodes the search may make low or FP32.
        low: FLOAT16 or BFLOAT16.
        keep_io_types: Whether FP32 graph inputs and outputs stay FP32.
        providers: ONNX Runtime providers.
    """

    SWITCH = "__onnxprec_low_{}"

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
        tick = time.perf_counter()
        self.candidates = list(candidates)
        self.low = low
        self._stack = contextlib.ExitStack()
        payload, folder = self._stack.enter_context(_ort.ort_model(model))
        proto = _ort.model_proto(payload)
        graph = model.graph
        nodes = list(graph)
        if len(nodes) != len(proto.graph.node):
            raise AssertionError("the serialized graph does not match the model")
        index = {node: i for i, node in enumerate(nodes)}
        candidate = {node: i for i, node in enumerate(self.candidates)}

        def state(node: ir.Node | None) -> str | int:
            if node is None or node.graph is not graph:
                return "high"
            if node in candidate:
                return candidate[node]
            return "low" if node in fixed_low else "high"

        used = _names(proto)
        self.switches: list[frozenset[int]] = []
        switch_of: dict[frozenset[int], str] = {}
        first: list[onnx.NodeProto] = []
        after: dict[int, list[onnx.NodeProto]] = {}
        self.fetch: dict[str, str] = {str(v.name): str(v.name) for v in graph.outputs}
        rounded_edges = 0
        for value in _float_tensors(graph):
            producer = value.producer()
            if value.is_initializer():
                p_state: str | int = "high"  # the converter copies an initializer for its low readers
            elif producer is None:
                p_state = "high" if keep_io_types else "low"
            else:
                p_state = state(producer)
            groups: dict[frozenset[int] | None, list[tuple[int, int]]] = {}
            readers = [(index[u.node], u.idx, state(u.node)) for u in value.uses() if u.node.graph is graph]
            if value.is_graph_output():
                position = next(i for i, v in enumerate(graph.outputs) if v is value)
                readers.append((-1, position, "high" if keep_io_types else "low"))
            for node_index, slot, c_state in readers:
                if "low" in (p_state, c_state):
                    drivers: frozenset[int] | None = None
                else:
                    drivers = frozenset(s for s in (p_state, c_state) if isinstance(s, int))
                    if not drivers:
                        continue
                groups.setdefault(drivers, []).append((node_index, slot))
            if not groups:
                continue
            name = str(value.name)
            new = _rounding(name, low, used, clamp=value.is_initializer())
            where = first if producer is None or producer.graph is not graph else after.setdefault(index[producer], [])
            where += new
            exact_rounded = new[-1].output[0]
            for drivers, uses in groups.items():
                out = exact_rounded
                if drivers is not None:
                    switch = switch_of.get(drivers)
                    if switch is None:
                        switch = switch_of[drivers] = self.SWITCH.format(len(self.switches))
                        self.switches.append(drivers)
                    out = unique_name(f"{name}__emu", used)
                    where.append(onnx.helper.make_node("Where", [switch, exact_rounded, name], [out]))
                for node_index, slot in uses:
                    if node_index < 0:
                        self.fetch[str(graph.outputs[slot].name)] = out
                    else:
                        proto.graph.node[node_index].input[slot] = out
                rounded_edges += len(uses)
        ordered = list(first)
        for i, node_proto in enumerate(proto.graph.node):
            ordered.append(node_proto)
            ordered += after.get(i, ())
        proto.graph.ClearField("node")
        proto.graph.node.extend(ordered)
        for switch in switch_of.values():
            proto.graph.input.append(onnx.helper.make_tensor_value_info(switch, onnx.TensorProto.BOOL, []))
        for name, fetched in self.fetch.items():
            if fetched != name:
                proto.graph.output.append(onnx.helper.make_tensor_value_info(fetched, onnx.TensorProto.FLOAT, None))
        self._proto = proto
        self._folder = folder
        self._payload = payload
        self._providers = providers
        self.session = self._session(proto)
        self.runs = 0
        self.sessions = 1
        logger.info(
            "Emulation session: %d candidates, %d switches, %d rounded edges (%.1f s)",
            len(self.candidates),
            len(self.switches),
            rounded_edges,
            time.perf_counter() - tick,
        )

    def _session(self, proto: onnx.ModelProto) -> _ort.Session:
        if isinstance(self._payload, bytes):
            source: bytes | str = proto.SerializeToString()
        else:  # a temporary model whose weights are in its external data file: rewrite only the small .onnx
            onnx.save(proto, self._payload)
            source = self._payload
        return _ort.create_session(
            source,
            providers=self._providers,
            optimization="basic",
            external_data_folder=self._folder,
            what="the emulation model",
        )

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


def _names(proto: onnx.ModelProto) -> set[str]:
    used = {v.name for v in (*proto.graph.input, *proto.graph.output, *proto.graph.initializer)}
    used.update(out for node in proto.graph.node for out in node.output)
    return used


def _float_tensors(graph: ir.Graph) -> Iterable[ir.Value]:
    yield from (v for v in graph.inputs if v.dtype == _F and not v.is_initializer())
    yield from (v for v in graph.initializers.values() if v.dtype == _F)
    for node in graph:
        yield from (v for v in node.outputs if v.dtype == _F and v.name)


def _rounding(name: str, low: ir.DataType, used: set[str], *, clamp: bool) -> list[onnx.NodeProto]:
    """``Cast(Cast(x, low), FLOAT)`` (clamped first for weights, as the converter clamps them)."""
    nodes = []
    source = name
    if clamp:
        limit = finite_max(low)
        lo, hi, clipped = (
            unique_name(f"{name}__lo", used),
            unique_name(f"{name}__hi", used),
            unique_name(f"{name}__clip", used),
        )
        nodes += [
            onnx.helper.make_node("Constant", [], [lo], value=onnx.numpy_helper.from_array(np.float32(-limit))),
            onnx.helper.make_node("Constant", [], [hi], value=onnx.numpy_helper.from_array(np.float32(limit))),
            onnx.helper.make_node("Clip", [name, lo, hi], [clipped]),
        ]
        source = clipped
    down, up = unique_name(f"{name}__low", used), unique_name(f"{name}__round", used)
    nodes += [
        onnx.helper.make_node("Cast", [source], [down], to=int(low)),
        onnx.helper.make_node("Cast", [down], [up], to=onnx.TensorProto.FLOAT),
    ]
    return nodes
