"""The region and box matcher against the brute force it replaced: every pair's IoU, then the best remaining pair
taken until none reaches 0.5 (ties to the first in row-major order); and the connected regions against a flood
fill. Random boxes on an integer grid (exact ties, IoU exactly 0.5) and in float32, with perturbed copies so that
many pairs match."""

from __future__ import annotations

from collections import deque

import numpy as np
import pytest

from onnxprec.accuracy._boxes import MATCH_IOU, MIN_AREA, _iou, _matched, regions


def _brute_matched(want: tuple[np.ndarray, ...], got: tuple[np.ndarray, ...]) -> int:
    overlap = _iou(want[0][:, None], got[0][None]) * (want[1][:, None] == got[1][None, :])
    matched = 0
    while overlap.size and overlap.max() >= MATCH_IOU:
        i, j = np.unravel_index(int(overlap.argmax()), overlap.shape)
        overlap[i, :] = 0
        overlap[:, j] = 0
        matched += 1
    return matched


def _boxes(rng: np.random.Generator, n: int, grid: bool, dtype: type) -> np.ndarray:
    corner = rng.integers(0, 40, (n, 2)) if grid else rng.uniform(0, 40, (n, 2))
    size = rng.integers(1, 12, (n, 2)) if grid else rng.uniform(0.1, 12, (n, 2))
    return np.concatenate([corner, corner + size], axis=1).astype(dtype)


def _moved(rng: np.random.Generator, boxes: np.ndarray, grid: bool) -> np.ndarray:
    """Copies of ``boxes`` moved and resized a little (a candidate's view of the float boxes)."""
    step = rng.integers(-2, 3, boxes.shape) if grid else rng.normal(0, 1.0, boxes.shape)
    return (boxes + step).astype(boxes.dtype)


@pytest.mark.slow
@pytest.mark.parametrize("grid", [True, False])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_the_sweep_matches_as_many_boxes_as_the_brute_force(grid: bool, dtype: type) -> None:
    rng = np.random.default_rng(0)
    matched = 0
    for _ in range(300):
        n, m, classes = int(rng.integers(0, 30)), int(rng.integers(0, 30)), int(rng.integers(1, 3))
        want, want_classes = _boxes(rng, n, grid, dtype), rng.integers(0, classes, n)
        copies = min(m // 2, n)
        got = np.concatenate([_moved(rng, want[:copies], grid), _boxes(rng, m - copies, grid, dtype)])
        got_classes = np.concatenate([want_classes[:copies], rng.integers(0, classes, m - copies)])
        shuffle = rng.permutation(m)
        sides = (want, want_classes), (got[shuffle], got_classes[shuffle])
        assert _matched(*sides) == _brute_matched(*sides)
        matched += _brute_matched(*sides)
    assert matched > 500  # the draws do match boxes, not only miss them


def test_degenerate_boxes_match_nothing() -> None:
    """Zero and negative sizes have no area: no IoU, as in the brute force."""
    boxes = np.array([[5, 5, 5, 9], [3, 3, 1, 1], [0, 0, 4, 4]], np.float64)
    none = np.zeros(3, np.int64)
    assert _matched((boxes, none), (boxes.copy(), none)) == _brute_matched((boxes, none), (boxes, none)) == 1


def _flood_regions(mask: np.ndarray) -> list[tuple[int, ...]]:
    seen = np.zeros_like(mask, bool)
    found = []
    for y, x in zip(*np.nonzero(mask)):
        if seen[y, x]:
            continue
        seen[y, x] = True
        queue, pixels = deque([(y, x)]), []
        while queue:
            cy, cx = queue.popleft()
            pixels.append((cy, cx))
            for ny, nx in ((cy - 1, cx), (cy + 1, cx), (cy, cx - 1), (cy, cx + 1)):
                if 0 <= ny < mask.shape[0] and 0 <= nx < mask.shape[1] and mask[ny, nx] and not seen[ny, nx]:
                    seen[ny, nx] = True
                    queue.append((ny, nx))
        ys, xs = np.array(pixels).T
        if len(pixels) >= MIN_AREA:
            found.append((int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1))
    return sorted(found)


@pytest.mark.parametrize("density", [0.3, 0.5, 0.7])
def test_regions_are_the_connected_components_a_flood_fill_finds(density: float) -> None:
    rng = np.random.default_rng(1)
    for _ in range(20):
        mask = rng.random((int(rng.integers(1, 40)), int(rng.integers(1, 40)))) < density
        assert sorted(tuple(b) for b in regions(mask).astype(int).tolist()) == _flood_regions(mask)
