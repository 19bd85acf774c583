"""onnxprec.preprocess.quant_pre_process: ONNX Runtime's steps and results, and where ORT's version fails.

Each test that compares with ONNX Runtime runs ORT's own ``quant_pre_process`` on the same model and checks
the same op-type counts and the same inferred shapes.
"""

from __future__ import annotations

import collections
import hashlib
import inspect
import json
import logging
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import helper

import onnxprec._io
from onnxprec._options import signature_mismatches
from onnxprec._testing import F, make_model, run, run_cli, shared_path, tensor_info
from onnxprec.errors import InvalidArgumentError, ModelLoadError, UnsupportedModelError
from onnxprec.preprocess import PreprocessOptions, quant_pre_process
from onnxprec.preprocess import _api as api

ort_shape_inference = pytest.importorskip("onnxruntime.quantization.shape_inference")

RNG = np.random.default_rng(0)


def _conv_bn_relu() -> onnx.ModelProto:
    weights = {
        "W": RNG.standard_normal((8, 3, 3, 3)).astype(np.float32),
        "scale": (RNG.random(8) + 0.5).astype(np.float32),
        "bias": RNG.standard_normal(8).astype(np.float32),
        "mean": RNG.standard_normal(8).astype(np.float32),
        "var": (RNG.random(8) + 0.5).astype(np.float32),
        "shape": np.array([0, -1], dtype=np.int64),
    }
    nodes = [
        helper.make_node("Conv", ["x", "W"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["bn"], name="bn"),
        helper.make_node("Relu", ["bn"], ["r"], name="relu"),
        helper.make_node("Reshape", ["r", "shape"], ["y"], name="flatten"),
    ]
    return make_model(nodes, [tensor_info("x", F, ["N", 3, 16, 16])], [tensor_info("y", F, ["N", 2048])], weights)


def _if_model() -> onnx.ModelProto:
    then_branch = helper.make_graph(
        [helper.make_node("MatMul", ["x", "M"], ["t"], name="then_mm")], "then", [], [tensor_info("t", F, None)]
    )
    else_branch = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["n"], name="neg"), helper.make_node("MatMul", ["n", "M"], ["e"], name="mm")],
        "else",
        [],
        [tensor_info("e", F, None)],
    )
    nodes = [
        helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0, name="sum"),
        helper.make_node("Greater", ["s", "zero"], ["cond"], name="gt"),
        helper.make_node("If", ["cond"], ["y"], then_branch=then_branch, else_branch=else_branch, name="if"),
        helper.make_node("Relu", ["y"], ["z"], name="relu"),
    ]
    weights = {"zero": np.zeros((), np.float32), "M": RNG.standard_normal((4, 5)).astype(np.float32)}
    return make_model(nodes, [tensor_info("x", F, ["N", 4])], [tensor_info("z", F, None)], weights)


def _contrib_model() -> onnx.ModelProto:
    nodes = [
        helper.make_node("FusedMatMul", ["x", "M"], ["m"], domain="com.microsoft", alpha=0.5, name="fmm"),
        helper.make_node("Gelu", ["m"], ["g"], domain="com.microsoft", name="gelu"),
        helper.make_node("Relu", ["g"], ["z"], name="relu"),
    ]
    weights = {"M": RNG.standard_normal((4, 5)).astype(np.float32)}
    return make_model(
        nodes,
        [tensor_info("x", F, ["N", 4])],
        [tensor_info("z", F, None)],
        weights,
        extra_opsets={"com.microsoft": 1},
    )


def _big_weights_model() -> onnx.ModelProto:
    """Two MatMuls with 64 KiB weights, a constant-foldable Add of two initializers, and a shape chain."""
    w1 = RNG.standard_normal((128, 128)).astype(np.float32)
    w2 = RNG.standard_normal((128, 64)).astype(np.float32)
    nodes = [
        helper.make_node("Add", ["w2", "w2_delta"], ["w2_sum"], name="fold_me"),
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "w2_sum"], ["y"], name="mm2"),
    ]
    weights = {"w1": w1, "w2": w2, "w2_delta": np.full((128, 64), 0.5, np.float32)}
    return make_model(nodes, [tensor_info("x", F, ["batch", 128])], [tensor_info("y", F, None)], weights)


