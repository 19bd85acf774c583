"""The quantizers' check: the float outputs it keeps stay within a budget (whole runs), and the guard's verdict
follows each output's task metric."""

from __future__ import annotations

import numpy as np

from onnxprec.accuracy import OutputMetric, Producer, ReferenceOutputs, TaskSummary
from onnxprec.quantization.guard import BoundedOutputs, describe_bounds, holds, judges_regions, short_of_defaults


def test_bounded_outputs_keep_whole_runs_within_the_budget() -> None:
    kept = BoundedOutputs(budget=6000)
    kept._names = frozenset({"a", "b"})  # what observer() sets from the model's outputs
    for _ in range(4):  # runs of two outputs of 2000 bytes each: one run and a half fit
        kept.update("a", np.zeros(500, np.float32))
        kept.update("b", np.zeros(500, np.float32))
    assert len(kept.outputs) == 1 and set(kept.outputs[0]) == {"a", "b"} and kept.limit == 1


def test_bounded_outputs_count_only_the_graph_outputs() -> None:
    """The reference run hands every tensor it fetched (activations for the ranges): they take none of the budget
    (PP-OCRv4's recognizer was checked on 1 of its 2 calibration runs)."""
    kept = BoundedOutputs(budget=6000)
    kept._names = frozenset({"y"})
    for _ in range(3):
        kept.update("activation", np.zeros(5000, np.float32))
        kept.update("y", np.zeros(100, np.float32))
    assert len(kept.outputs) == 3 and kept.limit is None and kept.kept_bytes == 1200


def _output(name: str, kind: str, metric: str, value: float, cosine: float, why: str = "") -> OutputMetric:
    return OutputMetric(name, kind, metric, value, 10, 1 - cosine, cosine, why)  # type: ignore[arg-type]


def test_an_embedding_within_int4s_bound_is_named_short_of_int8s() -> None:
    """paraphrase-MiniLM's INT4 pooled embedding at cosine 0.956 keeps INT4's 0.95, not the 0.99 an embedding keeps
    under INT8's guard: named; one at 0.995, a class output and one under INT4's own bound are not."""
    from onnxprec.quantization.int4._guard import BOUNDS

    embedding = _output("461", "values", "cosine", 0.95591, 0.95591)
    others = (_output("ok", "values", "cosine", 0.995, 0.995), _output("logits", "classes", "top1", 0.99, 0.96),
              _output("lost", "values", "cosine", 0.9, 0.9))  # fmt: skip
    assert short_of_defaults(TaskSummary((embedding, *others)), BOUNDS) == "461 cosine 0.95591 < 0.99"
    assert short_of_defaults(TaskSummary((embedding,)), {**BOUNDS, "values": 0.99}) == ""


def test_the_verdict_follows_each_outputs_kind() -> None:
    scores = _output("logits", "classes", "top1", 0.99, 0.95)
    assert holds(TaskSummary((scores,)))  # 0.99 >= 0.98 agreement; the cosine is not the classes' metric
    assert not holds(TaskSummary((_output("logits", "classes", "top1", 0.97, 0.9999),)))
    mask = _output("map", "mask", "mask_iou", 0.85, 0.99)
    assert not holds(TaskSummary((mask,))) and describe_bounds(TaskSummary((mask,))) == "map mask_iou >= 0.9"
    lm = _output("logits", "sequence", "step_agreement", 0.86, 0.995, why="named like logits")
    assert holds(TaskSummary((lm,))) and describe_bounds(TaskSummary((lm,))) == "logits cosine >= 0.99"
    kv = _output("present.0.key", "values", "cosine", 0.5, 0.5)
    assert holds(TaskSummary((scores, kv)))  # a KV cache output is not judged


