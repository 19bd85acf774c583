"""``python -m benchmarks``: measure onnxprec's tools against the anchors, regenerate BENCHMARKS.md.

    python -m benchmarks run [--models M,...] [--tools T,...] [--repeats 3] [--heavy-repeats 1] [--timeout 600]
    python -m benchmarks int4 [--plan smollm2|synthetic|genai|all] [--tools ...]   (INT4: benchmarks/int4.py)
    python -m benchmarks utilities [--models ...] [--tools ...]   (issue 10's tools: benchmarks/utilities.py)
    python -m benchmarks int8 [--models ...] [--tools ...]   (INT8 with the anchors: benchmarks/int8.py)
    python -m benchmarks corpus [--models ...] [--tools ...] [--table] [--report-only]   (benchmarks/corpus.py)
    python -m benchmarks report
    python -m benchmarks tools

Every part is one row of :data:`PARTS`: its tool table, its default settings and its run; they share the process
runner, the results schema and the arguments (:mod:`benchmarks.harness`), and one report renders them all.
Models: zoo names (``python -m zoo list``) or groups real, chains, matmul, synthetic, all (AutoCast's default).
Tools: see ``python -m benchmarks tools``; without ``--tools`` each model gets its part's default set.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import logging
import shlex
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from . import corpus, harness, int4, int8, report, report_corpus, utilities
from .tools import DEFAULT_TOOLS, MODEL_GROUPS, TOOLS, expand_models, parse_tools

# part: (help, run, default repeats, default timeout s)
PARTS: dict[str, tuple[str, Callable[[harness.RunConfig], Path], int, float]] = {
    "run": ("AutoCast: every tool on every model, then BENCHMARKS.md", harness.run, 3, 600.0),
    "int4": ("INT4 weight-only quantizers side by side (benchmarks/int4.py)", int4.run, 1, 3600.0),
    "int8": ("INT8 quantizers with the anchors, accuracy and CPU latency (benchmarks/int8.py)", int8.run, 1, 600.0),
    "utilities": ("preprocess, evaluate, dump and compare (benchmarks/utilities.py)", utilities.run, 1, 1800.0),
}


def _list(values: Sequence[str] | None) -> list[str] | None:
    """Comma or space separated values, or None when none were given."""
    out = [t.strip() for v in values or () for t in v.split(",") if t.strip()]
    return out or None


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=(__doc__ or "").splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    files = argparse.ArgumentParser(add_help=False)  # the results and the document, for every part and report
    files.add_argument("--results-dir", type=Path, default=harness.RESULTS_DIR)
    files.add_argument("--md", type=Path, default=report.MD_PATH, help="the markdown file to regenerate")
    for name, (text, _, repeats, timeout) in PARTS.items():
        r = sub.add_parser(name, help=text, parents=[files])
        r.add_argument("--models", nargs="*", help="models or groups, comma or space separated (default: the part's)")
        r.add_argument("--tools", nargs="*", help="tool ids, comma or space separated (default: per model)")
        r.add_argument("--repeats", type=int, default=repeats, help=f"rounds of every tool (default {repeats})")
        r.add_argument("--timeout", type=float, default=timeout, help=f"seconds per tool run (default {timeout:.0f})")
        r.add_argument("--mem-limit-gb", type=float, default=None, help="stop a tool above this RSS (default 75%% RAM)")
        r.add_argument("--tag", default=None, help="results file name suffix")
        r.add_argument("--no-latency", dest="latency", action="store_false", help="skip the CPU latency measurement")
        r.add_argument("--latency-runs", type=int, default=20, help="timed CPU runs of each model (default 20)")
        r.add_argument("--zoo-dir", type=Path, default=None, help="zoo folder (default: zoo's)")
        r.add_argument("--work-dir", type=Path, default=None, help="where converted models go (default: system temp)")
        r.add_argument("--no-report", action="store_true", help="do not regenerate BENCHMARKS.md")
        if name == "run":
            r.add_argument("--heavy-repeats", type=int, default=1, help="rounds for chain_5000 and matmul >= 1 GB")
        if name == "int4":
            r.add_argument("--plan", default="all", choices=sorted(int4.PLANS), help="which models (default: all)")
            r.add_argument("--decode-from", type=Path, help="only time genai decode of outputs in DIR/<model>/<tool>/")
            r.add_argument("--providers", default="cpu", help="the genai decode timing's provider: cpu or cuda")
    c = sub.add_parser(
        "corpus",
        help="every tool on every corpus model, then RELIABILITY.md (benchmarks/corpus.py)",
        description="Runs the tools on the corpus models. A run of every model and tool writes "
        "corpus-<date>.json and RELIABILITY.md's table; with --models or --tools only the results file "
        "(corpus-<date>-part-...json in --results-dir), unless --table asks for the table too.",
    )
    c.add_argument("--models", nargs="*", help="corpus models, comma or space separated (default: all with inputs)")
    c.add_argument("--tools", nargs="*", help=f"tool ids (default: all): {', '.join(corpus.TOOLS)}")
    c.add_argument("--jobs", type=int, default=1, help="models run in parallel (default 1; latency needs 1)")
    c.add_argument("--timeout", type=float, default=600.0, help="seconds per tool run (default 600)")
    c.add_argument("--results-dir", type=Path, default=harness.RESULTS_DIR)
    c.add_argument("--report-only", action="store_true", help="only regenerate RELIABILITY.md's corpus section")
    c.add_argument(
        "--table",
        action="store_true",
        help="with --models or --tools, render RELIABILITY.md's table from this run too (default: only the "
        "results file; a run of every model and tool always renders it)",
    )
    c.add_argument(
        "--results",
        type=Path,
        nargs="*",
        default=None,
        help="--report-only: this file (default: the newest); several files are merged into one table, "
        "a later file's cells replacing an earlier one's (written as corpus-merged-<date>.json)",
    )
    sub.add_parser("report", help="regenerate BENCHMARKS.md and experiments/STUDIES.md", parents=[files])
    sub.add_parser("tools", help="list the tools and the default plan")
    return ap


def _config(a: argparse.Namespace, argv: Sequence[str]) -> harness.RunConfig:
    """The run's settings: the arguments named as :class:`harness.RunConfig`'s fields, then the others."""
    fields = {f.name for f in dataclasses.fields(harness.RunConfig)} - {"models", "tools"}
    config = harness.RunConfig(**{k: v for k, v in vars(a).items() if k in fields})
    config.models, config.tools = _list(a.models) or [], _list(a.tools)
    if a.cmd == "run":
        config.models = expand_models(config.models or ["all"])
        config.tools = parse_tools(config.tools) if config.tools else None
    config.timeout_s = a.timeout
    config.mem_limit_mb = a.mem_limit_gb * 1024 if a.mem_limit_gb else None
    config.command = "python -m benchmarks " + shlex.join(argv)
    return config


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    a = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    try:
        if a.cmd == "tools":
            for t in TOOLS.values():
                print(f"{t.id:18s} {t.venv:8s} {t.user_command}")
            print("\ndefault tools per model (family):")
            for k, v in DEFAULT_TOOLS.items():
                print(f"  {k:20s} {', '.join(v)}")
            print("\nmodel groups:", ", ".join(f"{k}={'+'.join(v)}" for k, v in MODEL_GROUPS.items()))
            print("\nINT4 tools:", ", ".join(int4.TOOLS), "\nINT8 tools:", ", ".join(int8.TOOLS))
            print("utilities tools:", ", ".join(utilities.TOOL_IDS))
            return 0
        if a.cmd == "corpus":
            if a.report_only:
                results = a.results[0] if a.results and len(a.results) == 1 else None
                if a.results and len(a.results) > 1:
                    results = a.results_dir / f"corpus-merged-{dt.date.today():%Y-%m-%d}.json"
                    harness.write_results(results, report_corpus.merge(a.results))
                print(report_corpus.write(results))
                return 0
            config = harness.RunConfig(
                models=_list(a.models) or [],
                tools=_list(a.tools),
                timeout_s=a.timeout,
                results_dir=a.results_dir,
                command="python -m benchmarks " + shlex.join(argv),
            )
            print(corpus.run(config, a.jobs, table=True if a.table else None))
            return 0
        if a.cmd != "report":
            print(PARTS[a.cmd][1](_config(a, argv)))
        if a.cmd == "report" or not a.no_report:
            print(report.write_report(a.results_dir, a.md))
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
