"""A detection head judged on few boxes (issue 24: nudenet's INT8 result kept every box of its calibration images
and lost held-out ones; RELIABILITY.md): under MIN_BOXES boxes the share the score margins predict counts too; with
enough boxes the share seen stands. The heads run on ONNX Runtime; a candidate is the same head on logits with noise."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from onnxprec._ort import create_session
from onnxprec._testing import F, make_model, tensor_info
from onnxprec.accuracy import OutputMetric, Producer, TaskMetrics, TaskSummary
from onnxprec.accuracy._boxes import MIN_BOXES, ScoreMargins
from onnxprec.quantization.guard import holds

_ANCHORS = 400
_PRODUCER = Producer("Concat", 1, parts=(("Mul", 4), ("Sigmoid", 2)))


def _head() -> onnx.ModelProto:
    """A YOLOv8 head: 4 box values in pixels beside 2 Sigmoid class probabilities, ``[1, 6, 400]``."""
    nodes = [
        helper.make_node("Mul", ["box", "stride"], ["pixels"]),
        helper.make_node("Sigmoid", ["cls"], ["probs"]),
        helper.make_node("Concat", ["pixels", "probs"], ["output0"], axis=1),
    ]
    inputs = [tensor_info("box", F, [1, 4, _ANCHORS]), tensor_info("cls", F, [1, 2, _ANCHORS])]
    return make_model(nodes, inputs, [tensor_info("output0", F, None)], {"stride": np.array(8.0, np.float32)})


def _logits(scores: dict[int, float], rng: np.random.Generator) -> np.ndarray:
    """Class logits: class 0 of anchor ``i`` at probability ``scores[i]``, the other anchors between 0.02 and 0.2
    (below both thresholds), class 1 never a box."""
    p = rng.uniform(0.02, 0.2, _ANCHORS)
    for i, score in scores.items():
        p[i] = score
    logits = np.full((1, 2, _ANCHORS), -12.0)
    logits[0, 0] = np.log(p / (1 - p))
    return logits.astype(np.float32)


def _judge(scores: dict[int, float], noise: float, keep_boxes: bool = True) -> tuple[float, float | None, int]:
    """(value, observed, boxes) of the head whose logits move by ``noise`` (standard deviation, logit units);
    ``keep_boxes``: no box crosses a threshold (every box moves up, every other anchor at most half way to 0.25)."""
    rng = np.random.default_rng(0)
    session = create_session(_head())
    grid = np.arange(_ANCHORS)
    box = np.stack([(grid % 20) * 4.0, (grid // 20) * 4.0, np.full(_ANCHORS, 1.0), np.full(_ANCHORS, 1.0)])
    feeds = {"box": box[None].astype(np.float32), "cls": _logits(scores, rng)}  # 8-pixel boxes on a 32-pixel grid
    moved = feeds["cls"].copy()
    change = rng.normal(0.0, noise, _ANCHORS).astype(np.float32)
    if keep_boxes:
        boxes = np.array(sorted(scores))
        change[boxes] = np.abs(change[boxes])
        others = np.setdiff1d(grid, boxes)
        change[others] = np.minimum(change[others], 0.5 * (np.log(1 / 3) - moved[0, 0, others]))
    moved[0, 0] += change
    ref = session.run(feeds)[0]
    cand = session.run({"box": feeds["box"], "cls": moved})[0]
    metrics = TaskMetrics({"output0": _PRODUCER})
    metrics.update({"output0": ref}, {"output0": cand})
    out = metrics.summary().outputs[0]
    assert out.kind == "detections" and out.value is not None
    return out.value, out.observed, out.count


def _summary(value: float, observed: float | None, count: int) -> TaskSummary:
    return TaskSummary((OutputMetric("output0", "detections", "box_agreement", value, count, 0.0, 1.0, "", observed),))


def test_few_boxes_near_the_threshold_all_kept_are_judged_by_their_score_margins() -> None:
    """6 boxes just above 0.25 (and 0.5), every one kept: seen, 100 %; but the logits moved by 0.2 (nudenet's INT8
    result moved its held-out scores more), a box 0.03 above the threshold is lost half the time: the
    predicted share misses the guard's 0.95."""
    scores = {10: 0.27, 50: 0.28, 90: 0.3, 130: 0.52, 170: 0.55, 210: 0.9}
    value, observed, count = _judge(scores, noise=0.2)
    assert observed == 1.0 and count == 6
    assert value < 0.8
    assert not holds(_summary(value, observed, count))


