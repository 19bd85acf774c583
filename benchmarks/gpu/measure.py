"""Runs one command and writes its wall time, host peak RSS and the GPU's peak memory use as JSON.

Standalone (standard library, plus NVML through nvidia-ml-py where it is installed), for the GPU machine:

    python measure.py NAME OUT_DIR -- COMMAND ...

Host peak RSS is ``/usr/bin/time -v``'s "Maximum resident set size" when that program exists, else the largest
child's ``ru_maxrss``. GPU memory is the device's used memory (NVML, every 0.2 s, all processes), with the value
before the command as ``gpu_baseline_mib``. The command's output goes to ``OUT_DIR/NAME.log``, the numbers to
``OUT_DIR/NAME.json``.
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


def _gpu_used() -> Any:
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    except Exception:
        return None
    return lambda: pynvml.nvmlDeviceGetMemoryInfo(handle).used / 2**20


def main() -> int:
    name, out_dir = sys.argv[1], Path(sys.argv[2])
    command = sys.argv[sys.argv.index("--") + 1 :]
    out_dir.mkdir(parents=True, exist_ok=True)
    used = _gpu_used()
    baseline = used() if used else None
    peak = [baseline or 0.0]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], used())
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    if used:
        sampler.start()
    timed = ["/usr/bin/time", "-v", *command] if os.path.exists("/usr/bin/time") else command
    log = out_dir / f"{name}.log"
    tick = time.perf_counter()
    with log.open("w") as stream:
        code = subprocess.call(timed, stdout=stream, stderr=subprocess.STDOUT)
    wall = time.perf_counter() - tick
    stop.set()
    text = log.read_text(errors="replace")
    found = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
    rss_kb = int(found.group(1)) if found else resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    result = {
        "name": name,
        "command": command,
        "exit_code": code,
        "wall_s": round(wall, 1),
        "host_peak_rss_mib": round(rss_kb / 1024, 1),
        "rss_source": "/usr/bin/time -v" if found else "getrusage(RUSAGE_CHILDREN)",
        "gpu_baseline_mib": None if baseline is None else round(baseline),
        "gpu_peak_used_mib": round(peak[0]) if used else None,
    }
    (out_dir / f"{name}.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
