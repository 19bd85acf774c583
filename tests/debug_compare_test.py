"""``onnxprec compare`` / ``onnxprec.debug.compare_models``: planted divergences located exactly, the exclude
pattern verified with AutoCast, streaming in chunks, reports (JSON, HTML, terminal) and one-line errors."""

from __future__ import annotations

import json
import math
import re
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from onnxprec._testing import F, make_model, run_cli, tensor_info
from onnxprec.autocast import convert_to_mixed_precision
from onnxprec.debug import compare_models
from onnxprec.errors import InvalidArgumentError, ModelLoadError

WIDTH = 32


def _chain() -> onnx.ModelProto:
    """An FP32 MLP-like chain of 10 named nodes."""
    rng = np.random.default_rng(0)
    inits, nodes, prev = {}, [], "x"
    for i in range(3):
        inits[f"w{i}"] = (rng.standard_normal((WIDTH, WIDTH)) / math.sqrt(WIDTH)).astype(np.float32)
        inits[f"b{i}"] = (0.1 * rng.standard_normal(WIDTH)).astype(np.float32)
        nodes += [
            helper.make_node("MatMul", [prev, f"w{i}"], [f"mm{i}_out"], name=f"/layer{i}/MatMul"),
            helper.make_node("Add", [f"mm{i}_out", f"b{i}"], [f"add{i}_out"], name=f"/layer{i}/Add"),
            helper.make_node("Tanh", [f"add{i}_out"], [f"act{i}_out"], name=f"/layer{i}/Tanh"),
        ]
        prev = f"act{i}_out"
    nodes.append(helper.make_node("Softmax", [prev], ["probs"], name="/head/Softmax", axis=-1))
    return make_model(
        nodes, [tensor_info("x", F, ["batch", WIDTH])], [tensor_info("probs", F, ["batch", WIDTH])], inits
    )


def _inputs(batches: int = 1, rows: int = 8, seed: int = 1) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((rows, WIDTH)).astype(np.float32)} for _ in range(batches)]


