"""ONNX Runtime contrib ops in AutoCast: the float contracts of the LLM ops (GroupQueryAttention, the fused
normalizations, in com.microsoft and the ONNX domain), measured ranges, and ops AutoCast has no table entry for."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper

from onnxprec._ops import CONTRIB_FLOAT_CONTRACTS
from onnxprec._testing import F16, F, make_model, run, tensor_info
from onnxprec.autocast import convert_to_mixed_precision
from onnxprec.autocast.classify import classify
from onnxprec.autocast.rules import DataRangeRule, RuleContext
from onnxprec.observers import TensorStats

MS = "com.microsoft"
HIDDEN, HEAD = 16, 8  # two query heads, one KV head (GQA: head size a multiple of 8)
I32 = TensorProto.INT32


def _decoder_layer() -> onnx.ModelProto:
    """SimplifiedLayerNormalization (ONNX domain) -> q/k/v MatMuls -> GroupQueryAttention with a KV cache ->
    SkipSimplifiedLayerNormalization, the shape of an onnxruntime-genai builder layer."""
    rng = np.random.default_rng(0)
    weights = {
        "g1": rng.uniform(0.5, 1.5, HIDDEN).astype(np.float32),
        "g2": rng.uniform(0.5, 1.5, HIDDEN).astype(np.float32),
        "wq": (rng.standard_normal((HIDDEN, HIDDEN)) * 0.3).astype(np.float32),
        "wk": (rng.standard_normal((HIDDEN, HEAD)) * 0.3).astype(np.float32),
        "wv": (rng.standard_normal((HIDDEN, HEAD)) * 0.3).astype(np.float32),
    }
    nodes = [
        helper.make_node("SimplifiedLayerNormalization", ["X", "g1"], ["h"], name="norm", epsilon=1e-5),
        helper.make_node("MatMul", ["h", "wq"], ["q"], name="q_proj"),
        helper.make_node("MatMul", ["h", "wk"], ["k"], name="k_proj"),
        helper.make_node("MatMul", ["h", "wv"], ["v"], name="v_proj"),
        helper.make_node(
            "GroupQueryAttention",
            ["q", "k", "v", "past_key", "past_value", "seqlens_k", "total_sequence_length"],
            ["attn", "present_key", "present_value"],
            domain=MS,
            name="gqa",
            num_heads=2,
            kv_num_heads=1,
        ),
        helper.make_node(
            "SkipSimplifiedLayerNormalization",
            ["attn", "X", "g2"],
            ["Y", "", "inv_std_var", "residual"],
            domain=MS,
            name="skip_norm",
            epsilon=1e-5,
        ),
    ]
    inputs = [
        tensor_info("X", F, [1, "s", HIDDEN]),
        tensor_info("past_key", F, [1, 1, "p", HEAD]),
        tensor_info("past_value", F, [1, 1, "p", HEAD]),
        tensor_info("seqlens_k", I32, [1]),
        tensor_info("total_sequence_length", I32, []),
    ]
    outputs = [
        tensor_info("Y", F, None),
        tensor_info("inv_std_var", F, None),
        tensor_info("residual", F, None),
        tensor_info("present_key", F, None),
        tensor_info("present_value", F, None),
    ]
    return make_model(nodes, inputs, outputs, weights, opset=21, extra_opsets={MS: 1})


def _feeds(scale: float = 1.0) -> dict[str, np.ndarray]:
    x = (np.random.default_rng(1).standard_normal((1, 5, HIDDEN)) * scale).astype(np.float32)
    empty = np.zeros((1, 1, 0, HEAD), np.float32)
    return {
        "X": x,
        "past_key": empty,
        "past_value": empty,
        "seqlens_k": np.array([4], np.int32),
        "total_sequence_length": np.array(5, np.int32),
    }


def _types(model: onnx.ModelProto) -> dict[str, int]:
    """Element types of every value, by name (graph I/O, initializers and the inferred or declared types)."""
    loaded = ir.serde.deserialize_model(model)
    return {str(v.name): int(v.dtype) for v in ir.convenience.create_value_mapping(loaded.graph).values() if v.dtype}


@pytest.mark.parametrize("keep_io", [False, True])
def test_decoder_layer_goes_fp16_by_its_contracts(keep_io: bool) -> None:
    model = _decoder_layer()
    feeds = _feeds()
    out = convert_to_mixed_precision(model, keep_io_types=keep_io, calibration_data=feeds)
    nodes = {n.name: n for n in out.graph.node}
    types = _types(out)
    # Every node computes in FP16: its T slots carry FP16, its integer slots and FP32 statistics stay as they were.
    for name in ("norm", "q_proj", "k_proj", "v_proj", "gqa", "skip_norm"):
        assert types[nodes[name].output[0]] == F16, name
    gqa = nodes["gqa"]
    assert [types[gqa.input[i]] for i in (0, 1, 2)] == [F16] * 3
    assert types[gqa.input[5]] == I32 and types[gqa.input[6]] == I32  # seqlens_k, total_sequence_length
    assert types[nodes["skip_norm"].output[2]] == F  # inv_std_var is U = float
    io = F if keep_io else F16
    inputs = {i.name: i.type.tensor_type.elem_type for i in out.graph.input}
    outputs = {o.name: o.type.tensor_type.elem_type for o in out.graph.output}
    assert inputs == {"X": io, "past_key": io, "past_value": io, "seqlens_k": I32, "total_sequence_length": I32}
    assert outputs == {"Y": io, "inv_std_var": io, "residual": io, "present_key": io, "present_value": io}
    casts = [n for n in out.graph.node if n.op_type == "Cast"]
    # keep_io: the three float inputs down and the four FP16 outputs up, once each; else only the FP32 statistics
    # down to the graph output's new type.
    assert len(casts) == (7 if keep_io else 1)
    expected = dict(zip([o.name for o in model.graph.output], run(model, feeds)))
    got = dict(zip([o.name for o in out.graph.output], run(out, feeds)))
    for name, ref in expected.items():
        np.testing.assert_allclose(got[name].astype(np.float32), ref, rtol=2e-2, atol=2e-2, err_msg=name)


def test_fused_ops_that_compute_in_fp32_are_held_to_the_low_types_range() -> None:
    """A residual of 2000 keeps a plain Add in FP32 (data_max 512), not the fused normalization reading it: it
    normalizes in FP32 and only stores the values, which FP16 holds; past half FP16's range it stays FP32 too."""
    x, skip, gamma = (ir.Value(name=n, type=ir.TensorType(ir.DataType.FLOAT)) for n in ("x", "skip", "gamma"))
    y = ir.Value(name="y", type=ir.TensorType(ir.DataType.FLOAT))
    norm = ir.Node(MS, "SkipSimplifiedLayerNormalization", [x, skip, gamma], outputs=[y])
    add = ir.Node("", "Add", [x, skip], outputs=[ir.Value(name="sum", type=ir.TensorType(ir.DataType.FLOAT))])

    def stats(absmax: float) -> dict[str, TensorStats]:
        small = TensorStats(1.0, -1.0, 1.0, (4,), np.dtype(np.float32))
        big = TensorStats(absmax, -absmax, absmax, (4,), np.dtype(np.float32))
        return {"x": big, "skip": small, "gamma": small, "y": small, "sum": big}

    rule = DataRangeRule(512, ir.DataType.FLOAT16)
    assert rule(norm, RuleContext(stats=stats(2000.0))) is None
    assert "> data_max 512" in (rule(add, RuleContext(stats=stats(2000.0))) or "")
    reason = rule(norm, RuleContext(stats=stats(40000.0))) or ""
    assert "reaches 4e+04 > half the float16 range 32752" in reason
    assert "> data_max 512" in (DataRangeRule(512)(norm, RuleContext(stats=stats(2000.0))) or "")  # no low type