def test_a_ctc_sequence_is_held_to_identical_strings() -> None:
    """PP-OCRv4's recognizer kept 99.1 % of its steps and 91.7 % of its strings: only the strings' bound refuses it.
    ddddocr's, predicted 99.0 % on its calibration crops, kept 91.7 % of the held-out ones: refused too."""
    ctc = _output("softmax_11.tmp_0", "sequence", "string_agreement", 44 / 48, 0.998)
    assert not holds(TaskSummary((ctc,)))
    assert describe_bounds(TaskSummary((ctc,))) == "softmax_11.tmp_0 string_agreement >= 0.993"
    assert not holds(TaskSummary((_output("387", "sequence", "string_agreement", 0.99, 0.999),)))
    assert holds(TaskSummary((_output("387", "sequence", "string_agreement", 0.995, 0.9),)))
    assert holds(TaskSummary((_output("387", "sequence", "string_agreement", 0.99, 0.999),)), held_out=True)


def test_detections_and_waveforms_are_held_to_the_task_bounds() -> None:
    """nudenet kept a part cosine of 0.9966 with one of 7 boxes changed; hifigan kept a cosine of 0.9947 at 19.8 dB:
    both passed the old cosine bound, neither passes its task bound."""
    boxes = _output("output0", "detections", "box_agreement", 6 / 7, 0.99997)
    assert not holds(TaskSummary((boxes,)))
    assert describe_bounds(TaskSummary((boxes,))) == "output0 box_agreement >= 0.95"
    assert holds(TaskSummary((_output("output0", "detections", "box_agreement", 1.0, 0.98),)))
    audio = _output("audio", "signal", "snr", 19.8, 0.9947)
    assert not holds(TaskSummary((audio,))) and describe_bounds(TaskSummary((audio,))) == "audio snr >= 25"
    assert holds(TaskSummary((_output("audio", "signal", "snr", 25.5, 0.9986),)))


def test_held_out_strings_need_no_room_for_the_fit() -> None:
    """A PP-OCRv4 recognizer result predicted 99.1 % on its calibration crops and 98.9 % on its 4 held-out ones
    (all seen identical) kept 95.8 % of 48 other held-out crops, over the task's 0.95: the held-out runs' bound,
    0.98, accepts it; the calibration runs' stays 0.99 (the ranges were fitted to those crops)."""
    ctc = _output("softmax_11.tmp_0", "sequence", "string_agreement", 0.989, 0.9999)
    assert not holds(TaskSummary((ctc,))) and holds(TaskSummary((ctc,)), held_out=True)
    assert describe_bounds(TaskSummary((ctc,)), held_out=True) == "softmax_11.tmp_0 string_agreement >= 0.98"
    assert not holds(TaskSummary((_output("y", "sequence", "string_agreement", 0.975, 0.9999),)), held_out=True)
    for kind, metric in (("classes", "top1"), ("mask", "mask_iou"), ("values", "cosine")):  # only sequences differ
        other = TaskSummary((_output("y", kind, metric, 0.979, 0.979),))
        assert describe_bounds(other) == describe_bounds(other, held_out=True)


def test_a_sigmoid_map_is_judged_by_regions_a_detection_head_is_not() -> None:
    """The float fallback's own-error ranking is for region maps: a text detector's ``[N, 1, H, W]`` Sigmoid map,
    not a ``[N, 1]`` score, nor a YOLO head's ``[N, 4 + K, A]`` Concat."""
    rng = np.random.default_rng(0)
    kept = ReferenceOutputs()
    kept.outputs = [{"map": rng.random((1, 1, 32, 32), dtype=np.float32)}]
    assert judges_regions(kept, {"map": Producer("Sigmoid")})
    assert not judges_regions(kept, {"map": Producer("Conv")})  # values
    kept.outputs = [{"score": rng.random((2, 1), dtype=np.float32), "head": rng.random((1, 6, 50), dtype=np.float32)}]
    head = Producer("Concat", 1, parts=(("Mul", 4), ("Sigmoid", 2)))
    assert not judges_regions(kept, {"score": Producer("Sigmoid"), "head": head})
    assert not judges_regions(ReferenceOutputs(), {})  # nothing kept
