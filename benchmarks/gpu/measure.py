"""Runs one command and writes its wall time, host peak RSS, the GPU's peak memory use and per-phase numbers as JSON.

Standalone (standard library, plus NVML through nvidia-ml-py where it is installed), for the GPU machine (and any
Linux machine):

    python measure.py NAME OUT_DIR [--phases 'NAME=REGEX;NAME=REGEX...'] -- COMMAND ...

Host peak RSS is ``/usr/bin/time -v``'s "Maximum resident set size" when that program exists, else the largest
child's ``ru_maxrss``. Every 0.5 s the RSS of the command's process tree (``/proc``, the sum of ``VmRSS``) and the
device's used GPU memory (NVML, all processes) are sampled: each output line goes to ``OUT_DIR/NAME.log`` prefixed with
the seconds since the start and the RSS then (``[  12.5s  3.21G]``; progress lines ending in a carriage return
included), the samples to ``OUT_DIR/NAME.rss.tsv``. ``--phases``: a phase starts at the first output line (after the
previous phase's start) that matches its regex, the first phase at 0; a regex that starts with ``>`` is looked for
only once the phase listed before it has started (a later phase whose lines an earlier one also prints: INT4's check
and its walk both log "Reference run (segments)"). Each phase's wall seconds and peak sampled RSS and GPU memory go to
the JSON's ``phases`` (a phase whose line never came is absent). The numbers go to ``OUT_DIR/NAME.json`` and, with
the phases as a table, to stdout.
"""

from __future__ import annotations

import json
import os
import re
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

SAMPLE_S = 0.5


def _gpu_used() -> Any:
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    except Exception:
        return None
    return lambda: pynvml.nvmlDeviceGetMemoryInfo(handle).used / 2**20


def tree_rss_kib(root: int) -> int:
    """The summed ``VmRSS`` of ``root`` and its descendants (0 once they have exited)."""
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        try:
            with open(f"/proc/{pid}/status") as status:
                total += next((int(line.split()[1]) for line in status if line.startswith("VmRSS:")), 0)
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as children:
                    stack.extend(int(child) for child in children.read().split())
        except (OSError, ValueError):
            continue
    return total


def parse_phases(spec: str) -> list[tuple[str, re.Pattern[str], bool]]:
    """``'load=^;walk=Quantizing \\d+ weights;check=>Reference'`` -> [(name, regex, after the previous only)]."""
    phases = []
    for item in filter(None, spec.split(";")):
        name, _, pattern = item.partition("=")
        phases.append((name.strip(), re.compile(pattern.removeprefix(">")), pattern.startswith(">")))
    return phases


def phase_table(
    phases: list[tuple[str, re.Pattern[str], bool]],
    lines: list[tuple[float, str]],
    samples: list[tuple[float, float, float | None]],
    wall: float,
) -> list[dict[str, Any]]:
    """Each phase that started: its start, wall seconds, and the peak RSS / GPU memory sampled while it ran."""
    starts: list[tuple[str, float]] = []
    position = 0
    for index, (name, pattern, after_previous) in enumerate(phases):
        if index == 0:
            starts.append((name, 0.0))
            continue
        if after_previous and starts[-1][0] != phases[index - 1][0]:
            continue  # the phase before it never started
        found = next((i for i in range(position, len(lines)) if pattern.search(lines[i][1])), None)
        if found is not None:
            starts.append((name, lines[found][0]))
            position = found + 1
    table = []
    for index, (name, start) in enumerate(starts):
        end = starts[index + 1][1] if index + 1 < len(starts) else wall
        inside = [s for s in samples if start <= s[0] <= end] or [min(samples, key=lambda s: abs(s[0] - start))]
        gpu = [s[2] for s in inside if s[2] is not None]
        table.append({
            "phase": name,
            "start_s": round(start, 1),
            "wall_s": round(end - start, 1),
            "peak_rss_mib": round(max(s[1] for s in inside)),
            "peak_gpu_used_mib": round(max(gpu)) if gpu else None,
        })  # fmt: skip
    return table


def main() -> int:
    name, out_dir = sys.argv[1], Path(sys.argv[2])
    dash = sys.argv.index("--")
    options = sys.argv[3:dash]
    phases = parse_phases(options[options.index("--phases") + 1]) if "--phases" in options else []
    command = sys.argv[dash + 1 :]
    out_dir.mkdir(parents=True, exist_ok=True)
    used = _gpu_used()
    baseline = used() if used else None
    timed = ["/usr/bin/time", "-v", *command] if os.path.exists("/usr/bin/time") else command
    tick = time.perf_counter()
    child = subprocess.Popen(timed, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert child.stdout is not None
    samples: list[tuple[float, float, float | None]] = []
    current = [0.0]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            rss = tree_rss_kib(child.pid) / 1024
            current[0] = rss
            samples.append((time.perf_counter() - tick, rss, used() if used else None))
            time.sleep(SAMPLE_S)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    lines: list[tuple[float, str]] = []
    log = out_dir / f"{name}.log"
    with log.open("w") as stream:
        pending = b""
        while chunk := os.read(child.stdout.fileno(), 65536):
            pending += chunk
            *complete, pending = re.split(rb"[\r\n]", pending)
            for raw in complete:
                if raw.strip():
                    text = raw.decode(errors="replace")
                    seconds = time.perf_counter() - tick
                    lines.append((seconds, text))
                    stream.write(f"[{seconds:7.1f}s {current[0] / 1024:6.2f}G] {text}\n")
                    stream.flush()
        if pending.strip():
            stream.write(pending.decode(errors="replace") + "\n")
    code = child.wait()
    wall = time.perf_counter() - tick
    stop.set()
    sampler.join()
    text = log.read_text(errors="replace")
    found = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
    rss_kb = int(found.group(1)) if found else resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    gpu_peak = max((s[2] for s in samples if s[2] is not None), default=None)
    phase_rows = phase_table(phases, lines, samples, wall) if phases and samples else []
    result: dict[str, Any] = {
        "name": name,
        "command": command,
        "exit_code": code,
        "wall_s": round(wall, 1),
        "host_peak_rss_mib": round(rss_kb / 1024, 1),
        "rss_source": "/usr/bin/time -v" if found else "getrusage(RUSAGE_CHILDREN)",
        "sampled_peak_rss_mib": round(max((s[1] for s in samples), default=0.0)),
        "gpu_baseline_mib": None if baseline is None else round(baseline),
        "gpu_peak_used_mib": None if gpu_peak is None else round(gpu_peak),
        "phases": phase_rows,
    }
    with (out_dir / f"{name}.rss.tsv").open("w") as tsv:
        tsv.write("seconds\trss_mib\tgpu_used_mib\n")
        tsv.writelines(f"{t:.1f}\t{rss:.0f}\t{'' if gpu is None else round(gpu)}\n" for t, rss, gpu in samples)
    (out_dir / f"{name}.json").write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "phases"}), flush=True)
    for row in phase_rows:
        print(f"  phase {row['phase']:<18} from {row['start_s']:7.1f}s  {row['wall_s']:7.1f}s  peak RSS "
              f"{row['peak_rss_mib'] / 1024:6.2f} GiB  GPU {row['peak_gpu_used_mib']} MiB", flush=True)  # fmt: skip
    return code


if __name__ == "__main__":
    sys.exit(main())