def _save(model: onnx.ModelProto, path: Path, **kwargs: object) -> Path:
    onnx.save(model, path, **kwargs)  # type: ignore[arg-type]
    return path


def _op_counts(model: onnx.ModelProto) -> collections.Counter[str]:
    return collections.Counter(node.op_type for node in model.graph.node)


def _shapes(model: onnx.ModelProto) -> dict[str, list[int | str]]:
    """Shapes of main-graph node outputs, as written in value_info and graph outputs."""
    produced = {name for node in model.graph.node for name in node.output}
    result = {}
    for info in (*model.graph.value_info, *model.graph.output):
        if info.name in produced and info.type.tensor_type.HasField("shape"):
            dims = info.type.tensor_type.shape.dim
            result[info.name] = [d.dim_value if d.HasField("dim_value") else d.dim_param for d in dims]
    return result


def _ort_pre_process(source: Path, out: Path) -> onnx.ModelProto:
    ort_shape_inference.quant_pre_process(str(source), str(out))
    return onnx.load(out)


def _assert_same_as_ort(ours: onnx.ModelProto, theirs: onnx.ModelProto) -> None:
    assert _op_counts(ours) == _op_counts(theirs)
    assert _shapes(ours) == _shapes(theirs)
    assert {p.key: p.value for p in ours.metadata_props}["onnx.quant.pre_process"] == "onnxruntime.quant"


def _outputs_equal(a: Path | onnx.ModelProto, b: Path | onnx.ModelProto, feeds: dict[str, np.ndarray]) -> None:
    for x, y in zip(run(a, feeds), run(b, feeds)):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-5)


def test_conv_bn_relu_agrees_with_onnxruntime(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    source = _save(_conv_bn_relu(), tmp_path / "cbr.onnx")
    theirs = _ort_pre_process(source, tmp_path / "ort.onnx")
    with caplog.at_level(logging.INFO, logger="onnxprec"):
        report = quant_pre_process(source, tmp_path / "ours.onnx")
    ours = onnx.load(tmp_path / "ours.onnx")
    _assert_same_as_ort(ours, theirs)
    assert _op_counts(ours) == {"Conv": 1, "Relu": 1, "Reshape": 1}  # BatchNormalization fused into Conv
    assert _shapes(ours)["y"] == ["N", 2048]
    assert {o.domain for o in ours.opset_import} == {""}  # not ORT's list of every domain it knows
    _outputs_equal(source, tmp_path / "ours.onnx", {"x": RNG.standard_normal((2, 3, 16, 16)).astype(np.float32)})
    optimize = next(s for s in report.steps if s.name.startswith("ONNX Runtime"))
    assert optimize.op_changes == {"BatchNormalization": (1, 0)}
    assert (optimize.nodes_before, optimize.nodes_after) == (4, 3)
    assert "BatchNormalization 1->0" in caplog.text and "shapes newly known" in caplog.text
    assert json.dumps(report.to_json())  # JSON-ready


@pytest.mark.slow
def test_if_subgraph_model(tmp_path: Path) -> None:
    source = _save(_if_model(), tmp_path / "if.onnx")
    quant_pre_process(source, tmp_path / "ours.onnx")
    ours = onnx.load(tmp_path / "ours.onnx")
    onnx.checker.check_model(ours)
    assert "If" in _op_counts(ours)
    assert _shapes(ours)["z"] == ["N", 5]
    for sign in (1.0, -1.0):
        _outputs_equal(source, ours, {"x": sign * np.abs(RNG.standard_normal((3, 4))).astype(np.float32)})
    _assert_same_as_ort(ours, _ort_pre_process(source, tmp_path / "ort.onnx"))


@pytest.mark.slow
def test_contrib_ops_where_onnxruntime_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    source = _save(_contrib_model(), tmp_path / "ms.onnx")
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    with pytest.raises(Exception, match="Incomplete symbolic shape inference"):
        ort_shape_inference.quant_pre_process(str(source), str(tmp_path / "ort.onnx"))
    (work / "sym_shape_infer_temp.onnx").unlink()  # ORT's leftover in the working folder
    with caplog.at_level(logging.WARNING, logger="onnxprec"):
        report = quant_pre_process(source, tmp_path / "ours.onnx")
    assert "stopped at node 'fmm' (com.microsoft.FusedMatMul)" in caplog.text
    assert not list(work.iterdir())  # no sym_shape_infer_temp.onnx from us
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".onnxprec")]  # temporary folder removed
    ours = onnx.load(tmp_path / "ours.onnx")
    assert [n.op_type for n in ours.graph.node] == ["FusedMatMul", "Gelu", "Relu"]
    assert {o.domain: o.version for o in ours.opset_import} == {"": 17, "com.microsoft": 1}
    assert report.steps[1].warnings and not report.steps[2].skipped
    _outputs_equal(source, ours, {"x": RNG.standard_normal((3, 4)).astype(np.float32)})


