"""Settings for the whole test suite (every test path: src, tests, benchmarks, experiments, zoo, examples).

Threads that wait for work do not spin: the tests' matrices and models are small, and a thread that spins while it
waits costs CPU time without making a test faster, the more so on 2 cores shared by 2 pytest-xdist workers.

- Linear algebra (OpenBLAS) runs on one thread per process; set before any test module imports numpy, inherited
  by the processes the tests start. A value the caller set is kept.
- ONNX Runtime's sessions made in the test processes do not spin their intra-op threads
  (``session.intra_op.allow_spinning`` 0); the threads, the kernels and the results are the same.
"""

import os

for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, "1")


def _sessions_without_spinning() -> None:
    try:
        import onnxruntime as ort
    except ImportError:  # the tests that need it skip
        return

    class SessionOptions(ort.SessionOptions):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.add_session_config_entry("session.intra_op.allow_spinning", "0")

    ort.SessionOptions = SessionOptions


_sessions_without_spinning()
