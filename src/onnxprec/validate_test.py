"""Validation of models with ONNX Runtime's contrib ops: onnx.checker and strict inference cover every other node,
and ONNX Runtime proves the contrib ones by loading or running the model, never waving them through."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from onnxprec._io import load_model
from onnxprec._testing import F16, F, make_model, tensor_info
from onnxprec.autocast import convert_file, convert_to_mixed_precision
from onnxprec.errors import ValidationError
from onnxprec.validate import NumericReport, check_structure, describe_ops, load_in_ort, prove_by_run

MS = "com.microsoft"


def _model(add_input: str = "g", add_type: int = F) -> onnx.ModelProto:
    """SimplifiedLayerNormalization (ONNX domain) -> FastGelu (com.microsoft) -> Add(., bias)."""
    nodes = [
        helper.make_node("SimplifiedLayerNormalization", ["X", "scale"], ["h"], name="norm", epsilon=1e-5),
        helper.make_node("FastGelu", ["h"], ["g"], domain=MS, name="gelu"),
        helper.make_node("Add", [add_input, "bias"], ["Y"], name="add"),
    ]
    weights = {"scale": np.linspace(0.5, 1.5, 8, dtype=np.float32)}
    model = make_model(
        nodes,
        [tensor_info("X", F, [2, 8])],
        [tensor_info("Y", add_type, [2, 8])],
        weights,
        opset=21,
        extra_opsets={MS: 1},
    )
    bias = np.full(8, 0.25, np.float16 if add_type == F16 else np.float32)
    model.graph.initializer.append(onnx.numpy_helper.from_array(bias, "bias"))
    return model


def test_checker_covers_every_other_node_and_returns_the_ort_only_ones() -> None:
    ort_only = check_structure(load_model(_model()))
    assert ort_only == {"SimplifiedLayerNormalization": 1, "com.microsoft::FastGelu": 1}
    assert describe_ops(ort_only) == "2 nodes (SimplifiedLayerNormalization x1, com.microsoft::FastGelu x1)"
    # A type error in a standard node is still found with the ORT-only nodes in the model (FP32 + FP16 Add).
    broken = _model(add_input="X", add_type=F16)
    with pytest.raises(ValidationError, match=r"fails onnx.checker/type inference \(.*Add"):
        check_structure(load_model(broken))
    # A pure ONNX model has none.
    plain = make_model([helper.make_node("Relu", ["X"], ["Y"])], [tensor_info("X", F, [2])], [tensor_info("Y", F, [2])])
    assert check_structure(load_model(plain)) == {}


def _sliced(consumer: str) -> onnx.ModelProto:
    """Slice(X [2, 2, 4]) on axis 1 with step 2, its axes and steps one shared initializer (as torch exports them),
    then Squeeze of the sliced axis or Concat with a second Slice: inference gets every shape wrong if it loses the
    axes, as a shapeless value_info entry of the initializer made it do (ddddocr's Concat_40, openWakeWord's
    Squeeze__106)."""
    nodes = [helper.make_node("Slice", ["X", "one", "end", "one", "two"], ["s"], name="slice")]
    if consumer == "Squeeze":
        nodes.append(helper.make_node("Squeeze", ["s", "one"], ["Y"], name="squeeze"))
        shape = [2, 4]
    else:
        nodes.append(helper.make_node("Slice", ["X", "zero", "end", "one", "two"], ["t"], name="slice2"))
        nodes.append(helper.make_node("Concat", ["s", "t"], ["Y"], name="concat", axis=2))
        shape = [2, 1, 8]
    consts = {k: np.array([v], np.int64) for k, v in (("zero", 0), ("one", 1), ("two", 2), ("end", 2**63 - 1))}
    return make_model(nodes, [tensor_info("X", F, [2, 2, 4])], [tensor_info("Y", F, shape)], consts, opset=13)


@pytest.mark.parametrize("consumer", ["Squeeze", "Concat"])
def test_strict_inference_sees_the_data_of_initializers_onnx_ir_declares(consumer: str) -> None:
    model = load_model(_sliced(consumer))
    assert model.graph.initializers["one"].type is not None  # onnx-ir writes value_info entries for these
    assert check_structure(model) == {}
    pytest.importorskip("onnxruntime", reason="onnxruntime is not installed")
    load_in_ort(_sliced(consumer).SerializeToString(), {})


def test_onnx_runtime_proves_or_rejects_the_ort_only_nodes(caplog: pytest.LogCaptureFixture) -> None:
    pytest.importorskip("onnxruntime", reason="onnxruntime is not installed")
    model = _model()
    ort_only = check_structure(load_model(model))
    with caplog.at_level(logging.INFO, logger="onnxprec.validate"):
        load_in_ort(model.SerializeToString(), ort_only)
    assert (
        "its 2 nodes (SimplifiedLayerNormalization x1, com.microsoft::FastGelu x1), which onnx.checker" in caplog.text
    )
    # An FP16 scale on an FP32 SimplifiedLayerNormalization: onnx.checker cannot see it, ONNX Runtime can.
    wrong = _model()
    wrong.graph.initializer[0].CopyFrom(onnx.numpy_helper.from_array(np.ones(8, np.float16), "scale"))
    assert check_structure(load_model(wrong)) == ort_only  # passes everything ONNX can check
    with pytest.raises(ValidationError, match=r"ONNX Runtime rejects the output \(.*\), and only it can check"):
        load_in_ort(wrong.SerializeToString(), ort_only)


def test_a_run_that_fails_fails_models_with_ort_only_nodes(caplog: pytest.LogCaptureFixture) -> None:
    fast_gelu = {"com.microsoft::FastGelu": 1}
    prove_by_run(NumericReport(skipped="ONNX Runtime could not run it"), {})  # nothing to prove
    prove_by_run(NumericReport(), fast_gelu)  # ran: proved
    with pytest.raises(ValidationError, match=r"^ONNX Runtime could not run it; only ONNX Runtime can check the"):
        prove_by_run(NumericReport(skipped="ONNX Runtime could not run it"), fast_gelu)
    # The graph typed in ONNX Runtime, only a kernel is missing on this provider: proved types, a WARNING.
    with caplog.at_level(logging.WARNING, logger="onnxprec.validate"):
        prove_by_run(NumericReport(skipped="no BF16 FastGelu", no_kernel=True), fast_gelu)
    assert "they are type-checked, not run" in caplog.text


def test_autocast_proves_contrib_ops_by_its_run_and_never_waves_them_through(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pytest.importorskip("onnxruntime", reason="onnxruntime is not installed")
    source = tmp_path / "m.onnx"
    onnx.save(_model(), source)
    x = np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)
    output = tmp_path / "out.onnx"
    with caplog.at_level(logging.INFO, logger="onnxprec"):
        report = convert_file(source, output, calibration_data={"X": x})
    assert report.ort_only == {"SimplifiedLayerNormalization": 1, "com.microsoft::FastGelu": 1}
    assert report.numeric is not None and not report.numeric.skipped
    assert "which onnx.checker cannot type, are proved by the run" in caplog.text
    assert report.to_json()["ort_only_nodes"] == report.ort_only
    # BF16 by ModelOpt's API, which converts as ModelOpt does (convert_file refuses BF16 with only the CPU provider):
    # ONNX Runtime's CPU provider has no BF16 FastGelu: the graph types in ORT, the run is not possible here.
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="onnxprec"):
        convert_to_mixed_precision(str(source), calibration_data={"X": x}, low_precision_type="bf16")
    assert "Numeric check skipped" in caplog.text and "typed the output's 2 nodes" in caplog.text
    assert "type-checked, not run" in caplog.text
    # Without a reference run (data_max inf) the output is proved by loading it in ONNX Runtime.
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="onnxprec"):
        convert_file(source, tmp_path / "inf.onnx", data_max=float("inf"))
    assert "ONNX Runtime loads the output: its 2 nodes" in caplog.text


@pytest.mark.slow
def test_int4_output_with_contrib_ops_is_loaded_in_onnx_runtime(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pytest.importorskip("onnxruntime", reason="onnxruntime is not installed")
    from onnxprec.quantization.int4 import quantize_file

    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("SimplifiedLayerNormalization", ["X", "scale"], ["h"], name="norm", epsilon=1e-5),
        helper.make_node("MatMul", ["h", "W"], ["Y"], name="proj"),
    ]
    weights = {"scale": np.ones(64, np.float32), "W": rng.standard_normal((64, 32)).astype(np.float32)}
    source = tmp_path / "m.onnx"
    onnx.save(make_model(nodes, [tensor_info("X", F, [2, 64])], [tensor_info("Y", F, [2, 32])], weights), source)
    for fmt in ("qdq", "matmulnbits"):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="onnxprec"):
            report = quantize_file(source, tmp_path / f"{fmt}.onnx", calibration_method="rtn", output_format=fmt,
                                   block_size=32, nodes_to_exclude=[], accuracy_guard=False)  # fmt: skip
        expected = {"SimplifiedLayerNormalization": 1} | ({"com.microsoft::MatMulNBits": 1} if fmt != "qdq" else {})
        assert report.ort_only == expected
        # INT4's measurement of the written output (the guard off; on, the guard runs the result in memory) runs it
        # (segment by segment when large): that proves the nodes, with no session of the whole output
        assert "ONNX Runtime ran the output" in caplog.text and "ONNX Runtime loads the output" not in caplog.text
        assert TensorProto.FLOAT in {
            o.type.tensor_type.elem_type for o in onnx.load(tmp_path / f"{fmt}.onnx").graph.output
        }


def test_numeric_check_runs_a_large_output_in_segments_like_the_reference_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # The check of a converted model never maps more weights at once than the reference run did: with 1 KiB
    # segments each 16x16 FP32 weight is a session of its own, and the check still compares every output.
    import onnxprec.reference

    monkeypatch.setattr(onnxprec.reference, "DEFAULT_SEGMENT_BYTES", 1024)
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x" if i == 0 else f"h{i}", f"w{i}"], [f"h{i + 1}"]) for i in range(4)]
    nodes.append(helper.make_node("Relu", ["h4"], ["y"]))
    weights = {f"w{i}": (rng.standard_normal((16, 16)) / 4).astype(np.float32) for i in range(4)}
    source = tmp_path / "chain.onnx"
    onnx.save(make_model(nodes, [tensor_info("x", F, [2, 16])], [tensor_info("y", F, [2, 16])], weights), source)
    with caplog.at_level(logging.DEBUG, logger="onnxprec.reference"):
        report = convert_file(source, tmp_path / "chain.fp16.onnx")
    runs = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Reference run:")]
    # The reference run (four FP32 weights of 1 KiB), then the check (FP16 weights: two to a segment).
    assert len(runs) == 2 and "in 4 segments" in runs[0] and "in 2 segments" in runs[1], runs
    assert report.numeric is not None and not report.numeric.skipped
    assert 0 < report.numeric.errors["y"]["rel_l2"] < 1e-2


def _declared_rank_2(opset: int, output_type: int = F) -> onnx.ModelProto:
    """``X [N, 32] @ W -> [N, 16]``, reshaped to ``[N, 4, 4]`` by a shape computed from its own Shape (as ddddocr's
    recognizer ends), while the graph output declares ``[N, 16]``: Reshape-14's inference sees the rank-3 result,
    Reshape-5's does not. ONNX Runtime runs it either way, merging the declared shape leniently."""
    nodes = [
        helper.make_node("MatMul", ["X", "W"], ["h"], name="/fc"),
        helper.make_node("Shape", ["h"], ["hs"], name="/shape"),
        helper.make_node("Gather", ["hs", "zero"], ["n"], name="/gather", axis=0),
        helper.make_node("Unsqueeze", ["n"], ["n1"], name="/unsqueeze", axes=[0]),
        helper.make_node("Concat", ["n1", "four", "four"], ["dims"], name="/concat", axis=0),
        helper.make_node("Reshape", ["h", "dims"], ["Y"], name="/reshape"),
    ]
    if opset >= 13:
        nodes[3] = helper.make_node("Unsqueeze", ["n", "axes"], ["n1"], name="/unsqueeze")
    weights = {
        "W": np.random.default_rng(0).standard_normal((32, 16)).astype(np.float32),
        "zero": np.array(0, np.int64),
        "four": np.array([4], np.int64),
        "axes": np.array([0], np.int64),
    }
    inputs, outputs = [tensor_info("X", F, ["N", 32])], [tensor_info("Y", output_type, ["N", 16])]
    return make_model(nodes, inputs, outputs, weights, opset=opset)


