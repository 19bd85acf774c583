"""``onnxprec compare REFERENCE CANDIDATE`` (and ``python -m onnxprec.debug compare``).

The flags come from :class:`~onnxprec.debug.CompareOptions` (declared once, with the API keywords), the report
outputs below and the shared :class:`onnxprec._arg_groups.CommonArgs`. Nothing heavy is imported until :func:`run`.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from onnxprec import _options, _report
from onnxprec._arg_groups import CommonArgs, html_report_option
from onnxprec._options import ToolOptions, from_args, option
from onnxprec.debug._options import CompareOptions

DESCRIPTION = (
    "Run a model and its conversion (FP16/BF16/INT4...) on the same inputs, match their tensors by name, recorded "
    "original names, inserted Casts and DequantizeLinear, and report per node the max abs error, relative L2 error "
    "and cosine similarity, the first node that diverges beyond tolerance (with the --nodes_to_exclude pattern "
    "that keeps it in high precision), and the final outputs' error and top-1 agreement."
)
EPILOG = """\
examples:
  {prog} model.onnx model.fp16.onnx --calibration_data inputs.npz --report_html report.html
      the per-node table on the terminal, all rows and a plot of the error along the graph in report.html
  {prog} model.onnx model.fp16.onnx --verify --report_json report.json
      also re-runs AutoCast keeping the first divergent node in FP32 and checks that this fixes it
"""


@dataclass
class ReportArgs(ToolOptions):
    """Where the comparison goes besides the terminal (and ``--report_json``)."""

    TITLE = "report"

    html: str | None = html_report_option("the table and a plot of the error along the graph")
    max_rows: int = option(40, help="Rows of the terminal table (the rest go to --report_json/--report_html).")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("reference", metavar="REFERENCE", help="The source model (e.g. FP32).")
    parser.add_argument("candidate", metavar="CANDIDATE", help="Its conversion or quantization (same inputs).")
    _options.add_arguments(parser, CompareOptions, ReportArgs, CommonArgs)
    _options.deprecated_alias(parser, "--json", "report_json", "--report_json")
    _options.deprecated_alias(parser, "--html", "html", "--report_html")


def run(args: argparse.Namespace) -> int:
    """Compares; prints the table, the first divergence, its exclude pattern and the verification."""
    from onnxprec._io import write_atomically
    from onnxprec.debug.compare import compare_models

    common = from_args(CommonArgs, args)
    options = from_args(CompareOptions, args)
    outputs = from_args(ReportArgs, args)
    inputs = [args.reference, args.candidate, *filter(None, [options.calibration_data])]
    _report.check_paths({"--report_json": common.report_json, "--report_html": outputs.html}, inputs)
    report = compare_models(
        args.reference,
        args.candidate,
        options.calibration_data,
        options.atol,
        options.rtol,
        input_shapes=options.input_shapes,
        providers=options.providers,
        verify=options.verify,
    )
    print(report.table(outputs.max_rows))
    print()
    for o in report.outputs.values():
        top1 = "" if o.top1 is None else f", top-1 agreement {o.top1:.4f}"
        print(f"output {o.name}: max_abs {o.max_abs}, rel_l2 {o.rel_l2}, cosine {o.cosine}{top1}")
    print(report.summary)
    if report.advice is not None:
        print(report.advice)
    if report.verification is not None:
        print(report.verification.summary)
    for note in report.notes:
        print(note)
    _report.write_json(common.report_json, report.to_json())
    if outputs.html is not None:
        write_atomically(outputs.html, report.to_html())
    return 0
