"""The ``onnxprec`` command line: one subcommand per tool, registered in :data:`TOOLS`.

Each tool is a package with its API in ``_api`` and its command line in ``_cli``. A ``_cli`` module is
imported only when its subcommand runs (``onnxprec --help`` imports none), so it should import nothing heavy
at module level. It provides (this list is its interface; it has no ``__all__``):

- ``DESCRIPTION``: the paragraph at the top of ``--help``;
- ``EPILOG``: examples shown at the end of ``--help``; ``{prog}`` is replaced by the command's name;
- ``add_arguments(parser)``: the tool's flags, usually
  ``onnxprec._options.add_arguments(parser, MyOptions, CommonArgs)`` from its options dataclasses;
- ``run(args) -> int``: runs the tool on parsed arguments (``from_args(MyOptions, args)``) and returns the
  exit code. It may raise :class:`~onnxprec.errors.OnnxprecError`: the user sees one line, exit code 2.

Adding a tool is then two lines: its entry in ``TOOLS`` below, and, for ``python -m onnxprec.<tool>``,
a ``__main__.py`` with ``sys.exit(tool_main("<words>"))``. A name of several words is a nested subcommand::

    ("quantize int4", "onnxprec.quantization.int4._cli", "FP32 -> INT4 weight-only quantization."),

Flags every tool has (``--log_level``, ``--report_json``) are :class:`onnxprec._arg_groups.CommonArgs`, added by
each tool's ``add_arguments`` with the other shared groups (:class:`onnxprec._arg_groups.FileArgs`...); logging is
configured from ``--log_level`` before ``run`` is called, and ``run`` checks the report's path before the work
(:func:`onnxprec._report.check_paths`) and writes it after (:func:`onnxprec._report.write_json`). A ``_cli``
module never imports this module: this module imports them.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import itertools
import logging
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from onnxprec.errors import ACCURACY_GUARD_EXIT, AccuracyGuardError, OnnxprecError

if TYPE_CHECKING:
    from types import ModuleType

__all__ = ["autocast_main", "main", "tool_main"]

logger = logging.getLogger("onnxprec")

# (subcommand words, module with the tool's command line, one-line help for ``onnxprec --help``)
TOOLS: tuple[tuple[str, str, str], ...] = (
    ("autocast", "onnxprec.autocast._cli", "FP32 -> mixed FP32/FP16 or FP32/BF16 (ModelOpt AutoCast flags)."),
    ("preprocess", "onnxprec.preprocess._cli", "Shape inference and graph optimization before quantization."),
    ("evaluate", "onnxprec.evaluate._cli", "Models side by side: perplexity, accuracy, agreement, latency."),
    ("dump", "onnxprec.debug._dump_cli", "Write each quantized (or every float) node output to .bin/.txt files."),
    ("compare", "onnxprec.debug._compare_cli", "Node-by-node errors of a converted model; where it first diverges."),
    ("quantize int4", "onnxprec.quantization.int4._cli", "INT4 weight-only quantization: RTN, AWQ, GPTQ."),
    ("quantize int8", "onnxprec.quantization.int8._cli", "INT8 quantization (static QDQ, dynamic, SmoothQuant)."),
    ("quantize fp8", "onnxprec.quantization.fp8._cli", "FP8 (E4M3FN) quantization for TensorRT, as ModelOpt's fp8."),
)

# The one-line help of a subcommand that groups tools (``onnxprec quantize``), also its ``--help`` description
# (without an entry: the names of its tools).
GROUPS: dict[str, str] = {
    "quantize": "INT4 weight-only (int4) or INT8 (int8) quantization; `onnxprec quantize int4 --help` for its flags.",
}


def _configure_logging(level: str, log_file: str | None = None) -> None:
    from onnxprec._report import PrintedSummaryFilter

    logging.basicConfig(
        level=getattr(logging, level), format="[onnxprec] %(levelname)s: %(message)s", stream=sys.stderr, force=True
    )
    if sys.stdout.isatty() and sys.stderr.isatty():  # the summary printed on stdout is on this terminal already
        for handler in logging.getLogger().handlers:
            handler.addFilter(PrintedSummaryFilter())
    if log_file:
        try:
            handler = logging.FileHandler(log_file, encoding="utf-8")
        except OSError as e:
            raise OnnxprecError(f"Cannot write the log file '{log_file}' (--log_file): {e.strerror}.") from e
        handler.setFormatter(logging.Formatter("%(asctime)s [onnxprec] %(levelname)s: %(message)s"))
        logging.getLogger().addHandler(handler)
    if level != "DEBUG":  # onnx-ir logs its own INFO lines with stacks (e.g. a contrib op without a schema)
        logging.getLogger("onnx_ir").setLevel(logging.WARNING)


def _guarded(tool: ModuleType, args: argparse.Namespace) -> int:
    """Runs a tool: user errors become one line on stderr and exit code 2, never a traceback."""
    from onnxprec._arg_groups import CommonArgs, compat_notes
    from onnxprec._options import DEPRECATED_KEY, from_args

    try:
        common = from_args(CommonArgs, args)
        _configure_logging(common.log_level, common.log_file)
        for old, new in getattr(args, DEPRECATED_KEY, None) or ():
            logger.warning("%s is deprecated and will be removed: use %s", old, new)
        for note in compat_notes(args):
            logger.info("%s", note)
        from onnxprec._lazy_sympy import defer_sympy

        defer_sympy()  # before the tool imports onnx-ir
        # A model's graph is hundreds of thousands of Python objects, which every full collection walks: collect
        # cyclic garbage 70 times less often than the default thresholds.
        thresholds = gc.get_threshold()
        gc.set_threshold(50_000, 10, 10)
        try:
            return int(tool.run(args))
        finally:
            gc.set_threshold(*thresholds)
    except AccuracyGuardError as e:  # the model is written for inspection; its one line says what was measured
        print(f"error: {e}", file=sys.stderr)
        return ACCURACY_GUARD_EXIT
    except OnnxprecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except MemoryError:
        print("error: out of memory: save with --external_data and lower the calibration batch size", file=sys.stderr)
        return 2


def _tool(words: str) -> tuple[str, str]:
    for name, module, help_text in TOOLS:
        if name == words:
            return module, help_text
    raise KeyError(f"no tool '{words}' in onnxprec.cli.TOOLS: add it there.")


def _setup(parser: argparse.ArgumentParser, module_name: str, prog: str) -> ModuleType:
    """Imports a tool's ``_cli`` module and adds its description, example and flags to ``parser``."""
    tool = importlib.import_module(module_name)
    parser.description = tool.DESCRIPTION
    parser.epilog = tool.EPILOG.format(prog=prog)
    tool.add_arguments(parser)
    parser.set_defaults(_tool=tool)
    return tool


