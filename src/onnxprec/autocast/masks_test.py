"""Attention masks convert to FP16/BF16 without FP32 islands, and never turn a masked row into NaN."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxprec._testing import F, make_model, run, tensor_info
from onnxprec.autocast import AutoCastOptions, convert_model, convert_to_mixed_precision
from onnxprec.autocast.masks import find_mask_regions, low_fill

LOWEST = float(np.finfo(np.float32).min)
B, H, S, D = 2, 2, 6, 4


def _attention(mask_nodes: list[onnx.NodeProto], mask_inputs: list[onnx.ValueInfoProto], mask: str, **inits):  # type: ignore[no-untyped-def]
    """scores [B,H,S,S] + mask -> Softmax -> @ V; outputs the context and the probabilities."""
    nodes = [
        *mask_nodes,
        helper.make_node("Add", ["scores", mask], ["masked"], name="add_mask"),
        helper.make_node("Softmax", ["masked"], ["probs"], axis=-1, name="softmax"),
        helper.make_node("MatMul", ["probs", "V"], ["context"], name="pv"),
    ]
    inputs = [tensor_info("scores", F, [B, H, S, S]), *mask_inputs]
    outputs = [tensor_info("context", F, [B, H, S, D]), tensor_info("probs", F, [B, H, S, S])]
    values = np.random.default_rng(1).standard_normal((S, D)).astype(np.float32)
    return make_model(nodes, inputs, outputs, {"V": values, **inits})


def _scores(scale: float = 3.0) -> np.ndarray:
    return (np.random.default_rng(0).standard_normal((B, H, S, S)) * scale).astype(np.float32)


def _causal() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """SmolLM2's export: Where(causal, 0, finfo.min) from Constants."""
    causal = np.tril(np.ones((S, S), bool))[None, None]
    nodes = [
        helper.make_node("Constant", [], ["zero"], value=numpy_helper.from_array(np.float32(0))),
        helper.make_node("Constant", [], ["lowest"], value=numpy_helper.from_array(np.float32(LOWEST))),
        helper.make_node("Where", ["causal", "zero", "lowest"], ["mask"], name="mask_where"),
    ]
    model = _attention(nodes, [], "mask", causal=causal)
    return model, {"scores": _scores()}


def _padding() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """BERT's export: (1 - attention_mask) * finfo.min, unsqueezed to [B,1,1,S]; batch 1 is all padding."""
    nodes = [
        helper.make_node("Cast", ["attention_mask"], ["m"], to=TensorProto.FLOAT, name="mask_cast"),
        helper.make_node("Sub", ["one", "m"], ["inv"], name="mask_sub"),
        helper.make_node("Mul", ["inv", "lowest"], ["ext"], name="mask_mul"),
        helper.make_node("Unsqueeze", ["ext", "axes"], ["mask"], name="mask_unsqueeze"),
    ]
    model = _attention(
        nodes,
        [tensor_info("attention_mask", TensorProto.INT64, [B, S])],
        "mask",
        one=np.float32(1),
        lowest=np.float32(LOWEST),
        axes=np.array([1, 2], np.int64),
    )
    attention = np.ones((B, S), np.int64)
    attention[0, 4:] = 0
    attention[1, :] = 0  # every key masked: fully masked rows
    return model, {"scores": _scores(), "attention_mask": attention}


def _constant_of_shape() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """torch.full((S, S), -inf).triu(1): ConstantOfShape(-inf) -> Trilu."""
    nodes = [
        helper.make_node(
            "ConstantOfShape", ["shape"], ["full"], value=numpy_helper.from_array(np.array([-np.inf], np.float32))
        ),
        helper.make_node("Trilu", ["full", "k"], ["mask"], upper=1, name="mask_triu"),
    ]
    model = _attention(nodes, [], "mask", shape=np.array([S, S], np.int64), k=np.array(1, np.int64))
    return model, {"scores": _scores()}


