"""The share of identical strings a sequence output's step margins predict (:class:`StepMargins`), for the task
metric of a CTC head judged on few sequences."""

from __future__ import annotations

import numpy as np

from onnxprec.accuracy._boxes import share_at_least


class StepMargins:
    """The share of identical strings a sequence output's step margins predict, for checks on few sequences (16
    crops say little of a 5 % loss).

    Each step's margin is the float model's score of its argmax class minus its next best; its change is that
    difference in the candidate's scores minus the margin. A step flips when its change is below minus its margin:
    with the changes of every step compared as the noise, a step of margin ``m`` keeps its argmax with probability
    ``P(change >= -m)``, and a string survives when every one of its steps does.
    """

    def __init__(self) -> None:
        self.margins: list[np.ndarray] = []  # per sequence: its steps' margins
        self.changes: list[np.ndarray] = []

    def update(self, ref: np.ndarray, cand: np.ndarray, time: int) -> None:
        ref, cand = ref.astype(np.float32), cand.astype(np.float32)
        if time == 0:  # [T, N, C] -> [N, T, C]
            ref, cand = ref.transpose(1, 0, 2), cand.transpose(1, 0, 2)
        best = np.argmax(ref, axis=-1)[..., None]
        margin = np.take_along_axis(ref, best, -1)[..., 0] - _runner_up(ref, best)
        changed = np.take_along_axis(cand, best, -1)[..., 0] - _runner_up(cand, best)
        self.margins.extend(margin)
        self.changes.append((changed - margin).ravel())

    def predicted(self) -> float | None:
        if not self.margins:
            return None
        changes = np.sort(np.concatenate(self.changes))
        survive = [np.prod(share_at_least(changes, -m)) for m in self.margins]
        return float(np.mean(survive))


def _runner_up(scores: np.ndarray, best: np.ndarray) -> np.ndarray:
    """The highest score other than the ``best`` class's, per step."""
    others = scores.copy()
    np.put_along_axis(others, best, -np.inf, -1)
    return others.max(axis=-1)