def _perturbed_fp16(node_name: str, delta: float, keep: tuple[str, ...] = ()) -> onnx.ModelProto:
    """AutoCast FP16 of the chain, then the bias of one middle node changed: a planted divergence."""
    candidate = convert_to_mixed_precision(
        _chain(), keep_io_types=True, calibration_data=_inputs(), nodes_to_exclude=list(keep)
    )
    node = next(n for n in candidate.graph.node if n.name == node_name)
    init = next(t for t in candidate.graph.initializer if t.name == node.input[1])
    values = numpy_helper.to_array(init).copy()
    values[: WIDTH // 2] += np.asarray(delta, values.dtype)
    init.CopyFrom(numpy_helper.from_array(values, init.name))
    return candidate


def test_planted_divergence_is_located_exactly() -> None:
    report = compare_models(_chain(), _perturbed_fp16("/layer1/Add", 0.5), _inputs())
    assert report.first_divergence == "/layer1/Add"
    assert report.exclude_pattern == r"^/layer1/Add$"
    assert [r.node for r in report.rows] == [n.name for n in _chain().graph.node]  # topological order
    first = report.rows.index(report.first_divergence_row)  # type: ignore[arg-type]
    for row in report.rows[:first]:  # FP16 rounding only: within tolerance
        assert row.status == "compared" and not row.diverged and row.rel_l2 is not None and row.rel_l2 < 0.01
    assert report.rows[first].rel_l2 > 0.5  # type: ignore[operator]
    assert report.outputs["probs"].rel_l2 > report.rtol  # type: ignore[operator]
    assert all(r.match == "name" for r in report.rows)
    assert report.rows[-1].depth == 10


def test_a_divergent_node_already_in_fp32_gets_a_note() -> None:
    candidate = _perturbed_fp16("/layer1/Add", 0.5, keep=("^/layer1/Add$",))
    report = compare_models(_chain(), candidate, _inputs())
    assert report.first_divergence == "/layer1/Add"
    assert any(n.startswith("'/layer1/Add' already computes in FP32") and "/layer1/MatMul" in n for n in report.notes)
    assert not compare_models(_chain(), _perturbed_fp16("/layer1/Add", 0.5), _inputs()).notes


def test_fp16_conversion_alone_does_not_diverge() -> None:
    candidate = convert_to_mixed_precision(_chain(), keep_io_types=True, calibration_data=_inputs())
    report = compare_models(_chain(), candidate, _inputs(batches=3))
    assert report.first_divergence is None and report.exclude_pattern is None
    assert report.batches == 3 and report.counts["compared"] == 10
    assert report.outputs["probs"].top1 == 1.0 and report.outputs["probs"].rel_l2 < 0.01  # type: ignore[operator]


def _offset_model() -> onnx.ModelProto:
    """a -> Tanh -> Mul ; x - 300.1 (an offset FP16 cannot hold: 300.0) ; Add -> Relu -> y."""
    nodes = [
        helper.make_node("Tanh", ["a"], ["t"], name="tanh"),
        helper.make_node("Mul", ["t", "two"], ["m"], name="scale"),
        helper.make_node("Sub", ["x", "offset"], ["s"], name="/center/Sub"),
        helper.make_node("Add", ["m", "s"], ["u"], name="add"),
        helper.make_node("Relu", ["u"], ["y"], name="relu"),
    ]
    inputs = [tensor_info("a", F, [1, 64]), tensor_info("x", F, [1, 64])]
    inits = {"offset": np.array(300.1, np.float32), "two": np.array(2.0, np.float32)}
    return make_model(nodes, inputs, [tensor_info("y", F, [1, 64])], inits)


def _offset_inputs() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(2)
    return {
        "a": rng.standard_normal((1, 64)).astype(np.float32),
        "x": (300.1 + 0.05 * rng.standard_normal((1, 64))).astype(np.float32),
    }


def test_exclude_pattern_is_verified_with_autocast(tmp_path: Path) -> None:
    reference = tmp_path / "ref.onnx"
    onnx.save(_offset_model(), reference)
    data = _offset_inputs()
    candidate = tmp_path / "cand.onnx"
    onnx.save(convert_to_mixed_precision(str(reference), keep_io_types=True, calibration_data=data), candidate)
    report = compare_models(reference, candidate, data, verify=True)
    assert report.first_divergence == "/center/Sub"
    assert [r.diverged for r in report.rows] == [False, False, True, True, True]
    verification = report.verification
    assert verification is not None and verification.pattern == "^/center/Sub$"
    assert (verification.low_precision_type, verification.keep_io_types) == ("fp16", True)
    assert verification.fixed and verification.resolved
    assert verification.after is not None and verification.after.rel_l2 < 1e-3  # type: ignore[operator]
    assert verification.outputs_after["y"].rel_l2 < 1e-3 < verification.outputs_before["y"].rel_l2  # type: ignore[operator]
    assert re.match(verification.pattern, "/center/Sub") and not re.match(verification.pattern, "/center/Sub_1")
    data_json = report.to_json()
    assert data_json["verification"]["fixed"] is True
    assert data_json["first_divergence"]["exclude_pattern"] == "^/center/Sub$"


def test_in_memory_models_and_verify_of_an_in_memory_reference() -> None:
    data = _offset_inputs()
    candidate = convert_to_mixed_precision(_offset_model(), keep_io_types=True, calibration_data=data)
    report = compare_models(_offset_model(), candidate, data, verify=True)
    assert report.verification is not None and report.verification.resolved
    assert report.reference is None and report.candidate is None


@pytest.mark.slow
def test_streaming_in_chunks_gives_the_same_rows() -> None:
    candidate = _perturbed_fp16("/layer2/Add", 0.25)
    data = _inputs(batches=2, rows=64)
    whole = compare_models(_chain(), candidate, data)
    chunked = compare_models(_chain(), candidate, data, budget_bytes=2 * 64 * WIDTH * 4)
    assert whole.chunks == 1 and chunked.chunks >= 5
    assert [r.to_json() for r in chunked.rows] == [r.to_json() for r in whole.rows]
    assert chunked.first_divergence == "/layer2/Add"


@pytest.mark.slow
def test_a_one_shot_reader_is_replayed_for_both_models() -> None:
    class Reader:  # ONNX Runtime's CalibrationDataReader protocol
        def __init__(self) -> None:
            self.batches = iter(_inputs(batches=3))

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.batches, None)

    candidate = _perturbed_fp16("/layer0/Add", 0.5)
    from_reader = compare_models(_chain(), candidate, Reader(), budget_bytes=8 * WIDTH * 4)
    from_list = compare_models(_chain(), candidate, _inputs(batches=3))
    assert from_reader.batches == 3 and from_reader.chunks > 1
    assert [r.rel_l2 for r in from_reader.rows] == [r.rel_l2 for r in from_list.rows]


