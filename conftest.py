"""Settings for the whole test suite (every test path: src, tests, benchmarks, experiments, zoo, examples).

Linear algebra runs on one thread per process: the tests' matrices are small, and OpenBLAS's idle threads spin
while they wait for work, so on 2 cores (or 2 pytest-xdist workers) a second thread costs CPU time without making
a test faster. Set before any test module imports numpy; the processes the tests start inherit it. A value the
caller set is kept.
"""

import os

for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, "1")
