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
    batch_size,
    ctc_strings,
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
        ("maps", [1, 1, 64, 64], Producer("Sigmoid"), "regions", None),  # a text detector's probability map
        ("confidences", [1, 300, 10], Producer("Sigmoid"), "mask", None),
        ("output", [4, 1, 97, 32], Producer("Clip", logged=True), "signal", None),  # a log-mel spectrogram
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
    mask = np.zeros((1, 4, 4), np.float32)  # rank 3: a mask (rank 4 is a map of regions)
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
    # 1 string of 2 per batch changed; the margins predict less: 4 of 20 steps moved by -2, each step's margin is 1
    assert (by_name["ctc"].value, by_name["ctc"].observed, by_name["ctc"].count) == (pytest.approx(0.8**5), 0.5, 4)
    assert by_name["map"].value == pytest.approx(0.8) and by_name["map"].kind == "mask"
    assert by_name["ids"].value == pytest.approx(2 / 3) and by_name["ids"].rel_l2 is None
    line = summary.describe()
    assert line.startswith(
        "ctc identical strings 32.8% of 4 sequences predicted from step margins (50.0% seen) (every FP32 string "
        "empty: nothing read); "
        "ids label agreement 66.7% of 6 labels; logits top-1 agreement 75.0% of 8 rows; "
    )
    assert "1 more" in line and "float outputs rel L2 <= " in line
    data = json.loads(json.dumps(summary.to_json()))
    assert data["outputs"]["ctc"] == {
        "kind": "sequence", "metric": "string_agreement", "value": pytest.approx(0.8**5), "count": 4, "observed": 0.5,
        "empty": True,
        "rel_l2": pytest.approx(by_name["ctc"].rel_l2), "cosine": pytest.approx(by_name["ctc"].cosine),
        "why": "Softmax over axis 2 of [2, 5, 3]; [N, T, C], blank 0",
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


@pytest.mark.slow
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


def _ctc_scores(strings: list[list[int]], steps: int, classes: int, rng: np.random.Generator) -> np.ndarray:
    """Raw ``[N, T, C]`` scores whose argmax spells each string with blanks (class 0) between its letters."""
    scores = rng.standard_normal((len(strings), steps, classes)).astype(np.float32)
    for n, string in enumerate(strings):
        best = [0] * steps
        for i, letter in enumerate(string):
            best[2 * i + 1] = letter
        scores[n, np.arange(steps), best] += 8.0
    return scores


def test_raw_ctc_scores_in_either_layout_are_judged_by_decoded_strings() -> None:
    rng = np.random.default_rng(0)
    ntc = _ctc_scores([[3, 4], [5], [6, 6, 7], [2]], steps=8, classes=10, rng=rng)
    tnc = np.ascontiguousarray(ntc.transpose(1, 0, 2))  # [T=8, N=4, C]: a CRNN's layout (ddddocr)
    for scores, batch, time in ((ntc, 4, 1), (tnc, 4, 0)):
        got = kind_of("387", scores.shape, True, Producer("Gemm"), scores, batch)
        assert (got.kind, got.metric, got.time, got.blank) == ("sequence", "string_agreement", time, 0)
        assert ctc_strings(scores, time, 0) == [(3, 4), (5,), (6, 6, 7), (2,)]
    bad = ntc.copy()
    bad[2, 3, 0] += 20  # the blank between the two 6s turns into a 6: "667" decodes as "67"; one step of 32
    metrics = TaskMetrics({"387": Producer("Gemm")})
    metrics.update({"387": tnc}, {"387": np.ascontiguousarray(bad.transpose(1, 0, 2))}, batch_size({"x": ntc}))
    out = metrics.summary().outputs[0]
    assert (out.value, out.count) == (0.75, 4) and out.describe() == "387 identical strings 75.0% of 4 sequences"


def test_raw_rank3_scores_without_a_blank_are_no_ctc_sequence() -> None:
    rng = np.random.default_rng(0)
    hidden = rng.standard_normal((2, 16, 384)).astype(np.float32)  # no class is the argmax of 30 % of the steps
    assert kind_of("out", hidden.shape, True, Producer("MatMul"), hidden, 2).kind == "values"
    lm = rng.standard_normal((2, 16, 32000)).astype(np.float32)
    lm[..., 7] += 10  # an LM vocabulary is no CTC alphabet, even with a frequent token
    assert kind_of("logits", lm.shape, True, Producer("MatMul"), lm, 2).metric == "step_agreement"


def test_an_old_opset_softmax_of_unknown_rank_is_judged_on_the_runtime_shape() -> None:
    """PP-OCRv4's recognizer (opset 12, no value_info): Softmax(axis=2) of a [N, T, C] whose rank the graph omits."""
    nodes = [helper.make_node("Softmax", ["x"], ["y"], axis=2)]
    model = make_model(nodes, [tensor_info("x", F, None)], [tensor_info("y", F, None)], opset=12)
    producer = output_producers(_ir(model))["y"]
    assert producer == Producer("Softmax", 2, flattens=True)
    assert kind_of("y", [8, 40, 97], True, producer).metric == "string_agreement"
    assert kind_of("y", [2, 3, 4, 5], True, producer).kind == "values"  # over [4 * 5] flattened: no class axis
    assert kind_of("y", [2, 3, 4, 1], True, producer).kind == "positions"


def test_few_identical_strings_with_close_margins_predict_a_lower_share() -> None:
    """16 strings all identical, but a third of them hang on a step the candidate's noise can flip: the metric is
    the share the margins predict (PP-OCRv4's recognizer: 16 of 16 on calibration, 44 of 48 held out)."""
    rng = np.random.default_rng(0)
    ref = _ctc_scores([[3, 4]] * 16, steps=6, classes=8, rng=rng)
    ref[:6, 4, 5] = ref[:6, 4, 0] - 0.05  # six strings: a blank step with a runner-up 0.05 below it
    noise = rng.standard_normal(ref.shape).astype(np.float32) * 0.05
    noise[:6, 4, 5] = noise[:6, 4, 0] = 0  # the close steps keep their argmax in this run
    metrics = TaskMetrics({"y": Producer("Gemm")})
    metrics.update({"y": ref}, {"y": ref + noise}, 16)
    out = metrics.summary().outputs[0]
    assert out.observed == 1.0 and out.value is not None and out.value < 0.95  # about 6 of 16 at risk
    assert out.describe().endswith("predicted from step margins (100.0% seen)")
    exact = TaskMetrics({"y": Producer("Gemm")})
    exact.update({"y": ref}, {"y": ref}, 16)
    assert exact.summary().outputs[0].value == 1.0 and exact.summary().outputs[0].observed is None


def _yolo_head(box_part: int = 4) -> onnx.ModelProto:
    """A YOLOv8 head (nudenet): ``box_part`` values in pixels beside 3 Sigmoid class probabilities, [N, 4 + K, A]."""
    nodes = [
        helper.make_node("Mul", ["box", "stride"], ["pixels"]),
        helper.make_node("Sigmoid", ["cls"], ["probs"]),
        helper.make_node("Concat", ["pixels", "probs"], ["output0"], axis=1),
    ]
    inputs = [tensor_info("box", F, [1, box_part, 50]), tensor_info("cls", F, [1, 3, 50])]
    return make_model(nodes, inputs, [tensor_info("output0", F, None)], {"stride": np.array(8.0, np.float32)})


def _head_outputs(model: onnx.ModelProto) -> tuple[Producer | None, np.ndarray]:
    producer = output_producers(_ir(onnx.shape_inference.infer_shapes(model)))["output0"]
    rng = np.random.default_rng(0)
    box = rng.uniform(0, 40, (1, model.graph.input[0].type.tensor_type.shape.dim[1].dim_value, 50))
    box[:, 2:4] = rng.uniform(2, 6, (1, 2, 50))  # widths and heights: boxes that rarely overlap
    feeds = {"box": box.astype(np.float32), "cls": rng.normal(-4, 2, (1, 3, 50)).astype(np.float32)}
    return producer, create_session(model).run(feeds)[0]


def test_a_detection_head_is_judged_by_the_boxes_it_decodes_to() -> None:
    producer, ref = _head_outputs(_yolo_head())
    assert producer == Producer("Concat", 1, parts=(("Mul", 4), ("Sigmoid", 3)))
    kind = kind_of("output0", ref.shape, True, producer)
    assert (kind.kind, kind.metric) == ("detections", "box_agreement")
    metrics = TaskMetrics({"output0": producer})
    metrics.update({"output0": ref}, {"output0": ref})
    exact = metrics.summary().outputs[0]
    assert exact.value == 1.0 and exact.count >= 4  # counted in boxes
    # nudenet's INT8 case: every score moves by at most 0.005 (the cosine stays near 1), and the one box whose score
    # sat just above the 0.25 threshold falls below it.
    probs = ref[0, 4:]
    near = np.unravel_index(np.argmin(np.where(probs >= 0.25, probs, 9.0)), probs.shape)
    cand = ref.copy()
    cand[0, 4:] += np.random.default_rng(1).uniform(-0.005, 0.005, probs.shape).astype(np.float32)
    cand[0, 4 + near[0], near[1]] = 0.24
    metrics = TaskMetrics({"output0": producer})
    metrics.update({"output0": ref}, {"output0": cand})
    out = metrics.summary().outputs[0]
    assert out.cosine is not None and out.cosine > 0.9999 and out.value is not None and out.value < 0.95
    assert out.observed == (out.count - 1) / out.count and out.value <= out.observed  # few boxes: margins too
    assert out.describe().startswith(f"output0 boxes matched {100 * out.value:.1f}% of {out.count} boxes predicted")
    moved = ref.copy()
    moved[:, 4:] = np.roll(moved[:, 4:], 1, axis=2)  # the scores moved to other anchors; the boxes exact
    metrics = TaskMetrics({"output0": producer})
    metrics.update({"output0": ref}, {"output0": moved})
    assert metrics.summary().outputs[0].value == 0.0


def test_another_concat_of_scores_beside_values_is_judged_by_its_worst_part() -> None:
    producer, ref = _head_outputs(_yolo_head(box_part=5))  # 5 values: no box
    assert producer == Producer("Concat", 1, parts=(("Mul", 5), ("Sigmoid", 3)))
    cand = ref.copy()
    cand[:, 5:] = np.roll(cand[:, 5:], 1, axis=2)
    metrics = TaskMetrics({"output0": producer})
    metrics.update({"output0": ref}, {"output0": cand})
    out = metrics.summary().outputs[0]
    assert out.metric == "part_cosine" and out.cosine is not None and out.cosine > 0.99
    assert out.value is not None and out.value < 0.5
    assert metrics.summary().describe().startswith("output0 cosine of its worst part 0.")
    unknown = Producer("Concat", 1, parts=(("Mul", 5), ("Sigmoid", 2)))  # sizes that do not add up: the whole
    assert kind_of("output0", ref.shape, True, unknown).metric == "cosine"


def _speech_like(shape: list[int]) -> np.ndarray:
    """A sum of tones under 1 kHz at 16 kHz plus a little white noise: band-limited, as audio is."""
    t = np.arange(shape[-1]) / 16000.0
    rng = np.random.default_rng(0)
    tones = sum(np.sin(2 * np.pi * f * t + rng.uniform(0, 6)) for f in (120.0, 240.0, 610.0, 930.0))
    return np.broadcast_to(0.2 * tones + 0.05 * rng.standard_normal(shape[-1]), shape).astype(np.float32)


@pytest.mark.parametrize(
    ("name", "shape", "producer", "kind"),
    [
        ("audio", [1, 1, 32768], "Tanh", "signal"),  # hifigan
        ("wav", [2, 16000], "Conv", "signal"),
        ("audio", [1, 2, 32768], "Tanh", "values"),  # two channels
        ("audio", [1, 1, 1024], "Tanh", "values"),  # too short for a waveform
        ("features", [2, 4096], "Relu", "values"),  # named like an embedding
        ("y", [2, 4096], "Gemm", "classes"),  # a linear layer's scores
    ],
)
def test_a_waveform_is_judged_by_its_snr(name: str, shape: list[int], producer: str, kind: str) -> None:
    assert kind_of(name, shape, True, Producer(producer), _speech_like(shape)).kind == kind


@pytest.mark.parametrize(
    ("shape", "producer"),
    [
        ([2, 8192], Producer("Relu")),  # a wide feature vector (VGG's fc7-like [N, 4096+])
        ([2, 32000], Producer("Div")),  # logits divided by a temperature
        ([1, 1, 8192], Producer("LayerNormalization")),  # a pooled hidden state kept [N, 1, D]
    ],
)
def test_a_wide_feature_or_logit_output_is_not_a_waveform(shape: list[int], producer: Producer) -> None:
    """Its units have no order in time: neighbouring values do not move together, so it is judged by cosine."""
    rows = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    assert kind_of("output", shape, True, producer, np.maximum(rows, 0) + 0.1).kind == "values"
    assert kind_of("output", shape, True, producer).kind == "values"  # without a sample to show it
    assert kind_of("output", shape, True, producer, _speech_like(shape)).kind == "signal"  # the same, band-limited


def test_a_flattened_feature_map_is_not_a_waveform() -> None:
    """``Conv [N, 16, 32, 32] -> Flatten`` is ``[N, 16384]`` of smooth values, but a map, not a signal; a vocoder's
    ``[N, 1, T] -> Reshape -> [N, T]`` merges nothing and stays one."""
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="/conv", pads=[1, 1, 1, 1]),
        helper.make_node("Flatten", ["c"], ["flat"], name="/flatten"),
        helper.make_node("Conv", ["a", "k"], ["wave3"], name="/post", pads=[1, 1]),
        helper.make_node("Reshape", ["wave3", "to2"], ["wave"], name="/reshape"),
    ]
    inputs = [tensor_info("x", F, ["N", 3, 32, 32]), tensor_info("a", F, ["N", 1, "T"])]
    outputs = [tensor_info("flat", F, ["N", 16384]), tensor_info("wave", F, ["N", "T"])]
    weights = {"w": np.ones((16, 3, 3, 3), np.float32), "k": np.ones((1, 1, 3), np.float32),
               "to2": np.array([0, -1], np.int64)}  # fmt: skip
    model = ir.serde.deserialize_model(
        onnx.shape_inference.infer_shapes(make_model(nodes, inputs, outputs, weights, opset=17))
    )
    producers = output_producers(model)
    assert producers["flat"] == Producer("Conv", merged=True) and producers["wave"] == Producer("Conv")
    smooth = _speech_like([2, 16384])
    assert kind_of("flat", smooth.shape, True, producers["flat"], smooth).kind == "values"
    assert kind_of("wave", smooth.shape, True, producers["wave"], smooth).kind == "signal"


