"""FP64 -> FP32 everywhere inside the graph, keeping FP64 graph inputs and outputs (with boundary casts)."""

from __future__ import annotations

import logging

import onnx_ir as ir

from onnxprec._graph import TYPE_ATTRIBUTES, NameAllocator, all_graphs, make_cast
from onnxprec._tensors import converted_tensor

__all__ = ["ConvertFp64ToFp32Pass"]

logger = logging.getLogger(__name__)

_D = ir.DataType.DOUBLE
_F = ir.DataType.FLOAT


class ConvertFp64ToFp32Pass(ir.passes.InPlacePass):
    """Retypes DOUBLE tensors, initializers, Cast targets and dtype attributes to FLOAT.

    FP64 graph inputs and outputs of the main graph keep their type (the model's I/O contract): a Cast to
    FP32 follows each such input and a Cast back to FP64 produces each such output.
    """

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        names = NameAllocator(model)
        count = 0
        main = model.graph
        io_values = {*main.inputs, *main.outputs}
        for graph in all_graphs(main):
            for init in list(graph.initializers.values()):
                if init.dtype == _D and init.const_value is not None and init not in io_values:
                    init.const_value = converted_tensor(init.const_value, _F)
                    init.dtype = _F
                    count += 1
            for node in graph:
                count += self._retype_node(node, io_values)
        # Boundary casts for FP64 inputs/outputs of the main graph.
        for inp in main.inputs:
            if inp.dtype == _D and inp.uses():
                uses = list(inp.uses())
                cast = make_cast(inp, _F, names)
                for use in uses:
                    use.node.replace_input_with(use.idx, cast.outputs[0])
                main.insert_before(next(iter(main)), cast)
                count += 1
        for i, out in enumerate(main.outputs):
            if out.dtype == _D and not out.is_graph_input() and out.producer() is not None:
                out.dtype = _F
                producer = out.producer()
                assert producer is not None
                cast = make_cast(out, _D, names)
                final_name = out.name
                out.name = names(f"{final_name}_fp32")
                cast.outputs[0].name = final_name
                main.insert_after(producer, cast)
                main.outputs[i] = cast.outputs[0]
                count += 1
        if count:
            logger.info("Converted %d FP64 tensors/attributes to FP32", count)
        return ir.passes.PassResult(model, modified=bool(count))

    def _retype_node(self, node: ir.Node, io_values: set[ir.Value]) -> int:
        count = 0
        attr_name = TYPE_ATTRIBUTES.get(node.op_type) if node.domain in ("", "ai.onnx") else None
        if attr_name and attr_name in node.attributes and node.attributes[attr_name].as_int() == _D:
            node.attributes[attr_name] = ir.AttrInt64(attr_name, _F)
            count += 1
        if node.op_type in ("ConstantOfShape", "Constant") and "value" in node.attributes:
            tensor = node.attributes["value"].as_tensor()
            if tensor.dtype == _D:
                node.attributes["value"] = ir.AttrTensor("value", ir.Tensor(tensor.numpy().astype("float32")))
                count += 1
        for out in node.outputs:
            if out.dtype == _D and out not in io_values:
                out.dtype = _F
                count += 1
        return count
