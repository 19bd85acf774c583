"""``onnxprec preprocess`` and ``python -m onnxprec.preprocess``: ONNX Runtime's pre-processing, same flags.

The flags come from :class:`~onnxprec.preprocess._options.PreprocessOptions` (declared once, with the API
keywords), the shared :class:`onnxprec._arg_groups.FileArgs` spelled ``--input``/``--output`` as in ``python -m
onnxruntime.quantization.preprocess``, and the shared :class:`onnxprec._arg_groups.CommonArgs`. The skip flags
take no value (ONNX Runtime's take one: ``--skip_optimization True``). Nothing heavy is imported until
:func:`run`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from onnxprec import _options, _report
from onnxprec._arg_groups import CommonArgs, file_args, read_args
from onnxprec.errors import ModelLoadError
from onnxprec.preprocess._options import PreprocessOptions

DESCRIPTION = (
    "Prepare a model for quantization, as ONNX Runtime's quant_pre_process does: symbolic shape inference, "
    "ONNX Runtime basic graph optimization (constant folding, Conv+BatchNormalization fusion...), ONNX shape "
    "inference; for models of any size, with contrib ops or If/Loop subgraphs. Each step logs what it changed."
)
EPILOG = """\
examples:
  {prog} --input model.onnx --output model.pre.onnx
      the three steps of ONNX Runtime's quant_pre_process; the log says what each changed
  {prog} --input model.onnx --output model.opset21.onnx --opset 21 --save_as_external_data --all_tensors_to_one_file
      also upgrade to opset 21 (INT4 DequantizeLinear), checked by running the model before and after
"""


FILES = file_args("<name>.pre.onnx", input_flags=("--onnx_path", "--input"), output_flags=("--output_path", "--output"))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """ONNX Runtime's pre-processing flags and onnxprec's extras."""
    _options.add_arguments(parser, FILES, PreprocessOptions, CommonArgs)


def run(args: argparse.Namespace) -> int:
    """Pre-processes the model; prints one summary line on stdout."""
    from onnxprec.preprocess._api import default_output_path, preprocess_file

    files, common, options = read_args(args, PreprocessOptions)
    if not Path(files.onnx_path).exists():
        raise ModelLoadError(f"Model file '{files.onnx_path}' does not exist: check --input.")
    output = files.output_path or str(default_output_path(files.onnx_path))
    _report.check_paths({"--report_json": common.report_json}, [files.onnx_path, output])
    report = preprocess_file(files.onnx_path, output, options)
    _report.write_json(common.report_json, report.to_json())
    print(f"{report.summary}; saved {report.output_path}")
    return 0
