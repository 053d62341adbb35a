"""End to end on real processes and a real Spark session: a matrix of the
four modes through `dlab chaos matrix`, then the report's comparison.

Clean restarts lose nothing in any mode; SYNC_MASTER + SYNC_FLUSH keeps
every promise through a master crash."""

from __future__ import annotations

import csv
import os
import subprocess
import sys

import pytest


@pytest.mark.slow  # 8 local runs and a Spark report: started first (tests/conftest.py)
def test_matrix_then_report(tmp_path: str) -> None:
    out = os.path.join(tmp_path, "matrix")
    proc = subprocess.run(
        [sys.executable, "-m", "chaos.cli", "chaos", "matrix", "--out", out,
         "--scenarios", "master-crash,clean-restart", "--producers", "2", "--seed", "4"],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "8 runs in" in proc.stdout and "0 failed" in proc.stdout
    assert "[8/8] clean-restart-ASYNC_MASTER-ASYNC_FLUSH" in proc.stdout  # the live line per run
    with open(os.path.join(out, "report", "comparison.csv"), newline="") as f:
        rows = {(r["role"], r["flush"], r["scenario"]): r for r in csv.DictReader(f)}
    assert len(rows) == 8
    for (role, flush, scenario), row in rows.items():
        assert int(row["acked"]) > 0, (role, flush, scenario)
        if scenario == "clean-restart":
            assert int(row["acked_lost_master"]) == 0, (role, flush)
            assert int(row["acked_lost_everywhere"]) == 0, (role, flush)
            assert int(row["promise_violations"]) == 0, (role, flush)
    crash = rows[("SYNC_MASTER", "SYNC_FLUSH", "master-crash")]
    assert int(crash["promise_violations"]) == 0
    assert int(crash["acked_lost_master"]) == 0
    for name in ("report.md", "report.html", "verdicts.csv", "comparison.parquet"):
        assert os.path.exists(os.path.join(out, "report", name)), name
