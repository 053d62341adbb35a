"""A report over an interrupted matrix says which planned runs are missing
(chaos/check/matrix_plan.py): `dlab chaos matrix` writes OUT/plan.json before its
first run, and `dlab report OUT` names every planned run with no run
directory, on stderr, in report.md/html and in --json, and exits 1."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from support.cli_helpers import REPO, dlab

from chaos.check import matrix_plan

RUNS = 3


def _interrupt_after_first_run(out: str) -> None:
    """A real matrix of RUNS local runs, stopped by Ctrl-C (SIGINT to its
    process group, as a terminal sends it) once its first run is done."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "chaos.cli", "chaos", "matrix", "--out", out,
         "--scenarios", "clean-restart", "--roles", "ASYNC_MASTER", "--flushes", "ASYNC_FLUSH",
         "--runs", str(RUNS), "--producers", "1", "--no-report"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True)
    assert proc.stdout is not None  # each finished run's line: "[i/n] RUN_ID: ..."
    seen = b""
    deadline = time.monotonic() + 400
    try:
        while f"[1/{RUNS}]".encode() not in seen:
            chunk = proc.stdout.read1(4096)
            assert chunk and time.monotonic() < deadline, seen.decode(errors="replace")
            seen += chunk
        assert os.path.isfile(os.path.join(out, matrix_plan.PLAN_FILE))
        os.killpg(proc.pid, signal.SIGINT)
        proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode != 0  # interrupted, not finished


@pytest.mark.slow  # started first (tests/conftest.py)
@pytest.mark.timeout(900)  # a few local runs, then a Spark report
def test_a_report_over_an_interrupted_matrix_names_the_missing_runs(tmp_path: str) -> None:
    out = os.path.join(tmp_path, "m")
    _interrupt_after_first_run(out)
    with open(os.path.join(out, matrix_plan.PLAN_FILE), encoding="utf-8") as f:
        planned = json.load(f)["planned"]
    assert len(planned) == RUNS and len(set(planned)) == RUNS
    present = [r for r in planned if os.path.isfile(os.path.join(out, "runs", r, "params.json"))]
    missing = [r for r in planned if r not in present]
    assert present and missing, (present, missing)

    # One report (Spark is slow on a shared machine): --json keeps stdout for
    # the JSON; the warning is on stderr as without it.
    report_dir = os.path.join(tmp_path, "report")
    r = dlab("report", out, "--out", report_dir, "--json", timeout=800)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    summary = (f"{len(present)} of {RUNS} planned runs found; {len(missing)} missing: "
               + ", ".join(missing))
    assert f"dlab report: warning: incomplete matrix {out}: {summary}" in r.stderr, r.stderr
    doc = json.loads(r.stdout)
    assert doc["exit_status"] == 1 and doc["planned_runs"] == RUNS
    assert [m["run_id"] for m in doc["missing_runs"]] == missing
    for name in ("report.md", "report.html"):
        with open(os.path.join(report_dir, name), encoding="utf-8") as f:
            text = f.read()
        assert "Planned runs missing" in text and summary in text, name
        assert all(m in text for m in missing)


def _run_dir(path: str) -> str:
    os.makedirs(path)
    with open(os.path.join(path, "params.json"), "w", encoding="utf-8") as f:
        f.write("{}")
    return path


def test_which_plans_a_report_checks(tmp_path: str) -> None:
    out = os.path.join(tmp_path, "m")
    os.makedirs(out)
    matrix_plan.write_plan(out, ["a", "b", "c"])
    found = [_run_dir(os.path.join(out, "runs", "a"))]
    # The matrix's directory, its runs directory, a directory holding it.
    for given in (out, os.path.join(out, "runs"), str(tmp_path)):
        plans, unread = matrix_plan.find_plans([given])
        assert [p.path for p in plans] == [os.path.join(out, "plan.json")] and not unread
        (c,) = matrix_plan.coverage(plans, found)
        assert (c.found, c.planned, c.missing) == (1, 3, ("b", "c"))
    assert matrix_plan.find_plans([found[0]]) == ([], [])  # one run alone
    with open(os.path.join(out, "plan.json"), "w", encoding="utf-8") as f:
        f.write("{not json")
    plans, unread = matrix_plan.find_plans([out])
    assert plans == [] and "plan.json: cannot be read as a matrix plan" in unread[0]


@pytest.mark.parametrize("text", ['{"kind": "other"}', '{"kind": "dlab-matrix-plan"}'])
def test_a_file_that_is_not_a_plan_is_named(tmp_path: str, text: str) -> None:
    with open(os.path.join(tmp_path, "plan.json"), "w", encoding="utf-8") as f:
        f.write(text)
    with pytest.raises(matrix_plan.PlanError, match="plan.json: "):
        matrix_plan.read_plan(os.path.join(tmp_path, "plan.json"))
