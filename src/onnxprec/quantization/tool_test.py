"""Tests of the quantization-tool base: INT4 and INT8 check the settings they share the same way, once."""

from __future__ import annotations

from pathlib import Path

import pytest

from onnxprec._options import option_fields
from onnxprec.errors import InvalidArgumentError
from onnxprec.quantization import int4, int8
from onnxprec.quantization._tool import QuantizationOptions

TOOLS = (int4.Int4Options, int8.Int8Options)


@pytest.mark.parametrize("cls", TOOLS)
@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"log_level": "LOUD"}, "log_level must be one of DEBUG, INFO, WARNING, ERROR, got 'LOUD'."),
        ({"sample_tokens": 0}, "sample_tokens must be a positive integer, got 0."),
        ({"calibration_batch_size": -1}, "calibration_batch_size must be >= 0, got -1."),
        ({"nodes_to_exclude": ["("]}, "Invalid regular expression '(' in nodes_to_exclude"),
        ({"gptq_damp": 0.0}, "gptq_damp must be > 0, got 0.0."),
        ({"gptq_damp": -1.0}, "gptq_damp must be > 0, got -1.0."),
    ],
)
def test_shared_settings_are_checked_alike(cls: type[QuantizationOptions], setting: dict, message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message.replace("(", r"\(").replace(")", r"\)")):
        cls(**setting)


@pytest.mark.parametrize("cls", TOOLS)
def test_an_unknown_keyword_names_the_tool_and_the_closest_option(cls: type[QuantizationOptions]) -> None:
    with pytest.raises(InvalidArgumentError, match=f"Unknown {cls.TOOL} option 'sample_token'. Did you mean"):
        cls.from_call(None, {"sample_token": 3})
    with pytest.raises(InvalidArgumentError, match="got both options= and sample_tokens="):
        cls.from_call(cls(), {"sample_tokens": 3})


def test_the_shared_flags_are_declared_once() -> None:
    specs = [{f.name: spec for f, spec in option_fields(cls)} for cls in TOOLS]
    for name in ("calibration_eps", "log_level", "use_external_data_format"):
        assert specs[0][name].help == specs[1][name].help
    assert specs[0]["nodes_to_exclude"].help.startswith("Regexes of the nodes kept in float, matched")
    for spec in (specs[0]["gptq_damp"], specs[1]["gptq_damp"]):  # one sentence; each tool's default and why
        assert spec.help.startswith("GPTQ's damping: this fraction of the mean of a layer's Hessian diagonal")
    assert specs[1]["nodes_to_exclude"].help.startswith("Regexes of the nodes kept in float, matched")


def test_default_output_paths() -> None:
    assert int4.default_output_path("d/m.onnx") == Path("d/m.quant.onnx")  # ModelOpt's; .int4 before
    assert int8.default_output_path("d/m.onnx") == Path("d/m.quant.onnx")
