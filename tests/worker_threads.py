"""A pytest plugin (``-p tests.worker_threads`` in pyproject.toml), loaded before conftest.py and the test modules
import numpy or torch: each xdist worker gets its share of the cores for the OpenMP, MKL and OpenBLAS thread pools,
and so does every child it starts (conversions, CLIs, Streamlit servers inherit the environment).

With ``-n auto`` on 2 cores, 2 workers each running 2-thread pools (plus their children's) spin-wait for threads
that another process holds: test_families and test_interpret_presets took 92 s (159 s of CPU) that way and 69 s
(107 s of CPU) with one thread per worker. A variable already set is kept; outside xdist nothing changes.
"""

from __future__ import annotations

import os

THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")

_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _workers > 1:
    for _var in THREAD_VARS:
        os.environ.setdefault(_var, str(max(1, (os.cpu_count() or 1) // _workers)))
