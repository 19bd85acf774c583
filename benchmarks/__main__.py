"""``python -m benchmarks``: run the converter benchmark, regenerate BENCHMARKS.md.

    python -m benchmarks run [--models M,...] [--tools T,...] [--repeats 3] [--heavy-repeats 1] [--timeout 600]
    python -m benchmarks report
    python -m benchmarks tools
    python -m benchmarks int4 [--plan smollm2|synthetic|all] [--tools ...]   (INT4: see benchmarks/int4.py)
    python -m benchmarks utilities [--models ...] [--tools ...]   (issue 10's tools: see benchmarks/utilities.py)

Models: zoo names (``python -m zoo list``) or groups real, chains, matmul, synthetic, all (default).
Tools: see ``python -m benchmarks tools``; without ``--tools`` each model gets its default set.
"""

from __future__ import annotations

import argparse
import logging
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from . import harness, report
from .tools import DEFAULT_TOOLS, MODEL_GROUPS, TOOLS, expand_models, parse_tools


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def _list_arg(values: Sequence[str] | None) -> list[str] | None:
    if not values:
        return None
    return [t for v in values for t in _csv(v)]


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "int4":
        from . import int4

        return int4.main(argv[1:])
    if argv and argv[0] == "utilities":
        from . import utilities

        return utilities.main(argv[1:])
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)

    r = sub.add_parser("run", help="measure the tools on the models, write a results JSON and BENCHMARKS.md")
    r.add_argument("--models", nargs="*", help="models or groups, comma or space separated (default: all)")
    r.add_argument("--tools", nargs="*", help="tool ids, comma or space separated (default: per model)")
    r.add_argument("--repeats", type=int, default=3, help="rounds per model (default 3)")
    r.add_argument("--heavy-repeats", type=int, default=1, help="rounds for chain_5000 and matmul >= 1 GB")
    r.add_argument("--timeout", type=float, default=600.0, help="seconds per tool run (default 600)")
    r.add_argument("--mem-limit-gb", type=float, default=None, help="stop a tool above this RSS (default 75%% RAM)")
    r.add_argument("--tag", default=None, help="results file name: benchmarks/results/<date>-<tag>.json")
    r.add_argument("--no-metrics", action="store_true", help="time and memory only")
    r.add_argument("--no-latency", action="store_true", help="skip the CPU latency measurement")
    r.add_argument("--latency-budget", type=float, default=3.0, help="seconds of timed runs per model file")
    r.add_argument("--no-report", action="store_true", help="do not regenerate BENCHMARKS.md")
    r.add_argument("--keep-outputs", action="store_true", help="keep the converted models (their folder is logged)")
    r.add_argument("--zoo-dir", type=Path, default=None, help="zoo folder (default: zoo's)")
    r.add_argument("--work-dir", type=Path, default=None, help="where converted models go (default: system temp)")
    r.add_argument("--results-dir", type=Path, default=harness.RESULTS_DIR)
    r.add_argument("--md", type=Path, default=report.MD_PATH, help="the markdown file to regenerate")

    rp = sub.add_parser("report", help="regenerate BENCHMARKS.md and the scaling chart from the results")
    rp.add_argument("--results-dir", type=Path, default=harness.RESULTS_DIR)
    rp.add_argument("--md", type=Path, default=report.MD_PATH)

    sub.add_parser("tools", help="list the tools and the default plan")
    sub.add_parser("int4", help="the INT4 quantization benchmark (python -m benchmarks int4 --help)", add_help=False)
    sub.add_parser("utilities", help="issue 10's tools (python -m benchmarks utilities --help)", add_help=False)

    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    try:
        if a.cmd == "tools":
            for t in TOOLS.values():
                print(f"{t.id:18s} {t.venv:8s} {t.user_command}")
            print("\ndefault tools per model (family):")
            for k, v in DEFAULT_TOOLS.items():
                print(f"  {k:20s} {', '.join(v)}")
            print("\nmodel groups:", ", ".join(f"{k}={'+'.join(v)}" for k, v in MODEL_GROUPS.items()))
            return 0
        if a.cmd == "report":
            path = report.write_report(a.results_dir, a.md)
            print(path)
            return 0
        models = expand_models(_list_arg(a.models) or ["all"])
        tool_ids = _list_arg(a.tools)
        config = harness.RunConfig(
            models=models,
            tools=parse_tools(tool_ids) if tool_ids else None,
            repeats=a.repeats,
            heavy_repeats=a.heavy_repeats,
            timeout_s=a.timeout,
            mem_limit_mb=a.mem_limit_gb * 1024 if a.mem_limit_gb else None,
            zoo_dir=a.zoo_dir,
            results_dir=a.results_dir,
            work_dir=a.work_dir,
            tag=a.tag,
            metrics=not a.no_metrics,
            latency=not a.no_latency,
            latency_budget_s=a.latency_budget,
            keep_outputs=a.keep_outputs,
            command="python -m benchmarks " + shlex.join(argv),
        )
        path = harness.run(config)
        print(path)
        if not a.no_report:
            print(report.write_report(a.results_dir, a.md))
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
