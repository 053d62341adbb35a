"""`dlab chaos matrix --backend sim`: the runs go as Spark tasks (local[*]
here) and each run directory is exactly what the run gives in the driver."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from chaos.cli import build_parser
from chaos.commands.replay import tree_hashes
from chaos.harness import scenarios
from chaos.harness.runner import RunConfig
from chaos.matrix.launch import make_run


def test_a_sim_matrix_runs_as_spark_tasks_and_writes_the_same_run_directories(
        tmp_path: Path) -> None:
    out = tmp_path / "m"
    r = subprocess.run(
        [sys.executable, "-m", "chaos.cli", "chaos", "matrix", "--backend", "sim",
         "--scenarios", "master-crash", "--roles", "SYNC_MASTER", "--flushes",
         "SYNC_FLUSH,ASYNC_FLUSH", "--runs", "2", "--sim-duration", "6", "--seed", "7",
         # --out relative, as scripts/run-comparison gives it
         "--no-report", "--keep-stores", "all", "--out", "m"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "runs as Spark tasks on local[*]" in r.stdout
    assert "4 runs in" in r.stdout and "0 failed" in r.stdout
    assert "[4/4] master-crash-SYNC_MASTER-ASYNC_FLUSH-power-reject-sim-s8:" in r.stdout
    with open(out / "matrix.json", encoding="utf-8") as f:
        assert json.load(f)["runs"] == 4
    runs = sorted(os.listdir(out / "runs"))
    assert len(runs) == 4
    # The same run in this process: the same bytes.
    cfg = RunConfig(scenario=scenarios.get("master-crash"), role="SYNC_MASTER",
                    flush="ASYNC_FLUSH", seed=8, out_dir=str(tmp_path / "driver"),
                    backend="sim", sim_duration_s=6.0)
    here = make_run(cfg).execute()  # keeps its stores, as --keep-stores all
    there = out / "runs" / cfg.run_id
    assert tree_hashes(str(there)) == tree_hashes(here)


def test_bench_sweep_refuses_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["bench", "sweep", "--runs", "0"], ["bench", "sweep", "--rounds", "-1"],
                 ["bench", "sweep", "--duration", "0"]):
        with pytest.raises(SystemExit) as exc:
            build_parser().parse_args(argv)
        assert exc.value.code == 2, argv
        err = capsys.readouterr().err
        assert argv[2] in err and "Traceback" not in err, err
