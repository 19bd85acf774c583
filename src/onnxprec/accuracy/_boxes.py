"""The boxes a detection head's outputs decode to, matched between the float model and a candidate.

A YOLO-style head writes, per anchor, 4 box values (centre x, centre y, width, height) beside class scores
(Sigmoid or Softmax; YOLOv5/YOLOX put one objectness score first, which multiplies the class scores). A user keeps
the anchors whose best score reaches a confidence threshold, suppresses overlapping ones (NMS), and reads boxes:
a candidate keeps the task when it finds the float model's boxes, of the same class, at IoU >= 0.5, and no others.
The check takes the worst of :data:`THRESHOLDS`, as the threshold is the user's.
"""

from __future__ import annotations

import numpy as np

THRESHOLDS = (0.25, 0.5)
"""Confidence thresholds the boxes are compared at (0.25: YOLOv8's default; 0.5: a common stricter one)."""
NMS_IOU = 0.45
"""Overlap above which NMS keeps the higher-scoring box of a class (YOLOv8's default)."""
MATCH_IOU = 0.5
"""Overlap at which a candidate's box finds a float box."""
MAX_BOXES = 300
"""Anchors kept per image before NMS, highest scores first (YOLOv8's ``max_det``)."""


def box_counts(ref: np.ndarray, cand: np.ndarray, axis: int, score_parts: tuple[tuple[int, int], ...]) -> np.ndarray:
    """Per threshold (:data:`THRESHOLDS`): [boxes matched, boxes of the side with more], summed over the batch.

    Args:
        ref: The float model's head, ``[N, 4 + K, A]`` or ``[N, A, 4 + K]`` (``axis`` is the channel axis).
        cand: The candidate's, same shape.
        axis: The axis of the box values and scores.
        score_parts: (start, stop) of each score part along ``axis``; the box is the 4 values before the first.
    """
    counts = np.zeros((len(THRESHOLDS), 2), np.int64)
    ref_rows, cand_rows = np.moveaxis(ref, axis, -1), np.moveaxis(cand, axis, -1)
    for r, c in zip(ref_rows.reshape(ref_rows.shape[0], -1, ref_rows.shape[-1]), cand_rows.reshape(
        cand_rows.shape[0], -1, cand_rows.shape[-1])):  # fmt: skip
        for i, threshold in enumerate(THRESHOLDS):
            want = _decode(r.astype(np.float32), score_parts, threshold)
            got = _decode(c.astype(np.float32), score_parts, threshold)
            counts[i] += (_matched(want, got), max(len(want[0]), len(got[0])))
    return counts


def _decode(rows: np.ndarray, score_parts: tuple[tuple[int, int], ...], threshold: float) -> tuple[np.ndarray, ...]:
    """(xyxy boxes, classes) after the threshold and per-class NMS, from ``[A, 4 + K]`` rows."""
    first = score_parts[0][0]
    box = rows[:, first - 4 : first]
    scores = np.concatenate([rows[:, start:stop] for start, stop in score_parts], axis=1)
    if score_parts[0][1] - first == 1 and scores.shape[1] > 1:  # objectness times class scores
        scores = scores[:, :1] * scores[:, 1:]
    best, classes = scores.max(axis=1), scores.argmax(axis=1)
    keep = np.flatnonzero(best >= threshold)
    keep = keep[np.argsort(-best[keep], kind="stable")][:MAX_BOXES]
    xyxy = np.concatenate([box[keep, :2] - box[keep, 2:] / 2, box[keep, :2] + box[keep, 2:] / 2], axis=1)
    overlap = _iou(xyxy, xyxy)
    same = classes[keep][:, None] == classes[keep][None, :]
    kept: list[int] = []
    for i in range(len(keep)):
        if not any(same[i, j] and overlap[i, j] >= NMS_IOU for j in kept):
            kept.append(i)
    return xyxy[kept], classes[keep][kept]


def _iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pairwise IoU of xyxy boxes."""
    low = np.maximum(a[:, None, :2], b[None, :, :2])
    high = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.prod(np.clip(high - low, 0, None), axis=2)
    area_a = np.prod(np.clip(a[:, 2:] - a[:, :2], 0, None), axis=1)
    area_b = np.prod(np.clip(b[:, 2:] - b[:, :2], 0, None), axis=1)
    union = area_a[:, None] + area_b[None, :] - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)


def _matched(want: tuple[np.ndarray, ...], got: tuple[np.ndarray, ...]) -> int:
    """Float boxes a distinct candidate box of the same class covers at IoU >= :data:`MATCH_IOU` (greedy, best
    overlap first)."""
    overlap = _iou(want[0], got[0]) * (want[1][:, None] == got[1][None, :])
    matched = 0
    while overlap.size and overlap.max() >= MATCH_IOU:
        i, j = np.unravel_index(int(overlap.argmax()), overlap.shape)
        overlap[i, :] = 0
        overlap[:, j] = 0
        matched += 1
    return matched
