"""Options declared once: flags, defaults and docs generated from the fields, and the APIs agree with them."""

from __future__ import annotations

import argparse
import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from onnxprec._arg_groups import CommonArgs, FileArgs, providers_option
from onnxprec._options import (
    ToolOptions,
    add_arguments,
    args_doc,
    check_op_types,
    check_patterns,
    compile_patterns,
    fields_in,
    first_match,
    from_args,
    option,
    option_fields,
    parse_args_doc,
    signature_mismatches,
)
from onnxprec.autocast._cli import ModelOptCompatArgs
from onnxprec.autocast._options import AutoCastOptions


@dataclass
class _Demo(ToolOptions):
    TITLE = "demo"

    path: str = option(help="Required input.")
    size: int = option(8, flags=("-s", "--size"), help="A size.")
    scale: float = option(1, help="A scale (any number).")
    limit: int | None = option(None, help="An optional limit.")
    mode: str = option("a", choices=("a", "b"), help="A mode.")
    names: Sequence[str] | None = option(None, nargs="*", help="Some names.")
    providers: Sequence[str] = providers_option("the demo")
    fast: bool = option(False, help="Go fast.")
    check: bool = option(True, flags=("--no_check",), group="extras", help="Skip the check.", doc="Check.")
    hook: Any = option(None, api_only=True, help="A callable (API only).")


def _parse(*argv: str, classes: tuple[type, ...] = (_Demo,)) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser, *classes)
    return parser.parse_args(list(argv))


def test_flags_not_given_keep_the_dataclass_defaults() -> None:
    options = from_args(_Demo, _parse("--path", "p"))
    assert options == _Demo(path="p")
    assert options.providers == ("cpu",) and options.scale == 1 and options.check is True


def test_flags_set_typed_values() -> None:
    args = _parse(
        "--path", "p", "-s", "3", "--scale", "inf", "--limit", "7", "--mode", "b", "--names", "x", "y",
        "--providers", "cuda:0", "cpu", "--fast", "--no_check",
    )  # fmt: skip
    options = from_args(_Demo, args)
    assert (options.size, options.scale, options.limit, options.mode) == (3, float("inf"), 7, "b")
    assert options.names == ("x", "y") and options.providers == ("cuda:0", "cpu")
    assert options.fast is True and options.check is False
    assert options.hook is None


def test_bad_values_are_argparse_errors(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--path", "p", "--mode", "c"], ["--path", "p", "-s", "x"], []):
        with pytest.raises(SystemExit):
            _parse(*argv)
    assert "--path" in capsys.readouterr().err  # the required flag is named


def test_help_has_groups_defaults_and_no_api_only_flag() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser, _Demo)
    text = " ".join(parser.format_help().split())
    assert "demo:" in text and "extras:" in text
    assert "A size (default: 8)." in text and "(default: cpu)" in text
    assert "Go fast." in text and "(default: False)" not in text
    assert "hook" not in text


def test_nargs_fields_are_tuples_through_the_api_too() -> None:
    options = _Demo(path="p", names=["a"], providers="cuda")
    assert options.names == ("a",) and options.providers == ("cuda",)


def test_a_flag_is_the_field_name_unless_declared() -> None:
    flags = {f.name: spec.flags for f, spec in option_fields(_Demo)}
    assert flags["path"] == ("--path",) and flags["names"] == ("--names",)
    assert flags["size"] == ("-s", "--size") and flags["check"] == ("--no_check",)
    assert flags["hook"] == ()


def test_declaration_errors_say_how_to_fix() -> None:
    with pytest.raises(TypeError, match="flags="):
        option(1, flags=(), help="No flag.")
    with pytest.raises(TypeError, match="api_only"):
        option(1, flags=("--x",), api_only=True, help="Both.")
    with pytest.raises(TypeError, match="help"):
        option(1, flags=("--x",), help=" ")
    with pytest.raises(TypeError, match="mutable"):
        option([], flags=("--x",), help="A list.")

    @dataclass
    class Plain(ToolOptions):
        x: int = 1

    with pytest.raises(TypeError, match=r"declare it with onnxprec\._options\.option"):
        option_fields(Plain)


