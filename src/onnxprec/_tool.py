"""The tool base: the path-to-path run that every tool writing a model is built on (AutoCast, preprocess, INT4, INT8).

A tool is its options dataclass, its pipeline and its report; :class:`ModelTool` gives it its file-to-file
function (``convert_file``, ``preprocess_file``, ``quantize_file``):

- the settings from one options object or from the call's keywords (not both; an unknown keyword named);
- the default output ``<name><suffix>.onnx`` beside the input, and every path the run writes checked before the
  work (:func:`onnxprec._io.check_output_path`): never the input nor its data files;
- the ``onnxprec`` logger at the options' ``log_level`` for the call, when the tool has one;
- the tool's ``write(run)``: its pipeline, then :meth:`FileRun.save`, the one atomic save with a check of the written
  file before it replaces the output, timed as a step of the report (a tool that converts again after a failed
  check, as AutoCast after a kernel gap, saves more than once);
- the onnxruntime-genai files of the input's folder carried beside the output (:class:`onnxprec._genai.GenaiCarry`),
  when the options have ``genai_provider``;
- the tool's ``finish(run, model, report)``: what follows the written model (AutoCast's HTML page, preprocess's
  check against the input, the quantizers' accuracy guard).

Nothing heavy is imported at module level: the tools' ``_options`` and ``_cli`` modules import modules that import
this one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from onnxprec._options import ToolOptions, options_or_keywords
from onnxprec._report import Timer

if TYPE_CHECKING:
    import onnx_ir as ir

    from onnxprec._genai import GenaiCarry
    from onnxprec._io import ModelSource, WrittenModel

__all__ = ["FileRun", "ModelTool", "TimedReport", "WrittenReport"]

logger = logging.getLogger(__name__)

OptionsT = TypeVar("OptionsT", bound=ToolOptions)
ReportT = TypeVar("ReportT", bound="WrittenReport")


class WrittenReport(Protocol):
    """What the base fills in the report of a tool that writes a model."""

    input_path: Path | None
    output_path: Path | None
    genai: Any
    """The onnxruntime-genai files carried beside the output (:class:`onnxprec._genai.GenaiCarry`), or None."""


class TimedReport(WrittenReport, Protocol):
    """A report :meth:`FileRun.save` times its save in, as a named step."""

    def step(self, name: str) -> contextlib.AbstractContextManager[None]:
        """Times a block as a named step of the run (:class:`onnxprec._report.TimedSteps`)."""
        ...


@dataclasses.dataclass
class FileRun(Generic[OptionsT]):
    """One path-to-path run: the settings, the model read, where it goes, and the files it must not overwrite."""

    options: OptionsT
    source: ModelSource
    """The model read: a :class:`~pathlib.Path`, or a model given in memory."""
    output: Path
    external_data: bool | None = None
    """The call's ``external_data`` (None: the tool's default)."""
    protected: set[Path] = dataclasses.field(default_factory=set)
    """The input model and its data files: never overwritten."""
    output_flag: str = "--output_path"
    named_output: bool = True
    """Whether the caller named the output (else it is the default beside the input)."""
    genai: GenaiCarry | None = None
    clock: Timer = dataclasses.field(default_factory=Timer)
    """Started when the run is made, before the paths are checked."""

    @property
    def source_path(self) -> Path | None:
        """The input model's path, or None for a model given in memory."""
        return self.source if isinstance(self.source, Path) else None

    def load(self) -> ir.Model:
        """The input model (weights mapped); its data files are protected from then on, the output checked again."""
        from onnxprec._io import check_output_path, external_data_paths, load_model

        model = load_model(self.source)
        self.protected |= external_data_paths(model)
        check_output_path(self.output, self.protected, flag=self.output_flag)
        return model

    def save(
        self,
        model: ir.Model,
        report: TimedReport,
        *,
        check: Callable[[WrittenModel], None] | None = None,
        step: str = "save",
        external_data: bool | None = None,
    ) -> Path:
        """Saves ``model`` atomically to the output, timed as ``step`` of the report.

        Args:
            model: The model; its lazy weights are computed while it is written.
            report: The run's report: ``input_path`` and ``output_path`` are set.
            check: Called with the written file before it replaces the output; if it raises, nothing is written.
            step: The report's name for the save's time.
            external_data: The tool's default when the call gave none (True: weights in ``<output>.data``; None:
                only above 2 GB).

        Returns:
            The path written.
        """
        from onnxprec._io import external_data_paths, save_model

        report.input_path = self.source_path
        self.protected |= external_data_paths(model)
        external = self.external_data if self.external_data is not None else external_data
        with report.step(step):
            report.output_path = save_model(
                model, self.output, external_data=external, protected=self.protected, check=check
            )
        return report.output_path