def test_random_inputs_and_unmatched_tensors() -> None:
    candidate = _perturbed_fp16("/layer1/Add", 0.0)
    for node in candidate.graph.node:  # a tensor renamed without a record: not matched by name
        if node.name == "/layer0/Tanh":
            node.name = "renamed_tanh"
            node.output[0] = "renamed"
        node.input[:] = ["renamed" if i == "act0_out" else i for i in node.input]
    report = compare_models(_chain(), candidate, input_shapes={"x": (4, WIDTH)})
    row = report.row("/layer0/Tanh")
    assert row is not None and row.candidate == "renamed" and row.match == "via consumer /layer1/MatMul"
    assert report.counts["unmatched"] == 0 and report.batches == 1 and report.first_divergence is None


def _int4_qdq(block: int = 16) -> onnx.ModelProto:
    """The chain with every MatMul weight replaced by an INT4 block-quantized DequantizeLinear (opset 21)."""
    model = _chain()
    weights = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer if t.name.startswith("w")}
    keep = [t for t in model.graph.initializer if t.name not in weights]
    del model.graph.initializer[:]
    model.graph.initializer.extend(keep)
    nodes = []
    for name, w in weights.items():
        blocks = w.reshape(-1, block, w.shape[1])
        scale = np.abs(blocks).max(axis=1) / 7
        q = np.clip(np.rint(blocks / scale[:, None, :]), -8, 7).astype(int).reshape(w.shape)
        model.graph.initializer.extend(
            [
                helper.make_tensor(f"{name}_q", onnx.TensorProto.INT4, w.shape, q.reshape(-1).tolist()),
                numpy_helper.from_array(scale.astype(np.float32), f"{name}_scale"),
            ]
        )
        nodes.append(
            helper.make_node(
                "DequantizeLinear", [f"{name}_q", f"{name}_scale"], [name], name=f"{name}/DQ", axis=0, block_size=block
            )
        )
    nodes += list(model.graph.node)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    model.opset_import[0].version = 21
    model.ir_version = 10
    return model


def test_int4_qdq_candidate_matches_by_name_and_verify_is_skipped() -> None:
    report = compare_models(_chain(), _int4_qdq(), _inputs(), verify=True)
    assert report.counts["unmatched"] == 0 and {r.match for r in report.rows} == {"name"}
    # INT4 (block 16, RTN) costs ~8% relative L2 on the first MatMul: that is where it diverges at rtol 0.05
    assert report.first_divergence == "/layer0/MatMul"
    assert 0.02 < report.rows[0].rel_l2 < 0.3  # type: ignore[operator]
    assert compare_models(_chain(), _int4_qdq(), _inputs(), rtol=0.5).first_divergence is None
    assert report.verification is None
    assert any("not an AutoCast model" in note for note in report.notes)
    assert not any("already computes in FP32" in note for note in report.notes)  # its weight is dequantized INT4


def test_bf16_tensors_are_compared() -> None:
    """BF16 values travel as ml_dtypes arrays (ONNX Runtime's CPU provider has Cast, not MatMul, for BF16)."""
    io = ([tensor_info("x", F, [4, 64])], [tensor_info("y", F, [4, 64])])
    reference = make_model(
        [
            helper.make_node("Identity", ["x"], ["r"], name="round"),
            helper.make_node("Identity", ["r"], ["y"], name="back"),
        ],
        *io,
    )
    candidate = make_model(
        [
            helper.make_node("Cast", ["x"], ["r"], name="round", to=onnx.TensorProto.BFLOAT16),
            helper.make_node("Cast", ["r"], ["y"], name="back", to=onnx.TensorProto.FLOAT),
        ],
        *io,
    )
    report = compare_models(reference, candidate, {"x": np.random.default_rng(5).standard_normal((4, 64), np.float32)})
    row = report.row("round")
    assert row is not None and row.candidate_dtype == "bfloat16"
    assert 1e-4 < row.rel_l2 < 4e-3 and not row.diverged  # type: ignore[operator]
    assert report.outputs["y"].rel_l2 == row.rel_l2


def test_nonfinite_values_diverge() -> None:
    candidate = _perturbed_fp16("/layer1/Add", math.inf)
    report = compare_models(_chain(), candidate, _inputs())
    row = report.first_divergence_row
    assert row is not None and row.node == "/layer1/Add" and row.nonfinite > 0
    json.dumps(report.to_json(), allow_nan=False)  # non-finite errors are written as null


