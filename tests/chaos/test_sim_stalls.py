"""The two scenarios with `delay` failpoints on the sim backend: the stall
takes virtual time and holds back just the work that hit it (a flusher's
flush; a dispatch pass, and with it a clean stop that waits for that pass),
and a seed gives a byte-identical run directory. The bug checks on them are
in tests/chaos/test_known_bugs.py."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from chaos.commands import bugs
from chaos.commands.replay import tree_hashes
from chaos.harness.runner import RunConfig
from chaos.sim.run import SimRun


def _run(out: Path, bug_id: str, seed: int, *, emulate: bool) -> str:
    fields = {**bugs.get(bug_id).run_fields(), "seed": seed, "backend": "sim",
              "sim_duration_s": 15.0, "out_dir": str(out),
              "emulate": (bug_id,) if emulate else ()}
    return SimRun(RunConfig(**fields)).execute()


def _jsonl(run_dir: str, name: str) -> list[dict[str, Any]]:
    with open(os.path.join(run_dir, name), encoding="utf-8") as f:
        return [json.loads(line) for line in f]


@pytest.mark.parametrize("bug_id,emulate", [("rmq-8239", True), ("rmq-8239", False),
                                            ("rmq-405", True), ("rmq-405", False)])
def test_a_stall_scenario_gives_a_byte_identical_run_directory_per_seed(
        tmp_path: Path, bug_id: str, emulate: bool) -> None:
    a = tree_hashes(_run(tmp_path / "a", bug_id, 5, emulate=emulate))
    b = tree_hashes(_run(tmp_path / "b", bug_id, 5, emulate=emulate))
    assert a == b
    assert {"history.jsonl", "faults.jsonl", "consumed.jsonl", "nodes/master/records.jsonl"} <= \
        set(a)


def test_a_stalled_flusher_holds_back_the_acks_for_its_virtual_time_then_crashes(
        tmp_path: Path) -> None:
    run_dir = _run(tmp_path, "rmq-8239", 1, emulate=False)
    faults = _jsonl(run_dir, "faults.jsonl")
    assert faults[0]["kind"] == "failpoint" and "delay:2500+crash" in faults[0]["detail"]
    crash_ms = faults[0]["start_ms"]
    history = _jsonl(run_dir, "history.jsonl")
    acked = [h["complete_ms"] for h in history if h["status"] == "PUT_OK"]
    # SYNC_FLUSH: no put is acknowledged while the flusher stalls; the crash
    # comes at the stall's end (2.5 s of simulated time, to the millisecond).
    last_before = max(t for t in acked if t <= crash_ms)
    assert 2490 <= crash_ms - last_before <= 2510
    # Meanwhile the master took puts (appended, waiting for the flush): the
    # loop went on. They were not acknowledged, and the consumer, reading
    # only flushed records without the switch, lost none it was handed.
    assert any(h["invoke_ms"] > last_before and h["status"] != "PUT_OK" for h in history)
    assert bugs.judge_run(run_dir)["delivered_then_lost"] == 0


@pytest.mark.parametrize("emulate", [True, False])
def test_a_clean_stop_waits_for_the_stalled_dispatch_in_virtual_time(
        tmp_path: Path, emulate: bool) -> None:
    run_dir = _run(tmp_path, "rmq-405", 1, emulate=emulate)
    faults = {f["kind"]: f for f in _jsonl(run_dir, "faults.jsonl")}
    stopped, started = faults["stop"]["start_ms"], faults["start"]["start_ms"]
    # The start step comes 0.3-0.6 s after the stop step has finished.
    waited_ms = started - stopped
    if emulate:  # the close gives up on dispatch after 5 virtual seconds
        assert 5300 <= waited_ms <= 5600 + 50
    else:  # it waits for the 12 s stall (begun within the first ~2 s) to end
        assert 5600 + 50 < waited_ms <= 12_000 + 600
        assert bugs.judge_run(run_dir)["stored_never_delivered"] == 0