@dataclasses.dataclass(frozen=True)
class ModelTool(Generic[OptionsT, ReportT]):
    """A tool's path-to-path function from its options class and its ``write``.

    Args:
        options: The options dataclass.
        write: ``write(run) -> (model, report)``: the pipeline, saving through :meth:`FileRun.save`.
        suffix: The default output's suffix from the settings (``".fp16"``: ``<name>.fp16.onnx``).
        name: The tool as an error about its keywords names it (``"AutoCast"``).
        function: The file-to-file function's name, for the error when both ``options`` and keywords are given.
        output_flag: The output's option, for the messages about its path.
        other_outputs: ``{flag: path}`` of the other files the settings ask for (an HTML page), checked before the
            work too.
        finish: Called with the run, the written model and its report, after the genai files are carried.
    """

    options: type[OptionsT]
    write: Callable[[FileRun[OptionsT]], tuple[ir.Model, ReportT]]
    suffix: Callable[[OptionsT], str]
    name: str
    function: str
    output_flag: str = "--output_path"
    other_outputs: Callable[[OptionsT], Mapping[str, str | os.PathLike[str] | None]] | None = None
    finish: Callable[[FileRun[OptionsT], ir.Model, ReportT], None] | None = None

    def default_output_path(self, onnx_path: str | os.PathLike[str], options: OptionsT) -> Path:
        """``<name><suffix>.onnx`` beside the input."""
        from onnxprec._io import sibling_path

        return sibling_path(onnx_path, self.suffix(options))

    def settings(self, options: OptionsT | None, kwargs: Mapping[str, Any]) -> OptionsT:
        """The options of a call: ``options`` as given, or made from the call's keywords (not both).

        Raises:
            InvalidArgumentError: Both were given, an unknown keyword (with the closest field's name), or a bad value.
        """
        return options_or_keywords(self.options, options, kwargs, what=self.name, function=self.function)

    def start(
        self,
        source: ModelSource,
        output_path: str | os.PathLike[str] | None,
        settings: OptionsT,
        external_data: bool | None = None,
    ) -> FileRun[OptionsT]:
        """A run with every output path checked and the genai files planned, before any work.

        Raises:
            InvalidArgumentError: An output path would overwrite an input, or cannot be written.
        """
        from onnxprec._genai import GenaiCarry
        from onnxprec._io import check_output_path

        if isinstance(source, (str, os.PathLike)):
            source = Path(source)
        path = source if isinstance(source, Path) else None
        if output_path is not None:
            output = Path(output_path)
        elif path is not None:
            output = self.default_output_path(path, settings)
        else:
            raise TypeError(f"{self.function} needs an output path for a model given in memory.")
        run = FileRun(
            settings, source, output, external_data, output_flag=self.output_flag, named_output=output_path is not None
        )
        if path is not None and path.exists():
            run.protected.add(path.resolve())
        check_output_path(output, run.protected, flag=self.output_flag)  # fail before the work, not after
        others = self.other_outputs(settings) if self.other_outputs is not None else {}
        for flag, other in others.items():
            if other is not None:
                check_output_path(other, {*run.protected, output.resolve()}, flag=flag, data_file=False)
        if path is not None and hasattr(settings, "genai_provider"):
            run.genai = GenaiCarry.plan(path, output, settings.genai_provider)
        return run

    def run_file(
        self,
        source: ModelSource,
        output_path: str | os.PathLike[str] | None = None,
        *,
        external_data: bool | None = None,
        options: OptionsT | None = None,
        **kwargs: Any,
    ) -> ReportT:
        """Runs the tool from a model file (or a model in memory) to a new file; see the module docstring.

        Returns:
            The report; ``report.to_json()`` is JSON-ready.

        Raises:
            OnnxprecError: A bad argument, model or output path; the message says how to fix it.
        """
        from onnxprec._options import log_level_during

        settings = self.settings(options, kwargs)
        run = self.start(source, output_path, settings, external_data)
        level = getattr(settings, "log_level", None)
        with log_level_during(level) if level is not None else contextlib.nullcontext():
            model, report = self.write(run)
            if run.genai is not None:
                run.genai.write(model)
                report.genai = run.genai
            if self.finish is not None:
                self.finish(run, model, report)
        return report
