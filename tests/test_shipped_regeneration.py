"""``make shipped`` regenerates every file in analyzer/shipped/ equal to the committed one in every op count,
tile and byte figure (graph.diff.figure_differences; timestamps, timings, memory and versions aside).

Full size: four conversions of ~15 GB and 3–10 min each, one at a time. Run it alone, e.g.
``QFOLD_FULL=1 flock /tmp/qfold-fullsize.lock .venv/bin/python -m pytest tests/test_shipped_regeneration.py``.
The same comparison runs by default on a structure build and on a shipped file (tests/test_shipped.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from analyzer.analysis.record import read_analysis_file
from analyzer.compare.diff import figure_differences
from analyzer.report.catalog import shipped_files

pytestmark = [pytest.mark.full, pytest.mark.conversion]
REPO = Path(__file__).resolve().parent.parent
FOUR_CONVERSIONS_S = 4 * 3600


def test_make_shipped_regenerates_every_shipped_analysis(tmp_path):
    out = tmp_path / "shipped"
    cmd = [sys.executable, "bench/full_size.py", "--every-shipped", "--ship-dir", str(out),
           "--builds-dir", str(tmp_path / "builds"), "--results-dir", str(tmp_path / "results")]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=FOUR_CONVERSIONS_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    committed = shipped_files()
    assert committed and [s.path.name for s in shipped_files(out)] == [s.path.name for s in committed]
    for s in committed:
        lines = figure_differences(read_analysis_file(s.path), read_analysis_file(out / s.path.name))
        assert lines == (), f"{s.path.name}: " + "; ".join(lines)