def _masked_fill() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """scores.masked_fill(~keep, finfo.min): Where(keep, scores, fill) straight into the Softmax."""
    nodes = [
        helper.make_node("Where", ["keep", "scores", "lowest"], ["masked"], name="fill_where"),
        helper.make_node("Softmax", ["masked"], ["probs"], axis=-1, name="softmax"),
        helper.make_node("MatMul", ["probs", "V"], ["context"], name="pv"),
    ]
    keep = np.ones((B, 1, S, S), bool)
    keep[1] = False  # fully masked
    keep[0, :, :, 3:] = False
    model = make_model(
        nodes,
        [tensor_info("scores", F, [B, H, S, S]), tensor_info("keep", TensorProto.BOOL, [B, 1, S, S])],
        [tensor_info("context", F, [B, H, S, D])],
        {"lowest": np.float32(LOWEST), "V": np.ones((S, D), np.float32)},
    )
    return model, {"scores": _scores(), "keep": keep}


BUILDERS = {"causal": _causal, "padding": _padding, "constant_of_shape": _constant_of_shape}


def _decisions(model: onnx.ModelProto, feeds: dict[str, np.ndarray], **kwargs: object) -> dict[str, bool]:
    _, report, _ = convert_model(model, AutoCastOptions(calibration_data=feeds, keep_io_types=True, **kwargs))  # type: ignore[arg-type]
    return {n.name: d.low for n, d in report.decisions.items() if n.name}


@pytest.mark.parametrize("kind", sorted(BUILDERS))
def test_masks_run_in_fp16_without_fp32_islands_and_match_fp32(kind: str) -> None:
    model, feeds = BUILDERS[kind]()
    decisions = _decisions(model, feeds)
    assert all(decisions.values()), {n: low for n, low in decisions.items() if not low}
    out = convert_to_mixed_precision(model, calibration_data=feeds, keep_io_types=True)
    onnx.checker.check_model(out, full_check=True)
    io = [v for v in (*out.graph.input, *out.graph.output) if v.type.tensor_type.elem_type == F]
    casts = [n for n in out.graph.node if n.op_type == "Cast" and n.name != "mask_cast"]
    assert len(casts) == len(io)  # one per FP32 input and output, none inside
    ref_context, ref_probs = run(model, feeds)
    context, probs = run(out, feeds)
    assert np.isfinite(context).all() and np.isfinite(probs).all()
    rows = slice(0, 1) if kind == "padding" else slice(None)  # batch 1 of "padding": fully masked rows, below
    np.testing.assert_allclose(probs[rows], ref_probs[rows], atol=2e-3)
    np.testing.assert_allclose(context[rows], ref_context[rows], atol=5e-3)


def test_fully_masked_rows_are_finite_and_uniform_in_fp16_arithmetic() -> None:
    model, feeds = _padding()
    out = convert_to_mixed_precision(model, calibration_data=feeds, keep_io_types=True)
    _, ref_probs = run(model, feeds)
    np.testing.assert_allclose(ref_probs[1], 1 / S)  # FP32: finfo.min + score == finfo.min, a uniform row
    context, probs = run(out, feeds)  # ORT's CPU computes the FP16 Add in FP32: softmax of the scores, finite
    assert np.isfinite(probs).all() and np.isfinite(context).all()
    np.testing.assert_allclose(probs[1].sum(-1), 1, rtol=1e-3)
    # In FP16 arithmetic (GPUs) the fill absorbs scores below 8 in magnitude: the row is uniform, as in FP32
    fill = next(numpy_helper.to_array(i) for i in out.graph.initializer if i.name == "lowest")
    masked = (feeds["scores"][1] / 3).astype(np.float16) + fill.astype(np.float16)
    assert (masked == fill).all()


