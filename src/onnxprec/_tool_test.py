"""The tool base: a tool that writes a model is its options and its ``write``; the base does the rest, the same way
for every tool (AutoCast, preprocess and the quantizers are built on it; here a tool that copies its input)."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import ClassVar

import onnx
import onnx_ir as ir
import pytest

from onnxprec._arg_groups import log_level_option
from onnxprec._options import ToolOptions, option
from onnxprec._report import TimedSteps
from onnxprec._testing import make_model, tensor_info
from onnxprec._tool import FileRun, ModelTool
from onnxprec.errors import InvalidArgumentError


@dataclasses.dataclass
class CopyOptions(ToolOptions):
    log_level: str = log_level_option()
    page: str | None = option(None, help="A page the tool writes beside the model.")


@dataclasses.dataclass
class CopyReport(TimedSteps):
    TOOL: ClassVar[str] = "copy"
    input_path: Path | None = None
    output_path: Path | None = None
    genai: object = None
    seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    level: int = 0
    finished: bool = False


def _write(run: FileRun[CopyOptions]) -> tuple[ir.Model, CopyReport]:
    report = CopyReport(level=logging.getLogger("onnxprec").level)
    model = run.load()
    run.save(model, report, check=lambda written: onnx.checker.check_model(str(written.path)))
    return model, report


def _finish(run: FileRun[CopyOptions], model: ir.Model, report: CopyReport) -> None:
    report.finished = True


TOOL = ModelTool(
    CopyOptions,
    _write,
    suffix=lambda options: ".copy",
    name="copy",
    function="copy_file",
    other_outputs=lambda options: {"--page": options.page},
    finish=_finish,
)


@pytest.fixture
def model_path(tmp_path: Path) -> Path:
    path = tmp_path / "m.onnx"
    node = onnx.helper.make_node("Relu", ["x"], ["y"], name="relu")
    onnx.save(make_model([node], [tensor_info("x", shape=[2])], [tensor_info("y", shape=[2])]), path)
    return path


def test_the_base_writes_beside_the_input_at_the_options_log_level_and_times_the_save(model_path: Path) -> None:
    report = TOOL.run_file(model_path, log_level="ERROR")
    assert report.output_path == model_path.with_name("m.copy.onnx") and report.input_path == model_path
    assert report.level == logging.ERROR != logging.getLogger("onnxprec").level  # restored after the call
    assert list(report.seconds) == ["save"] and report.finished
    assert onnx.load(report.output_path).graph.node[0].op_type == "Relu"


def test_every_output_path_is_checked_before_the_work(model_path: Path, tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match=r"--output_path .* would overwrite the input"):
        TOOL.run_file(model_path, model_path)
    with pytest.raises(InvalidArgumentError, match=r"--page .* would overwrite the input"):
        TOOL.run_file(model_path, tmp_path / "out.onnx", page=str(model_path))
    with pytest.raises(InvalidArgumentError, match="copy_file got both options= and page="):
        TOOL.run_file(model_path, options=CopyOptions(), page="p.html")
    with pytest.raises(InvalidArgumentError, match=r"Unknown copy option .pages.\. Did you mean .page."):
        TOOL.run_file(model_path, pages="p.html")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


def test_a_failed_check_leaves_nothing_behind(model_path: Path, tmp_path: Path) -> None:
    def failing(run: FileRun[CopyOptions]) -> tuple[ir.Model, CopyReport]:
        def check(written: object) -> None:
            raise ValueError("the written model is wrong")

        report = CopyReport()
        run.save(run.load(), report, check=check)
        return run.load(), report

    with pytest.raises(ValueError, match="the written model is wrong"):
        dataclasses.replace(TOOL, write=failing).run_file(model_path, tmp_path / "out.onnx")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]
