"""The boxes a detection head's outputs decode to, matched between the float model and a candidate.

A YOLO-style head writes, per anchor, 4 box values (centre x, centre y, width, height) beside class scores
(Sigmoid or Softmax; YOLOv5/YOLOX put one objectness score first, which multiplies the class scores). A user keeps
the anchors whose best score reaches a confidence threshold, suppresses overlapping ones (NMS), and reads boxes:
a candidate keeps the task when it finds the float model's boxes, of the same class, at IoU >= 0.5, and no others.
The check takes the worst of :data:`THRESHOLDS`, as the threshold is the user's.

A check on a few images sees few boxes, and one that sees them all kept says little of a 5 % loss: with fewer than
:data:`MIN_BOXES` boxes, :class:`ScoreMargins` predicts the share from how far each box's score is from the
threshold, against how much the candidate moved the scores near it.

A text detector's probability map (``[N, C, H, W]`` after a Sigmoid: DB, PP-OCR) is read the same way: its user cuts
it at a threshold and takes each connected region's bounding box (:func:`regions`); :func:`region_counts` matches
the float map's boxes with the candidate's at each of :data:`REGION_THRESHOLDS`.
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
MIN_BOXES = 60
"""The fewest boxes whose share, all seen matched, shows a loss under 5 %: with none lost among ``n``, a loss rate
of ``3 / n`` is still likely (the rule of three, 95 % confidence), and ``3 / 60`` is 5 %. Fewer boxes are judged by
the lower of the share seen and the share :class:`ScoreMargins` predicts (the result that set it:
experiments/design_notes.md, "INT8 accuracy guard")."""
REGION_THRESHOLDS = (0.3, 0.5)
"""Probabilities a map is cut at into regions (0.3: DB's and PP-OCR's binarization; 0.5: the even odds)."""
MIN_AREA = 4
"""The fewest pixels of a region counted (smaller ones are noise a detector's post-processing drops)."""
LEVEL_SHARES = ((16, 4, 1), (64, 16, 4, 1))
"""The anchors of a feature pyramid's levels, finest first, in proportion (strides 8, 16, 32, and 8 to 64 with a
P6 level, on an image whose sides the coarsest stride divides): a head of ``A`` anchors, ``A`` a multiple of their
sum, is split so (:func:`level_sizes`)."""
SCORE_FLOOR = 0.01
"""The lowest float score of an anchor whose score change counts (:class:`ScoreMargins`), and of a box below the
threshold that could cross it; below it a Sigmoid's logit is the background's, far from any threshold."""


def box_counts(
    ref: np.ndarray,
    cand: np.ndarray,
    axis: int,
    score_parts: tuple[tuple[int, int], ...],
    thresholds: tuple[float, ...] = THRESHOLDS,
) -> np.ndarray:
    """Per threshold (``thresholds``): [boxes matched, boxes of the side with more], summed over the batch.

    Args:
        ref: The float model's head, ``[N, 4 + K, A]`` or ``[N, A, 4 + K]`` (``axis`` is the channel axis).
        cand: The candidate's, same shape.
        axis: The axis of the box values and scores.
        score_parts: (start, stop) of each score part along ``axis``; the box is the 4 values before the first.
    """
    counts = np.zeros((len(thresholds), 2), np.int64)
    ref_rows, cand_rows = np.moveaxis(ref, axis, -1), np.moveaxis(cand, axis, -1)
    for r, c in zip(ref_rows.reshape(ref_rows.shape[0], -1, ref_rows.shape[-1]), cand_rows.reshape(
        cand_rows.shape[0], -1, cand_rows.shape[-1])):  # fmt: skip
        for i, threshold in enumerate(thresholds):
            want = _decode(r.astype(np.float32), score_parts, threshold)
            got = _decode(c.astype(np.float32), score_parts, threshold)
            counts[i] += (_matched(want, got), max(len(want[0]), len(got[0])))
    return counts


def tally(
    ref: np.ndarray,
    cand: np.ndarray,
    axis: int,
    score_parts: tuple[tuple[int, int], ...],
    margins: ScoreMargins,
    levels: tuple[int, ...] | None = None,
) -> np.ndarray:
    """:func:`box_counts` of a candidate's head against the float one's (of another shape: every float box lost) at
    ``margins``' thresholds, its score changes added to ``margins`` (``levels``: as :meth:`ScoreMargins.update`)."""
    if ref.shape != cand.shape:
        return box_counts(ref, ref, axis, score_parts, margins.thresholds) * [0, 1]
    margins.update(ref, cand, axis, score_parts, levels)
    return box_counts(ref, cand, axis, score_parts, margins.thresholds)


def level_sizes(anchors: int) -> tuple[int, ...]:
    """The anchors of each pyramid level of a head of ``anchors`` (:data:`LEVEL_SHARES`; one level otherwise)."""
    for shares in LEVEL_SHARES:
        if anchors % sum(shares) == 0:
            return tuple(anchors // sum(shares) * share for share in shares)
    return (anchors,)


def _scores(rows: np.ndarray, score_parts: tuple[tuple[int, int], ...]) -> np.ndarray:
    """``[A, K]`` class scores of ``[A, 4 + K]`` rows (an objectness first multiplies the class scores)."""
    first = score_parts[0][0]
    scores = np.concatenate([rows[:, start:stop] for start, stop in score_parts], axis=1)
    if score_parts[0][1] - first == 1 and scores.shape[1] > 1:  # objectness times class scores
        scores = scores[:, :1] * scores[:, 1:]
    return scores


def _select(
    rows: np.ndarray, score_parts: tuple[tuple[int, int], ...], threshold: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(anchor indices, xyxy boxes, classes) after the threshold and per-class NMS, from ``[A, 4 + K]`` rows."""
    first = score_parts[0][0]
    box = rows[:, first - 4 : first]
    scores = _scores(rows, score_parts)
    best, classes = scores.max(axis=1), scores.argmax(axis=1)
    keep = np.flatnonzero(best >= threshold)
    keep = keep[np.argsort(-best[keep], kind="stable")][:MAX_BOXES]
    xyxy = np.concatenate([box[keep, :2] - box[keep, 2:] / 2, box[keep, :2] + box[keep, 2:] / 2], axis=1)
    covers = (_iou(xyxy[:, None], xyxy[None]) >= NMS_IOU) & (classes[keep][:, None] == classes[keep][None, :])
    suppressed = np.zeros(len(keep), bool)
    kept: list[int] = []
    for i in range(len(keep)):  # each box kept suppresses the lower-scoring ones of its class it covers
        if not suppressed[i]:
            kept.append(i)
            suppressed |= covers[i]
    return keep[kept], xyxy[kept], classes[keep][kept]


def _decode(rows: np.ndarray, score_parts: tuple[tuple[int, int], ...], threshold: float) -> tuple[np.ndarray, ...]:
    """(xyxy boxes, classes) after the threshold and per-class NMS, from ``[A, 4 + K]`` rows."""
    return _select(rows, score_parts, threshold)[1:]


def _iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of xyxy boxes ``[..., 4]``, broadcast over the leading axes (``a[:, None], b[None]``: every pair)."""
    low = np.maximum(a[..., :2], b[..., :2])
    high = np.minimum(a[..., 2:], b[..., 2:])
    inter = np.prod(np.clip(high - low, 0, None), axis=-1)
    area_a = np.prod(np.clip(a[..., 2:] - a[..., :2], 0, None), axis=-1)
    area_b = np.prod(np.clip(b[..., 2:] - b[..., :2], 0, None), axis=-1)
    union = area_a + area_b - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)


def _near_pairs(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(i, j) of the boxes ``b[j]`` whose centre lies in ``a[i]`` widened by a quarter of its size on each side.

    IoU >= 1/2 puts each box's centre inside the other (closed) box, so these pairs hold every pair at or above
    :data:`MATCH_IOU`; the quarter covers rounding. ``b``'s centres are sorted along x and along y, and each ``a``
    box takes its slice along the axis that cuts fewer of them: ``O((n + m) log m)`` plus the pairs listed.
    """
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    centres = (b64[:, :2] + b64[:, 2:]) / 2
    margin = (a64[:, 2:] - a64[:, :2]) / 4
    low, high = a64[:, :2] - margin, a64[:, 2:] + margin
    sweeps = []
    for axis in (0, 1):
        order = np.argsort(centres[:, axis], kind="stable")
        start = np.searchsorted(centres[order, axis], low[:, axis], side="left")
        stop = np.searchsorted(centres[order, axis], high[:, axis], side="right")
        sweeps.append((order, start, np.maximum(stop - start, 0)))
    along_y = sweeps[1][2] < sweeps[0][2]
    pairs_i, pairs_j = [], []
    for (order, start, count), rows in zip(sweeps, (np.flatnonzero(~along_y), np.flatnonzero(along_y))):
        start, count = start[rows], count[rows]
        pairs_i.append(np.repeat(rows, count))
        pairs_j.append(order[np.repeat(start - np.cumsum(count) + count, count) + np.arange(int(count.sum()))])
    return np.concatenate(pairs_i), np.concatenate(pairs_j)


def _matched(want: tuple[np.ndarray, ...], got: tuple[np.ndarray, ...]) -> int:
    """Float boxes a distinct candidate box of the same class covers at IoU >= :data:`MATCH_IOU` (greedy, best
    overlap first, ties to the lower float then candidate index: the pairs at or above it taken in that order, each
    box once; only pairs :func:`_near_pairs` lists can reach it)."""
    if not len(want[0]) or not len(got[0]):
        return 0
    i, j = _near_pairs(want[0], got[0])
    overlap = _iou(want[0][i], got[0][j]) * (want[1][i] == got[1][j])
    keep = overlap >= MATCH_IOU
    i, j, overlap = i[keep], j[keep], overlap[keep]
    used_want, used_got = np.zeros(len(want[0]), bool), np.zeros(len(got[0]), bool)
    matched = 0
    order = np.lexsort((j, i, -overlap))
    for w, g in zip(i[order].tolist(), j[order].tolist()):
        if not used_want[w] and not used_got[g]:
            used_want[w] = used_got[g] = True
            matched += 1
    return matched


def regions(mask: np.ndarray, min_area: int = MIN_AREA) -> np.ndarray:
    """xyxy bounding boxes ``[K, 4]`` of the 4-connected regions of a 2-D boolean mask with at least ``min_area``
    pixels (union-find over the runs of each row, each row's runs swept against the previous row's)."""
    parent: list[int] = []
    runs: list[tuple[int, int, int]] = []  # (row, start, end)

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    previous: list[int] = []
    for y, row in enumerate(mask):
        edges = np.flatnonzero(np.diff(np.concatenate([[False], row, [False]]).astype(np.int8)))
        current, first = [], 0
        for start, end in zip(edges[::2].tolist(), edges[1::2].tolist()):
            index = len(runs)
            runs.append((y, start, end))
            parent.append(index)
            while first < len(previous) and runs[previous[first]][2] <= start:  # ends before this run
                first += 1
            touching = first  # the previous row's runs are sorted: those touching this one follow
            while touching < len(previous) and runs[previous[touching]][1] < end:
                a, b = find(previous[touching]), find(index)
                parent[max(a, b)] = min(a, b)
                touching += 1
            current.append(index)
        previous = current
    found: dict[int, list[int]] = {}
    for i, (y, start, end) in enumerate(runs):
        box = found.setdefault(find(i), [start, y, end, y + 1, 0])
        box[:] = [min(box[0], start), min(box[1], y), max(box[2], end), max(box[3], y + 1), box[4] + end - start]
    return np.asarray([v[:4] for v in found.values() if v[4] >= min_area], np.float64).reshape(-1, 4)


def region_counts(ref: np.ndarray, cand: np.ndarray) -> np.ndarray:
    """Per threshold (:data:`REGION_THRESHOLDS`): [regions matched, regions of the side with more], summed over
    every ``[H, W]`` map of ``[..., H, W]`` probability maps (same shapes)."""
    counts = np.zeros((len(REGION_THRESHOLDS), 2), np.int64)
    for r, c in zip(ref.reshape(-1, *ref.shape[-2:]), cand.reshape(-1, *cand.shape[-2:])):
        for i, threshold in enumerate(REGION_THRESHOLDS):
            want, got = regions(r > threshold), regions(c > threshold)
            none_w, none_g = np.zeros(len(want), np.int64), np.zeros(len(got), np.int64)
            counts[i] += (_matched((want, none_w), (got, none_g)), max(len(want), len(got)))
    return counts


def share_at_least(changes: np.ndarray, values: np.ndarray | float) -> np.ndarray:
    """Per value, the share of the sorted ``changes`` at least that large: the chance a change reaches it."""
    return 1.0 - np.searchsorted(changes, values, side="left") / changes.size


def expected_share(changes: np.ndarray, margins: np.ndarray, below: np.ndarray, levels: tuple[np.ndarray, ...] = (
    np.zeros(0, np.int64),) * 3) -> float:  # fmt: skip
    """The share of float items (boxes, mask entries) expected kept over the float items plus those expected to
    appear: an item over the threshold by ``margins`` stays when its change is at least ``-margin``, one under it by
    ``below`` appears when its change reaches that, each by the ``changes`` of its own level (``levels``: the level
    of each change, margin and distance; none: one level). With no float item, 1 minus the chances that one appears
    (at most their sum)."""
    of_change, of_margin, of_below = (lv if lv.size else np.zeros(a.size, np.int64) for lv, a in zip(
        levels, (changes, margins, below)))  # fmt: skip
    kept = appear = 0.0
    for level in np.unique(of_change):
        noise = np.sort(changes[of_change == level])
        kept += float(share_at_least(noise, -margins[of_margin == level]).sum())
        appear += float(share_at_least(noise, below[of_below == level]).sum())
    if not margins.size:
        return max(0.0, 1.0 - appear)
    return kept / (margins.size + appear)


def logit(p: np.ndarray | float) -> np.ndarray:
    q = np.clip(np.asarray(p, np.float64), 1e-7, 1 - 1e-7)
    return np.log(q / (1 - q))


class ScoreMargins:
    """The share of boxes matched that a detection head's score margins predict, at the worst of ``thresholds``
    (default :data:`THRESHOLDS`), for checks on few boxes (:data:`MIN_BOXES`).

    A float box is lost when its score falls below the threshold, and a box appears when an anchor below it rises
    past it. Scores change in logit units (a Sigmoid's input, where the error is alike at every score): each box's
    margin is its float score's logit minus the threshold's, and the changes of every anchor's score (of its float
    class, where either model scores at least :data:`SCORE_FLOOR`) are the noise, as :class:`~onnxprec.accuracy.
    StepMargins` does for a CTC step. A box of margin ``m`` survives with probability ``P(change >= -m)``; an anchor
    below the threshold by ``d`` that NMS would keep (no float box of its class covers it at IoU >= :data:`NMS_IOU`)
    appears with probability ``P(change >= d)``. The share is the boxes expected kept over the float boxes plus the
    ones expected to appear (without a float box: 1 minus the chances that one appears).

    The levels of a feature pyramid change alike within themselves, not across them (a coarse level's anchors, few,
    move more when a layer of its own branch is quantized): each box and anchor below is judged by the changes of
    its own level's anchors (:func:`level_sizes`).
    """

    def __init__(self, thresholds: tuple[float, ...] = THRESHOLDS) -> None:
        self.thresholds = thresholds
        self.changes: list[np.ndarray] = []
        self.kept: dict[float, list[np.ndarray]] = {t: [] for t in thresholds}  # float boxes' margins
        self.below: dict[float, list[np.ndarray]] = {t: [] for t in thresholds}  # distances of anchors below
        self.levels: dict[str, list[np.ndarray]] = {"changes": []}  # the level of each, keyed as above

    def update(
        self,
        ref: np.ndarray,
        cand: np.ndarray,
        axis: int,
        score_parts: tuple[tuple[int, int], ...],
        levels: tuple[int, ...] | None = None,
    ) -> None:
        """Adds a batch of the float head and the candidate's (same shapes; as :func:`box_counts`); ``levels``: the
        anchors of each level in order (default: :func:`level_sizes` of the anchors)."""
        ref_rows, cand_rows = np.moveaxis(ref, axis, -1), np.moveaxis(cand, axis, -1)
        width = ref_rows.shape[-1]
        anchors = int(np.prod(ref_rows.shape[1:-1]))
        sizes = levels if levels is not None and sum(levels) == anchors else level_sizes(anchors)
        level_of = np.repeat(np.arange(len(sizes)), sizes)
        for r, c in zip(ref_rows.reshape(ref_rows.shape[0], -1, width), cand_rows.reshape(
            cand_rows.shape[0], -1, width)):  # fmt: skip
            r, c = r.astype(np.float32), c.astype(np.float32)
            scores = _scores(r, score_parts)
            best, classes = scores.max(axis=1), scores.argmax(axis=1)
            moved = np.take_along_axis(_scores(c, score_parts), classes[:, None], 1)[:, 0]
            near = (best >= SCORE_FLOOR) | (moved >= SCORE_FLOOR)
            self.changes.append(logit(moved[near]) - logit(best[near]))
            self.levels["changes"].append(level_of[near])
            low, low_xyxy, low_classes = _select(r, score_parts, SCORE_FLOOR)
            for threshold in self.thresholds:
                index, xyxy, cls = _select(r, score_parts, threshold)
                self.kept[threshold].append(logit(best[index]) - logit(threshold))
                self.levels.setdefault(f"kept {threshold}", []).append(level_of[index])
                under = best[low] < threshold
                overlap = _iou(low_xyxy[:, None], xyxy[None]) * (low_classes[:, None] == cls[None, :])
                covered = (overlap >= NMS_IOU).any(axis=1)
                self.below[threshold].append(logit(threshold) - logit(best[low[under & ~covered]]))
                self.levels.setdefault(f"below {threshold}", []).append(level_of[low[under & ~covered]])

    def predicted(self) -> float | None:
        """The predicted share at the worse threshold; None before any batch."""
        if not self.changes:
            return None
        changes = np.concatenate(self.changes)
        if not changes.size:
            return 1.0
        shares = []
        for t in self.kept:
            keys = ("changes", f"kept {t}", f"below {t}")
            levels = tuple(np.concatenate(self.levels.get(k) or [np.zeros(0, np.int64)]) for k in keys)
            shares.append(expected_share(changes, np.concatenate(self.kept[t]), np.concatenate(self.below[t]), levels))
        return min(shares)