def test_score_plus_mask_cannot_overflow() -> None:
    """Scores of -500 with the mask: -65504 - 500 is -inf in FP16 (the old clamp); -16384 - 500 is not."""
    model, feeds = _padding()
    feeds["scores"] = np.full((B, H, S, S), -500.0, np.float32)
    out = convert_to_mixed_precision(model, calibration_data=feeds, keep_io_types=True)
    fill = next(i for i in out.graph.initializer if i.name == "lowest")
    assert fill.data_type == TensorProto.FLOAT16 and numpy_helper.to_array(fill) == low_fill(ir.DataType.FLOAT16)
    context, probs = run(out, feeds)
    assert np.isfinite(probs).all() and np.isfinite(context).all()
    np.testing.assert_allclose(probs[1], 1 / S, atol=1e-3)


def test_masked_fill_where_runs_in_fp16() -> None:
    model, feeds = _masked_fill()
    assert all(_decisions(model, feeds).values())
    out = convert_to_mixed_precision(model, calibration_data=feeds, keep_io_types=True)
    (context,) = run(out, feeds)
    (ref,) = run(model, feeds)
    assert np.isfinite(context).all()
    np.testing.assert_allclose(context, ref, atol=5e-3)


def test_bf16_masks_convert_with_a_bf16_fill() -> None:
    model, feeds = _causal()
    assert all(_decisions(model, feeds, low_precision_type="bf16").values())
    out = convert_to_mixed_precision(model, calibration_data=feeds, keep_io_types=True, low_precision_type="bf16")
    onnx.checker.check_model(out, full_check=True)
    fills = [i for i in out.graph.initializer if i.data_type == TensorProto.BFLOAT16 and not i.dims]
    values = {float(numpy_helper.to_array(i).astype(np.float32)) for i in fills}
    assert low_fill(ir.DataType.BFLOAT16) in values and low_fill(ir.DataType.BFLOAT16) == -(2.0**126)
    # BF16 arithmetic, emulated: the converted fill plus any score stays finite, the softmax is the FP32 one
    bf16 = ml_dtypes.bfloat16
    masked = feeds["scores"].astype(bf16) + np.where(np.tril(np.ones((S, S))) > 0, 0, -(2.0**126)).astype(bf16)
    assert np.isfinite(masked.astype(np.float32)).all()


def test_large_scores_keep_the_region_in_fp32_and_the_mask_exact() -> None:
    model, feeds = _causal()
    feeds["scores"] = _scores(scale=300.0)  # past data_max 512
    decisions = _decisions(model, feeds)
    assert decisions["softmax"] is False and decisions["add_mask"] is False
    out = convert_to_mixed_precision(model, calibration_data=feeds, keep_io_types=True)
    np.testing.assert_allclose(run(out, feeds)[1], run(model, feeds)[1], atol=1e-3)


def test_a_fill_that_also_feeds_a_matmul_is_not_a_mask() -> None:
    model, feeds = _causal()
    model.graph.node.append(helper.make_node("MatMul", ["mask", "V"], ["leak"], name="leak"))
    model.graph.output.append(tensor_info("leak", F, None))
    regions = find_mask_regions(ir.serde.deserialize_model(model))
    assert len(regions) == 0  # the Constant is not lifted here: no initializer fill
    _, report, _ = convert_model(model, AutoCastOptions(calibration_data=feeds, keep_io_types=True))
    (region,) = report.mask_regions
    assert region.impure is not None and "leak" in region.impure and region.rewritten_to is None
    decisions = {n.name: d.low for n, d in report.decisions.items()}
    assert decisions["add_mask"] is False  # measured as before: 3.4e38 > data_max


def test_mask_regions_are_found_where_they_are_made() -> None:
    model, _ = _padding()
    (region,) = find_mask_regions(ir.serde.deserialize_model(model))
    assert [v.name for v in region.sources] == ["lowest"] and region.impure is None
    assert {v.name for v in region.tainted} == {"ext", "mask", "masked"}
    assert [n.name for n in region.softmaxes] == ["softmax"]
    assert region.threshold == LOWEST / 2
