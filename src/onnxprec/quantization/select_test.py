"""Layer selection: which MatMul/Gemm weights qualify, exclusion patterns, tied weights, input groups."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnx import TensorProto, helper

from onnxprec._options import compile_patterns
from onnxprec._testing import F, make_model, tensor_info
from onnxprec.quantization._testing import mlp
from onnxprec.quantization.select import select_layers


def _ir(proto):  # type: ignore[no-untyped-def]
    return ir.serde.deserialize_model(proto)


def test_mlp_selection_groups_and_exclusion() -> None:
    selection = select_layers(_ir(mlp()), exclude=compile_patterns([".*/lm_head"], "nodes_to_exclude"))
    assert [t.name for t in selection.targets] == ["Wq", "Wk", "Wo"]
    assert selection.excluded == [("/model/lm_head/MatMul", ".*/lm_head")]
    groups = selection.groups()
    assert [[layer.name for layer in g.layers] for g in groups] == [
        ["/model/layers.0/q_proj/MatMul", "/model/layers.0/k_proj/MatMul"],
        ["/model/layers.0/o_proj/MatMul"],
    ]
    assert [g.k for g in groups] == [64, 96]


def test_patterns_match_node_output_and_weight_names_from_their_start() -> None:
    model = _ir(mlp())
    for pattern in (".*lm_head", "/model/lm_head", "^/model/lm_head", "logits$", "Whead$"):
        selection = select_layers(model, exclude=compile_patterns([pattern], "x"))
        assert [t.name for t in selection.targets] == ["Wq", "Wk", "Wo"], pattern
    for pattern in ("lm_head", "^lm_head", "head"):  # re.match, as ModelOpt: these matched under the old re.search
        selection = select_layers(model, exclude=compile_patterns([pattern], "x"))
        assert len(selection.targets) == 4, pattern


def test_eight_bit_wins_over_exclusion() -> None:
    selection = select_layers(
        _ir(mlp()), exclude=compile_patterns([".*/lm_head"], "x"), eight_bit=compile_patterns([".*lm_head"], "y")
    )
    assert {t.name: t.bits for t in selection.targets} == {"Wq": 4, "Wk": 4, "Wo": 4, "Whead": 8}
    assert selection.excluded == []


def test_skipped_layers_say_why() -> None:
    nodes = [
        helper.make_node("MatMul", ["X", "Wd"], ["a"], name="double"),
        helper.make_node("MatMul", ["X", "Xw"], ["b"], name="dynamic"),
        helper.make_node("MatMul", ["C", "W"], ["c"], name="constant"),
        helper.make_node("Gemm", ["X", "W"], ["d"], name="transa", transA=1),
        helper.make_node("MatMul", ["X", "W3"], ["e"], name="rank3"),
        helper.make_node("Gather", ["W", "I"], ["g"], name="gather"),
        helper.make_node("MatMul", ["X", "W"], ["f"], name="tied_with_gather"),
    ]
    model = make_model(
        nodes,
        [tensor_info("X", F, [4, 4]), tensor_info("Xw", F, [4, 4]), tensor_info("I", TensorProto.INT64, [2])],
        [tensor_info(n, F, None) for n in "abcdefg"],
        {
            "Wd": np.ones((4, 4), np.float64),
            "C": np.ones((4, 4), np.float32),
            "W": np.ones((4, 4), np.float32),
            "W3": np.ones((1, 4, 4), np.float32),
        },
    )
    selection = select_layers(_ir(model))
    reasons = dict(selection.skipped)
    assert "DOUBLE" in reasons["double"]
    assert "not an initializer" in reasons["dynamic"]
    assert "constant MatMul" in reasons["constant"]
    assert "transA" in reasons["transa"]
    assert "rank 3" in reasons["rank3"]
    assert "Gather 'gather'" in reasons["tied_with_gather"]  # quantizing would duplicate the weight
    assert selection.targets == []


def test_tied_weight_and_gemm_trans_b() -> None:
    w = np.ones((8, 4), np.float32)
    nodes = [
        helper.make_node("Gemm", ["X", "W"], ["a"], name="g1", transB=1),
        helper.make_node("Gemm", ["a2", "W"], ["b"], name="g2", transB=1),
        helper.make_node("Relu", ["a"], ["a2"], name="relu"),
    ]
    model = make_model(nodes, [tensor_info("X", F, [2, 4])], [tensor_info("b", F, [2, 8])], {"W": w})
    (target,) = select_layers(_ir(model)).targets
    assert (target.k, target.n, target.transposed, len(target.layers)) == (4, 8, True, 2)
    # a weight read both as [K, N] and transposed cannot be replaced once
    nodes[1] = helper.make_node("MatMul", ["a2", "Wsq"], ["b"], name="g2")
    nodes.append(helper.make_node("Gemm", ["X", "Wsq"], ["c"], name="g3", transB=1))
    model = make_model(nodes, [tensor_info("X", F, [2, 4])], [tensor_info("b", F, None), tensor_info("c", F, None)],
                       {"W": np.ones((4, 4), np.float32), "Wsq": np.ones((4, 4), np.float32)})  # fmt: skip
    selection = select_layers(_ir(model))
    assert [t.name for t in selection.targets] == ["W"]
    assert "transposed" in dict(selection.skipped)["g3"]
