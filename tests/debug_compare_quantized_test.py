"""``compare`` on quantized candidates: tensors judged by the value their consumers see (the DequantizeLinear output
after a QuantizeLinear), names that survive a removed op not taken at face value, and ``--nodes_to_exclude`` pointing
to a quantized node.

The hand-built candidate reproduces what ONNX Runtime's ``quantize_static`` does to a Conv/MatMul followed by a
Clip(0, 6): the Clip is dropped (the UINT8 range [0, 6] clamps instead) and its output name moves to the MatMul's
output, which then holds the values *before* the clip.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxprec._testing import F, make_model, tensor_info
from onnxprec.debug import compare_models

WIDTH = 16
RNG = np.random.default_rng(0)
W1 = (RNG.standard_normal((WIDTH, WIDTH)) * 1.5).astype(np.float32)
W2 = (RNG.standard_normal((WIDTH, WIDTH)) / 4).astype(np.float32)
INPUTS = [{"x": RNG.standard_normal((32, WIDTH)).astype(np.float32)}]


def _reference() -> onnx.ModelProto:
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["/mm1/out"], name="/mm1"),
        helper.make_node("Clip", ["/mm1/out", "lo", "hi"], ["/clip/out"], name="/clip"),
        helper.make_node("MatMul", ["/clip/out", "w2"], ["/mm2/out"], name="/mm2"),
        helper.make_node("Tanh", ["/mm2/out"], ["y"], name="/tanh"),
    ]
    inits = {"w1": W1, "w2": W2, "lo": np.array(0, np.float32), "hi": np.array(6, np.float32)}
    return make_model(nodes, [tensor_info("x", F, ["n", WIDTH])], [tensor_info("y", F, ["n", WIDTH])], inits)


def _qdq(name: str, scale: float, zero: int, dtype: type = np.uint8) -> tuple[list[onnx.NodeProto], list]:
    """QuantizeLinear -> DequantizeLinear of ``name``, as ONNX Runtime names them."""
    nodes = [
        helper.make_node("QuantizeLinear", [name, f"{name}_s", f"{name}_z"], [f"{name}_QuantizeLinear_Output"],
                         name=f"{name}_QuantizeLinear"),
        helper.make_node("DequantizeLinear", [f"{name}_QuantizeLinear_Output", f"{name}_s", f"{name}_z"],
                         [f"{name}_DequantizeLinear_Output"], name=f"{name}_DequantizeLinear"),
    ]  # fmt: skip
    inits = [
        numpy_helper.from_array(np.array(scale, np.float32), f"{name}_s"),
        numpy_helper.from_array(np.array(zero, dtype), f"{name}_z"),
    ]
    return nodes, inits


def _ort_like(w2: np.ndarray = W2, clip_scale: float = 6 / 255, clip_zero: int = 0) -> onnx.ModelProto:
    """The reference as ONNX Runtime's QDQ quantizer writes it: the Clip removed, '/clip/out' on /mm1's output."""
    absmax = float(np.abs(INPUTS[0]["x"]).max())
    q_x, i_x = _qdq("x", absmax / 127, 0, np.int8)
    q_c, i_c = _qdq("/clip/out", clip_scale, clip_zero)
    nodes = [
        *q_x,
        helper.make_node("MatMul", ["x_DequantizeLinear_Output", "w1"], ["/clip/out"], name="/mm1"),
        *q_c,
        helper.make_node("MatMul", ["/clip/out_DequantizeLinear_Output", "w2"], ["/mm2/out"], name="/mm2"),
        helper.make_node("Tanh", ["/mm2/out"], ["y"], name="/tanh"),
    ]
    model = make_model(
        nodes, [tensor_info("x", F, ["n", WIDTH])], [tensor_info("y", F, ["n", WIDTH])], {"w1": W1, "w2": w2}
    )
    model.graph.initializer.extend([*i_x, *i_c])
    onnx.checker.check_model(model, full_check=True)
    return model


def test_a_name_that_survives_a_removed_clip_is_not_a_false_divergence() -> None:
    report = compare_models(_reference(), _ort_like(), INPUTS)
    rows = {r.node: r for r in report.rows}
    clip, mm1 = rows["/clip"], rows["/mm1"]
    # /clip/out in the candidate holds /mm1's values (before the clip): it is /mm1's tensor, compared raw ...
    assert mm1.candidate == "/clip/out" and mm1.match == "producer"
    assert mm1.rel_l2 is not None and mm1.rel_l2 < 0.02
    # ... and the Clip's values are what /mm2 reads: the DequantizeLinear output (clamped to [0, 6] by UINT8)
    assert clip.candidate == "/clip/out_DequantizeLinear_Output" and "removed" in clip.match
    assert clip.rel_l2 is not None and clip.rel_l2 < 0.02
    assert report.first_divergence is None, report.summary
    # the same tensor taken by name would have been a large (false) error: the negative half is not clipped
    raw = INPUTS[0]["x"] @ W1
    assert np.linalg.norm(raw - np.clip(raw, 0, 6)) / np.linalg.norm(np.clip(raw, 0, 6)) > 1


def test_a_removed_clip_whose_name_went_with_it() -> None:
    # The same, but the MatMul keeps its own output name: the Clip's tensor is found through /mm2's input.
    candidate = _ort_like()
    for node in candidate.graph.node:
        node.input[:] = [n.replace("/clip/out", "/mm1/out") for n in node.input]
        node.output[:] = [n.replace("/clip/out", "/mm1/out") for n in node.output]
    for init in candidate.graph.initializer:
        init.name = init.name.replace("/clip/out", "/mm1/out")
    report = compare_models(_reference(), candidate, INPUTS)
    rows = {r.node: r for r in report.rows}
    assert rows["/mm1"].candidate == "/mm1/out" and rows["/mm1"].match == "name"  # raw: /mm2 reads the clamp
    assert rows["/clip"].candidate == "/mm1/out_DequantizeLinear_Output" and "removed" in rows["/clip"].match
    assert report.first_divergence is None, report.summary


def test_a_bad_activation_range_points_to_the_node_that_reads_it_quantized() -> None:
    # The Clip's output quantized with a range 8x too narrow: the error is in the value /mm2 reads.
    report = compare_models(_reference(), _ort_like(clip_scale=6 / 255 / 8), INPUTS)
    assert report.first_divergence == "/clip"
    assert report.exclude_nodes == ["/mm2"] and report.exclude_pattern == r"^/mm2$"
    assert report.advice is not None and "'/mm2'" in report.advice
    assert any("is not a quantized layer (Conv, MatMul, Gemm, Gather) in the candidate" in n for n in report.notes)


def test_a_quantized_node_that_diverges_is_the_one_to_exclude() -> None:
    bad = W2.copy()
    bad[:, : WIDTH // 2] *= 1.5  # a wrong weight in the quantized MatMul
    report = compare_models(_reference(), _ort_like(w2=bad), INPUTS)
    assert report.first_divergence == "/mm2" and report.exclude_nodes == ["/mm2"]
    assert report.exclude_pattern == r"^/mm2$"


def test_a_float_node_after_a_quantized_one_points_upstream() -> None:
    # /sub computes in float in the candidate; it cancels 99 % of its input, so it turns the small quantization
    # error of /mm2 into a large relative error.
    reference = _reference()
    candidate = _ort_like()
    offset = (0.99 * np.tanh(np.clip(INPUTS[0]["x"] @ W1, 0, 6) @ W2)).astype(np.float32)
    for model in (reference, candidate):
        model.graph.output[0].name = "z"
        model.graph.node.append(helper.make_node("Sub", ["y", "offset"], ["z"], name="/sub"))
        model.graph.initializer.append(numpy_helper.from_array(offset, "offset"))
    report = compare_models(reference, candidate, INPUTS)
    assert report.first_divergence == "/sub", report.table()
    assert report.exclude_nodes == ["/mm2"]
    assert max(r.rel_l2 for r in report.rows[:-1] if r.rel_l2 is not None) < 0.02 < report.rows[-1].rel_l2  # type: ignore[operator]


def test_an_fp16_candidate_keeps_its_own_node() -> None:
    from onnxprec.autocast import convert_to_mixed_precision

    candidate = convert_to_mixed_precision(_reference(), keep_io_types=True, calibration_data=INPUTS)
    for init in candidate.graph.initializer:
        if init.name.startswith("w2"):
            values = numpy_helper.to_array(init) * 2
            init.CopyFrom(numpy_helper.from_array(values.astype(values.dtype), init.name))
    report = compare_models(_reference(), candidate, INPUTS)
    assert report.first_divergence == "/mm2" and report.exclude_nodes == []
    assert report.exclude_pattern == r"^/mm2$"
    assert TensorProto.FLOAT16 in {i.data_type for i in candidate.graph.initializer}


def _nhwc_cnn() -> onnx.ModelProto:
    """Conv -> Relu -> two Transposes (NCHW -> NHWC -> NCHW, as a TensorFlow-converted model) -> Conv -> Gemm head."""
    rng = np.random.default_rng(1)
    inits = {
        "w1": (rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32),
        "w2": (rng.standard_normal((8, 8, 3, 3)) * 0.3).astype(np.float32),
        "wfc": (rng.standard_normal((10, 8 * 4 * 4)) * 0.1).astype(np.float32),
        "shape": np.array([0, -1], np.int64),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], name="/Conv_1", kernel_shape=[3, 3]),
        helper.make_node("Relu", ["c1"], ["r1"], name="/Relu_1"),
        helper.make_node("Transpose", ["r1"], ["t1"], name="/Transpose_1", perm=[0, 2, 3, 1]),
        helper.make_node("Transpose", ["t1"], ["t2"], name="/Transpose_2", perm=[0, 3, 1, 2]),
        helper.make_node("Conv", ["t2", "w2"], ["c2"], name="/Conv_5", kernel_shape=[3, 3]),
        helper.make_node("Relu", ["c2"], ["r"], name="/Relu"),
        helper.make_node("Reshape", ["r", "shape"], ["f"], name="/Reshape"),
        helper.make_node("Gemm", ["f", "wfc"], ["logits"], name="/fc/Gemm", transB=1),
    ]
    return make_model(nodes, [tensor_info("x", F, [2, 3, 8, 8])], [tensor_info("logits", F, [2, 10])], inits)


@pytest.mark.slow
def test_advice_names_the_conv_the_quantizer_owns_and_applied_to_int8_it_changes_the_output(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Issue 24: on a QDQ model whose activation is quantized before a Transpose (as ONNX Runtime's quantize_static
    propagates it), the first divergent node is the Transpose computing on INT8 values; the advice used to name it,
    and ``quantize int8 --nodes_to_exclude '^/Transpose_1$'`` then wrote a byte-identical model. It names the Conv that
    reads it, and that advice keeps the Conv float in our INT8 output, which changes."""
    from onnxprec._testing import run
    from onnxprec.quantization.int8 import quantize_file

    reference = _nhwc_cnn()
    q_r, i_r = _qdq("r1", 0.25, 0)  # a coarse range: the Transpose's INT8 input is off by up to 0.125
    candidate = onnx.ModelProto()
    candidate.CopyFrom(reference)
    nodes = list(candidate.graph.node)
    del candidate.graph.node[:]
    w2 = numpy_helper.to_array(next(i for i in reference.graph.initializer if i.name == "w2"))
    w2_scale = float(np.abs(w2).max()) / 127
    dq_w2 = helper.make_node("DequantizeLinear", ["w2_q", "w2_s"], ["w2_dq"], name="w2_DequantizeLinear")
    for node in nodes:
        if node.name == "/Transpose_1":
            node.input[0] = "r1_DequantizeLinear_Output"
        if node.name == "/Conv_5":
            node.input[1] = "w2_dq"
            candidate.graph.node.append(dq_w2)
        candidate.graph.node.append(node)
        if node.name == "/Relu_1":
            candidate.graph.node.extend(q_r)
    candidate.graph.initializer.extend([
        *i_r,
        numpy_helper.from_array(np.round(w2 / w2_scale).astype(np.int8), "w2_q"),
        numpy_helper.from_array(np.array(w2_scale, np.float32), "w2_s"),
    ])  # fmt: skip
    data = [{"x": np.random.default_rng(2).standard_normal((2, 3, 8, 8)).astype(np.float32)}]
    report = compare_models(reference, candidate, data, rtol=1e-3)
    # the Relu's output as the Transpose reads it (after Q/DQ), or the Transpose's: either computes on INT8 values
    assert report.first_divergence in ("/Relu_1", "/Transpose_1"), report.table()
    assert report.exclude_nodes == ["/Conv_5"] and report.exclude_pattern == "^/Conv_5$", report.advice
    assert "'/Conv_5'" in (report.advice or "") and "Transpose" not in (report.advice or "")

    source = tmp_path / "cnn.onnx"
    onnx.save(reference, source)
    calibration = [{"x": np.random.default_rng(s).standard_normal((2, 3, 8, 8)).astype(np.float32)} for s in range(4)]
    plain = quantize_file(source, tmp_path / "plain.onnx", calibration_data=calibration)
    advised = quantize_file(source, tmp_path / "advised.onnx", calibration_data=calibration,
                            nodes_to_exclude=[report.exclude_pattern])  # fmt: skip
    assert [node for node, _ in advised.excluded] == ["/Conv_5"] and not plain.excluded
    assert {e.name for e in plain.layers} - {e.name for e in advised.layers} == {"/Conv_5"}
    written = onnx.load(tmp_path / "advised.onnx")
    conv = next(n for n in written.graph.node if n.name == "/Conv_5")
    assert conv.op_type == "Conv" and conv.input[1] == "w2"  # the float weight, no DequantizeLinear
    (before,), (after,) = run(tmp_path / "plain.onnx", data[0]), run(tmp_path / "advised.onnx", data[0])
    assert not np.array_equal(before, after)
    (expected,) = run(source, data[0])
    assert np.abs(after - expected).max() < np.abs(before - expected).max()
