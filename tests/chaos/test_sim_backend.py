"""`--backend sim` (chaos/sim/run.py): the whole cluster in this process on a
virtual-time loop, in-memory network and MemoryDisk, running the real node
code. A run's directory is a pure function of its seed; a power cut loses
exactly what no fsync made durable; the checker reads a sim run like any
other and tells the modes apart; a minute of cluster time takes seconds."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from chaos.check.summary import run_outcome
from chaos.commands.bugs import judge_run
from chaos.commands.replay import tree_hashes
from chaos.harness import scenarios
from chaos.harness.runner import RunConfig
from chaos.schema import load_json_file, validate_run_dir
from chaos.sim.cluster import DATA_DIR, SimCluster
from chaos.sim.run import SimRun
from cluster.backends.interface import NodeSpec, NodeState
from cluster.node.role import Role
from store.log.record import UNIQ_KEY, Message
from store.log.segments import segment_name
from store.sim import loop as sim_loop
from store.sim.loop import VirtualTimeLoop
from store.sim.memory_disk import DiskFaults, MemoryDisk
from store.status import PutStatus


def _run(tmp: Path, scenario: str, role: str, flush: str, seed: int,
         duration_s: float = 12.0) -> str:
    cfg = RunConfig(scenario=scenarios.get(scenario), role=role, flush=flush, seed=seed,
                    out_dir=str(tmp), backend="sim", sim_duration_s=duration_s)
    return SimRun(cfg).execute()



def test_same_seed_gives_a_byte_identical_run_directory(tmp_path: Path) -> None:
    a = tree_hashes(_run(tmp_path / "a", "master-crash", "SYNC_MASTER", "ASYNC_FLUSH", 5))
    b = tree_hashes(_run(tmp_path / "b", "master-crash", "SYNC_MASTER", "ASYNC_FLUSH", 5))
    assert a == b
    # It holds what a run holds, so the comparison compares something.
    for rel in ("params.json", "history.jsonl", "faults.jsonl", "observations.jsonl",
                "nodes/master/records.jsonl", "nodes/slave1/final.json",
                f"cluster/nodes/master/data/commitlog/{segment_name(0)}"):
        assert rel in a, sorted(a)
    assert not any(p.endswith("/lock") for p in a)
    other = tree_hashes(_run(tmp_path / "c", "master-crash", "SYNC_MASTER", "ASYNC_FLUSH", 6))
    assert other["history.jsonl"] != a["history.jsonl"]


def test_a_sim_run_follows_the_result_schema_with_simulated_times(tmp_path: Path) -> None:
    run_dir = _run(tmp_path, "clean-restart", "ASYNC_MASTER", "SYNC_FLUSH", 2)
    assert validate_run_dir(run_dir) == ["master", "slave1"]
    params = load_json_file(os.path.join(run_dir, "params.json"))
    assert params["backend"] == "sim"
    epoch = sim_loop.DEFAULT_START_WALL_MS + 2 * 1000
    assert params["started_ms"] == epoch
    assert params["ended_ms"] - epoch >= 12_000  # simulated, from the seed's epoch
    assert params["sim"]["simulated_s"] >= 12.0
    o = run_outcome(run_dir)
    assert o.acked > 500 and o.acked_lost_master == 0 and not o.replication_stalled
    assert [f["kind"] for f in o.faults] == ["stop", "start"]


def test_a_slave_crash_and_a_double_crash_recover_and_keep_the_sync_promises(
        tmp_path: Path) -> None:
    run_dir = _run(tmp_path, "slave-crash", "SYNC_MASTER", "SYNC_FLUSH", 2)
    o = run_outcome(run_dir)
    assert [(f["kind"], f["node"]) for f in o.faults] == [("kill", "slave1"),
                                                          ("start", "slave1")]
    assert o.acked > 500 and o.acked_lost_master == 0 and not o.replication_stalled
    run_dir = _run(tmp_path, "double-crash", "SYNC_MASTER", "SYNC_FLUSH", 2)
    o = run_outcome(run_dir)
    assert {f["node"] for f in o.faults} == {"master", "slave1"}
    assert o.acked > 500 and o.acked_lost_everywhere == 0
    assert judge_run(run_dir)["promise_violations"] == 0


def test_async_modes_lose_acked_messages_on_a_master_crash_sync_modes_none(
        tmp_path: Path) -> None:
    lost = []
    for seed in (1, 3):
        run_dir = _run(tmp_path, "master-crash", "ASYNC_MASTER", "ASYNC_FLUSH", seed)
        o = run_outcome(run_dir)
        figures = judge_run(run_dir)
        assert figures["acked"] == o.acked > 500
        assert figures["promise_violations"] == 0  # nothing was promised
        lost.append(o.acked_lost_master)
    assert sum(lost) > 0, lost  # acked, then lost with the master's page cache
    for seed in (1, 3):
        run_dir = _run(tmp_path, "master-crash", "SYNC_MASTER", "SYNC_FLUSH", seed)
        o = run_outcome(run_dir)
        figures = judge_run(run_dir)
        assert figures["acked"] == o.acked > 500
        assert o.acked_lost_master == 0 and o.acked_lost_everywhere == 0
        assert figures["promise_violations"] == 0


def test_a_crash_failpoint_between_write_and_fsync_loses_exactly_the_unsynced_bytes(
        ) -> None:
    """The master crashes (in-process) after a flush wrote its bytes and
    before its fsync: its new disk holds the durable bytes, byte for byte,
    not the page cache's; the restarted store recovers to the last synced
    offset, and every put it acknowledged under SYNC_FLUSH is in it."""

    async def main(loop: VirtualTimeLoop) -> dict[str, Any]:
        import random

        master = NodeSpec(name="master", role=Role.ASYNC_MASTER, flush="SYNC_FLUSH",
                          segment_size_bytes=8 << 20, failpoints="before_flush_sync=crash@30")
        slave = NodeSpec(name="slave1", role=Role.SLAVE, flush="SYNC_FLUSH",
                         segment_size_bytes=8 << 20)
        crashed: list[str] = []
        c = SimCluster(loop, random.Random(4), master, (slave,), DiskFaults(),
                       on_crash=crashed.append)
        await c.start("master")
        await c.start("slave1")
        old_disk = c.nodes["master"].disk
        node = c.nodes["master"].node
        assert node is not None and node.store is not None
        acked: list[Any] = []
        for i in range(60):
            if c.nodes["master"].state is not NodeState.RUNNING:
                break
            done: asyncio.Future[Any] = loop.create_future()
            node.submit([Message("t", b"z" * 500, {UNIQ_KEY: f"m{i}"})],
                        lambda rs, d=done: d.done() or d.set_result(rs[0]))
            try:
                async with asyncio.timeout(1):
                    r = await done
            except TimeoutError:
                break
            if r.status is PutStatus.PUT_OK:
                acked.append(r)
        seg = os.path.join(DATA_DIR, "commitlog", segment_name(0))
        new_disk: MemoryDisk = c.nodes["master"].disk
        out = {"crashed": crashed, "acked": acked, "old_durable": old_disk.durable_bytes(seg),
               "old_cache": old_disk.cached_bytes(seg), "new": new_disk.read_file(seg),
               "flushed": node.store.log.flushed, "faults": list(new_disk.faults)}
        assert await c.start("master")
        restarted = c.nodes["master"].node
        assert restarted is not None and restarted.store is not None
        out["recovered"] = restarted.store.recovery.max_valid_offset
        await c.stop("slave1")
        await c.stop("master")
        return out

    out = sim_loop.run(main)
    assert out["crashed"] == ["master"]
    assert out["faults"] == []  # no tears drawn: the unsynced writes are lost whole
    assert out["new"] == out["old_durable"]
    assert out["old_cache"] != out["old_durable"]  # the flush's bytes were written, not synced
    assert out["recovered"] == out["flushed"]  # the store had not counted them flushed
    assert out["acked"] and all(r.offset + r.size <= out["recovered"] for r in out["acked"])


def test_a_minute_of_cluster_time_takes_a_few_wall_seconds(tmp_path: Path) -> None:
    t0 = time.monotonic()
    cfg = RunConfig(scenario=scenarios.get("master-crash-unflushed"), role="SYNC_MASTER",
                    flush="ASYNC_FLUSH", seed=1, out_dir=str(tmp_path), backend="sim")
    run_dir = SimRun(cfg).execute()
    wall = time.monotonic() - t0
    params = load_json_file(os.path.join(run_dir, "params.json"))
    assert params["sim"]["simulated_s"] >= 60.0
    kinds = [f["kind"] for f in run_outcome(run_dir).faults]
    assert kinds[0] == "failpoint", kinds  # the crash failpoint fired in-process
    assert wall < 20.0, wall  # a few seconds; generous for a loaded machine


def test_bench_sim_prints_its_figures_as_json() -> None:
    r = subprocess.run([sys.executable, "-m", "chaos.cli", "bench", "sim", "--runs", "1",
                        "--rate", "1", "--duration", "5", "--jobs", "2", "--json"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    figures = json.loads(r.stdout)
    assert figures["sim_runs"] == 16  # the four quick scenarios x the four modes
    assert figures["sim_jobs"] == 2
    assert figures["sim_simulated_s_per_run"] >= 5.0
    assert figures["sim_runs_per_min"] > 0 and figures["sim_puts_per_run"] > 0
    assert figures["ratio"] == round(figures["sim_runs_per_min"] / 7.0, 1)
    # The workers' CPU time, and the ratio a sim run with a core to itself reaches.
    assert figures["sim_cpu_s_per_run"] > 0
    assert figures["ratio_cpu"] == pytest.approx(60.0 / figures["sim_cpu_s_per_run"] / 7.0,
                                                 rel=0.02, abs=0.1)
    assert len(figures["load_avg_1m"]) == 2
    assert figures["local_measured"] is False
    assert figures["python"] == " ".join(sys.version.split())  # which interpreter ran it


def test_bad_sim_arguments_are_refused_with_exit_2(tmp_path: Path) -> None:
    for args in (["bench", "sim", "--duration", "0"], ["bench", "sim", "--rate", "-1"],
                 ["chaos", "run", "--backend", "sim", "--sim-duration", "-5", "--scenario",
                  "master-crash", "--role", "SYNC_MASTER", "--flush", "SYNC_FLUSH",
                  "--out", str(tmp_path)],
                 ["chaos", "run", "--backend", "sim", "--crash-model", "process", "--scenario",
                  "master-crash", "--role", "SYNC_MASTER", "--flush", "SYNC_FLUSH",
                  "--out", str(tmp_path)]):
        r = subprocess.run([sys.executable, "-m", "chaos.cli", *args], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 2, (args, r.stderr)
        assert "Traceback" not in r.stderr and r.stderr.strip(), (args, r.stderr)
    assert "power crash model only" in r.stderr


def test_the_same_seed_gives_the_same_bytes_in_another_process(tmp_path: Path) -> None:
    """Across processes too, whatever the interpreter's string hashing
    (a set iterated in hash order would change the order of events)."""
    for scenario, extra in (("master-crash-unflushed", []),
                            ("master-crash-consuming", ["--sim-disk-faults", "drawn"])):
        trees = []
        for hash_seed in ("1", "2"):
            out = tmp_path / scenario / hash_seed
            r = subprocess.run([sys.executable, "-m", "chaos.cli", "chaos", "run", "--backend",
                                "sim", "--sim-duration", "8", "--scenario", scenario, *extra,
                                "--role", "SYNC_MASTER", "--flush", "ASYNC_FLUSH", "--seed", "4",
                                "--out", str(out)], capture_output=True, text=True, timeout=120,
                               env={**os.environ, "PYTHONHASHSEED": hash_seed})
            assert r.returncode in (0, 1), r.stderr
            (run_dir,) = os.listdir(out)
            trees.append(tree_hashes(str(out / run_dir)))
        assert trees[0] == trees[1]
        assert len(trees[0]) > 10
