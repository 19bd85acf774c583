"""Task metrics of the corpus models (``zoo.corpus``): a candidate's outputs judged against FP32's, per kind.

Each metric takes the outputs of FP32 and of the candidate on the same held-out batches (a list of
``{output name: array}``, one per batch) and returns ``{"value": ..., ...details}``; :func:`judge` runs the one a
manifest entry names and says whether its bound holds. Every float output also gets its relative L2 error
(:func:`max_rel_l2`, the worst output).

- ``top1``: top-1 agreement (and top-5: FP32's class among the candidate's five best) of ``[N, classes]`` scores
  or of a label output;
- ``ctc``: the fraction of strings decoded identically (greedy CTC: argmax, collapse repeats, drop the blank);
- ``boxes``: boxes decoded from the outputs (:data:`DECODERS`), FP32's matched one to one at IoU >= 0.5 with the
  same class; the value is min(recall, precision), so that extra boxes count too;
- ``decision``: agreement of the thresholded score (p >= 0.5) of ``[N, 1]`` or ``[N]`` outputs;
- ``snr``: signal-to-noise ratio in dB of the candidate against FP32;
- ``cosine``: the mean cosine of the rows (samples) of an embedding output;
- ``mask_iou``: IoU of the masks thresholded at 0.5.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from onnxprec import metrics
from onnxprec.accuracy._boxes import regions

Outputs = Sequence[Mapping[str, np.ndarray]]
Boxes = tuple[np.ndarray, np.ndarray]  # [K, 4] x1 y1 x2 y2, [K] class ids


def _pick(outs: Outputs, name: str | None) -> list[np.ndarray]:
    return [np.asarray(o[name] if name else next(iter(o.values()))) for o in outs]


# ------------------------------------------------------------------------------------------------------------
# classification, sequences, scores, signals, embeddings
# ------------------------------------------------------------------------------------------------------------


def top1(ref: Outputs, got: Outputs, name: str | None = None, labels: bool = False, **_: Any) -> dict[str, Any]:
    """Top-1 (and top-5) agreement of class scores ``[N, classes]`` (``labels``: an output of class ids)."""
    r, g = np.concatenate(_pick(ref, name)), np.concatenate(_pick(got, name))
    if labels:
        return {"value": float(np.mean(r == g)), "n": int(r.size)}
    r, g = r.reshape(-1, r.shape[-1]), g.reshape(-1, g.shape[-1])
    best = r.argmax(-1)
    k = min(5, r.shape[-1])
    top5 = np.argsort(-g, axis=-1)[:, :k]
    return {"value": float(np.mean(best == g.argmax(-1))), "top5": float(np.mean((top5 == best[:, None]).any(-1))),
            "n": len(best)}  # fmt: skip


def ctc_decode(scores: np.ndarray, layout: str = "NTC", blank: int = 0) -> list[tuple[int, ...]]:
    """Greedy CTC decoding: per sample the argmax class of each step, repeats collapsed, blanks dropped.
    ``layout``: ``NTC`` / ``TNC`` scores, or ``ids`` (``[N, T]`` class ids already)."""
    if layout == "ids":
        ids = np.rint(scores).astype(np.int64).reshape(scores.shape[0], -1)
    else:
        ids = (scores.transpose(1, 0, 2) if layout == "TNC" else scores).argmax(-1)
    out = []
    for row in ids:
        keep = np.ones(len(row), bool)
        keep[1:] = row[1:] != row[:-1]
        out.append(tuple(int(c) for c in row[keep] if c != blank))
    return out


def ctc(ref: Outputs, got: Outputs, name: str | None = None, layout: str = "NTC", blank: int = 0,
        **_: Any) -> dict[str, Any]:  # fmt: skip
    """The fraction of samples whose decoded string equals FP32's."""
    r = [s for x in _pick(ref, name) for s in ctc_decode(x, layout, blank)]
    g = [s for x in _pick(got, name) for s in ctc_decode(x, layout, blank)]
    same = sum(a == b for a, b in zip(r, g))
    return {"value": same / max(1, len(r)), "n": len(r), "empty_fp32": sum(not s for s in r),
            "empty": sum(not s for s in g)}  # fmt: skip


