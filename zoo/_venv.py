"""Creates the side virtual environments the benchmarks need (outside the repo), step by step, with pip.

Shared by ``zoo`` (the torch venv that builds the real models) and ``zoo.anchors_env`` (the
venv with ModelOpt / onnxconverter-common that we measure ourselves against).
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

logger = logging.getLogger(__name__)

CACHE_ROOT = Path(os.environ.get("ONNXPREC_CACHE", "~/.cache/onnxprec")).expanduser()

# torch==2.13.0 first: it is a local CPU build here; an unpinned torch (asked for directly or by another
# package) would pull a multi-GB CUDA build.
TORCH_PIN = "torch==2.13.0"


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def run_logged(cmd: Sequence[str | Path], cwd: Path | None = None, env: dict[str, str] | None = None) -> None:
    """Runs ``cmd``, forwarding its output line by line to the log; raises CalledProcessError on failure."""
    args = [str(c) for c in cmd]
    logger.info("$ %s", " ".join(args))
    with subprocess.Popen(
        args, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip()
            if line and not line.startswith("WARNING: Location"):
                logger.info("  %s", line)
        rc = proc.wait()
    if rc:
        raise subprocess.CalledProcessError(rc, args)


def _passes(python: Path, check: Sequence[str]) -> bool:
    if not check:
        return False
    res = subprocess.run([str(python), "-c", "\n".join(check)], capture_output=True, text=True)
    if res.returncode:
        logger.info("check failed in %s: %s", python, res.stderr.strip().splitlines()[-1:])
    return res.returncode == 0


def create_venv(venv: Path, steps: Sequence[Sequence[str]], check: Sequence[str] = ()) -> Path:
    """Returns the python of ``venv``, creating it first if needed.

    Creation is ``python -m venv`` followed by each ``steps`` entry run as ``<venv>/bin/<step...>`` (for
    example ``["pip", "install", "x"]``; ``{venv}`` in an argument expands to the venv path), then the
    ``check`` lines run as a Python program. A marker file written last tells a complete venv from a
    half-built one; an existing venv without the marker is kept if ``check`` passes in it, else rebuilt."""
    python = venv_python(venv)
    marker = venv / ".onnxprec-complete"
    if marker.exists():
        return python
    if python.exists() and _passes(python, check):
        marker.write_text("ok\n")
        return python
    if venv.exists():
        logger.warning("removing incomplete venv %s", venv)
        shutil.rmtree(venv)
    venv.parent.mkdir(parents=True, exist_ok=True)
    run_logged([sys.executable, "-m", "venv", str(venv)])
    for step in steps:
        exe, *rest = (s.format(venv=venv) for s in step)
        run_logged([str(venv / "bin" / exe), *rest], cwd=venv)
    if check:
        run_logged([str(python), "-c", "\n".join(check)])
    marker.write_text("ok\n")
    return python
