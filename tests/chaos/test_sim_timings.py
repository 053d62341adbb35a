"""A sim run given this machine's timings (chaos/harness/timings.py): its
flushes take the measured fsync times, each put the node's time on its put
path (one after another), and the timings are recorded so that a replay
is the same run byte for byte."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from chaos.commands.replay import tree_hashes
from chaos.harness import scenarios
from chaos.harness.run_config import RunConfig
from chaos.harness.timings import MachineTimings
from chaos.harness.workload import WorkloadConfig
from chaos.matrix.launch import make_run
from chaos.schema import load_json_file, read_jsonl

# A slow put path (2 ms a put) and a slow disk (20-40 ms an fsync): both
# show in the latencies beyond the sim's own network delays.
SLOW = MachineTimings(fsync_us=(20_000.0, 30_000.0, 40_000.0), put_us=2_000.0,
                      net_us=(50.0, 60.0), start_us=700_000.0)


def _run(out: Path, flush: str, timings: MachineTimings | None) -> str:
    cfg = RunConfig(scenario=scenarios.get("clean-restart"), role="ASYNC_MASTER", flush=flush,
                    seed=4, out_dir=str(out), backend="sim", sim_duration_s=None,
                    sim_timings=timings, workload=WorkloadConfig(producers=3, rate_per_s=20.0))
    return make_run(cfg).execute()  # as a sweep or compare-backends runs it


def _latencies_ms(run_dir: str) -> list[float]:
    return [(r["complete_us"] - r["invoke_us"]) / 1000
            for r in read_jsonl(os.path.join(run_dir, "history.jsonl"))
            if r["status"] == "PUT_OK"]


def test_puts_and_flushes_take_the_machines_times(tmp_path: Path) -> None:
    asynchronous = _latencies_ms(_run(tmp_path / "a", "ASYNC_FLUSH", SLOW))
    assert asynchronous and min(asynchronous) >= 2.0  # every put paid its put path
    synchronous = _latencies_ms(_run(tmp_path / "s", "SYNC_FLUSH", SLOW))
    # A SYNC_FLUSH put also waits for a flush: 20 ms at least.
    assert synchronous and min(synchronous) >= 20.0
    drawn = _latencies_ms(_run(tmp_path / "d", "SYNC_FLUSH", None))
    assert sorted(drawn)[len(drawn) // 2] < 20.0  # without them, the run's drawn disk speed


def test_a_node_takes_the_machines_start_time_to_come_back(tmp_path: Path) -> None:
    run_dir = _run(tmp_path / "a", "ASYNC_FLUSH", SLOW)
    starts = [f for f in read_jsonl(os.path.join(run_dir, "faults.jsonl"))
              if f["kind"] == "start"]
    assert starts and all(f["end_ms"] - f["start_ms"] == 700 for f in starts)
    # Meanwhile the master is down: no put was acknowledged in that time.
    (start,) = starts
    assert not [r for r in read_jsonl(os.path.join(run_dir, "history.jsonl"))
                if r["status"] == "PUT_OK" and start["start_ms"] < r["invoke_ms"]
                and r["complete_ms"] < start["end_ms"]]


def test_the_load_lasts_the_scenarios_load_time_as_on_real_nodes(tmp_path: Path) -> None:
    run_dir = _run(tmp_path / "a", "ASYNC_FLUSH", SLOW)
    history = read_jsonl(os.path.join(run_dir, "history.jsonl"))
    span_s = (history[-1]["invoke_ms"] - history[0]["invoke_ms"]) / 1000
    load_s = scenarios.get("clean-restart").load_s
    assert load_s - 1.0 < span_s < load_s + scenarios.get("clean-restart").settle_s + 1.0


def test_the_timings_are_recorded_and_a_replay_is_byte_identical(tmp_path: Path) -> None:
    original = _run(tmp_path / "a", "SYNC_FLUSH", SLOW)
    config = load_json_file(os.path.join(original, "params.json"))["config"]
    assert MachineTimings.from_record(config["sim_timings"]) == SLOW
    assert config["sim_duration_s"] is None
    r = subprocess.run([sys.executable, "-m", "chaos.cli", "chaos", "replay", original,
                        "--out", str(tmp_path / "b")], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode in (0, 1), r.stderr
    assert "identical to the original, byte for byte" in r.stdout, r.stdout
    assert tree_hashes(original) == tree_hashes(str(tmp_path / "b" / os.path.basename(original)))
