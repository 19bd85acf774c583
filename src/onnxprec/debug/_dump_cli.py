"""``onnxprec dump`` (and ``python -m onnxprec.debug dump``): AMD Quark's ``dump_model`` on the command line.

The flags come from :class:`~onnxprec.debug.DumpOptions` (declared once, with the API keywords) and the shared
:class:`onnxprec._arg_groups.FileArgs` (``--onnx_path``) and :class:`onnxprec._arg_groups.CommonArgs`. Nothing heavy is
imported until :func:`run`.
"""

from __future__ import annotations

import argparse

from onnxprec import _options, _report
from onnxprec._arg_groups import CommonArgs, file_args, read_args
from onnxprec.debug._options import DumpOptions

DESCRIPTION = (
    "Run a model on one batch and write each quantized node's output (DequantizeLinear, QuantizeLinear, "
    "MatMulNBits...) as <name>.bin (raw little-endian) and <name>.txt (one value a line, the first --text_values), "
    "with index.json; "
    "--dump_float adds every float node output as <name>_float.bin/.txt. Same meaning as AMD Quark's dump_model."
)
EPILOG = """\
examples:
  {prog} --onnx_path model.int4.onnx --calibration_data inputs.npz --output_dir dump_int4
      dequantized weights, QDQ and MatMulNBits outputs of the first batch; dump_int4/index.json lists them
  {prog} --onnx_path model.onnx --input_shapes input:1x3x224x224 --dump_float
      every float node output on random inputs, in ./dump_results
"""


FILES = file_args(None, input_help="The ONNX model to run and dump.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _options.add_arguments(parser, FILES, DumpOptions, CommonArgs)


def run(args: argparse.Namespace) -> int:
    """Dumps the model; prints one summary line on stdout."""
    from onnxprec.debug.dump import dump_model

    files, common, options = read_args(args, DumpOptions)
    _report.check_paths({"--report_json": common.report_json}, [files.onnx_path])
    result = dump_model(
        files.onnx_path,
        options.dump_data_reader,
        options.random_data_reader_input_shape,
        options.dump_float,
        options.output_dir,
        overwrite=options.overwrite,
        text_values=options.text_values,
        providers=options.providers,
    )
    _report.write_json(common.report_json, result.to_json())
    print(result.summary)
    return 0
