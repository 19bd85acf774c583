"""decide's attention match: the context's V found through the heads, and nothing that another node reads."""

from __future__ import annotations

import onnx
import onnx_ir as ir
import pytest

from onnxprec.quantization.int8 import decide
from onnxprec.quantization.int8.api_test import _attention


@pytest.mark.parametrize("also_read", [None, "va", "vt", "mixed", "back"])
def test_attention_values_are_v_unless_a_value_on_the_way_has_another_reader(also_read: str | None) -> None:
    proto = _attention()
    if also_read is not None:
        proto.graph.node.append(onnx.helper.make_node("Identity", [also_read], ["extra"]))
        proto.graph.output.append(onnx.helper.make_tensor_value_info("extra", onnx.TensorProto.FLOAT, None))
    model = ir.serde.deserialize_model(proto)
    ir.passes.common.ShapeInferencePass()(model)
    context = next(node for node in model.graph if node.name == "/attn/merge").outputs[0]
    values = decide._attention_values(context, 64)
    assert (values.name if values is not None else None) == ("va" if also_read is None else None)
    assert decide._attention_values(context, 60) is None  # 60 is no multiple of the head size 16