def test_args_doc_renders_and_parses_back() -> None:
    def documented(size: int = 8, check: bool = True) -> None:
        pass

    documented.__doc__ = (
        f"Demo.\n\n    Args:\n{args_doc(_Demo, ['size', 'check'], indent=8)}\n\n    Returns:\n        None.\n"
    )
    assert parse_args_doc(documented.__doc__) == {"size": "A size.", "check": "Check."}
    assert signature_mismatches(documented, _Demo) == []

    def drifted(size: int = 9, colour: str = "red") -> None:
        """Demo.

        Args:
            size: Some size.
            colour: A colour.
        """

    problems = signature_mismatches(drifted, _Demo)
    assert any("defaults to 9" in p for p in problems)
    assert any("'colour'" in p and "not a field" in p for p in problems)
    assert any("documents 'size'" in p for p in problems)


# --- AutoCast: the ModelOpt-compatible API agrees with its options ----------------------------------------


def test_convert_to_mixed_precision_parameters_are_autocast_options() -> None:
    from onnxprec.autocast import convert_to_mixed_precision

    problems = signature_mismatches(convert_to_mixed_precision, AutoCastOptions, skip=["onnx_path"])
    assert not problems, "\n".join(problems)


def test_convert_to_mixed_precision_keeps_modelopt_positional_order() -> None:
    from onnxprec.autocast import convert_to_mixed_precision

    params = list(inspect.signature(convert_to_mixed_precision).parameters.values())
    positional = [p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD]
    assert positional == [
        "onnx_path", "low_precision_type", "nodes_to_exclude", "op_types_to_exclude", "nodes_to_include",
        "op_types_to_include", "data_max", "init_max", "keep_io_types", "calibration_data", "custom_rule",
        "init_conversion_max_bytes", "providers", "trt_plugins", "trt_plugins_precision", "max_depth_of_reduction",
        "opset",
    ]  # fmt: skip
    assert [p.name for p in params if p.kind is p.KEYWORD_ONLY] == ["input_shapes", "target_accuracy"]


def test_every_option_has_help_and_every_flag_is_unique() -> None:
    seen: dict[str, str] = {}
    for cls in (FileArgs, AutoCastOptions, ModelOptCompatArgs, CommonArgs):
        for f, spec in option_fields(cls):
            assert spec.help.strip() and spec.api_doc.strip(), f.name
            for flag in spec.flags:
                assert flag not in seen, f"{flag} of {f.name} is also {seen[flag]}"
                seen[flag] = f.name
    api_only = [f.name for f, spec in option_fields(AutoCastOptions) if spec.api_only]
    assert api_only == ["custom_rule"]


