"""The smallest new quantize mode, built on the tool base: its options, its steps and its report, nothing else.

``Int8WeightsOptions``, ``quantize_model`` and ``Int8WeightsReport`` below are a whole quantizer (INT8 weight-only,
per output channel, as DequantizeLinear in front of each MatMul): :class:`QuantizationTool` gives it ``quantize_file``
(output checked before the work, the input protected, the log level, the save with the output loaded in ONNX Runtime,
the report's step times) and :func:`command_line` its command line. The tests run it end to end.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import onnx
import onnx_ir as ir
import pytest

from onnxprec._arg_groups import log_level_option
from onnxprec._io import ModelSource, load_model
from onnxprec._report import Step
from onnxprec.errors import InvalidArgumentError
from onnxprec.quantization import _tool
from onnxprec.quantization._testing import mlp, run_fp32_compute
from onnxprec.quantization._tool import QuantizationOptions, QuantizationReportBase, QuantizationTool

# ---------------------------------------------------------------------------------------------------
# The mode: options, steps, report (41 lines of code)


@dataclasses.dataclass
class Int8WeightsOptions(QuantizationOptions):
    """INT8 weight-only quantization of MatMul weights, one scale per output channel."""

    TOOL: ClassVar[str] = "INT8 weights"
    calibration_eps: Sequence[str] = _tool.calibration_eps_option()
    use_external_data_format: bool = _tool.external_data_option()
    nodes_to_exclude: Sequence[str] | None = _tool.nodes_to_exclude_option("the node name")
    log_level: str = log_level_option()
    calibration_batch_size: int | None = _tool.calibration_batch_size_option(None, "unused: no calibration")
    sample_tokens: int = _tool.sample_tokens_option("layer input (unused: no calibration)")


@dataclasses.dataclass
class Int8WeightsReport(QuantizationReportBase):
    TOOL: ClassVar[str] = "quantize int8-weights"
    layers: list[str] = dataclasses.field(default_factory=list)

    @property
    def summary(self) -> str:
        return f"Quantized {len(self.layers)} MatMul weights to INT8"

    def to_json(self) -> dict[str, Any]:
        return {**_tool.json_start(self), "layers": self.layers, "seconds": self.seconds}


def _quantize_weights(model: ir.Model, options: Int8WeightsOptions, report: Int8WeightsReport) -> None:
    for node in list(model.graph):
        weight = node.inputs[1] if node.op_type == "MatMul" else None
        excluded = any(re.match(pattern, str(node.name)) for pattern in options.nodes_to_exclude or ())
        if weight is None or weight.const_value is None or excluded:
            continue
        w = weight.const_value.numpy()
        scale = np.maximum(np.abs(w).max(axis=0), 1e-12) / 127
        q = ir.Value(name=f"{weight.name}_q", const_value=ir.tensor(np.round(w / scale).astype(np.int8)))
        s = ir.Value(name=f"{weight.name}_scale", const_value=ir.tensor(scale.astype(np.float32)))
        dequantize = ir.node("DequantizeLinear", [q, s], attributes={"axis": 1})
        for value in (q, s):
            model.graph.register_initializer(value)
        model.graph.insert_before(node, dequantize)
        node.replace_input_with(1, dequantize.outputs[0])
        report.layers.append(str(node.name))


def quantize_model(source: ModelSource, options: Int8WeightsOptions) -> tuple[ir.Model, Int8WeightsReport]:
    model, report = load_model(source), Int8WeightsReport()
    report.run_steps([Step("quantize", lambda m: _quantize_weights(m, options, report))], model)
    return model, report


TOOL = QuantizationTool(Int8WeightsOptions, quantize_model)
quantize_file = TOOL.quantize_file  # what command_line's ``run`` calls in this module


# ---------------------------------------------------------------------------------------------------
# It runs end to end


@pytest.fixture
def model_path(tmp_path: Path) -> Path:
    path = tmp_path / "mlp.onnx"
    onnx.save(mlp(), path)
    return path


def test_the_new_mode_writes_a_model_onnx_runtime_runs_close_to_the_float_one(model_path: Path) -> None:
    report = TOOL.quantize_file(model_path, nodes_to_exclude=["/model/lm_head/MatMul"])
    written = model_path.with_name("mlp.quant.onnx")  # the base's default output, <name>.quant.onnx
    assert report.output_path == written and report.input_path == model_path
    assert report.layers == [f"/model/layers.0/{p}_proj/MatMul" for p in ("q", "k", "o")]
    assert set(report.seconds) == {"quantize", "quantize+save"}  # its step, and the base's save
    proto = onnx.load(written)
    onnx.checker.check_model(proto, full_check=True)
    assert [n.op_type for n in proto.graph.node].count("DequantizeLinear") == 3
    x = np.random.default_rng(0).standard_normal((2, 5, 64)).astype(np.float32)
    (expected,), (got,) = run_fp32_compute(model_path, {"X": x}), run_fp32_compute(written, {"X": x})
    assert np.linalg.norm(got - expected) / np.linalg.norm(expected) < 0.02  # INT8 per channel


def test_the_base_gives_the_new_mode_its_checks_and_its_command_line(model_path: Path, tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="would overwrite the input"):
        TOOL.quantize_file(model_path, model_path)
    with pytest.raises(InvalidArgumentError, match="Unknown INT8 weights option 'node_to_exclude'"):
        TOOL.quantize_file(model_path, node_to_exclude=["x"])
    import argparse

    add_arguments, run = _tool.command_line(Int8WeightsOptions, __name__)
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    out, report = tmp_path / "cli.onnx", tmp_path / "report.json"
    args = parser.parse_args(["--onnx_path", str(model_path), "--output_path", str(out), "--report_json", str(report)])
    assert run(args) == 0
    data = json.loads(report.read_text())
    assert data["tool"] == "quantize int8-weights" and data["summary"] == "Quantized 4 MatMul weights to INT8"
    assert [n.op_type for n in onnx.load(out).graph.node].count("DequantizeLinear") == 4