def _parser(prog: str, help_text: str | None = None) -> argparse.ArgumentParser:
    return argparse.ArgumentParser(
        prog=prog, description=help_text, formatter_class=argparse.RawDescriptionHelpFormatter
    )


def tool_main(words: str, argv: Sequence[str] | None = None, *, prog: str | None = None) -> int:
    """Entry point of one tool on its own, e.g. ``python -m onnxprec.autocast`` is ``tool_main("autocast")``."""
    module, _ = _tool(words)
    parser = _parser(prog or f"python -m {module.rsplit('._cli', 1)[0]}")
    tool = _setup(parser, module, parser.prog)
    return _guarded(tool, parser.parse_args(argv))


def autocast_main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m onnxprec.autocast`` (kept for callers of earlier versions)."""
    return tool_main("autocast", argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``onnxprec`` console script.

    Only the ``_cli`` module of the subcommand named in ``argv`` is imported; the others are listed in
    ``--help`` from their one-line help in :data:`TOOLS`.
    """
    from onnxprec import __version__

    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = _parser("onnxprec", "Make ONNX models smaller and faster while keeping them accurate.")
    parser.add_argument("--version", action="version", version=f"onnxprec {__version__}")
    commands = list(itertools.takewhile(lambda arg: not arg.startswith("-"), args_list))
    subparsers: dict[str, Any] = {"": parser.add_subparsers(dest="command", metavar="TOOL", required=True)}
    for words, module, help_text in TOOLS:
        *parents, leaf = words.split()
        for depth, word in enumerate(parents):
            prefix = " ".join(parents[: depth + 1])
            if prefix not in subparsers:
                children = [w.split()[depth + 1] for w, _, _ in TOOLS if w.startswith(prefix + " ")]
                about = GROUPS.get(prefix, f"{', '.join(children)} (`onnxprec {prefix} TOOL --help`).")
                group = subparsers[" ".join(parents[:depth])].add_parser(word, help=about, description=about)
                subparsers[prefix] = group.add_subparsers(dest=f"command{depth + 1}", metavar="TOOL", required=True)
        sub = subparsers[" ".join(parents)].add_parser(
            leaf, help=help_text, formatter_class=argparse.RawDescriptionHelpFormatter
        )
        if commands[: len(parents) + 1] == words.split():
            _setup(sub, module, sub.prog)
    args = parser.parse_args(args_list)
    if not hasattr(args, "_tool"):  # only when the command words are not the leading arguments
        parser.error(f"put the tool's name first: onnxprec {args.command} ...")
    return _guarded(args._tool, args)


if __name__ == "__main__":
    sys.exit(main())