def decision(ref: Outputs, got: Outputs, name: str | None = None, threshold: float = 0.5, **_: Any) -> dict[str, Any]:
    """Agreement of ``score >= threshold`` (a speech or wake-word probability), with the largest score change."""
    r, g = np.concatenate([x.ravel() for x in _pick(ref, name)]), np.concatenate([x.ravel() for x in _pick(got, name)])
    return {"value": float(np.mean((r >= threshold) == (g >= threshold))), "n": int(r.size),
            "positives_fp32": int((r >= threshold).sum()), "max_abs": float(np.max(np.abs(r - g)))}  # fmt: skip


def snr_db(reference: np.ndarray, candidate: np.ndarray) -> float:
    """10 log10(signal power / error power); inf when identical, -inf for a non-finite candidate."""
    ref, cand = np.asarray(reference, np.float64), np.asarray(candidate, np.float64)
    if not np.isfinite(cand).all():
        return -math.inf
    noise = float(np.sum((ref - cand) ** 2))
    return math.inf if noise == 0 else 10 * math.log10(max(float(np.sum(ref**2)), 1e-30) / noise)


def snr(ref: Outputs, got: Outputs, name: str | None = None, **_: Any) -> dict[str, Any]:
    """SNR of the whole output (waveform or spectrogram) over all batches, and of the worst batch."""
    r, g = _pick(ref, name), _pick(got, name)
    per = [snr_db(a, b) for a, b in zip(r, g)]
    whole = snr_db(np.concatenate([a.ravel() for a in r]), np.concatenate([b.ravel() for b in g]))
    return {"value": whole, "worst": min(per), "n": len(per)}


def cosine(ref: Outputs, got: Outputs, name: str | None = None, **_: Any) -> dict[str, Any]:
    """Cosine of each sample's embedding (axis 0 = samples) with FP32's: the mean and the worst."""
    r = np.concatenate([x.reshape(x.shape[0], -1) for x in _pick(ref, name)]).astype(np.float64)
    g = np.concatenate([x.reshape(x.shape[0], -1) for x in _pick(got, name)]).astype(np.float64)
    if not np.isfinite(g).all():
        return {"value": -1.0, "worst": -1.0, "n": len(r), "nonfinite": True}
    den = np.linalg.norm(r, axis=1) * np.linalg.norm(g, axis=1)
    cos = np.where(den > 0, (r * g).sum(1) / np.where(den > 0, den, 1), 1.0)
    return {"value": float(cos.mean()), "worst": float(cos.min()), "n": len(cos)}


def mask_iou(ref: Outputs, got: Outputs, name: str | None = None, threshold: float = 0.5, **_: Any) -> dict[str, Any]:
    """IoU of ``output > threshold`` with FP32's (all pixels of all samples)."""
    r = np.concatenate([x.ravel() for x in _pick(ref, name)]) > threshold
    g = np.concatenate([x.ravel() for x in _pick(got, name)]) > threshold
    union = int((r | g).sum())
    return {"value": 1.0 if union == 0 else float((r & g).sum() / union), "fp32_pixels": int(r.sum())}


# ------------------------------------------------------------------------------------------------------------
# boxes
# ------------------------------------------------------------------------------------------------------------


def iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pairwise IoU of boxes ``a`` [K, 4] and ``b`` [M, 4] (x1, y1, x2, y2) -> [K, M]."""
    if len(a) == 0 or len(b) == 0:
        return np.zeros((len(a), len(b)))
    x1 = np.maximum(a[:, None, 0], b[None, :, 0])
    y1 = np.maximum(a[:, None, 1], b[None, :, 1])
    x2 = np.minimum(a[:, None, 2], b[None, :, 2])
    y2 = np.minimum(a[:, None, 3], b[None, :, 3])
    inter = np.clip(x2 - x1, 0, None) * np.clip(y2 - y1, 0, None)
    area = lambda z: (z[:, 2] - z[:, 0]) * (z[:, 3] - z[:, 1])  # noqa: E731
    union = area(a)[:, None] + area(b)[None, :] - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)


def nms(boxes: np.ndarray, scores: np.ndarray, classes: np.ndarray, threshold: float = 0.45) -> Boxes:
    """Per-class non-maximum suppression: the kept boxes and classes, best score first."""
    order = np.argsort(-scores)
    keep: list[int] = []
    for i in order:
        if all(classes[j] != classes[i] or iou(boxes[i : i + 1], boxes[j : j + 1])[0, 0] < threshold for j in keep):
            keep.append(int(i))
    return boxes[keep].reshape(-1, 4), classes[keep]


def match(ref: Boxes, got: Boxes, threshold: float = 0.5) -> int:
    """How many of ``ref``'s boxes a distinct ``got`` box of the same class covers at IoU >= ``threshold``
    (greedy, highest IoU first)."""
    m = iou(ref[0], got[0])
    m[ref[1][:, None] != got[1][None, :]] = 0
    matched = 0
    while m.size and m.max() >= threshold:
        i, j = np.unravel_index(int(m.argmax()), m.shape)
        matched += 1
        m[i, :] = 0
        m[:, j] = 0
    return matched


def components(mask: np.ndarray, min_area: int = 4) -> np.ndarray:
    """Bounding boxes [K, 4] of the 4-connected regions of a 2-D boolean mask with at least ``min_area`` pixels
    (the accuracy guard's :func:`onnxprec.accuracy._boxes.regions`)."""
    return regions(mask, min_area)


def _prob_map(outs: Mapping[str, np.ndarray], name: str | None, threshold: float = 0.3, channel: int = 0,
              **_: Any) -> list[Boxes]:  # fmt: skip
    x = np.asarray(outs[name] if name else next(iter(outs.values())))
    x = x[:, channel] if x.ndim == 4 else x
    out = []
    for m in x:
        b = components(m > threshold)
        out.append((b, np.zeros(len(b), np.int64)))
    return out


def _yolov8(outs: Mapping[str, np.ndarray], name: str | None, threshold: float = 0.25, **_: Any) -> list[Boxes]:
    x = np.asarray(outs[name] if name else next(iter(outs.values())))  # [N, 4 + classes, anchors]
    out = []
    for a in x.transpose(0, 2, 1):
        scores, cls = a[:, 4:].max(1), a[:, 4:].argmax(1)
        keep = scores >= threshold
        cx, cy, w, h = a[keep, :4].T
        out.append(nms(np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], 1), scores[keep], cls[keep]))
    return out


def _yolox(outs: Mapping[str, np.ndarray], name: str | None, threshold: float = 0.3,
           strides: Sequence[int] = (8, 16, 32), **_: Any) -> list[Boxes]:  # fmt: skip
    x = np.asarray(outs[name] if name else next(iter(outs.values())))  # [N, anchors, 5 + classes], raw
    side = math.sqrt(x.shape[1] / sum(1 / s**2 for s in strides))
    grids, steps = [], []
    for s in strides:
        n = round(side / s)
        gy, gx = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
        grids.append(np.stack([gx.ravel(), gy.ravel()], 1))
        steps.append(np.full((n * n, 1), s))
    grid, stride = np.concatenate(grids), np.concatenate(steps)
    out = []
    for a in x:
        xy, wh = (a[:, :2] + grid) * stride, np.exp(np.clip(a[:, 2:4], -10, 10)) * stride
        scores = a[:, 4] * a[:, 5:].max(1)
        cls = a[:, 5:].argmax(1)
        keep = scores >= threshold
        box = np.concatenate([xy - wh / 2, xy + wh / 2], 1)[keep]
        out.append(nms(box, scores[keep], cls[keep]))
    return out


