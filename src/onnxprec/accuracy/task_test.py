"""Task metrics that follow the output: the rules on shapes and producers, the producers found in real graphs (past
reshapes and casts), the metrics on known agreements, and the real EfficientNet-Lite0 and MiniLM outputs."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper

from onnxprec._ort import create_session
from onnxprec._testing import F, make_model, shared_path, tensor_info
from onnxprec.accuracy import (
    OutputKind,
    Producer,
    TaskMetrics,
    kind_of,
    output_producers,
    task_metrics,
)


@pytest.mark.parametrize(
    ("name", "shape", "producer", "kind", "axis"),
    [
        ("logits", [7, 1000], Producer("Gemm"), "classes", 1),
        ("output", [7, 1000], Producer("MatMul"), "classes", 1),  # logits, whatever their name
        ("probs", [4, 10], Producer("Softmax", 1), "classes", 1),
        ("y", [4, 2], Producer("Gemm"), "classes", 1),
        ("y", [4, 1], Producer("Gemm"), "values", None),  # a [N, 1] output is not called top-1
        ("p", [4, 1], Producer("Sigmoid"), "binary", None),
        ("p", [4, 2], Producer("Sigmoid"), "binary", None),
        ("maps", [1, 1, 64, 64], Producer("Sigmoid"), "mask", None),
        ("ctc", [2, 40, 97], Producer("Softmax", -1), "sequence", 2),
        ("logits", [2, 16, 500], Producer("MatMul"), "sequence", 2),  # an LM's logits
        ("last_hidden_state", [8, 14, 384], Producer("MatMul"), "values", None),
        ("last_hidden_state", [8, 14, 384], Producer("LayerNormalization"), "values", None),
        ("text_embeds", [4, 512], Producer("MatMul"), "values", None),
        ("boxes", [4, 4], Producer("Gemm"), "values", None),
        ("x", [4, 10], Producer("Relu"), "values", None),
        ("seg", [1, 21, 32, 32], Producer("Softmax", 1), "positions", 1),
        ("probs", [4, 1], Producer("Softmax", 1), "values", None),  # one class: nothing to agree on
    ],
)
def test_the_metric_follows_the_output(
    name: str, shape: list[int], producer: Producer, kind: str, axis: int | None
) -> None:
    got = kind_of(name, shape, True, producer)
    assert (got.kind, got.axis) == (kind, axis)


def test_integer_outputs_are_labels() -> None:
    assert kind_of("label", [4], False, Producer("ArgMax")).metric == "label_agreement"


def _ir(model: onnx.ModelProto) -> ir.Model:
    return ir.serde.deserialize_model(model)


def test_producers_are_found_past_casts_and_reshapes() -> None:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 5)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["mm"]),
        helper.make_node("Add", ["mm", "b"], ["logits"]),
        helper.make_node("Reshape", ["x", "shape3"], ["x3"]),  # [2, 2, 8]
        helper.make_node("Softmax", ["x3"], ["sm"], axis=-1),
        helper.make_node("Flatten", ["sm"], ["flat"], axis=2),
        helper.make_node("Reshape", ["flat", "shape3"], ["seq"]),
        helper.make_node("Reshape", ["x", "shape4"], ["x4"]),  # [4, 8, 1, 1]
        helper.make_node("Softmax", ["x4"], ["sm4"], axis=1),
        helper.make_node("Flatten", ["sm4"], ["probs"]),
        helper.make_node("Reshape", ["x", "shape_map"], ["xm"]),  # [1, 2, 4, 4]
        helper.make_node("Softmax", ["xm"], ["seg"], axis=1),
        helper.make_node("Sigmoid", ["x"], ["sig"]),
        helper.make_node("Cast", ["sig"], ["p"], to=TensorProto.FLOAT),
        helper.make_node("Relu", ["x"], ["features"]),
    ]
    inits: dict[str, np.ndarray] = {
        "w": w,
        "b": np.zeros(5, np.float32),
        "shape3": np.array([2, 2, 8], np.int64),
        "shape4": np.array([4, 8, 1, 1], np.int64),
        "shape_map": np.array([1, 2, 4, 4], np.int64),
    }
    outputs = ["logits", "seq", "probs", "seg", "p", "features"]
    model = make_model(nodes, [tensor_info("x", F, [4, 8])], [tensor_info(n, F, None) for n in outputs], inits)
    model = onnx.shape_inference.infer_shapes(model)
    producers = output_producers(_ir(model))
    assert producers == {
        "logits": Producer("MatMul"),
        "seq": Producer("Softmax", -1),
        "probs": Producer("Softmax", -1),  # its trailing axes are ones: the class axis is the last after Flatten
        "seg": Producer("Softmax", 1),
        "p": Producer("Sigmoid"),
        "features": Producer("Relu"),
    }
    x = rng.standard_normal((4, 8)).astype(np.float32)
    session = create_session(model)
    reference = dict(zip(session.output_names, session.run({"x": x})))
    summary = task_metrics(_ir(model), [reference], [reference])
    kinds = {o.name: o.kind for o in summary.outputs}
    assert kinds == {"logits": "classes", "seq": "sequence", "probs": "classes", "seg": "positions", "p": "binary",
                     "features": "values"}  # fmt: skip
    assert all(o.value == pytest.approx(1.0) for o in summary.outputs)


def test_an_old_opset_softmax_over_flattened_axes_is_values() -> None:
    nodes = [helper.make_node("Softmax", ["x"], ["y"], axis=1)]  # opset 11: over [T * C] flattened
    model = make_model(nodes, [tensor_info("x", F, [2, 3, 4])], [tensor_info("y", F, [2, 3, 4])], opset=11)
    assert output_producers(_ir(model)) == {"y": Producer("Softmax", None)}
    assert kind_of("y", [2, 3, 4], True, Producer("Softmax", None)).kind == "values"


def test_agreements_are_counted_per_row_step_and_pixel() -> None:
    metrics = TaskMetrics(
        {"logits": Producer("Gemm"), "ctc": Producer("Softmax", -1), "map": Producer("Sigmoid"), "ids": None}
    )
    logits = np.eye(4, 6, dtype=np.float32)
    flipped = logits.copy()
    flipped[0] = np.roll(flipped[0], 1)  # one row of four disagrees
    ctc = np.zeros((2, 5, 3), np.float32)
    ctc[..., 0] = 1
    ctc_bad = ctc.copy()
    ctc_bad[1, :2] = [0, 1, 0]  # two steps of ten
    mask = np.zeros((1, 1, 4, 4), np.float32)
    mask[..., :2, :2] = 0.9  # 4 pixels
    mask_bad = mask.copy()
    mask_bad[..., 0, 2] = 0.8  # a fifth: IoU 4/5
    ids = np.array([1, 2, 3], np.int64)
    for _ in range(2):  # two batches: the counts add up
        metrics.update({"logits": logits, "ctc": ctc, "map": mask, "ids": ids},
                       {"logits": flipped, "ctc": ctc_bad, "map": mask_bad, "ids": np.array([1, 2, 0])})  # fmt: skip
    summary = metrics.summary()
    by_name = {o.name: o for o in summary.outputs}
    assert (by_name["logits"].value, by_name["logits"].count) == (0.75, 8)
    assert (by_name["ctc"].value, by_name["ctc"].count) == (0.8, 20)
    assert by_name["map"].value == pytest.approx(0.8) and by_name["map"].kind == "mask"
    assert by_name["ids"].value == pytest.approx(2 / 3) and by_name["ids"].rel_l2 is None
    line = summary.describe()
    assert line.startswith("ids label agreement 66.7% of 6 labels; logits top-1 agreement 75.0% of 8 rows; ")
    assert "1 more" in line and "float outputs rel L2 <= " in line
    data = json.loads(json.dumps(summary.to_json()))
    assert data["outputs"]["ctc"] == {
        "kind": "sequence", "metric": "step_agreement", "value": 0.8, "count": 20,
        "rel_l2": pytest.approx(by_name["ctc"].rel_l2), "cosine": pytest.approx(by_name["ctc"].cosine),
        "why": "Softmax over axis 2 of [2, 5, 3]",
    }  # fmt: skip
    assert data["worst_rel_l2"] == pytest.approx(summary.worst_rel_l2)


def test_string_labels_agree_and_maps_are_skipped() -> None:
    metrics = TaskMetrics({})
    labels = np.array(["cat", "dog", "cat"])
    maps = np.array([{"cat": 0.9, "dog": 0.1}] * 3, dtype=object)
    other = np.array(["cat", "dog", "dog"])
    metrics.update({"label": labels, "probabilities": maps, "score": np.float32(2.0)},
                   {"label": other, "probabilities": maps, "score": np.float32(2.0)})  # fmt: skip
    summary = metrics.summary()
    assert [(o.name, o.kind) for o in summary.outputs] == [("label", "labels"), ("score", "values")]
    assert summary.outputs[0].value == pytest.approx(2 / 3)
    assert summary.describe() == "label label agreement 66.7% of 3 labels; float outputs rel L2 <= 0, cosine >= 1"


def test_a_cosine_near_one_is_shown_as_its_distance_from_one() -> None:
    metrics = TaskMetrics({"h": Producer("LayerNormalization")})
    h = np.linspace(1, 2, 100, dtype=np.float32).reshape(1, 10, 10)
    metrics.update({"h": h}, {"h": h + np.float32(1e-4) * np.sin(np.arange(100, dtype=np.float32)).reshape(h.shape)})
    summary = metrics.summary()
    assert summary.outputs[0].describe().startswith("h cosine 1 - ")
    assert "cosine >= 1 - " in summary.describe() and summary.worst_cosine is not None and summary.worst_cosine < 1


def test_a_softmax_of_unknown_rank_keeps_its_last_axis_past_a_reshape() -> None:
    nodes = [
        helper.make_node("Softmax", ["x"], ["sm"], axis=-1),
        helper.make_node("Reshape", ["sm", "shape"], ["y"]),
    ]
    inits = {"shape": np.array([2, 3, 4], np.int64)}
    model = make_model(nodes, [tensor_info("x", F, None)], [tensor_info("y", F, None)], inits)
    assert output_producers(_ir(model)) == {"y": Producer("Softmax", -1)}
    assert kind_of("y", [2, 3, 4], True, Producer("Softmax", -1)).kind == "sequence"


def test_a_mask_both_models_leave_empty_agrees() -> None:
    metrics = TaskMetrics({"map": Producer("Sigmoid")})
    empty = np.zeros((1, 1, 4, 4), np.float32)
    metrics.update({"map": empty}, {"map": empty + 0.1})
    assert metrics.summary().outputs[0].value == 1.0


@pytest.mark.parametrize(
    ("model_file", "data_file", "expected"),
    [
        ("efficientnet_lite0.onnx", "efficientnet_lite0_input.npy", {"logits": OutputKind("classes", "top1", 1)}),
        ("minilm_l6_v2_bert.onnx", "minilm_l6_v2_bert_inputs.npz", None),
    ],
)
def test_real_models(model_file: str, data_file: str, expected: dict[str, OutputKind] | None) -> None:
    path, data_path = shared_path("models", model_file), shared_path("models", data_file)
    if path is None or data_path is None:
        pytest.skip(f"../shared/models/{model_file} is absent")
    model = onnx.load(path)
    session = create_session(model)
    if data_path.suffix == ".npy":
        feeds = {next(iter(session.input_types)): np.load(data_path)[:2]}
    else:
        feeds = dict(np.load(data_path))
    reference = dict(zip(session.output_names, session.run(feeds)))
    rng = np.random.default_rng(0)
    noisy = {k: v + rng.standard_normal(v.shape).astype(v.dtype) * 1e-3 * np.abs(v).max() for k, v in reference.items()}
    metrics = TaskMetrics.of(_ir(model))
    metrics.update(reference, noisy)
    summary = metrics.summary()
    kinds = {o.name: o.kind for o in summary.outputs}
    if expected is not None:  # EfficientNet's Gemm logits: top-1, and 1e-3 of noise moves no argmax of 2 photos
        assert kinds == {name: k.kind for name, k in expected.items()}
        assert summary.outputs[0].value == 1.0 and summary.outputs[0].count == 2
        assert summary.describe().startswith("logits top-1 agreement 100.0% of 2 rows")
    else:  # MiniLM's [N, T, 384] hidden states (LayerNormalization) are no class scores
        assert set(kinds.values()) == {"values"}
        assert summary.describe().startswith("float outputs rel L2 <= ")
    assert summary.worst_cosine is not None and summary.worst_cosine > 0.999