def test_few_boxes_whose_scores_barely_move_pass() -> None:
    scores = {10: 0.27, 50: 0.28, 90: 0.3, 130: 0.52, 170: 0.55, 210: 0.9}
    value, observed, count = _judge(scores, noise=0.002)
    assert count == 6 and value >= 0.99
    assert holds(_summary(value, observed, count))


def test_enough_boxes_are_judged_by_the_share_seen() -> None:
    """MIN_BOXES boxes or more: the share seen stands, however close their scores sit to the threshold."""
    scores = {i: 0.26 + 0.001 * (i % 7) for i in range(0, _ANCHORS, 5)}
    assert len(scores) >= MIN_BOXES
    value, observed, count = _judge(scores, noise=0.2)
    assert count == len(scores) and value == 1.0 and observed is None


def test_anchors_below_the_threshold_may_appear() -> None:
    """No float box at all, and anchors just below 0.25 whose logits move by 0.3: the predicted share counts the
    boxes expected to appear."""
    margins = ScoreMargins()
    rng = np.random.default_rng(0)
    session = create_session(_head())
    box = np.zeros((1, 4, _ANCHORS), np.float32)
    box[0, 0], box[0, 1], box[0, 2:] = (np.arange(_ANCHORS) % 20) * 4.0, (np.arange(_ANCHORS) // 20) * 4.0, 1.0
    logits = _logits({i: 0.24 for i in range(0, 40, 8)}, rng)
    ref = session.run({"box": box, "cls": logits})[0]
    moved = logits.copy()
    moved[0, 0] += rng.normal(0.0, 0.3, _ANCHORS).astype(np.float32)
    margins.update(ref, session.run({"box": box, "cls": moved})[0], 1, ((4, 6),))
    predicted = margins.predicted()
    assert predicted is not None and predicted < 0.5  # about 2 of the 5 are expected to appear, over no box
    still = ScoreMargins()
    still.update(ref, ref, 1, ((4, 6),))
    assert still.predicted() == 1.0


def test_a_box_exactly_at_the_threshold_that_does_not_move_is_kept() -> None:
    """A score equal to the threshold is a box (``>=``); unchanged, it stays one: predicted 1."""
    session = create_session(_head())
    box = np.zeros((1, 4, _ANCHORS), np.float32)
    box[0, 0], box[0, 1], box[0, 2:] = (np.arange(_ANCHORS) % 20) * 4.0, (np.arange(_ANCHORS) // 20) * 4.0, 1.0
    ref = session.run({"box": box, "cls": _logits({3: 0.25}, np.random.default_rng(0))})[0]
    ref[0, 4, 3] = 0.25
    margins = ScoreMargins()
    margins.update(ref, ref.copy(), 1, ((4, 6),))
    assert margins.predicted() == 1.0


def test_without_a_float_box_a_faint_chance_of_one_appearing_costs_little() -> None:
    """No float box, one anchor at 0.24 whose logit may move by 1e-3: the share is 1 unless a box appears."""
    session = create_session(_head())
    box = np.zeros((1, 4, _ANCHORS), np.float32)
    box[0, 0], box[0, 1], box[0, 2:] = (np.arange(_ANCHORS) % 20) * 4.0, (np.arange(_ANCHORS) // 20) * 4.0, 1.0
    rng = np.random.default_rng(0)
    logits = _logits({3: 0.2499}, rng)
    ref = session.run({"box": box, "cls": logits})[0]
    moved = logits.copy()
    moved[0, 0] += rng.normal(0.0, 1e-3, _ANCHORS).astype(np.float32)
    margins = ScoreMargins()
    margins.update(ref, session.run({"box": box, "cls": moved})[0], 1, ((4, 6),))
    predicted = margins.predicted()
    assert predicted is not None and 0.5 <= predicted < 1.0