@pytest.mark.slow
def test_symbolic_shape_inference_crash_is_a_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from onnxruntime.tools import symbolic_shape_infer

    def boom(self: object, *args: object) -> bool:
        raise AssertionError("handler failed")

    monkeypatch.setattr(symbolic_shape_infer.SymbolicShapeInference, "_infer_impl", boom)
    source = _save(_conv_bn_relu(), tmp_path / "cbr.onnx")
    report = quant_pre_process(source, tmp_path / "ours.onnx")
    assert report.steps[1].skipped == "it failed: AssertionError: handler failed"
    assert _shapes(onnx.load(tmp_path / "ours.onnx"))["y"] == ["N", 2048]  # ONNX shape inference still ran


@pytest.mark.slow
def test_external_data_input_and_output(tmp_path: Path) -> None:
    source = _save(
        _big_weights_model(), tmp_path / "in.onnx", save_as_external_data=True, location="in.weights", size_threshold=0
    )
    digest = hashlib.sha256((tmp_path / "in.weights").read_bytes()).hexdigest()
    out = tmp_path / "out" / "model.onnx"
    out.parent.mkdir()
    report = quant_pre_process(
        source, out, save_as_external_data=True, all_tensors_to_one_file=True, external_data_location="w.bin"
    )
    assert report.external_data
    assert sorted(p.name for p in out.parent.iterdir()) == ["model.onnx", "w.bin"]
    assert out.stat().st_size < 4096  # the weights are in w.bin
    assert hashlib.sha256((tmp_path / "in.weights").read_bytes()).hexdigest() == digest
    folded = onnx.load(out)
    assert _op_counts(folded) == {"MatMul": 2, "Relu": 1}  # Add of two initializers constant-folded
    _outputs_equal(source, out, {"x": RNG.standard_normal((2, 128)).astype(np.float32)})


@pytest.mark.slow
def test_one_file_per_tensor_as_onnx_does(tmp_path: Path) -> None:
    source = _save(_big_weights_model(), tmp_path / "in.onnx")
    out = tmp_path / "out" / "model.onnx"
    out.parent.mkdir()
    quant_pre_process(source, out, save_as_external_data=True, external_data_size_threshold=1024)
    names = sorted(p.name for p in out.parent.iterdir())
    assert names[0] == "model.onnx" and len(names) == 3  # two weights above 1 KiB, each in its own file
    _outputs_equal(source, out, {"x": RNG.standard_normal((2, 128)).astype(np.float32)})