def _picodet(outs: Mapping[str, np.ndarray], name: str | None, threshold: float = 0.5,
             strides: Sequence[int] = (8, 16, 32, 64), **_: Any) -> list[Boxes]:  # fmt: skip
    values = list(outs.values())
    levels = len(strides)
    cls_out, reg_out = values[:levels], values[levels:]
    n = cls_out[0].shape[0]
    result = []
    for i in range(n):
        boxes, scores, classes = [], [], []
        for s, c, r in zip(strides, cls_out, reg_out):
            cells = c.shape[1]
            w = round(math.sqrt(cells * 608 / 800)) if cells > 1 else 1
            h = math.ceil(cells / w)
            cy, cx = np.divmod(np.arange(cells), w)
            del h
            bins = r[i].reshape(cells, 4, -1)
            p = np.exp(bins - bins.max(-1, keepdims=True))
            dist = (p / p.sum(-1, keepdims=True) * np.arange(bins.shape[-1])).sum(-1) * s
            ctr = np.stack([(cx + 0.5) * s, (cy + 0.5) * s], 1)
            boxes.append(np.concatenate([ctr - dist[:, :2], ctr + dist[:, 2:]], 1))
            scores.append(c[i].max(1))
            classes.append(c[i].argmax(1))
        b, sc, cl = np.concatenate(boxes), np.concatenate(scores), np.concatenate(classes)
        keep = sc >= threshold
        result.append(nms(b[keep], sc[keep], cl[keep]))
    return result


DECODERS: dict[str, Callable[..., list[Boxes]]] = {
    "prob_map": _prob_map,
    "yolov8": _yolov8,
    "yolox": _yolox,
    "picodet": _picodet,
}


def boxes(
    ref: Outputs, got: Outputs, name: str | None = None, decode: str = "yolov8", **options: Any
) -> dict[str, Any]:
    """FP32's boxes matched by the candidate's (IoU >= 0.5, same class): recall, precision, value = the smaller."""
    dec = DECODERS[decode]
    n_ref = n_got = matched = 0
    for r, g in zip(ref, got):
        for rb, gb in zip(dec(r, name, **options), dec(g, name, **options)):
            n_ref, n_got, matched = n_ref + len(rb[0]), n_got + len(gb[0]), matched + match(rb, gb)
    recall = matched / n_ref if n_ref else (1.0 if n_got == 0 else 0.0)
    precision = matched / n_got if n_got else (1.0 if n_ref == 0 else 0.0)
    return {"value": min(recall, precision), "recall": recall, "precision": precision, "fp32_boxes": n_ref,
            "boxes": n_got}  # fmt: skip


# ------------------------------------------------------------------------------------------------------------
# judging
# ------------------------------------------------------------------------------------------------------------

METRICS: dict[str, Callable[..., dict[str, Any]]] = {
    "top1": top1,
    "ctc": ctc,
    "boxes": boxes,
    "decision": decision,
    "snr": snr,
    "cosine": cosine,
    "mask_iou": mask_iou,
}


def max_rel_l2(ref: Outputs, got: Outputs) -> tuple[float | None, str | None]:
    """The worst relative L2 error over the float outputs (all batches of each output together), and its output."""
    worst: tuple[float | None, str | None] = (None, None)
    for name in ref[0]:
        r = [np.asarray(o[name]) for o in ref]
        if not np.issubdtype(r[0].dtype, np.floating):
            continue
        value = metrics.rel_l2(np.concatenate([x.ravel() for x in r]),
                               np.concatenate([np.asarray(o[name], np.float32).ravel() for o in got]))  # fmt: skip
        if worst[0] is None or value > worst[0] or math.isnan(value):
            worst = (value, name)
    return worst


def judge(metric: str, bound: float, ref: Outputs, got: Outputs, output: str | None = None,
          options: Mapping[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
    """The task metric of ``got`` against ``ref`` with ``passed`` (value >= bound, and the largest change at most
    ``options["max_abs"]`` when given), plus the worst float output's relative L2 error."""
    opts = {k: v for k, v in (options or {}).items() if k not in ("bound", "max_abs")}
    result = METRICS[metric](ref, got, output, **opts)
    value = result["value"]
    passed = bool(value >= bound) if not math.isnan(value) else False
    if options and "max_abs" in options:  # a score whose every change is bounded too (wake-word probabilities)
        passed = passed and result["max_abs"] <= options["max_abs"]
    result.update(metric=metric, bound=bound, passed=passed)
    result["max_rel_l2"], result["max_rel_l2_output"] = max_rel_l2(ref, got)
    return result