def test_a_wrong_declared_output_shape_passes_as_onnx_runtime_loads_it_and_types_are_still_checked() -> None:
    pytest.importorskip("onnxruntime", reason="onnxruntime is not installed")
    model = _declared_rank_2(opset=14)
    with pytest.raises(onnx.shape_inference.InferenceError, match="differ in rank"):
        onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    assert check_structure(load_model(model)) == {}
    load_in_ort(model.SerializeToString(), {})
    with pytest.raises(ValidationError, match=r"fails onnx.checker/type inference \(.*Reshape"):
        check_structure(load_model(_declared_rank_2(opset=14, output_type=F16)))  # a declared FP16 output


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["int4", "fp8"])
def test_quantizers_upgrading_the_opset_keep_a_model_whose_declared_output_rank_is_wrong(
    tmp_path: Path, mode: str
) -> None:
    """ddddocr's recognizer (opset 12) was refused by INT4 and FP8 after their opset upgrade made Reshape's
    inference see the rank its graph output misdeclares."""
    pytest.importorskip("onnxruntime", reason="onnxruntime is not installed")
    from onnxprec.quantization import quantize

    source, out = tmp_path / "m.onnx", tmp_path / "q.onnx"
    model = _declared_rank_2(opset=12)
    onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)  # passes at opset 12
    onnx.save(model, source)
    x = np.random.default_rng(1).standard_normal((8, 32)).astype(np.float32)
    extra = {"block_size": 16} if mode == "int4" else {}
    quantize(str(source), quantize_mode=mode, output_path=str(out), calibration_data=[{"X": x}], accuracy_guard=False,
             **extra)  # fmt: skip
    written = onnx.load(out)
    assert written.graph.output[0] == model.graph.output[0]  # the user's interface, as declared
    assert next(o.version for o in written.opset_import if o.domain in ("", "ai.onnx")) >= 14
    import onnxruntime as ort

    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    (y,) = session.run(None, {"X": x})
    expected = (x @ onnx.numpy_helper.to_array(model.graph.initializer[0])).reshape(8, 4, 4)
    assert y.shape == (8, 4, 4) and np.linalg.norm(y - expected) / np.linalg.norm(expected) < 0.2


