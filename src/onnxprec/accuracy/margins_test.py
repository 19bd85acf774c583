"""The share of identical strings a CTC head's step margins predict (:class:`StepMargins`): only the steps whose flip
to their runner-up changes the decoded string count (ddddocr's recognizer: the guard's prediction rose from 97.6 %
to 99.4 % of its 36 calibration strings, experiments/design_notes.md, "INT8 accuracy guard")."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from onnxprec.accuracy import Producer, StepMargins, TaskMetrics, ctc_strings
from onnxprec.accuracy._margins import string_steps
from onnxprec.quantization.guard import holds


def test_string_steps_are_the_steps_whose_flip_changes_the_decoded_string() -> None:
    """Against decoding every path with one step replaced: every path of 5 steps over a blank and 2 letters, and
    every other class in place of each step."""
    paths = np.array(list(itertools.product(range(3), repeat=5)))
    for shift in (1, 2):
        second = (paths + shift) % 3
        got = string_steps(paths, second, blank=0)
        for n, t in np.ndindex(paths.shape):
            flipped = paths[n].copy()
            flipped[t] = second[n, t]
            one_hot = np.eye(3, dtype=np.float32)[np.stack([paths[n], flipped])]
            before, after = ctc_strings(one_hot, 1, 0)
            assert got[n, t] == (before != after), (paths[n], t, second[n, t])


def _scores(rng: np.random.Generator, close_to: int) -> np.ndarray:
    """16 sequences of 8 steps spelling "3 4" as ``0 3 3 0 4 4 0 0``, raw scores (letters 8 above the noise); at step
    3, the blank between the letters, ``close_to`` scores 0.05 below the blank."""
    ref = rng.standard_normal((16, 8, 8)).astype(np.float32)
    path = [0, 3, 3, 0, 4, 4, 0, 0]
    ref[:, np.arange(8), path] += 8.0
    ref[:, 3, close_to] = ref[:, 3, 0] - 0.05
    return ref


@pytest.mark.parametrize(("close_to", "kept"), [(4, True), (3, True), (5, False)])
def test_a_close_step_counts_only_where_its_flip_changes_the_string(close_to: int, kept: bool) -> None:
    """A blank beside a letter's run that turns into that letter (3 before it, 4 after it) decodes the same "34": the
    prediction stays 1; into another letter (5), "354", about a fifth of such steps are at risk under noise of 0.05."""
    rng = np.random.default_rng(0)
    ref = _scores(rng, close_to)
    cand = ref + rng.standard_normal(ref.shape).astype(np.float32) * 0.05
    cand[:, 3, [0, close_to]] = ref[:, 3, [0, close_to]]  # this run keeps the close steps' argmax
    assert ctc_strings(ref, 1, 0) == ctc_strings(cand, 1, 0) == [(3, 4)] * 16
    margins, every = StepMargins(blank=0), StepMargins()
    margins.update(ref, cand, 1)
    every.update(ref, cand, 1)
    predicted, all_steps = margins.predicted(), every.predicted()
    assert predicted is not None and all_steps is not None
    assert all_steps < 0.9  # every step counted: the close blank of each sequence, whatever its runner-up
    assert (predicted == 1.0) if kept else (predicted == pytest.approx(all_steps))
    metrics = TaskMetrics({"y": Producer("Gemm")})  # raw scores with a blank: judged by strings, blank 0
    metrics.update({"y": ref}, {"y": cand}, 16)
    assert holds(metrics.summary()) is kept


def test_a_letter_run_edge_that_turns_blank_keeps_the_string_but_a_single_letter_does_not() -> None:
    """``0 3 3 0``: either 3 may turn blank and the string stays "3"; in ``0 3 0 0`` the lone 3 may not."""
    run, lone = np.array([[0, 3, 3, 0]]), np.array([[0, 3, 0, 0]])
    blank_second = np.array([[3, 0, 0, 3]])
    assert string_steps(run, blank_second, 0).tolist() == [[False, False, False, False]]
    assert string_steps(lone, blank_second, 0).tolist() == [[False, True, False, True]]  # 0 3 0 3 reads "33"


def test_mask_margins_predict_the_iou_of_a_noisy_map() -> None:
    """Confidences moved by logit noise: on a large map the IoU the margins predict is the IoU seen; on a map of few
    entries near 0.5 that all kept their side, the prediction still counts the chances that some flip."""
    from onnxprec.accuracy._margins import MaskMargins

    rng = np.random.default_rng(0)
    logits = rng.normal(-3.0, 2.0, (4, 2000, 10))
    ref = 1 / (1 + np.exp(-logits))
    cand = 1 / (1 + np.exp(-(logits + rng.normal(0, 0.3, logits.shape))))
    margins = MaskMargins()
    margins.update_map(ref, cand)
    r, c = ref >= 0.5, cand >= 0.5
    seen = (r & c).sum() / (r | c).sum()
    assert margins.predicted() == pytest.approx(seen, abs=0.01)
    few = MaskMargins()  # 4 entries just over 0.5 that kept it, beside a noisy background
    few_ref, few_cand = ref.copy(), cand.copy()
    few_ref[0, :4, 0], few_cand[0, :4, 0] = 0.55, 0.56
    few_ref[ref >= 0.5], few_cand[ref >= 0.5] = 0.0, 0.0
    few_ref[0, :4, 0], few_cand[0, :4, 0] = 0.55, 0.56
    few.update_map(few_ref, few_cand)
    predicted = few.predicted()
    assert predicted is not None and predicted < 0.9


def test_a_mask_judged_by_its_margins_reports_the_iou_seen_too() -> None:
    """TaskMetrics takes the lower of the IoU seen and the one predicted, and says both."""
    rng = np.random.default_rng(1)
    logits = rng.normal(-3.0, 2.0, (1, 300, 10)).astype(np.float32)
    ref = 1 / (1 + np.exp(-logits))
    ref[0, :3, 0] = 0.52  # three entries just over 0.5 that the candidate keeps by luck
    cand = 1 / (1 + np.exp(-(logits + rng.normal(0, 0.5, logits.shape).astype(np.float32))))
    cand[0, :3, 0] = 0.53
    metrics = TaskMetrics({"confidences": Producer("Sigmoid")})
    metrics.update({"confidences": ref}, {"confidences": cand})
    (out,) = metrics.summary().outputs
    assert out.kind == "mask" and out.observed is not None and out.value is not None and out.value < out.observed
    assert "predicted from score margins" in out.describe()