def test_the_snr_of_a_waveform_is_its_relative_error_in_db() -> None:
    """hifigan's INT8 case: a waveform cosine 0.9947 (the old bound 0.99 held) is 19.8 dB."""
    t = np.arange(32768, dtype=np.float32)
    ref = (0.5 * np.sin(t / 20.0))[None, None]
    noise = np.random.default_rng(0).standard_normal(ref.shape).astype(np.float32)
    cand = ref + noise * 0.1 * np.linalg.norm(ref) / np.linalg.norm(noise)  # rel L2 0.1
    metrics = TaskMetrics({"audio": Producer("Tanh")})
    metrics.update({"audio": ref}, {"audio": cand})
    out = metrics.summary().outputs[0]
    assert out.kind == "signal" and out.value is not None and abs(out.value - 20.0) < 0.01
    assert out.cosine is not None and out.cosine > 0.99
    assert out.describe() == "audio SNR 20.0 dB of 32768 samples"


def test_an_objectness_score_multiplies_the_class_scores() -> None:
    """YOLOv5/YOLOX: one objectness score before the class scores; a box needs both."""
    producer = Producer("Concat", 2, parts=(("Add", 4), ("Sigmoid", 1), ("Sigmoid", 2)))
    kind = kind_of("output", [1, 3, 7], True, producer)
    assert kind.kind == "detections"
    head = np.zeros((1, 3, 7), np.float32)
    head[0, :, :4] = [[10, 10, 4, 4], [30, 30, 4, 4], [50, 50, 4, 4]]  # three anchors, apart
    head[0, :, 4:] = [[0.9, 0.9, 0.1], [0.1, 0.9, 0.1], [0.9, 0.1, 0.6]]  # boxes: anchor 0 (class 0), 2 (class 1)
    cand = head.copy()
    cand[0, 2, 4] = 0.3  # objectness 0.3 x 0.6 = 0.18: anchor 2's box is lost at either threshold
    metrics = TaskMetrics({"output": producer})
    metrics.update({"output": head}, {"output": cand})
    out = metrics.summary().outputs[0]
    assert (out.value, out.count) == (0.5, 2)