def _single(op: str, domain: str, n_in: int, n_out: int = 1) -> ir.Model:
    values = [ir.Value(name=f"x{i}", type=ir.TensorType(ir.DataType.FLOAT)) for i in range(n_in)]
    outputs = [ir.Value(name=f"y{j}", type=ir.TensorType(ir.DataType.FLOAT)) for j in range(n_out)]
    node = ir.Node(domain, op, values, outputs=outputs, name="n")
    graph = ir.Graph(values, outputs, nodes=[node], opset_imports={"": 21, domain: 1})
    return ir.Model(graph, ir_version=10)


def test_contracts_decide_the_low_types_and_the_fp32_slots() -> None:
    # BiasAdd's T is float16 or float: BF16 keeps it in FP32, FP16 converts it.
    bias_add = _single("BiasAdd", MS, 3)
    (decision,) = classify(bias_add, low=ir.DataType.BFLOAT16, rules=[]).values()
    assert not decision.low and decision.reason == "ONNX Runtime's BiasAdd has no bfloat16 type"
    (decision,) = classify(bias_add, low=ir.DataType.FLOAT16, rules=[]).values()
    assert decision.low and not decision.fp32_inputs
    # GroupQueryAttention's k_scale/v_scale (slots 12, 13) stay FP32 in a low node, and its integer slots (5, 6, 9)
    # are never retyped, even given floats; SkipLayerNorm's statistics stay FP32.
    (decision,) = classify(_single("GroupQueryAttention", MS, 14), low=ir.DataType.FLOAT16, rules=[]).values()
    assert decision.low and decision.fp32_inputs == {5, 6, 9, 12, 13}
    skip = _single("SkipLayerNormalization", MS, 3, 4)
    (decision,) = classify(skip, low=ir.DataType.FLOAT16, rules=[]).values()
    assert decision.low and decision.fp32_outputs == {1, 2}
    assert CONTRIB_FLOAT_CONTRACTS[(MS, "SkipLayerNormalization")].output(2) == "F"


