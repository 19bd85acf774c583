"""Settings for the whole test suite (every test path: src, tests, benchmarks, experiments, zoo, examples).

Threads that wait for work do not spin: the tests' matrices and models are small, and a thread that spins while it
waits costs CPU time without making a test faster, the more so on 2 cores shared by 2 pytest-xdist workers.

- Linear algebra (OpenBLAS) runs on one thread per process; set before any test module imports numpy, inherited
  by the processes the tests start. A value the caller set is kept.
- ONNX Runtime's sessions made in the test processes do not spin their intra-op threads
  (``session.intra_op.allow_spinning`` 0); the threads, the kernels and the results are the same.
- After collection, the objects then alive (the imported modules of every test file, their constants) move to the
  collector's permanent generation (``gc.freeze``): each later ``gc.collect`` (the tools call it through
  ``onnxprec._io.trim_heap`` after every checked run) walks only what the tests made since, not the whole heap.
- When a test file's last test ends, the C heap's free pages go back to the system (``onnxprec._io.trim_heap``): a
  worker that runs hundreds of files does not keep at their peak the memory its earlier files freed.
- Under ``pytest -n 2 --dist loadfile`` (CI), each test file is one unit of work given to one worker (so that
  module-scoped fixtures are built once), except the files of ``HEAVY_TEST_FILES``, which together are one unit:
  they run one after another on one worker, never two at the same time on both workers, in the order written there,
  and they start first (the longest unit: the other worker meanwhile takes the light files, one at a time, while its
  own memory is still small). The light files of ``FIRST_LIGHT_FILES`` (0.55-0.8 GB) come first on the other
  worker, in that order, beside the heavy unit's smaller first files; the heavy unit's last files run beside the
  other worker's last light files, the smallest. (A scheduler of its own:
  pytest-xdist 3.8's ``--dist loadgroup`` sets ``item._nodeid``, which pytest 9 no longer reads, so its groups
  are lost and every test is scheduled on its own.)
"""

import gc
import os
from collections import OrderedDict

import pytest

# Test files whose tests (or the processes they start) hold 0.6-1.1 GB: the run holds one of them at a time, not two.
# In the order they run: first those under 0.9 GB (the inline model's tools, the PP-OCRv4 detector, EfficientNet's
# A16W8 search, the corpus's models), beside the other worker's largest light files (FIRST_LIGHT_FILES); then those
# of 0.8-1 GB (the Gemma-3 pieces, the golden tools, the written KV cache, SmolLM2's INT4, FP16 and builder
# perplexities).
HEAVY_TEST_FILES = (
    "tests/inline_weights_test.py",
    "src/onnxprec/quantization/int8/decide_test.py",
    "tests/int8_real_models_test.py",
    "zoo/corpus_test.py",
    "experiments/llm_corpus/segments_test.py",
    "tests/golden/golden_test.py",
    "src/onnxprec/quantization/generated_test.py",
    "tests/int4_real_models_test.py",
    "tests/real_models_test.py",
    "tests/llm_data_test.py",
)

# Light test files whose process (with the processes it starts) holds 0.55-0.8 GB, the largest first: the other
# worker starts with them, beside the heavy unit's smaller files.
FIRST_LIGHT_FILES = (
    "tests/bad_input_corpus_test.py",
    "tests/evaluate_api_test.py",
    "src/onnxprec/accuracy/task_test.py",
    "tests/preprocess_api_test.py",
    "tests/debug_real_models_test.py",
    "src/onnxprec/quantization/int8/guard_test.py",
    "src/onnxprec/quantization/fp8/modelopt_test.py",
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


def pytest_collection_finish(session: pytest.Session) -> None:
    """Moves what collection made to the collector's permanent generation (the module docstring says why)."""
    gc.collect()
    gc.freeze()


@pytest.hookimpl(trylast=True)  # after the file's fixtures are torn down
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """After the last test of a file: the freed memory back to the system (the module docstring says why)."""
    if nextitem is None or nextitem.path != item.path:
        from onnxprec._io import trim_heap

        trim_heap()


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """Under ``--dist loadfile``: each file one unit of work, the files of ``HEAVY_TEST_FILES`` together one unit
    (the module docstring says in which order)."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class _HeavyFirst(OrderedDict[str, dict[str, bool]]):
        """xdist's queue of work units (taken with ``popitem(last=False)``): the heavy unit first, then the files of
        FIRST_LIGHT_FILES, then the others."""

        def popitem(self, last: bool = True) -> tuple[str, dict[str, bool]]:
            if last:
                return super().popitem(last)
            first = next((key for key in ("heavy", *FIRST_LIGHT_FILES) if key in self), None) or next(iter(self))
            unit = self.pop(first)
            if first == "heavy":  # its tests in the order of its files (a worker runs them as sent)
                order = sorted(unit, key=lambda nodeid: HEAVY_TEST_FILES.index(nodeid.split("::")[0]))
                unit = {nodeid: unit[nodeid] for nodeid in order}
            return first, unit

    class _HeavyFilesTogether(LoadFileScheduling):
        def __init__(self, config: pytest.Config, log: object) -> None:
            super().__init__(config, log)
            self.workqueue = _HeavyFirst()

        def _split_scope(self, nodeid: str) -> str:
            path = super()._split_scope(nodeid)
            return "heavy" if path in HEAVY_TEST_FILES else path

    return _HeavyFilesTogether(config, log)
