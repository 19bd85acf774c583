"""run_passes: the passes' results in order; a user error raised in a pass surfaces as itself, anything else as a
PassError naming the pass and those before it."""

from __future__ import annotations

import onnx_ir as ir
import pytest

from onnxprec.errors import InvalidArgumentError
from onnxprec.passes import NameNodesPass, run_passes, user_error


class _Failing(ir.passes.InPlacePass):
    def __init__(self, error: Exception) -> None:
        super().__init__()
        self.error = error

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        raise self.error


def _model() -> ir.Model:
    x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([2]))
    node = ir.node("Relu", [x])
    return ir.Model(ir.Graph([x], node.outputs, nodes=[node], opset_imports={"": 21}), ir_version=10)


def test_results_come_in_order_and_a_user_error_surfaces_as_itself() -> None:
    model = _model()
    results = run_passes(model, NameNodesPass(), ir.passes.common.TopologicalSortPass())
    assert len(results) == 2 and all(r.model is model for r in results)
    wrong = InvalidArgumentError("--opset 99 is out of range: use 7..23.")
    with pytest.raises(InvalidArgumentError, match="--opset 99 is out of range") as raised:
        run_passes(model, NameNodesPass(), _Failing(wrong))
    assert raised.value is wrong


def test_another_failure_names_the_pass_and_those_before_it() -> None:
    with pytest.raises(ir.passes.PassError, match=r"_Failing.*after the passes \['NameNodesPass'\]") as raised:
        run_passes(_model(), NameNodesPass(), _Failing(ValueError("bug")))
    assert user_error(raised.value) is None
