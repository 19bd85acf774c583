"""Runs one command as a measured child process: wall time, peak RSS, timeout and a memory guard.

Peak RSS comes from GNU ``/usr/bin/time -v`` (the kernel's ``ru_maxrss`` of the child, exact) when it is
installed, else from polling the child's process tree with psutil every ``POLL_S`` seconds (may miss short
peaks). A watchdog polls the tree either way: it kills the whole process group when the command runs past
its timeout or when the tree's RSS passes the memory limit, so a runaway tool cannot hang the run or take the
shared machine down; such runs are recorded as ``timeout`` / ``memory-limit``, never retried.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

logger = logging.getLogger(__name__)

GNU_TIME = Path("/usr/bin/time")
POLL_S = 0.05
MARKER = "@@BENCH "
MIB = 1 << 20

_TIME_FIELDS = {
    "Maximum resident set size (kbytes)": "maxrss_kb",
    "User time (seconds)": "user_s",
    "System time (seconds)": "sys_s",
    "Exit status": "exit_status",
}


@dataclass
class ProcResult:
    """What one measured run gave. ``status``: ok, failed, timeout or memory-limit."""

    status: str
    returncode: int | None
    wall_s: float
    peak_rss_mb: float | None
    rss_source: str
    poll_peak_rss_mb: float | None = None
    user_s: float | None = None
    sys_s: float | None = None
    runner: dict[str, Any] | None = None
    log_tail: list[str] = field(default_factory=list)


def gnu_time_available() -> bool:
    """Whether ``/usr/bin/time`` is GNU time (it understands ``-v``)."""
    if not GNU_TIME.exists():
        return False
    res = subprocess.run([str(GNU_TIME), "-v", "true"], capture_output=True, text=True)
    return res.returncode == 0 and "Maximum resident set size" in res.stderr


def _tree_rss(proc: psutil.Process, own: bool = True) -> int:
    """Sum of the RSS of ``proc`` (unless not ``own``) and its descendants (0 for those gone)."""
    total = 0
    try:
        members = ([proc] if own else []) + proc.children(recursive=True)
    except psutil.Error:
        return 0
    for p in members:
        with contextlib.suppress(psutil.Error):
            total += p.memory_info().rss
    return total


def _parse_gnu_time(path: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if not path.exists():
        return out
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("Command terminated by signal "):  # GNU time then says "Exit status: 0"
            out["signal"] = int(line.rsplit(" ", 1)[1])
        key, _, value = line.strip().rpartition(": ")
        if name := _TIME_FIELDS.get(key):
            out[name] = int(value) if name in ("maxrss_kb", "exit_status") else float(value)
    return out


def parse_runner_line(text: str) -> dict[str, Any] | None:
    """The last ``@@BENCH {json}`` line of a runner's output, or None."""
    found = None
    for line in text.splitlines():
        if line.startswith(MARKER):
            with contextlib.suppress(json.JSONDecodeError):
                found = json.loads(line[len(MARKER) :])
    return found


def _kill_group(popen: subprocess.Popen[bytes]) -> None:
    """Kills the process group of the child we started (it was made a session leader)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(popen.pid, signal.SIGKILL)


def run_measured(
    cmd: Sequence[str | os.PathLike[str]],
    log_path: Path,
    timeout_s: float | None = None,
    mem_limit_mb: float | None = None,
    cwd: Path | None = None,
    use_gnu_time: bool | None = None,
) -> ProcResult:
    """Runs ``cmd`` (its stdout and stderr go to ``log_path``) and measures it; never raises for the
    command's own failure."""
    if use_gnu_time is None:
        use_gnu_time = gnu_time_available()
    args = [str(c) for c in cmd]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    time_file = log_path.with_name(log_path.name + ".gnutime")
    full = [str(GNU_TIME), "-v", "-o", str(time_file), *args] if use_gnu_time else args
    logger.debug("$ %s", " ".join(args))
    status = "ok"
    poll_peak = 0
    with open(log_path, "wb") as log:
        t0 = time.perf_counter()
        popen = subprocess.Popen(full, stdout=log, stderr=subprocess.STDOUT, cwd=cwd, start_new_session=True)
        try:
            ps = psutil.Process(popen.pid)
        except psutil.Error:  # already gone
            ps = None
        while True:
            try:
                rc = popen.wait(timeout=POLL_S)
                break
            except subprocess.TimeoutExpired:
                pass
            except KeyboardInterrupt:
                _kill_group(popen)
                popen.wait()
                raise
            if ps is not None:
                # under GNU time, the wrapper's own RSS is left out: users don't run it
                poll_peak = max(poll_peak, _tree_rss(ps, own=not use_gnu_time))
            if timeout_s is not None and time.perf_counter() - t0 > timeout_s:
                status = "timeout"
            elif mem_limit_mb is not None and poll_peak > mem_limit_mb * MIB:
                status = "memory-limit"
            if status != "ok":
                _kill_group(popen)
                rc = popen.wait()
                break
        wall = time.perf_counter() - t0
    gt = _parse_gnu_time(time_file) if use_gnu_time else {}
    time_file.unlink(missing_ok=True)
    text = log_path.read_text(errors="replace")
    runner = parse_runner_line(text)
    if use_gnu_time and "exit_status" in gt:
        rc = 128 + gt["signal"] if "signal" in gt else gt["exit_status"]
    if status == "ok" and (rc != 0 or (runner is not None and runner.get("rc", 0) != 0)):
        status = "failed"
    if use_gnu_time and "maxrss_kb" in gt and status == "ok":
        peak, source = gt["maxrss_kb"] / 1024, "ru_maxrss (/usr/bin/time -v)"
    else:
        peak, source = (poll_peak / MIB if poll_peak else None), f"psutil tree poll every {POLL_S} s"
    tail = [line for line in text.splitlines() if not line.startswith(MARKER)][-25:]
    return ProcResult(status=status, returncode=rc, wall_s=wall, peak_rss_mb=peak, rss_source=source,
                      poll_peak_rss_mb=poll_peak / MIB if poll_peak else None, user_s=gt.get("user_s"),
                      sys_s=gt.get("sys_s"), runner=runner, log_tail=tail if status != "ok" else [])  # fmt: skip
