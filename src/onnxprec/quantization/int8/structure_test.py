"""Model structures the quantizers meet: a TensorFlow-style NHWC CNN (Transposes and BatchNorm chains folded first,
the unfused Q/DQ counted) and layers inside If bodies (INT8: the branch the data takes quantized, the others counted
and said to stay float; INT4: counted and kept float)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from onnxprec._ort_profile import unfused_qdq
from onnxprec._testing import qdq_conv, run, tf2onnx_block
from onnxprec.quantization.int8 import _api, quantize_file


def test_unfused_qdq_counts_what_onnx_runtime_leaves_by_the_op_beside_it(tmp_path: Path) -> None:
    path = tmp_path / "qdq.onnx"
    onnx.save(qdq_conv(np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32)), path)
    # the QLinearConv group fuses; the float interface keeps its QuantizeLinear and DequantizeLinear
    assert unfused_qdq(path) == {"input": 1, "output": 1}


@pytest.mark.slow
def test_an_nhwc_cnn_is_quantized_with_its_transposes_and_batchnorms_folded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "nhwc.onnx"
    onnx.save(tf2onnx_block(), source)
    rng = np.random.default_rng(1)
    data = [{"x": rng.standard_normal((1, 8, 8, 6)).astype(np.float32)} for _ in range(4)]
    settings: dict[str, Any] = {"calibration_data": data, "target_accuracy": None, "nodes_to_quantize": [".*"]}
    report = quantize_file(source, tmp_path / "q.onnx", **settings)
    assert report.structure == {"casts_removed": 0, "transposes_removed": 4, "affine_folded": 12}
    assert report.count("static") == 3
    assert report.unfused is not None and "Q/DQ left unfused on ort-cpu" in report.summary
    assert report.to_json()["unfused_qdq"]["total"] == sum(report.unfused.values())
    x = {"x": rng.standard_normal((1, 8, 8, 6)).astype(np.float32)}
    (ref,), (got,) = run(source, x), run(tmp_path / "q.onnx", x)
    assert np.linalg.norm(ref - got) / np.linalg.norm(ref) < 0.05

    monkeypatch.setattr(_api, "_fold_structure", lambda model: {})
    unfolded = quantize_file(source, tmp_path / "unfolded.onnx", **settings)
    assert unfolded.unfused is not None
    assert sum(report.unfused.values()) < sum(unfolded.unfused.values())
    # ONNX Runtime cancels the Transposes itself, but Q/DQ stay around the BatchNorm Adds it cannot fold
    assert "Add" in unfolded.unfused and "Add" not in report.unfused


def _if_model(main_conv: bool) -> onnx.ModelProto:
    """A Conv in each branch of an If chosen by a boolean input (as silero-vad picks its 16 kHz or 8 kHz network),
    after a main-graph Conv when ``main_conv``."""
    from onnx import helper

    from onnxprec._testing import F, make_model, tensor_info

    rng = np.random.default_rng(2)

    def branch(name: str) -> onnx.GraphProto:
        weight = helper.make_tensor(f"{name}_w", F, [4, 4, 3, 3], rng.standard_normal(144).astype(np.float32))
        conv = helper.make_node("Conv", ["h", f"{name}_w"], [f"{name}_y"], pads=[1, 1, 1, 1], name=f"{name}/Conv")
        return helper.make_graph([conv], name, [], [tensor_info(f"{name}_y", F, None)], [weight])

    nodes = [
        helper.make_node("If", ["flag"], ["y"], then_branch=branch("then"), else_branch=branch("else"), name="If_0")
    ]
    inits = {}
    if main_conv:
        inits["w"] = rng.standard_normal((4, 4, 3, 3)).astype(np.float32)
        nodes.insert(0, helper.make_node("Conv", ["x", "w"], ["h"], pads=[1, 1, 1, 1], name="main/Conv"))
    else:
        nodes.insert(0, helper.make_node("Relu", ["x"], ["h"], name="relu"))
    inputs = [tensor_info("x", F, [1, 4, 8, 8]), tensor_info("flag", onnx.TensorProto.BOOL, [])]
    return make_model(nodes, inputs, [tensor_info("y", F, None)], inits)


def test_the_branch_the_data_takes_is_quantized_and_the_other_said_to_stay_float(tmp_path: Path) -> None:
    from onnxprec.errors import UnsupportedModelError

    source = tmp_path / "if.onnx"
    onnx.save(_if_model(main_conv=True), source)
    rng = np.random.default_rng(3)
    data = [{"x": rng.standard_normal((1, 4, 8, 8)).astype(np.float32), "flag": np.array(True)} for _ in range(2)]
    report = quantize_file(source, tmp_path / "q.onnx", calibration_data=data, nodes_to_quantize=[".*"])
    assert report.count("static") == 2 and report.in_subgraphs == {"If": 1} and report.in_branches == 1
    assert "1 layer inside If bodies kept float" in report.summary
    assert report.skipped == [("else/Conv", "inside the else_branch of If 'If_0', which the calibration data never "
                                            "takes: kept float (no ranges)")]  # fmt: skip
    assert report.to_json()["counts"]["in_subgraphs"] == 1

    onnx.save(_if_model(main_conv=False), source)
    both = [{**batch, "flag": np.array(i % 2 == 0)} for i, batch in enumerate(data)]
    with pytest.raises(UnsupportedModelError, match="2 skipped, of which 2 layers inside If bodies kept float"):
        quantize_file(source, tmp_path / "q2.onnx", calibration_data=both)


def test_the_unfused_summary_suggests_preprocess_only_where_it_removes_the_op_and_has_not_run() -> None:
    from onnxprec.quantization.int8._report import unfused_text

    counts = {"Transpose": 12, "Add": 4}
    assert unfused_text(counts) == (
        "16 Q/DQ left unfused on ort-cpu: 12 beside Transpose, 4 beside Add "
        "(onnxprec preprocess first may remove the Transpose)"
    )
    assert "preprocess" not in unfused_text(counts, preprocessed=True)
    assert "preprocess" not in unfused_text({"Add": 6, "Pad": 1})
    assert unfused_text({}) == "every Q/DQ fused on ort-cpu"


def test_int4_counts_the_matmuls_inside_if_bodies_and_says_they_stay_float(tmp_path: Path) -> None:
    from onnx import helper

    from onnxprec._testing import F, make_model, tensor_info
    from onnxprec.quantization.int4 import quantize_file as quantize_int4

    rng = np.random.default_rng(4)

    def branch(name: str) -> onnx.GraphProto:
        weight = helper.make_tensor(f"{name}_w", F, [64, 64], rng.standard_normal(64 * 64).astype(np.float32))
        matmul = helper.make_node("MatMul", ["h", f"{name}_w"], [f"{name}_y"], name=f"{name}/MatMul")
        return helper.make_graph([matmul], name, [], [tensor_info(f"{name}_y", F, None)], [weight])

    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="main/MatMul"),
        helper.make_node("If", ["flag"], ["y"], then_branch=branch("then"), else_branch=branch("else"), name="If_0"),
    ]
    inputs = [tensor_info("x", F, [2, 64]), tensor_info("flag", onnx.TensorProto.BOOL, [])]
    inits = {"w": rng.standard_normal((64, 64)).astype(np.float32)}
    source = tmp_path / "if.onnx"
    onnx.save(make_model(nodes, inputs, [tensor_info("y", F, [2, 64])], inits, opset=21, ir_version=10), source)
    report = quantize_int4(source, tmp_path / "q.onnx", block_size=32, calibration_method="rtn")
    assert report.in_subgraphs == {"If": 2} and len(report.layers) == 1
    assert "2 layers inside If bodies kept float (INT4 quantizes the main graph's layers only)" in report.summary