def test_html_report_is_self_contained(tmp_path: Path) -> None:
    report = compare_models(_chain(), _perturbed_fp16("/layer1/Add", 0.5), _inputs())
    page = report.to_html()
    assert page.startswith("<!DOCTYPE html>") and "<svg" in page and "<polyline" in page
    assert "/layer1/Add" in page and "^/layer1/Add$" in page
    assert not re.search(r"(src|href)\s*=\s*[\"']?(https?:)?//", page)  # nothing fetched
    assert page.count("<tr class=") == len(report.rows)
    table = report.table()
    assert "> " in table and "/layer1/Add" in table


def test_models_with_different_inputs_are_refused() -> None:
    other = _chain()
    other.graph.input[0].name = "pixels"
    for node in other.graph.node:
        node.input[:] = ["pixels" if i == "x" else i for i in node.input]
    with pytest.raises(InvalidArgumentError, match="different inputs"):
        compare_models(_chain(), other)
    with pytest.raises(ModelLoadError, match="does not exist"):
        compare_models("missing.onnx", _chain())


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args)  # in this process: same code path, no interpreter start per call


def test_cli_table_json_html_and_verify(tmp_path: Path) -> None:
    reference, candidate = tmp_path / "ref.onnx", tmp_path / "cand.onnx"
    onnx.save(_offset_model(), reference)
    data = _offset_inputs()
    np.savez(tmp_path / "data.npz", **data)
    onnx.save(convert_to_mixed_precision(str(reference), keep_io_types=True, calibration_data=data), candidate)
    result = _cli(
        "compare", str(reference), str(candidate), "-d", str(tmp_path / "data.npz"), "--verify",
        "--report_json", str(tmp_path / "r.json"), "--report_html", str(tmp_path / "r.html"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "first divergence at node '/center/Sub'" in result.stdout
    assert "--nodes_to_exclude '^/center/Sub$'" in result.stdout
    assert ": fixed; no node diverges any more" in result.stdout
    saved = json.loads((tmp_path / "r.json").read_text())
    assert saved["first_divergence"]["node"] == "/center/Sub" and len(saved["rows"]) == 5
    assert (tmp_path / "r.html").read_text().startswith("<!DOCTYPE html>")


def test_cli_errors_are_one_line_with_exit_code_2_and_no_output(tmp_path: Path) -> None:
    reference = tmp_path / "ref.onnx"
    onnx.save(_chain(), reference)
    other = _offset_model()
    onnx.save(other, tmp_path / "other.onnx")
    report = tmp_path / "r.json"
    for args, words in (
        ([str(tmp_path / "nope.onnx"), str(reference)], f"The reference model '{tmp_path}/nope.onnx' does not exist"),
        ([str(reference), str(tmp_path / "nope.onnx")], f"The candidate model '{tmp_path}/nope.onnx' does not exist"),
        ([str(reference), str(tmp_path / "other.onnx")], "different inputs"),
        ([str(reference), str(reference), "--report_html", str(tmp_path / "no" / "r.html")], "does not exist"),
        ([str(reference), str(reference), "--report_json", str(reference)], "would overwrite"),
        ([str(reference), str(reference), "--rtol", "-1"], "rtol must be"),
    ):
        bad = (
            _cli("compare", *args, "--report_json", str(report))
            if "--report_json" not in args
            else _cli("compare", *args)
        )
        assert bad.returncode == 2, bad.stderr
        lines = bad.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0], bad.stderr
        assert "--onnx_path" not in lines[0]  # compare takes its models as positional arguments
        assert not report.exists()


def test_empty_tensors_are_compared_without_a_crash() -> None:
    """A tensor with a zero-length last axis (Phi-3 Optimum's rotary slices of an empty past) has nothing to
    compare: it crashed compare with 'cannot reshape array of size 0 into shape (0)'."""
    nodes = [
        helper.make_node("Slice", ["x", "zero", "zero", "last"], ["empty"], name="/empty/Slice"),
        helper.make_node("Tanh", ["empty"], ["empty_tanh"], name="/empty/Tanh"),
        helper.make_node("Concat", ["x", "empty_tanh"], ["cat"], name="/cat/Concat", axis=-1),
        helper.make_node("Tanh", ["cat"], ["y"], name="/out/Tanh"),
    ]
    zero, last = np.array([0], np.int64), np.array([-1], np.int64)
    model = make_model(
        nodes, [tensor_info("x", F, ["batch", WIDTH])], [tensor_info("y", F, ["batch", WIDTH])],
        {"zero": zero, "last": last},
    )  # fmt: skip
    candidate = convert_to_mixed_precision(model, keep_io_types=True, calibration_data=_inputs())
    report = compare_models(model, candidate, _inputs())
    rows = {r.node: r for r in report.rows}
    assert rows["/empty/Tanh"].status == "compared" and rows["/empty/Tanh"].max_abs == 0.0
    assert not rows["/empty/Tanh"].diverged
    assert 0 < rows["/out/Tanh"].rel_l2 < 1e-3 and not rows["/out/Tanh"].diverged  # type: ignore[operator]


def test_mask_fills_that_both_models_mask_with_are_no_divergence() -> None:
    """An FP32 mask of -inf against AutoCast's FP16 fill -16384: both mask, so the mask is no divergence (it was
    Phi-3 Optimum's first divergence, rel L2 1e6); a fill the candidate lost (0 where -inf) still diverges."""
    causal = np.triu(np.ones((8, 8), bool), 1)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["scores"], name="/attn/MatMul"),
        helper.make_node("Where", ["causal", "neg_inf", "zero"], ["mask"], name="/attn/Where"),
        helper.make_node("Add", ["scores", "mask"], ["masked"], name="/attn/Add"),
        helper.make_node("Softmax", ["masked"], ["y"], name="/attn/Softmax", axis=-1),
    ]
    inits = {
        "w": (np.random.default_rng(0).standard_normal((WIDTH, 8)) / 6).astype(np.float32),
        "causal": causal, "neg_inf": np.array(-np.inf, np.float32), "zero": np.array(0.0, np.float32),
    }  # fmt: skip
    model = make_model(nodes, [tensor_info("x", F, [8, WIDTH])], [tensor_info("y", F, [8, 8])], inits)
    feeds = [{"x": np.random.default_rng(1).standard_normal((8, WIDTH)).astype(np.float32)}]
    candidate = convert_to_mixed_precision(model, keep_io_types=True, calibration_data=feeds)
    fills = {float(numpy_helper.to_array(t).min()) for t in candidate.graph.initializer if t.name.startswith("neg")}
    assert fills and all(-1e5 < f <= -1e4 for f in fills)  # AutoCast's own FP16 fill
    report = compare_models(model, candidate, feeds)
    rows = {r.node: r for r in report.rows}
    assert rows["/attn/Where"].status == "compared" and rows["/attn/Where"].max_abs == 0.0
    assert report.first_divergence is None and not any(r.diverged for r in report.rows)
    lost = onnx.ModelProto()
    lost.CopyFrom(candidate)
    for t in lost.graph.initializer:
        if t.name.startswith("neg"):
            t.CopyFrom(numpy_helper.from_array(np.zeros_like(numpy_helper.to_array(t)), t.name))
    # The mask itself diverges where it lost the fill: FP32 -inf against 0 (counted as no error until the
    # non-finite mismatch rule; the divergence then showed only at the Add after it).
    report = compare_models(model, lost, feeds)
    assert report.first_divergence == "/attn/Where"
    where = {r.node: r for r in report.rows}["/attn/Where"]
    assert where.diverged and math.isinf(where.rel_l2) and where.nonfinite == 0 < where.ref_nonfinite


