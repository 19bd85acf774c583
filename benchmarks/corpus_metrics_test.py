"""The corpus task metrics on synthetic arrays whose answers are known."""

from __future__ import annotations

import math

import numpy as np
import pytest

from benchmarks import corpus_metrics as cm


def _outs(*arrays: np.ndarray, name: str = "y") -> list[dict[str, np.ndarray]]:
    return [{name: a} for a in arrays]


def test_top1_and_top5_agreement() -> None:
    ref = np.eye(4, 6, dtype=np.float32)  # classes 0..3
    got = ref.copy()
    got[3] = [0, 0, 0, 0.5, 0.9, 0]  # class 3 is now second: top-1 flips, top-5 keeps it
    r = cm.top1(_outs(ref[:2], ref[2:]), _outs(got[:2], got[2:]))
    assert r["value"] == pytest.approx(0.75)
    assert r["top5"] == 1.0
    assert r["n"] == 4


def test_top1_of_label_outputs() -> None:
    r = cm.top1(_outs(np.array([0, 1, 2])), _outs(np.array([0, 2, 2])), labels=True)
    assert r["value"] == pytest.approx(2 / 3)


@pytest.mark.parametrize(
    ("ids", "expected"),
    [([0, 3, 3, 0, 3, 5, 5, 0], (3, 3, 5)), ([0, 0, 0], ()), ([2, 2, 2, 1], (2, 1))],
)
def test_ctc_greedy_decode(ids: list[int], expected: tuple[int, ...]) -> None:
    scores = np.eye(6, dtype=np.float32)[ids][None]  # [1, T, C]
    assert cm.ctc_decode(scores, "NTC", blank=0) == [expected]
    assert cm.ctc_decode(scores.transpose(1, 0, 2), "TNC", blank=0) == [expected]
    assert cm.ctc_decode(np.asarray(ids, np.float32)[None], "ids", blank=0) == [expected]


def test_ctc_string_agreement_counts_changed_and_empty_strings() -> None:
    eye = np.eye(5, dtype=np.float32)
    ref = np.stack([eye[[1, 2, 3]], eye[[4, 4, 1]]])  # "123", "41"
    got = np.stack([eye[[1, 2, 3]], eye[[0, 0, 0]]])  # "123", ""
    r = cm.ctc(_outs(ref), _outs(got), layout="NTC")
    assert r["value"] == 0.5
    assert (r["empty_fp32"], r["empty"]) == (0, 1)


def test_boxes_matching_one_to_one_by_iou_and_class() -> None:
    ref = (np.array([[0, 0, 10, 10], [20, 20, 30, 30]], float), np.array([0, 1]))
    assert cm.match(ref, ref) == 2
    shifted = (ref[0] + [2, 0, 2, 0], ref[1])  # IoU 8/12 = 0.67 >= 0.5
    assert cm.match(ref, shifted) == 2
    far = (ref[0] + [6, 0, 6, 0], ref[1])  # IoU 4/16 = 0.25
    assert cm.match(ref, far) == 0
    wrong_class = (ref[0], np.array([1, 0]))
    assert cm.match(ref, wrong_class) == 0
    one_box = (ref[0][:1], ref[1][:1])  # it covers one of the two, once
    assert cm.match(ref, one_box) == 1


def test_components_finds_regions_and_their_boxes() -> None:
    m = np.zeros((10, 12), bool)
    m[1:3, 1:4] = True  # 6 px
    m[5:9, 6:8] = True  # 8 px, U-shaped below
    m[8, 8:11] = True
    m[7:9, 10] = True
    m[0, 11] = True  # 1 px: under min_area
    boxes = sorted(map(tuple, cm.components(m, min_area=4).tolist()))
    assert boxes == [(1.0, 1.0, 4.0, 3.0), (6.0, 5.0, 11.0, 9.0)]


def test_boxes_metric_penalizes_missing_and_extra_boxes() -> None:
    prob = np.zeros((1, 1, 20, 20), np.float32)
    prob[0, 0, 2:6, 2:6] = 0.9
    prob[0, 0, 10:15, 10:15] = 0.9
    fewer = prob.copy()
    fewer[0, 0, 10:15, 10:15] = 0.1
    r = cm.boxes(_outs(prob), _outs(fewer), decode="prob_map", threshold=0.3)
    assert (r["recall"], r["precision"], r["value"]) == (0.5, 1.0, 0.5)
    more = prob.copy()
    more[0, 0, 17:20, 0:4] = 0.8
    r = cm.boxes(_outs(prob), _outs(more), decode="prob_map", threshold=0.3)
    assert (r["recall"], r["precision"]) == (1.0, pytest.approx(2 / 3))


