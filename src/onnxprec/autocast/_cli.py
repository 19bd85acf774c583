"""``onnxprec autocast`` and ``python -m onnxprec.autocast``: ModelOpt AutoCast's command line, same flags.

The flags come from :class:`~onnxprec.autocast.AutoCastOptions` (declared once, with the API keywords) and the
shared :class:`onnxprec._arg_groups.FileArgs` and :class:`onnxprec._arg_groups.CommonArgs`. Nothing heavy is
imported until :func:`run`, so ``--help`` is fast.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from onnxprec import _options, _report
from onnxprec._arg_groups import CommonArgs, file_args, read_args
from onnxprec._options import ToolOptions, option
from onnxprec.autocast._options import AutoCastOptions

DESCRIPTION = "Convert an FP32 ONNX model to mixed FP32/FP16 or FP32/BF16 (ModelOpt AutoCast flags)."
EPILOG = """\
examples:
  {prog} --onnx_path model.onnx --keep_io_types
      writes model.fp16.onnx beside model.onnx; FP32 inputs and outputs
  {prog} --onnx_path model.onnx --output_path model.bf16.onnx -t bf16 -d inputs.npz --report_json report.json
      BF16, measured on real inputs; report.json lists every node's precision and why
"""


FILES = file_args("<name>.fp16.onnx or <name>.bf16.onnx", input_help="Input FP32 ONNX model.", external_data=True)


@dataclass
class ModelOptCompatArgs(ToolOptions):
    """ModelOpt flags that onnxprec accepts and ignores, listed at the end of the AutoCast group."""

    TITLE = AutoCastOptions.TITLE

    use_standalone_type_inference: bool = option(
        False, help="Accepted for ModelOpt compatibility and ignored: onnxprec always uses ONNX type inference."
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """AutoCast's flags, spelled as in ModelOpt (``python -m modelopt.onnx.autocast``), and onnxprec's extras."""
    _options.add_arguments(parser, FILES, AutoCastOptions, ModelOptCompatArgs, CommonArgs)
    _options.deprecated_alias(parser, "--report", "report", "--report_html")


def run(args: argparse.Namespace) -> int:
    """Converts the model; prints one summary line on stdout."""
    from onnxprec.autocast._api import convert_file

    files, common, options = read_args(args, AutoCastOptions)
    _report.check_paths(
        {"--report_json": common.report_json}, [files.onnx_path, *filter(None, [files.output_path, options.report])]
    )
    report = convert_file(
        files.onnx_path, files.output_path, external_data=True if files.external_data else None, options=options
    )
    _report.write_json(common.report_json, report.to_json())
    print(f"{report.summary}; saved {report.output_path}")
    return 0
