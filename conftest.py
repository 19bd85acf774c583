"""Settings for the whole test suite (every test path: src, tests, benchmarks, experiments, zoo, examples).

Threads that wait for work do not spin: the tests' matrices and models are small, and a thread that spins while it
waits costs CPU time without making a test faster, the more so on 2 cores shared by 2 pytest-xdist workers.

- Linear algebra (OpenBLAS) runs on one thread per process; set before any test module imports numpy, inherited
  by the processes the tests start. A value the caller set is kept.
- ONNX Runtime's sessions made in the test processes do not spin their intra-op threads
  (``session.intra_op.allow_spinning`` 0); the threads, the kernels and the results are the same.
- Under ``pytest -n 2 --dist loadgroup`` (CI), each test file is one unit of work given to one worker (so that
  module-scoped fixtures are built once), except the files of ``HEAVY_TEST_FILES``, which together are one unit:
  they run one after another on one worker, never two at the same time on both workers.
"""

import os

import pytest

# Test files whose tests hold 0.9-1.8 GB (real models run whole); the test run's peak memory is one of them, not two.
HEAVY_TEST_FILES = frozenset(
    {
        "experiments/llm_corpus/segments_test.py",
        "src/onnxprec/quantization/fp8/modelopt_test.py",
        "src/onnxprec/quantization/generated_test.py",
        "src/onnxprec/quantization/int8/decide_test.py",
        "tests/golden/golden_test.py",
        "tests/llm_data_test.py",
    }
)

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


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Puts each test in the xdist group of its file, or in the group "heavy" for the files of ``HEAVY_TEST_FILES``."""
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        item.add_marker(pytest.mark.xdist_group("heavy" if path in HEAVY_TEST_FILES else path))