def test_yolov8_decoding_and_nms() -> None:
    # [1, 4 + 2 classes, 3 anchors]: two overlapping boxes of class 1 (one suppressed), one of class 0 below threshold
    a = np.array([[50, 52, 10], [50, 50, 10], [20, 20, 4], [20, 20, 4], [0, 0, 0.1], [0.9, 0.8, 0]], np.float32)
    ((boxes, classes),) = cm.DECODERS["yolov8"]({"out": a[None]}, None, threshold=0.25)
    assert classes.tolist() == [1]
    assert boxes.tolist() == [[40.0, 40.0, 60.0, 60.0]]


def test_yolox_grid_decoding() -> None:
    # a 32 x 32 input: 4x4 + 2x2 + 1x1 anchors; one confident anchor at grid cell (1, 2) of stride 8
    x = np.zeros((1, 21, 6), np.float32)
    x[0, 2 * 4 + 1] = [0.5, 0.5, math.log(2), math.log(2), 0.9, 0.9]  # centre (12, 20), 16 x 16
    ((boxes, classes),) = cm.DECODERS["yolox"]({"out": x}, None, threshold=0.3)
    assert boxes.tolist() == [[4.0, 12.0, 20.0, 28.0]]
    assert classes.tolist() == [0]


def test_decision_and_its_max_abs_limit() -> None:
    ref = np.array([[0.1], [0.9], [0.6], [0.001]], np.float32)
    got = np.array([[0.2], [0.8], [0.4], [0.001]], np.float32)  # one decision flips
    r = cm.decision(_outs(ref), _outs(got))
    assert r["value"] == 0.75
    assert r["max_abs"] == pytest.approx(0.2)
    assert cm.judge("decision", 0.7, _outs(ref), _outs(got))["passed"]
    assert not cm.judge("decision", 0.7, _outs(ref), _outs(got), options={"max_abs": 0.05})["passed"]


def test_snr_of_known_noise() -> None:
    ref = np.ones(1000, np.float32)
    got = ref + 0.1  # error power 0.01 of the signal's: 20 dB
    assert cm.snr_db(ref, got) == pytest.approx(20.0, abs=1e-4)
    assert cm.snr_db(ref, ref) == math.inf
    assert cm.snr_db(ref, ref * np.nan) == -math.inf
    r = cm.snr(_outs(ref[:500], ref[500:]), _outs(got[:500], ref[500:]))
    assert r["worst"] == pytest.approx(20.0, abs=1e-4)
    assert r["value"] == pytest.approx(23.0103, abs=1e-3)  # half the samples carry the error


def test_cosine_per_sample() -> None:
    ref = np.array([[1, 0], [0, 1]], np.float32)
    got = np.array([[1, 0], [1, 1]], np.float32)
    r = cm.cosine(_outs(ref), _outs(got))
    assert r["worst"] == pytest.approx(1 / math.sqrt(2))
    assert r["value"] == pytest.approx((1 + 1 / math.sqrt(2)) / 2)
    assert cm.cosine(_outs(ref), _outs(got * np.nan))["value"] == -1.0


def test_mask_iou() -> None:
    ref = np.zeros((1, 4, 4), np.float32)
    ref[0, :2] = 0.9  # 8 px
    got = ref.copy()
    got[0, 1] = 0.1  # 4 px left
    assert cm.mask_iou(_outs(ref), _outs(got))["value"] == 0.5


@pytest.mark.slow
def test_judge_reports_bound_and_worst_float_output() -> None:
    ref = [{"scores": np.eye(3, dtype=np.float32), "ids": np.arange(3)}]
    got = [{"scores": np.eye(3, dtype=np.float32) * 2, "ids": np.arange(3)}]
    r = cm.judge("top1", 0.98, ref, got, "scores")
    assert r["passed"] and r["value"] == 1.0 and r["bound"] == 0.98
    assert r["max_rel_l2_output"] == "scores"
    assert r["max_rel_l2"] == pytest.approx(1.0)
