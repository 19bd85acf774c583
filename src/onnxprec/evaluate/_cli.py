"""``onnxprec evaluate`` and ``python -m onnxprec.evaluate``: models side by side, task metrics and latency.

The flags come from :class:`~onnxprec.evaluate._options.EvaluateOptions` (declared once, with the API
keywords), the models (positional) and the shared :class:`onnxprec._arg_groups.CommonArgs` (``--report_json``;
``--json`` is its hidden alias, kept for one release).
Nothing heavy is imported until :func:`run`.
"""

from __future__ import annotations

import argparse

from onnxprec import _options, _report
from onnxprec._arg_groups import CommonArgs
from onnxprec._options import from_args
from onnxprec.evaluate._options import EvaluateOptions

DESCRIPTION = (
    "Run one or several models side by side on the same data (e.g. an FP32 model and its FP16/BF16/INT4 "
    "versions) and report perplexity (causal LMs), top-1/top-5 accuracy (with --labels), agreement with the "
    "reference model's outputs (top-1 agreement, max abs, relative L2, cosine), and when asked latency per batch "
    "(--latency_runs) and the kernels ONNX Runtime ran (nodes in integer kernels such as QLinearConv, unfused Q/DQ; "
    "--profile_runs); or, with "
    "--generate, greedy generation through onnxruntime-genai (tokens/s, greedy agreement)."
)
EPILOG = """\
examples:
  {prog} model.onnx model.fp16.onnx model.int4.onnx -d windows.npz --batch_size 4 --report_json eval.json
      perplexity of each model on token windows, agreement with model.onnx; eval.json for scripts
  {prog} resnet.onnx resnet.fp16.onnx -d images.npz --labels labels.npy --providers cuda:0 --latency_runs 10
      top-1/top-5 accuracy against the labels, top-1 agreement with the FP32 model, latency on CUDA
  {prog} model.onnx model.quant.onnx -d inputs.npz --latency_runs 10 --profile_runs 3
      an INT8 model beside its float one: agreement, latency, and which kernels ONNX Runtime ran (int kernels:
      nodes in integer kernels / all, int time: their share of kernel time, Q/DQ: nodes left unfused)
  {prog} fp32/model.onnx int4/model.onnx --generate --max_new_tokens 64
      onnxruntime-genai folders: greedy generation, prefill and decode tokens/s, greedy agreement with fp32
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The models (positional), the evaluation flags and the shared flags."""
    parser.add_argument(
        "models", nargs="+", metavar="MODEL", help="ONNX models to evaluate side by side (the first is the reference)."
    )
    _options.add_arguments(parser, EvaluateOptions, CommonArgs)
    _options.deprecated_alias(parser, "--json", "report_json", "--report_json")


def run(args: argparse.Namespace) -> int:
    """Evaluates the models; prints the table on stdout."""
    from onnxprec.evaluate._api import EvaluationReport, run_evaluation
    from onnxprec.evaluate._generate import GenerationReport

    options = from_args(EvaluateOptions, args)
    common = from_args(CommonArgs, args)
    inputs = [*args.models, *filter(None, [options.data, options.labels, options.reference])]
    _report.check_paths({"--report_json": common.report_json}, inputs)
    if options.generate:
        from onnxprec.evaluate._generate import run_generation

        report: EvaluationReport | GenerationReport = run_generation(args.models, options)
    else:
        report = run_evaluation(args.models, options)
    _report.write_json(common.report_json, report.to_json())
    print(report.table())
    return 0