def test_a_probability_map_is_judged_by_its_regions() -> None:
    """Each connected region's box is matched at IoU >= 0.5 at each threshold; the worst threshold counts, over the
    regions of the side with more."""
    ref = np.zeros((1, 1, 32, 32), np.float32)
    ref[0, 0, 2:6, 2:12] = 0.9  # a text line
    ref[0, 0, 10:14, 2:20] = 0.9  # another
    ref[0, 0, 20:24, 2:8] = 0.4  # a faint one: a region at 0.3 only
    cand = ref.copy()
    cand[0, 0, 10:14, 10:12] = 0.1  # the second line split in two halves, each under IoU 0.5 with it
    metrics = TaskMetrics({"map": Producer("Sigmoid")})
    metrics.update({"map": ref}, {"map": cand})
    (out,) = metrics.summary().outputs
    # at 0.3: 2 matched of 4 candidate regions (3 float ones); at 0.5, the worse: 1 of 3 (2 float ones)
    assert (out.kind, out.value, out.count) == ("regions", pytest.approx(1 / 3), 3)
    assert "map regions matched 33.3% of 3 regions" in metrics.summary().describe()


def test_log_features_and_transposed_confidences_get_their_producers() -> None:
    """A Log then elementwise arithmetic is log-scale features; a Transpose is looked through (a Sigmoid's
    confidences), but a Softmax's axis is not followed past it."""
    import onnx_ir as ir

    from onnxprec.accuracy import output_producers

    x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([1, 8, 4]))
    log = ir.node("Log", [x])
    scaled = ir.node("Mul", [log.outputs[0], log.outputs[0]])
    clip = ir.node("Clip", [scaled.outputs[0]])
    sigmoid = ir.node("Sigmoid", [x])
    moved = ir.node("Transpose", [sigmoid.outputs[0]], attributes={"perm": [0, 2, 1]})
    softmax = ir.node("Softmax", [x], attributes={"axis": -1})
    turned = ir.node("Transpose", [softmax.outputs[0]], attributes={"perm": [0, 2, 1]})
    outputs = [clip.outputs[0], moved.outputs[0], turned.outputs[0]]
    for value, name in zip(outputs, ("features", "confidences", "turned")):
        value.name = name
    graph = ir.Graph([x], outputs, nodes=[log, scaled, clip, sigmoid, moved, softmax, turned], opset_imports={"": 17})
    producers = output_producers(ir.Model(graph, ir_version=8))
    assert producers["features"] == Producer("Clip", logged=True)
    assert producers["confidences"] == Producer("Sigmoid", permuted=True)
    assert producers["turned"] == Producer("Softmax")
    assert kind_of("confidences", [1, 4, 8], True, producers["confidences"]).kind == "mask"
    assert kind_of("turned", [1, 4, 8], True, producers["turned"]).kind == "values"


