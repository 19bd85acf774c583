"""``onnxprec evaluate`` and ``python -m onnxprec.evaluate``: models side by side, task metrics and latency.

The flags come from :class:`~onnxprec.evaluate._options.EvaluateOptions` (declared once, with the API
keywords), the models (positional) and ``--json`` below, and the shared :class:`onnxprec._options.CommonArgs`.
Nothing heavy is imported until :func:`run`.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from onnxprec import _options
from onnxprec._options import CommonArgs, ToolOptions, from_args, option
from onnxprec.cli import check_report_path, write_report
from onnxprec.evaluate._options import EvaluateOptions

__all__ = ["DESCRIPTION", "EPILOG", "OutputArgs", "add_arguments", "run"]

DESCRIPTION = (
    "Run one or several models side by side on the same data (e.g. an FP32 model and its FP16/BF16/INT4 "
    "versions) and report perplexity (causal LMs), top-1/top-5 accuracy (with --labels), agreement with the "
    "reference model's outputs (top-1 agreement, max abs, relative L2, cosine) and latency per batch; or, with "
    "--generate, greedy generation through onnxruntime-genai (tokens/s, greedy agreement)."
)
EPILOG = """\
examples:
  {prog} model.onnx model.fp16.onnx model.int4.onnx --data windows.npz --batch_size 4 --json eval.json
      perplexity of each model on token windows, agreement with model.onnx, latency; eval.json for scripts
  {prog} resnet.onnx resnet.fp16.onnx --data images.npz --labels labels.npy --providers cuda:0
      top-1/top-5 accuracy against the labels, top-1 agreement with the FP32 model, latency on CUDA
  {prog} fp32/model.onnx int4/model.onnx --generate --max_new_tokens 64
      onnxruntime-genai folders: greedy generation, prefill and decode tokens/s, greedy agreement with fp32
"""


@dataclass
class OutputArgs(ToolOptions):
    """What the command line writes besides the table on stdout."""

    TITLE = "output"

    json: str | None = option(
        None,
        flags=("--json",),
        metavar="PATH",
        help="Also write the results as JSON (per model: perplexity, accuracy, agreement, latency).",
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The models (positional), the evaluation flags and the shared flags."""
    parser.add_argument(
        "models", nargs="+", metavar="MODEL", help="ONNX models to evaluate side by side (the first is the reference)."
    )
    _options.add_arguments(parser, EvaluateOptions, OutputArgs, CommonArgs)


def run(args: argparse.Namespace) -> int:
    """Evaluates the models; prints the table on stdout."""
    from onnxprec.evaluate._api import EvaluationReport, run_evaluation
    from onnxprec.evaluate._generate import GenerationReport

    options = from_args(EvaluateOptions, args)
    output = from_args(OutputArgs, args)
    common = from_args(CommonArgs, args)
    inputs = [*args.models, *filter(None, [options.data, options.labels, options.reference])]
    for path in filter(None, [output.json, common.report_json]):
        check_report_path(path, protected=inputs)
    if options.generate:
        from onnxprec.evaluate._generate import run_generation

        report: EvaluationReport | GenerationReport = run_generation(args.models, options)
    else:
        report = run_evaluation(args.models, options)
    data = report.to_json()
    write_report(output.json, data)
    if common.report_json != output.json:
        write_report(common.report_json, data)
    print(report.table())
    return 0
