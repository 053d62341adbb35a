"""Commands that say how it went (README, exit status): exit statuses as each
`--help` documents them, and every `--json` output parsed whole (nothing
else on stdout). One small cluster for the module; one real chaos run; one
`dlab report` (Spark) over that run and the pipeline's fixture runs."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from support.cli_helpers import dlab
from support.ha_helpers import FAST

from chaos.check.summary import run_outcome
from chaos.cli import build_parser
from chaos.harness import scenarios

# The module-scoped fixtures below (a cluster, a run) are made once: under
# pytest-xdist (scripts/test) this module's tests share one worker.
pytestmark = pytest.mark.xdist_group("test_cli_outcomes")


def as_json(r: subprocess.CompletedProcess[str]) -> Any:
    """The whole of stdout as one JSON document: fails on anything else there."""
    assert "Traceback" not in r.stderr, r.stderr
    return json.loads(r.stdout)


@pytest.fixture(scope="module")
def cdir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    d = str(tmp_path_factory.mktemp("outcomes") / "c")
    up = dlab("cluster", "up", "--dir", d, "--slaves", "1", "--segment-size", "256KiB",
              "--node-args", " ".join(FAST))
    assert up.returncode == 0, up.stderr
    yield d
    dlab("cluster", "down", "--dir", d)


def _addresses(d: str) -> dict[str, str]:
    return {row["name"]: row["address"] for row in as_json(dlab("cluster", "status", "--dir", d,
                                                                "--json"))}


# ------------------------------------------------------------------ send
def test_send_json_is_the_only_stdout_and_exits_0_with_a_put_ok(cdir: str) -> None:
    r = dlab("send", "--dir", cdir, "--count", "5", "--size", "100", "--json")
    assert r.returncode == 0, r.stderr
    summary = as_json(r)
    assert summary["counts"] == {"PUT_OK": 5} and summary["details"] == {}


@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_send_with_no_put_ok_exits_1_and_says_why(cdir: str, json_flag: list[str]) -> None:
    # A slave refuses every put (SERVICE_NOT_AVAILABLE), nothing stored. (A
    # --size over the node's max is refused before sending: test_send_size.py.)
    slave = _addresses(cdir)["slave1"]
    r = dlab("send", "--target", slave, "--token-file", os.path.join(cdir, "token"),
             "--count", "3", *json_flag)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "no message was stored (no PUT_OK of 3): SERVICE_NOT_AVAILABLE x3 (" in r.stderr, \
        r.stderr
    if json_flag:
        summary = as_json(r)
        assert summary["counts"] == {"SERVICE_NOT_AVAILABLE": 3}
        assert summary["details"]["SERVICE_NOT_AVAILABLE"], summary
    else:
        assert "SERVICE_NOT_AVAILABLE" in r.stdout  # the table, as without the refusal


def test_send_target_names_a_node_and_a_slave_refuses_every_put(cdir: str) -> None:
    slave = _addresses(cdir)["slave1"]
    r = dlab("send", "--target", slave, "--token-file", os.path.join(cdir, "token"),
             "--count", "2", "--json")
    assert r.returncode == 1, (r.stdout, r.stderr)
    summary = as_json(r)
    assert summary["target"] == slave and "PUT_OK" not in summary["counts"], summary
    assert "no message was stored" in r.stderr


# -------------------------------------------------------- status, inspect
def test_status_exits_1_while_a_node_is_down_and_0_when_all_answer(cdir: str) -> None:
    r = dlab("cluster", "status", "--dir", cdir, "--json")
    assert r.returncode == 0, r.stderr
    assert {row["state"] for row in as_json(r)} == {"running"}
    assert dlab("cluster", "kill", "slave1", "--dir", cdir).returncode == 0
    try:
        r = dlab("cluster", "status", "--dir", cdir, "--json")
        assert r.returncode == 1, r.stderr
        rows = {row["name"]: row for row in as_json(r)}
        assert rows["slave1"]["state"] == "stopped" and rows["master"]["state"] == "running"
        assert "dlab cluster status: slave1 is stopped" in r.stderr
        r = dlab("cluster", "status", "--dir", cdir)
        assert r.returncode == 1 and "slave1 is stopped" in r.stderr
    finally:
        assert dlab("cluster", "start", "slave1", "--dir", cdir).returncode == 0
    assert dlab("cluster", "status", "--dir", cdir).returncode == 0


def test_store_inspect_json_is_one_object(cdir: str) -> None:
    r = dlab("store", "inspect", os.path.join(cdir, "nodes", "master", "data"), "--json")
    assert r.returncode == 0, r.stderr
    assert as_json(r)["first_bad_offset"] is None


# ---------------------------------------------------- chaos: plan, scenarios
def test_chaos_plan_is_a_labelled_table_or_json() -> None:
    r = dlab("chaos", "plan", "--scenario", "master-crash-unflushed", "--seed", "3")
    assert r.returncode == 0, r.stderr
    header = next(line for line in r.stdout.splitlines() if line.startswith("STEP"))
    assert header.split() == ["STEP", "AT", "(s)", "AFTER", "(s)", "WINDOW", "(s)", "ACTION",
                              "TARGET"]
    assert "failpoint on master: after_append_before_flush=crash@" in r.stdout
    plan = as_json(dlab("chaos", "plan", "--scenario", "master-crash", "--seed", "3", "--json"))
    assert [s["action"] for s in plan["steps"]] == ["kill", "start"]
    assert plan["steps"][1]["at_s"] == pytest.approx(sum(plan["step_delays_s"]), abs=0.002)
    r = dlab("chaos", "plan", "--scenario", "nosuch", "--seed", "1")
    assert r.returncode == 2 and "unknown scenario 'nosuch'" in r.stderr


def test_chaos_scenarios_json_lists_every_scenario() -> None:
    listed = as_json(dlab("chaos", "scenarios", "--json"))
    assert [s["name"] for s in listed] == list(scenarios.SCENARIOS)
    assert {s["name"] for s in listed if s["in_quick_matrix"]} == set(scenarios.QUICK_MATRIX)


def test_quick_names_what_it_runs_and_refuses_scenarios_beside_it(tmp_path: str) -> None:
    quick = next(a for where, a in _options(build_parser())
                 if where == "chaos matrix" and "--quick" in a.option_strings)
    assert quick.help and all(name in quick.help for name in scenarios.QUICK_MATRIX)
    assert f"the {len(scenarios.QUICK_MATRIX)} scenarios" in quick.help
    r = dlab("chaos", "matrix", "--quick", "--scenarios", "master-crash", "--out",
             os.path.join(tmp_path, "m"))
    assert r.returncode == 2 and "--quick and --scenarios both choose" in r.stderr
    assert not os.path.exists(os.path.join(tmp_path, "m"))


# ------------------------------------------------------------ help texts
def _options(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
             ) -> Iterator[tuple[str, argparse.Action]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _options(sub, (*path, name))
        elif action.option_strings and action.help != argparse.SUPPRESS \
                and not isinstance(action, argparse._HelpAction):
            yield " ".join(path), action


def test_every_option_has_help_and_says_its_default() -> None:
    missing = []
    for where, action in _options(build_parser()):
        text = (action.help or "") % {"default": action.default, "prog": "dlab"}
        has_default = action.default not in (None, False, "") and action.nargs != 0
        if not text or (has_default and "default" not in text):
            missing.append(f"dlab {where} {action.option_strings[0]}")
    assert not missing, missing


@pytest.mark.parametrize("command", [("send",), ("report",), ("cluster", "status"),
                                     ("chaos", "run"), ("chaos", "matrix"), ("chaos", "plan"),
                                     ("chaos", "replay"), ("chaos", "compare-backends"),
                                     ("store", "inspect")])
def test_each_help_documents_its_exit_status(command: tuple[str, ...]) -> None:
    r = dlab(*command, "--help")
    assert r.returncode == 0 and "exit status:" in r.stdout, r.stdout


# ------------------------------------------- a real run, and its report
@pytest.fixture(scope="module")
def trust_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str],
                                                                  str]:
    """The master crashes with an unflushed tail under the trust policy; it
    restarts and acknowledges puts its slave (ahead of it) never receives."""
    out = str(tmp_path_factory.mktemp("run"))
    r = dlab("chaos", "run", "--scenario", "master-crash-unflushed", "--role", "SYNC_MASTER",
             "--flush", "ASYNC_FLUSH", "--slave-ahead-policy", "trust", "--seed", "1",
             "--producers", "2", "--out", out, "--json", timeout=300)
    return r, out


def test_chaos_run_json_is_its_outcome_and_the_exit_status_follows_it(
        trust_run: tuple[subprocess.CompletedProcess[str], str]) -> None:
    r, _ = trust_run
    o = as_json(r)
    assert r.returncode == (1 if o["promise_violations"] else 0), (o, r.stderr)
    assert o["mode"] == "SYNC_MASTER + ASYNC_FLUSH" and o["promises"] == "replica"
    assert 0 < o["acked"] <= o["puts"] and o["not_put_ok"] == o["puts"] - o["acked"]
    assert o["failed_share"] == pytest.approx(o["not_put_ok"] / o["puts"], abs=1e-4)
    assert [f["kind"] for f in o["faults"]][-1] == "start" and o["faults"][0]["at_s"] > 0
    assert "fault start master" in r.stderr  # the run's log, kept off stdout
    assert o == run_outcome(o["run_dir"]).to_json()


def test_the_text_outcome_is_one_line_with_the_fault_times(
        trust_run: tuple[subprocess.CompletedProcess[str], str], tmp_path: str) -> None:
    from chaos.check.summary import fault_lines, outcome_line

    o = run_outcome(json.loads(trust_run[0].stdout)["run_dir"])
    line = outcome_line(o)
    for part in (f"{o.acked} of {o.puts} puts acked",
                 f"{o.acked_lost_master} acked lost on the master",
                 f"{o.acked_lost_everywhere} lost everywhere", f"{o.acked_stranded} stranded",
                 f"{o.promise_violations} promise violation",
                 f"{100 * o.failed_share:.1f} % of puts failed"):
        assert part in line, line
    assert ("slave" in line and "bytes ahead" in line) == (o.slave_ahead_bytes > 0)
    assert ("replication stalled" in line) == o.replication_stalled
    faults = fault_lines(o.faults)
    assert len(faults) == len(o.faults) and "failpoint" in faults[0] and "master" in faults[0]


def test_report_json_exit_1_and_the_run_outcome_agrees_with_it(
        trust_run: tuple[subprocess.CompletedProcess[str], str], tmp_path: str) -> None:
    """`dlab report --json` over the real run and the pipeline's fixture runs
    (some break their promise): exit status 1, stdout one JSON object, and
    each run's outcome as `dlab chaos run` judges it equal to the report's."""
    from support.pipeline_fixtures import fixture_runs

    fixtures = os.path.join(tmp_path, "fixtures")
    fixture_runs(fixtures)
    r = dlab("report", trust_run[1], fixtures, "--out", os.path.join(tmp_path, "out"),
             "--spark-master", "local[2]", "--json", timeout=600)
    report = as_json(r)
    assert r.returncode == 1 == report["exit_status"], r.stderr
    assert report["runs_with_violations"] > 0 and report["left_out"] == []
    keys = ("acked", "acked_lost_master", "acked_lost_everywhere", "acked_stranded",
            "promise_violations")
    assert len(report["verdicts"]) == report["runs"] > 5
    for v in report["verdicts"]:
        o = run_outcome(v["run_dir"]).to_json()
        assert {k: o[k] for k in keys} == {k: v[k] for k in keys}, v["run_id"]


def test_matrix_exit_status_follows_its_runs_violations(tmp_path: str) -> None:
    """One cell (the trust run's mode and seed), no report: the matrix
    judges each run from its read-back and exits 1 when one broke a promise."""
    out = os.path.join(tmp_path, "m")
    r = dlab("chaos", "matrix", "--scenarios", "master-crash-unflushed", "--roles",
             "SYNC_MASTER", "--flushes", "ASYNC_FLUSH", "--slave-ahead-policy", "trust",
             "--producers", "2", "--no-report", "--out", out, timeout=300)
    assert "Traceback" not in r.stderr, r.stderr
    (run_dir,) = [os.path.join(out, "runs", d) for d in os.listdir(os.path.join(out, "runs"))]
    o = run_outcome(run_dir)
    assert r.returncode == (1 if o.promise_violations else 0), (r.stdout, r.stderr)
    bad = 1 if o.promise_violations else 0
    assert r.stdout.strip().splitlines()[-1] == \
        f"{bad} run{'' if bad == 1 else 's'} with promise violations", r.stdout
    assert f"{o.promise_violations} promise violation" in r.stdout  # the live line per run