def test_non_finite_values_in_different_places_diverge() -> None:
    """The reference is -inf where the candidate is finite, and the candidate -inf where the reference is finite,
    as many of each: the counts of non-finite values agree, the values do not. Was zero error (both zeroed)."""
    nodes = [
        helper.make_node("Log", ["x"], ["l"], name="log"),
        helper.make_node("Neg", ["l"], ["y"], name="neg"),
    ]
    model = make_model(nodes, [tensor_info("x", F, [4])], [tensor_info("y", F, [4])])
    shifted = make_model(
        [
            helper.make_node("Sub", ["x", "one"], ["d"], name="sub"),
            helper.make_node("Abs", ["d"], ["s"], name="abs"),
            *nodes,
        ],
        [tensor_info("x", F, [4])],
        [tensor_info("y", F, [4])],
        {"one": np.array(1.0, np.float32)},
    )
    shifted.graph.node[2].input[0] = "s"
    feeds = [{"x": np.array([0.0, 1.0, 2.0, 3.0], np.float32)}]  # -log(x): inf at 0; -log|x - 1|: inf at 1
    report = compare_models(model, shifted, feeds)
    rows = {r.node: r for r in report.rows}
    assert rows["log"].nonfinite == rows["log"].ref_nonfinite == 1
    assert rows["log"].diverged and math.isinf(rows["log"].rel_l2) and report.first_divergence == "log"
    assert math.isinf(report.outputs["y"].rel_l2)