def test_autocasts_check_decodes_a_time_major_ctc_head_per_sequence(tmp_path: Path) -> None:
    """A ``[T, N, C]`` CTC head (ddddocr's): the check decodes N strings of T steps (it took each of the T steps for
    a string of one), and where the float model reads every input as blanks the summary says it read nothing."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((8, 5)) * 0.1).astype(np.float32)
    b = np.array([4.0, 0, 0, 0, 0], np.float32)  # the blank wins every step: random data decodes to empty strings
    nodes = [
        helper.make_node("Transpose", ["X"], ["t"], perm=[1, 0, 2]),  # [N, T, 8] -> [T, N, 8]
        helper.make_node("MatMul", ["t", "W"], ["m"]),
        helper.make_node("Add", ["m", "B"], ["s"]),
        helper.make_node("Softmax", ["s"], ["Y"], axis=-1),
    ]
    inputs, outputs = [tensor_info("X", F, [2, 6, 8])], [tensor_info("Y", F, [6, 2, 5])]
    source = tmp_path / "ctc.onnx"
    onnx.save(make_model(nodes, inputs, outputs, {"W": w, "B": b}), source)
    report = convert_file(source, tmp_path / "fp16.onnx", keep_io_types=True)
    assert report.numeric is not None and report.numeric.task is not None
    (output,) = report.numeric.task.outputs
    assert (output.metric, output.count, output.empty) == ("string_agreement", 2, True)
    assert "of 2 sequences (every FP32 string empty: nothing read)" in report.summary
    assert "it cannot judge the task on real data" in report.summary
