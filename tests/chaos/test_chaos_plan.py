"""Run plans derive from the seed alone: same seed, same schedule."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from chaos.harness.plan import plan_run, stream
from chaos.harness.scenarios import DEFAULT_MATRIX, QUICK_MATRIX, SCENARIOS, get


def test_same_seed_same_plan_for_every_scenario() -> None:
    for name in SCENARIOS:
        assert plan_run(get(name), 42) == plan_run(get(name), 42)


def test_different_seeds_give_different_schedules() -> None:
    delays = {plan_run(get("master-crash"), seed).step_delays_s for seed in range(20)}
    assert len(delays) > 15
    hits = {plan_run(get("master-crash-unflushed"), seed).failpoints["master"]
            for seed in range(20)}
    assert len(hits) > 15


def test_plan_is_the_same_in_another_process() -> None:
    """No per-process hash randomisation leaks into a plan."""
    code = ("from chaos.harness.plan import plan_run; from chaos.harness.scenarios import get; "
            "print(plan_run(get('master-crash-after-ship'), 9))")
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True, env={"PYTHONHASHSEED": str(i)}).stdout
            for i in (1, 2)}
    assert len(outs) == 1
    assert repr(plan_run(get("master-crash-after-ship"), 9)) + "\n" in outs


def test_delays_fall_in_their_windows_and_failpoints_in_range() -> None:
    for name in SCENARIOS:
        sc = get(name)
        for seed in range(10):
            plan = plan_run(sc, seed)
            for delay, step in zip(plan.step_delays_s, sc.steps, strict=True):
                lo, hi = step.after_s
                assert lo - 1e-3 <= delay <= hi + 1e-3
            for fp in sc.failpoints:
                spec = plan.failpoints[fp.target]
                nth = int(spec.split("@")[1])
                assert fp.hits[0] <= nth <= fp.hits[1]
                assert spec.startswith(f"{fp.name}={fp.action}@")


def test_streams_are_independent_per_purpose() -> None:
    assert stream(1, "faults").random() != stream(1, "workload").random()
    assert stream(1, "faults").random() == stream(1, "faults").random()


def test_shipped_scenarios_cover_the_issue() -> None:
    wanted = {"master-crash", "master-crash-unflushed", "master-crash-mid-flush",
              "master-crash-after-ship",
              "slave-crash", "slave-pause", "partition", "clean-restart", "double-crash",
              "torn-tail", "bit-flip"}
    consuming = {"consumer-crash", "master-crash-consuming", "slave-crash-consuming"}
    failover = {"master-lost", "master-crash-failover", "failover-twice", "isolated-master"}
    assert wanted | consuming | failover <= set(SCENARIOS)
    assert set(DEFAULT_MATRIX) == wanted | consuming | failover
    assert all(SCENARIOS[n].consume for n in consuming)
    assert set(QUICK_MATRIX) == {"master-crash", "master-crash-unflushed", "clean-restart",
                                 "master-crash-consuming", "master-crash-mid-flush"}
    assert set(QUICK_MATRIX) <= set(DEFAULT_MATRIX)


def test_plan_says_how_long_the_load_runs_on_each_backend(tmp_path: Path) -> None:
    """The sim backend's load lasts --sim-duration, not the scenario's load_s:
    the plan says so, and a sim run's history spans what the plan said."""
    def plan_text(*extra: str) -> str:
        return subprocess.run([sys.executable, "-m", "chaos.cli", "chaos", "plan", "--scenario",
                               "master-crash", "--seed", "3", *extra],
                              capture_output=True, text=True, check=True).stdout

    assert "load runs 6 s on the local and compose backends, 60 simulated s on the sim " \
        "backend" in plan_text()
    assert "12 simulated s on the sim backend" in plan_text("--sim-duration", "12")
    out = tmp_path / "sim"
    subprocess.run([sys.executable, "-m", "chaos.cli", "chaos", "run", "--backend", "sim",
                    "--scenario", "master-crash", "--seed", "3", "--sim-duration", "12",
                    "--role", "ASYNC_MASTER", "--flush", "ASYNC_FLUSH",
                    "--out", str(out)], capture_output=True, text=True, timeout=300, check=True)
    (history,) = out.glob("**/history.jsonl")
    invoked = [json.loads(line)["invoke_ms"] for line in history.read_text().splitlines()]
    assert 11_500 <= max(invoked) - min(invoked) <= 14_000  # the last put ends it