def test_autocast_flags_and_defaults_match_modelopt() -> None:
    specs = {
        f.name: (f, spec) for cls in (FileArgs, AutoCastOptions, ModelOptCompatArgs) for f, spec in option_fields(cls)
    }
    expected_flags = {
        "onnx_path": ("--onnx_path",),
        "output_path": ("--output_path",),
        "low_precision_type": ("-t", "--low_precision_type"),
        "calibration_data": ("-d", "--calibration_data"),
        "nodes_to_exclude": ("-ne", "--nodes_to_exclude"),
        "nodes_to_include": ("-ni", "--nodes_to_include"),
        "op_types_to_exclude": ("-ope", "--op_types_to_exclude"),
        "op_types_to_include": ("-opi", "--op_types_to_include"),
        "data_max": ("--data_max",),
        "init_max": ("--init_max",),
        "init_conversion_max_bytes": ("--init_conversion_max_bytes",),
        "max_depth_of_reduction": ("--max_depth_of_reduction",),
        "keep_io_types": ("--keep_io_types",),
        "providers": ("--providers",),
        "trt_plugins": ("--trt_plugins",),
        "trt_plugins_precision": ("--trt_plugins_precision",),
        "opset": ("--opset",),
        "use_standalone_type_inference": ("--use_standalone_type_inference",),
        "input_shapes": ("--input_shapes",),
        "external_data": ("--external_data",),
        "validate": ("--no_validate",),
    }
    for name, flags in expected_flags.items():
        assert specs[name][1].flags == flags, name
    args = _parse("--onnx_path", "m.onnx", classes=(FileArgs, AutoCastOptions, ModelOptCompatArgs, CommonArgs))
    options = from_args(AutoCastOptions, args)
    assert options == AutoCastOptions()
    assert (options.data_max, options.init_max, options.providers) == (512, 65504, ("cpu",))
    assert from_args(CommonArgs, args) == CommonArgs(log_level="INFO", report_json=None)
    args = _parse(
        "--onnx_path", "m", "--data_max", "inf", "-ne", "a.*", "-t", "bf16", "--no_validate",
        classes=(FileArgs, AutoCastOptions, ModelOptCompatArgs, CommonArgs),
    )  # fmt: skip
    parsed = from_args(AutoCastOptions, args)
    assert (parsed.data_max, parsed.nodes_to_exclude, parsed.low_precision_type) == (float("inf"), ("a.*",), "bf16")
    assert parsed.validate is False


def test_fields_in_picks_only_fields() -> None:
    assert fields_in(AutoCastOptions, {"onnx_path": "m", "data_max": 3.0, "opset": None}) == {
        "data_max": 3.0,
        "opset": None,
    }


NAMES = ["/stem/Conv", "/layer1/Conv_5", "/fc/Gemm"]


def test_a_pattern_that_matches_nothing_names_the_closest_names(caplog: pytest.LogCaptureFixture) -> None:
    (warning,) = check_patterns(compile_patterns(["NoSuchNode"], "x"), "nodes_to_exclude", NAMES)
    assert warning.startswith("nodes_to_exclude pattern 'NoSuchNode' matches no node; closest: '")
    assert warning in caplog.text
    # a pattern naming a node the tool does not select says so (compare's advice naming a Transpose, say)
    (warning,) = check_patterns(
        compile_patterns([r"^/Transpose_2$"], "x"), "nodes_to_exclude", NAMES, {"/Transpose_2": "Transpose"}, "layer"
    )
    assert "matches no layer; it matches '/Transpose_2' (Transpose), which this tool does not select" in warning


def test_a_pattern_that_matched_only_under_re_search_says_how_to_write_it() -> None:
    (warning,) = check_patterns(compile_patterns(["Conv_5"], "x"), "nodes_to_exclude", NAMES)
    assert "(re.search, INT4 and INT8's rule before) it would match '/layer1/Conv_5': write '.*Conv_5'" in warning
    (warning,) = check_patterns(compile_patterns(["/stem"], "x"), "nodes_to_exclude", [*NAMES, "a/stem/b"])
    assert warning.startswith("nodes_to_exclude pattern '/stem' matches 1 names from their start (re.match), 2 ")
    assert check_patterns(compile_patterns(["/", ".*Conv", "/fc/Gemm$"], "x"), "x", NAMES) == []  # all matched


def test_first_match_is_re_match() -> None:
    patterns = compile_patterns(["Conv", ".*Gemm"], "x")
    assert first_match(patterns, ["/stem/Conv"]) is None and first_match(patterns, ["/fc/Gemm"]) == ".*Gemm"


def test_an_op_type_the_model_lacks_names_the_closest() -> None:
    (warning,) = check_op_types(["Conv", "Gemn"], "op_types_to_exclude", {"Conv", "Gemm", "Relu"})
    assert warning.startswith("op_types_to_exclude op type 'Gemn' matches no node of the model; closest: 'Gemm'")
