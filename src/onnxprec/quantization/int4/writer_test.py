"""Without data, a large LLM writes its calibration text through an INT4 copy of itself, never changing the model."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

from onnxprec._testing import tiny_decoder
from onnxprec.quantization.generated import generated_token_windows
from onnxprec.quantization.int4 import _api
from onnxprec.quantization.int4._options import Int4Options


def _initializers(model: ir.Model) -> dict[str, np.ndarray]:
    return {name: v.const_value.numpy().copy() for name, v in model.graph.initializers.items() if v.const_value}


def test_a_model_below_the_bound_writes_with_its_own_weights() -> None:
    model = ir.serde.deserialize_model(tiny_decoder(vocab=64))
    assert _api._text_writer(model, Int4Options()) is None


def test_a_large_model_writes_through_an_int4_copy_and_stays_as_it_was(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_api, "WRITER_FLOAT_BYTES", 0)
    model = ir.serde.deserialize_model(tiny_decoder(vocab=64))
    before = _initializers(model)
    nodes = [(n.op_type, n.name) for n in model.graph]
    writer = _api._text_writer(model, Int4Options())
    assert writer is not None
    ops = [n.op_type for n in writer.graph]
    assert "MatMul" not in ops and ops.count("MatMulNBits") == sum(op == "MatMul" for op, _ in nodes)
    assert "GatherBlockQuantized" in ops  # the embedding too, as the LLM defaults write it
    for node in writer.graph:  # every weight at 4 bits in blocks of WRITER_BLOCK_SIZE, the head included
        if node.op_type in ("MatMulNBits", "GatherBlockQuantized"):
            assert node.attributes.get_int("bits", 4) == 4
            assert node.attributes.get_int("block_size") == _api.WRITER_BLOCK_SIZE
    assert [v.name for v in writer.graph.outputs] == [v.name for v in model.graph.outputs]  # the KV cache's presents
    # the model itself is unchanged: same nodes, same weights
    assert [(n.op_type, n.name) for n in model.graph] == nodes
    after = _initializers(model)
    assert before.keys() == after.keys() and all(np.array_equal(before[k], after[k]) for k in before)
    ids = generated_token_windows(model, windows=2, length=12, writer=writer)
    assert ids.shape == (2, 12) and ids.min() >= 0 and ids.max() < 64
    np.testing.assert_array_equal(ids, generated_token_windows(model, windows=2, length=12, writer=writer))
