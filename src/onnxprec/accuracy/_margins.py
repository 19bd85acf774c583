"""The share of identical strings a sequence output's step margins predict (:class:`StepMargins`), for the task
metric of a CTC head judged on few sequences."""

from __future__ import annotations

import numpy as np

from onnxprec.accuracy._boxes import SCORE_FLOOR, ScoreMargins, logit, share_at_least


class StepMargins:
    """The share of identical strings a sequence output's step margins predict, for checks on few sequences (16
    crops say little of a 5 % loss).

    Each step's margin is the float model's score of its argmax class minus its next best; its change is that
    difference in the candidate's scores minus the margin. A step flips when its change is below minus its margin:
    with the changes of every step compared as the noise, a step of margin ``m`` keeps its argmax with probability
    ``P(change >= -m)``, and a string survives when every one of its steps does.

    With a CTC ``blank``, only the steps whose flip to their runner-up changes the decoded string count
    (:func:`string_steps`): a step on the edge of a letter's run that turns into the blank (or a blank beside a letter
    that turns into that letter) moves the run's boundary and decodes the same. Those are the steps of the smallest
    margins in a CTC head's output, the letter-to-blank transitions.
    """

    def __init__(self, blank: int | None = None) -> None:
        self.blank = blank
        self.margins: list[np.ndarray] = []  # per sequence: the margins of the steps that can change its string
        self.changes: list[np.ndarray] = []

    def update(self, ref: np.ndarray, cand: np.ndarray, time: int) -> None:
        ref, cand = ref.astype(np.float32), cand.astype(np.float32)
        if time == 0:  # [T, N, C] -> [N, T, C]
            ref, cand = ref.transpose(1, 0, 2), cand.transpose(1, 0, 2)
        best = np.argmax(ref, axis=-1)[..., None]
        second, runner_up = _runner_up(ref, best)
        margin = np.take_along_axis(ref, best, -1)[..., 0] - runner_up
        changed = np.take_along_axis(cand, best, -1)[..., 0] - _runner_up(cand, best)[1]
        self.changes.append((changed - margin).ravel())
        if self.blank is not None:
            margin = np.where(string_steps(best[..., 0], second, self.blank), margin, np.inf)
        self.margins.extend(margin)

    def predicted(self) -> float | None:
        if not self.margins:
            return None
        changes = np.sort(np.concatenate(self.changes))
        survive = [np.prod(share_at_least(changes, -m)) for m in self.margins]
        return float(np.mean(survive))


def string_steps(best: np.ndarray, second: np.ndarray, blank: int) -> np.ndarray:
    """Per step of greedy CTC paths ``best`` ``[N, T]``: whether putting its ``second`` class in place of its own
    changes the decoded string (repeats collapsed, the blank dropped).

    A step's class decides only what it and the next step emit: itself unless it repeats the previous step's class or
    is the blank, and the next step's class unless that repeats it or is the blank. The string stays the same when
    those (one or two) letters are the same for both classes.
    """
    none = np.full((*best.shape[:-1], 1), -1, best.dtype)
    before = np.concatenate([none, best[..., :-1]], axis=-1)
    after = np.concatenate([best[..., 1:], none], axis=-1)

    def emitted(own: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        this = np.where((own != before) & (own != blank), own, -1)
        following = np.where((after >= 0) & (after != own) & (after != blank), after, -1)
        return np.where(this >= 0, this, following), np.where(this >= 0, following, -1)

    (first, then), (first_2, then_2) = emitted(best), emitted(second)
    return (first != first_2) | (then != then_2)


def _runner_up(scores: np.ndarray, best: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(class, score) of the highest score other than the ``best`` class's, per step."""
    others = scores.copy()
    np.put_along_axis(others, best, -np.inf, -1)
    return others.argmax(axis=-1), others.max(axis=-1)


class MaskMargins(ScoreMargins):
    """The mask IoU a Sigmoid map's score margins predict (``[N, A, K]``: a detector's per-anchor class confidences,
    cut at 0.5), the way :class:`~onnxprec.accuracy._boxes.ScoreMargins` predicts a detection head's boxes, at the
    one threshold 0.5 and without boxes: every entry counts.

    The entries over 0.5 cluster by object (the anchors that cover one object, the classes it is confused with), so
    their count overstates what the seen IoU shows: a few objects near the threshold make or break the boxes a user
    decodes. Scores change in logit units: an entry over 0.5 by margin ``m`` (its float logit) stays with probability
    ``P(change >= -m)``, one under it by ``d`` (float score at least :data:`~onnxprec.accuracy._boxes.SCORE_FLOOR`)
    joins with probability ``P(change >= d)``, the changes of every entry either model scores at least the floor
    being the noise. The IoU predicted is the entries expected kept over the float ones plus those expected to join.
    """

    def __init__(self) -> None:
        super().__init__()
        self.kept, self.below = {0.5: []}, {0.5: []}

    def update_map(self, ref: np.ndarray, cand: np.ndarray) -> None:
        """Adds a batch of the float map and the candidate's (same shapes)."""
        ref, cand = ref.astype(np.float32).ravel(), cand.astype(np.float32).ravel()
        near = (ref >= SCORE_FLOOR) | (cand >= SCORE_FLOOR)
        self.changes.append(logit(cand[near]) - logit(ref[near]))
        self.kept[0.5].append(logit(ref[ref >= 0.5]))
        self.below[0.5].append(-logit(ref[(ref < 0.5) & (ref >= SCORE_FLOOR)]))


def ctc_strings(scores: np.ndarray, time: int, blank: int) -> list[tuple[int, ...]]:
    """Greedy CTC decoding of ``[N, T, C]`` (``time`` 1) or ``[T, N, C]`` (``time`` 0) scores: per sequence the argmax
    of each step, repeats collapsed, the blank dropped."""
    best = np.argmax(scores, axis=-1)
    rows = best.T if time == 0 else best
    strings = []
    for row in rows:
        keep = np.ones(row.shape, bool)
        keep[1:] = row[1:] != row[:-1]
        strings.append(tuple(int(c) for c in row[keep] if c != blank))
    return strings