def test_ops_without_a_table_entry_are_measured_like_standard_ops() -> None:
    """An ORT contrib op AutoCast has no entry for takes its contract from ORT's schema and is classified by the
    rules (here the measured range); an op no runtime knows the types of stays FP32."""
    pytest.importorskip("onnxruntime", reason="onnxruntime is not installed")
    inverse = _single("Inverse", MS, 1)  # com.microsoft::Inverse: T is float16, float or double
    (decision,) = classify(inverse, low=ir.DataType.FLOAT16, rules=[]).values()
    assert decision.low and decision.reason == "default"
    big = {
        "x0": TensorStats(1e4, -1e4, 1e4, (2, 2), np.dtype(np.float32)),
        "y0": TensorStats(1.0, -1.0, 1.0, (2, 2), np.dtype(np.float32)),
    }
    rules = [DataRangeRule(512, ir.DataType.FLOAT16)]
    (decision,) = classify(inverse, low=ir.DataType.FLOAT16, rules=rules, ctx=RuleContext(stats=big)).values()
    assert not decision.low and "> data_max 512" in decision.reason
    (decision,) = classify(_single("Fused", "my.ops", 1), low=ir.DataType.FLOAT16, rules=[]).values()
    assert not decision.low and decision.reason == "custom op my.ops::Fused (no ONNX schema)"


def _cuda() -> bool:
    try:
        import onnxruntime as ort
    except ImportError:
        return False
    return "CUDAExecutionProvider" in ort.get_available_providers()


@pytest.mark.skipif(not _cuda(), reason="needs onnxruntime-gpu and a GPU")
def test_bf16_on_cuda_keeps_ops_without_a_cuda_bf16_kernel_in_fp32_up_front() -> None:
    """LFM2-MoE's router on CUDA: ORT 1.31 has no CUDA BF16 Reciprocal, Log or Clip (Clip it expands into its
    function body, whose Less has none either: the unnamed 'Less' of ORT's error). AutoCast probes the kernels up
    front and keeps those ops in FP32 at once, the MatMul and Add go BF16, and the output runs on CUDA."""
    import onnxruntime as ort

    from onnxprec.autocast import AutoCastOptions
    from onnxprec.autocast._api import convert_model

    nodes = [
        helper.make_node("MatMul", ["X", "W"], ["m"], name="mm"),
        helper.make_node("Clip", ["m", "lo", "hi"], ["c"], name="clip"),
        helper.make_node("Log", ["c"], ["l"], name="log"),
        helper.make_node("Reciprocal", ["l"], ["r"], name="recip"),
        helper.make_node("Add", ["r", "m"], ["Y"], name="add"),
    ]
    inits = {
        "W": np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32),
        "lo": np.array(1.5, np.float32),
        "hi": np.array(4.0, np.float32),
    }
    model = make_model(nodes, [tensor_info("X", F, [4, 8])], [tensor_info("Y", F, [4, 8])], inits, opset=22)
    x = np.random.default_rng(1).standard_normal((4, 8)).astype(np.float32)
    options = AutoCastOptions(
        low_precision_type="bf16", keep_io_types=True, providers=("cuda",), calibration_data={"X": x}
    )
    _, report, _ = convert_model(model, options)
    decided = {n.name: d for n, d in report.decisions.items()}
    assert decided["mm"].low and decided["add"].low
    for name in ("clip", "log", "recip"):
        assert not decided[name].low and "no BF16 kernel" in decided[name].reason, (name, decided[name])
    out = convert_to_mixed_precision(model, low_precision_type="bf16", keep_io_types=True, providers=["cuda"],
                                     calibration_data={"X": x})  # fmt: skip
    sess = ort.InferenceSession(out.SerializeToString(), providers=["CUDAExecutionProvider"])
    assert np.isfinite(sess.run(None, {"X": x})[0]).all()


def test_a_sliding_window_kv_cache_cast_at_the_interface_is_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    """keep_io_types with a BF16 sliding-window GroupQueryAttention and an FP16 KV cache puts Casts between the
    shared past/present buffers, which ORT's CUDA kernel needs (onnxruntime-genai on CUDA fails: measured on the
    builder's Gemma2 and GPT-OSS): a WARNING says so and how to avoid it; without the Cast, no warning."""
    from onnxprec.autocast.kernel_gaps import warn_cast_shared_kv

    def model(cast: bool) -> ir.Model:
        past = ir.Value(name="past_key_values.0.key", type=ir.TensorType(ir.DataType.FLOAT16))
        q = ir.Value(name="q", type=ir.TensorType(ir.DataType.BFLOAT16))
        nodes = []
        read = past
        if cast:
            nodes.append(ir.Node("", "Cast", [past], attributes=[ir.AttrInt64("to", 16)], name="c"))
            read = nodes[-1].outputs[0]
        gqa = ir.Node("com.microsoft", "GroupQueryAttention", [q, None, None, read, None],
                      attributes=[ir.AttrInt64("sliding_window_cache", 1)], name="attn", num_outputs=3)  # fmt: skip
        graph = ir.Graph([q, past], [gqa.outputs[0]], nodes=[*nodes, gqa], opset_imports={"": 22, "com.microsoft": 1})
        return ir.Model(graph, ir_version=10)

    with caplog.at_level("WARNING", logger="onnxprec.autocast.kernel_gaps"):
        warn_cast_shared_kv(model(cast=False))
        assert not caplog.records
        warn_cast_shared_kv(model(cast=True))
    assert "sliding-window KV cache" in caplog.text and "without --keep_io_types" in caplog.text