@pytest.mark.slow
def test_above_the_protobuf_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Above 2 GB (forced low here) every step still runs and the output gets external data."""
    monkeypatch.setattr(onnxprec._io, "PROTOBUF_LIMIT", 10_000)
    source = _save(_big_weights_model(), tmp_path / "in.onnx", save_as_external_data=True, location="in.data")
    out = tmp_path / "out.onnx"
    with caplog.at_level(logging.INFO, logger="onnxprec"):
        report = quant_pre_process(source, out)
    assert report.external_data and (tmp_path / "out.onnx.data").is_file()
    assert "exceed the 2 GB protobuf limit" in caplog.text
    assert not any(step.skipped for step in report.steps[1:])
    assert _op_counts(onnx.load(out)) == {"MatMul": 2, "Relu": 1}
    _outputs_equal(source, out, {"x": RNG.standard_normal((2, 128)).astype(np.float32)})


@pytest.mark.slow
def test_opset_upgrade_verified(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    source = _save(_conv_bn_relu(), tmp_path / "cbr.onnx")
    with caplog.at_level(logging.INFO, logger="onnxprec"):
        report = quant_pre_process(source, tmp_path / "o21.onnx", opset=21)
    model = onnx.load(tmp_path / "o21.onnx")
    assert {o.domain: o.version for o in model.opset_import}[""] == 21
    assert model.ir_version >= 10
    assert "Opset 17 -> 21: outputs agree" in caplog.text
    assert not report.steps[0].skipped
    _outputs_equal(source, model, {"x": RNG.standard_normal((1, 3, 16, 16)).astype(np.float32)})


def test_opset_upgrade_that_changes_outputs_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    class BadUpgrade(ir.passes.InPlacePass):
        def __init__(self, target: int) -> None:
            super().__init__()
            self.target = target

        def call(self, model: ir.Model) -> ir.passes.PassResult:
            model.opset_imports[""] = self.target
            for node in model.graph:
                if node.op_type == "Relu":
                    node.op_type = "Neg"
            return ir.passes.PassResult(model, modified=True)

    monkeypatch.setattr(api, "UpgradeOpsetPass", BadUpgrade)
    source = _save(_conv_bn_relu(), tmp_path / "cbr.onnx")
    with pytest.raises(UnsupportedModelError, match=r"opset 17 -> 18 conversion changed output 'y'.*relative L2"):
        quant_pre_process(source, tmp_path / "bad.onnx", opset=18)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cbr.onnx"]  # no output, no temporary folder


@pytest.mark.slow
def test_old_opset_upsample_keeps_its_sampling(tmp_path: Path) -> None:
    """Opset <= 10 becomes 11 as in ORT, but Resize keeps Upsample's asymmetric/floor sampling (ORT's does not)."""
    nodes = [helper.make_node("Upsample", ["x", "scales"], ["y"], mode="nearest", name="up")]
    scales = np.array([1, 1, 1.5, 1.75], np.float32)
    proto = make_model(
        nodes,
        [tensor_info("x", F, [1, 1, 4, 4])],
        [tensor_info("y", F, [1, 1, 6, 7])],
        {"scales": scales},
        opset=9,
        ir_version=7,
    )
    source = _save(proto, tmp_path / "up.onnx")
    quant_pre_process(source, tmp_path / "out.onnx")
    model = onnx.load(tmp_path / "out.onnx")
    assert {o.domain: o.version for o in model.opset_import}[""] == 11
    assert [n.op_type for n in model.graph.node] == ["Resize"]
    _outputs_equal(source, model, {"x": RNG.standard_normal((1, 1, 4, 4)).astype(np.float32)})


def test_never_overwrites_the_input(tmp_path: Path) -> None:
    source = _save(_big_weights_model(), tmp_path / "in.onnx", save_as_external_data=True, location="in.onnx.data")
    with pytest.raises(InvalidArgumentError, match="would overwrite the input"):
        quant_pre_process(source, source)
    with pytest.raises(InvalidArgumentError, match="would overwrite the input"):
        quant_pre_process(
            source,
            tmp_path / "out.onnx",
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            external_data_location="in.onnx.data",
        )
    with pytest.raises(ModelLoadError, match="does not exist"):
        quant_pre_process(tmp_path / "missing.onnx", tmp_path / "out.onnx")
    with pytest.raises(InvalidArgumentError, match="relative to the output"):
        quant_pre_process(source, tmp_path / "out.onnx", save_as_external_data=True, external_data_location="/x/y")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.onnx", "in.onnx.data"]


def test_in_memory_model_proto(tmp_path: Path) -> None:
    quant_pre_process(_conv_bn_relu(), tmp_path / "out.onnx", skip_symbolic_shape=True)
    assert _op_counts(onnx.load(tmp_path / "out.onnx")) == {"Conv": 1, "Relu": 1, "Reshape": 1}


@pytest.mark.slow
def test_same_signature_as_onnxruntime() -> None:
    ours = inspect.signature(quant_pre_process).parameters
    theirs = inspect.signature(ort_shape_inference.quant_pre_process).parameters
    names = [n for n, p in theirs.items() if p.kind is p.POSITIONAL_OR_KEYWORD][1:]  # input_model vs _path
    assert list(ours)[1 : len(names) + 1] == names
    assert all(ours[n].default == theirs[n].default for n in names[1:])
    skip = ("input_model_path", "output_model_path", "input_model", "providers")
    assert signature_mismatches(quant_pre_process, PreprocessOptions, skip=skip) == []


@pytest.mark.slow
def test_onnxruntime_keyword_names(tmp_path: Path) -> None:
    source = _save(_conv_bn_relu(), tmp_path / "cbr.onnx")
    quant_pre_process(input_model=source, output_model_path=tmp_path / "a.onnx", skip_symbolic_shape=True)
    assert (tmp_path / "a.onnx").is_file()
    with pytest.raises(InvalidArgumentError, match="exactly once"):
        quant_pre_process(source, tmp_path / "b.onnx", input_model=source)
    with pytest.raises(InvalidArgumentError, match="output_model_path is required"):
        quant_pre_process(source)


def _registered(words: str) -> bool:
    from onnxprec import cli

    return any(name == words for name, _, _ in cli.TOOLS)


@pytest.mark.slow
def test_command_line_flags_and_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from onnxprec.preprocess import _cli

    source = _save(_conv_bn_relu(), tmp_path / "cbr.onnx")
    report_path = tmp_path / "report.json"
    parser = argparse.ArgumentParser()
    _cli.add_arguments(parser)
    args = parser.parse_args(["--input", str(source), "--skip_symbolic_shape", "--report_json", str(report_path)])
    assert _cli.run(args) == 0
    assert (tmp_path / "cbr.pre.onnx").is_file()  # default output beside the input
    assert "Pre-processed: 4 -> 3 nodes" in capsys.readouterr().out
    report = json.loads(report_path.read_text())
    assert [(s["name"], s["skipped"]) for s in report["steps"]] == [
        ("opset", "the model is at opset 17"),
        ("symbolic shape inference", "skip_symbolic_shape"),
        ("ONNX Runtime optimization (basic)", None),
        ("ONNX shape inference", None),
    ]
    assert report["steps"][2]["op_changes"] == {"BatchNormalization": {"before": 1, "after": 0}}
    for flag in ("--skip_optimization", "--auto_merge", "--int_max", "--guess_output_rank", "--verbose"):
        assert flag in parser.format_help()
    assert "--save_as_external_data" in parser.format_help() and "--opset" in parser.format_help()


@pytest.mark.slow
@pytest.mark.skipif(not _registered("preprocess"), reason="'preprocess' is not yet registered in onnxprec.cli.TOOLS")
def test_subcommand(tmp_path: Path) -> None:
    source = _save(_conv_bn_relu(), tmp_path / "cbr.onnx")
    for module, words in (("onnxprec.preprocess", []), ("onnxprec", ["preprocess"])):
        out = tmp_path / f"out{len(words)}.onnx"
        result = run_cli(*words, "--input", str(source), "--output", str(out), module=module)
        assert result.returncode == 0, result.stderr
        assert out.is_file() and "Pre-processed: 4 -> 3 nodes" in result.stdout
    bad = run_cli("preprocess", "--input", str(tmp_path / "nope.onnx"))
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "does not exist" in bad.stderr
    helptext = run_cli("preprocess", "--help").stdout
    assert "--skip_symbolic_shape" in helptext and "examples:" in helptext


# --------------------------------------------------------------------------------------------------
# Real models (../shared/models and the zoo cache)

EFFICIENTNET = shared_path("models", "efficientnet_lite0.onnx")
MINILM = shared_path("models", "minilm_l6_v2_bert.onnx")


@pytest.mark.slow
@pytest.mark.skipif(EFFICIENTNET is None, reason="../shared/models is absent (fresh clone): real-model test skipped")
def test_efficientnet_agrees_with_onnxruntime(tmp_path: Path) -> None:
    assert EFFICIENTNET is not None
    theirs = _ort_pre_process(EFFICIENTNET, tmp_path / "ort.onnx")
    report = quant_pre_process(EFFICIENTNET, tmp_path / "ours.onnx")
    ours = onnx.load(tmp_path / "ours.onnx")
    _assert_same_as_ort(ours, theirs)
    assert len(ours.graph.node) == 93 and "Pad" not in _op_counts(ours)  # Pads folded into Conv by ORT
    photos = np.load(EFFICIENTNET.with_name("efficientnet_lite0_input.npy"))
    _outputs_equal(EFFICIENTNET, ours, {"input": photos})
    assert report.steps[-1].shapes_after == 93


@pytest.mark.slow
@pytest.mark.skipif(MINILM is None, reason="../shared/models is absent (fresh clone): real-model test skipped")
def test_minilm_where_onnxruntime_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert MINILM is not None
    monkeypatch.chdir(tmp_path)
    with pytest.raises(Exception, match="Incomplete symbolic shape inference"):
        ort_shape_inference.quant_pre_process(str(MINILM), str(tmp_path / "ort.onnx"))
    report = quant_pre_process(MINILM, tmp_path / "ours.onnx")
    ours = onnx.load(tmp_path / "ours.onnx")
    assert len(ours.graph.node) < 516
    assert report.steps[-1].shapes_after == report.steps[-1].values_after  # every tensor's shape known
    feeds = dict(np.load(MINILM.with_name("minilm_l6_v2_bert_inputs.npz")))
    _outputs_equal(MINILM, ours, feeds)


@pytest.mark.slow
def test_the_result_is_checked_against_the_input_and_the_summary_says_so(tmp_path: Path) -> None:
    """Issue 24, nothing silent: the output is run against the input on random data; the summary and the report
    say how (the flattened [N, 2048] output after a Relu is values: cosine and relative L2)."""
    source = _save(_conv_bn_relu(), tmp_path / "cbr.onnx")
    report = quant_pre_process(str(source), str(tmp_path / "out.onnx"))
    assert report.check["random_data"] and report.check["outputs"]["y"]["kind"] == "values"
    assert report.check["worst_rel_l2"] < 1e-5
    assert "; checked on random data (1 run): float outputs rel L2 <= " in report.summary
    assert report.to_json()["accuracy_check"] == report.check


@pytest.mark.slow
def test_a_model_that_runs_on_no_random_inputs_is_written_and_its_check_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Regression: the check of the result on random data raised CalibrationDataError after the output was written,
    so the command exited 2 with advice (--input_shapes) that preprocess does not take."""
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape")]  # [N, 7] -> [5, -1]: N % 5 == 0
    shape = np.array([5, -1], np.int64)
    proto = make_model(nodes, [tensor_info("x", F, ["N", 7])], [tensor_info("y", F, [5, None])], {"shape": shape})
    source, output = _save(proto, tmp_path / "reshape.onnx"), tmp_path / "out.onnx"
    report = quant_pre_process(str(source), str(output))
    assert output.exists() and not report.check
    assert any("not checked against the input" in r.getMessage() for r in caplog.records if r.levelname == "WARNING")