def test_a_log_of_probabilities_is_no_log_feature_and_a_permuted_map_no_regions() -> None:
    """Log(Softmax) gives log-probabilities, judged as scores, not as log-scale features by SNR; a Sigmoid map
    transposed to NHWC is judged as a mask, not by regions cut along its NCHW planes."""
    import onnx_ir as ir

    from onnxprec.accuracy import output_producers

    x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([1, 10]))
    softmax = ir.node("Softmax", [x], attributes={"axis": -1})
    log = ir.node("Log", [softmax.outputs[0]])
    log.outputs[0].name = "logprob"
    graph = ir.Graph([x], [log.outputs[0]], nodes=[softmax, log], opset_imports={"": 17})
    producer = output_producers(ir.Model(graph, ir_version=8))["logprob"]
    assert producer == Producer("Log")
    assert kind_of("logprob", [1, 10], True, producer).metric == "top1"
    nhwc = Producer("Sigmoid", permuted=True)
    assert kind_of("map", [1, 64, 64, 1], True, nhwc).kind == "mask"
    assert kind_of("map", [1, 1, 64, 64], True, Producer("Sigmoid")).kind == "regions"


def test_kv_cache_outputs_stay_out_of_the_summary_line_and_in_the_report() -> None:
    """A decoder's ``present.*`` outputs are state, not judged: the line's worst errors are the logits'; their own
    errors stay in :meth:`TaskSummary.to_json`. A model whose only outputs are state still gets a line."""
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((1, 4, 16)).astype(np.float32)
    cache = rng.standard_normal((1, 2, 4, 8)).astype(np.float32)
    metrics = TaskMetrics({})
    metrics.update({"logits": logits, "present.0.key": cache},
                   {"logits": logits * 1.001, "present.0.key": cache + 0.5})  # fmt: skip
    summary = metrics.summary()
    line = summary.describe()
    assert "float outputs rel L2 <= 0.001," in line and "present" not in line
    cache_error = summary.to_json()["outputs"]["present.0.key"]["rel_l2"]
    assert cache_error > 0.1 and summary.worst_rel_l2 == pytest.approx(cache_error)
    only = TaskMetrics({})
    only.update({"present.0.key": cache}, {"present.0.key": cache + 0.5})
    assert only.summary().describe().startswith(f"float outputs rel L2 <= {cache_error:.4g}")
