"""The sim backend's faults do what they say (chaos/sim/cluster.py,
chaos/sim/run.py): a pause freezes a node (SIGSTOP's twin) and a resume lets it
catch up; a partition holds replication and a heal resumes it; the disk
damage steps leave what chaos/harness/disk_faults.py leaves on a real disk; a drawn
fsync EIO is neither counted flushed nor acknowledged; every new step runs
on sim, and a seed still gives a byte-identical run directory."""

from __future__ import annotations

import asyncio
import json
import os
import random
from pathlib import Path
from typing import Any

import pytest

from chaos.check.summary import run_outcome
from chaos.commands.bugs import judge_run
from chaos.commands.replay import tree_hashes
from chaos.harness import scenarios
from chaos.harness.runner import RunConfig
from chaos.schema import load_json_file, validate_run_dir
from chaos.sim.cluster import DATA_DIR, SimCluster, SimSender
from chaos.sim.run import SimRun
from cluster.backends.interface import NodeSpec
from cluster.node.role import Role
from store.log.segments import segment_name
from store.sim import loop as sim_loop
from store.sim.loop import VirtualTimeLoop
from store.sim.memory_disk import DiskFaults
from store.status import INDETERMINATE


async def _cluster(loop: VirtualTimeLoop, role: Role, flush: str = "ASYNC_FLUSH",
                   seed: int = 3) -> SimCluster:
    master = NodeSpec(name="master", role=role, flush=flush, segment_size_bytes=8 << 20)
    slave = NodeSpec(name="slave1", role=Role.SLAVE, flush=flush, segment_size_bytes=8 << 20)
    c = SimCluster(loop, random.Random(seed), master, (slave,), DiskFaults(),
                   on_crash=lambda _n: None, pausable=True)
    assert await c.start("master") and await c.start("slave1")
    while not c.slaves_connected():
        await asyncio.sleep(0.01)
    return c


async def _put(c: SimCluster, i: int, timeout_s: float = 5.0) -> Any:
    return await SimSender(c, "master").send("t", b"x" * 300, f"m{i}", timeout_s)


async def _caught_up(c: SimCluster, within_s: float) -> bool:
    deadline = c.loop.time() + within_s
    while c.loop.time() < deadline:
        if c.wrote("slave1") == c.wrote("master"):
            return True
        await asyncio.sleep(0.01)
    return False


def test_a_paused_slave_runs_nothing_and_catches_up_once_resumed() -> None:
    async def main(loop: VirtualTimeLoop) -> dict[str, Any]:
        c = await _cluster(loop, Role.ASYNC_MASTER)
        for i in range(5):
            await _put(c, i)
        assert await _caught_up(c, 1.0)
        slave = c.nodes["slave1"].node
        assert slave is not None and slave.ha_slave is not None
        link = slave.ha_slave.link
        fired: list[float] = []  # a timer of the slave's own, due in 1 s
        c.nodes["slave1"].context.run(loop.call_later, 1.0, lambda: fired.append(loop.time()))
        frozen, contact = c.wrote("slave1"), link.last_contact_ms
        c.pause("slave1")
        paused_at = loop.time()
        for i in range(5, 40):  # 7 s of load while it is stopped
            await _put(c, i)
            await asyncio.sleep(0.2)
        out = {"frozen": frozen, "during": c.wrote("slave1"), "master": c.wrote("master"),
               "contact": (contact, link.last_contact_ms), "fired_during": list(fired)}
        resumed_at = loop.time()
        c.resume("slave1")
        out["caught_up"] = await _caught_up(c, 10.0)
        out["fired"] = [t - resumed_at for t in fired]
        out["paused_s"] = resumed_at - paused_at
        out["contact_after"] = link.last_contact_ms
        await c.stop("slave1")
        await c.stop("master")
        return out

    out = sim_loop.run(main)
    assert out["paused_s"] > 7
    assert out["during"] == out["frozen"] < out["master"]  # nothing applied while stopped
    assert out["contact"][0] == out["contact"][1]  # nothing read from its stream
    assert out["fired_during"] == []  # nor did a timer of it fire
    assert out["fired"] == [0.0]  # overdue: it fires as the node resumes
    assert out["caught_up"] and out["contact_after"] > out["contact"][1]


def test_a_client_call_to_a_paused_master_stalls_until_it_resumes() -> None:
    async def main(loop: VirtualTimeLoop) -> dict[str, Any]:
        c = await _cluster(loop, Role.ASYNC_MASTER)
        first = await _put(c, 0)
        c.pause("master")
        before = c.wrote("master")
        # Past its deadline while the master is stopped: the client gives up
        # (the server drops a call whose deadline passed before it ran).
        expired = await _put(c, 1, timeout_s=2.0)
        waiting = asyncio.ensure_future(_put(c, 2, timeout_s=30.0))
        await asyncio.sleep(3.0)
        out = {"first": first, "expired": expired, "during": (before, c.wrote("master")),
               "answered_while_paused": waiting.done()}
        resumed_at = loop.time()
        c.resume("master")
        out["waiting"] = await waiting
        out["waited_past_resume"] = loop.time() >= resumed_at
        node = c.nodes["master"].node
        assert node is not None and node.store is not None
        out["ids"] = [r.msg_id for r in node.store.log.iter_records()]
        await c.stop("slave1")
        await c.stop("master")
        return out

    out = sim_loop.run(main)
    assert out["first"].status == "PUT_OK"
    assert out["expired"].status == INDETERMINATE
    assert "DEADLINE_EXCEEDED" in out["expired"].detail
    assert out["during"][0] == out["during"][1]  # the stopped master appended nothing
    assert not out["answered_while_paused"]
    assert out["waiting"].status == "PUT_OK" and out["waited_past_resume"]
    assert out["ids"] == ["m0", "m2"]


def test_a_partition_holds_replication_and_a_heal_resumes_it() -> None:
    async def main(loop: VirtualTimeLoop) -> dict[str, Any]:
        c = await _cluster(loop, Role.SYNC_MASTER)
        ok = await _put(c, 0)
        slave = c.nodes["slave1"].node
        assert slave is not None and slave.ha_slave is not None
        connects = slave.ha_slave.link.connects
        c.partition("master", "slave1")
        cut = c.wrote("slave1")
        during = [await _put(c, i, timeout_s=10.0) for i in range(1, 4)]
        out = {"ok": ok, "during": during, "cut": cut, "slave_during": c.wrote("slave1"),
               "master_during": c.wrote("master")}
        out["connects_during"] = slave.ha_slave.link.connects - connects
        c.heal("master", "slave1")
        out["caught_up"] = await _caught_up(c, 10.0)
        out["connects_after"] = slave.ha_slave.link.connects - connects
        out["after"] = await _put(c, 9)
        await c.stop("slave1")
        await c.stop("master")
        return out

    out = sim_loop.run(main)
    assert out["ok"].status == "PUT_OK"
    assert out["slave_during"] == out["cut"] < out["master_during"]
    # SYNC_MASTER: no ack crosses the cut, so no put is PUT_OK during it.
    assert {r.status for r in out["during"]} <= {"FLUSH_SLAVE_TIMEOUT", "SLAVE_NOT_AVAILABLE"}
    assert out["caught_up"] and out["after"].status == "PUT_OK"
    # Neither side heard of the cut; the heal reset the stream that lived
    # through it (as the local link proxy does) and the slave reconnected.
    assert out["connects_during"] == 0 and out["connects_after"] == 1


def test_an_fsync_eio_leaves_flushed_where_it_was_and_the_put_is_not_put_ok() -> None:
    """The drawn fault (DiskFaults.fsync_eio) on the sim master, through the
    real put path: the store does not count the bytes flushed and does not
    acknowledge them (tests/store/test_fsync_eio.py shows the same on a real disk)."""

    async def main(loop: VirtualTimeLoop) -> dict[str, Any]:
        c = await _cluster(loop, Role.ASYNC_MASTER, flush="SYNC_FLUSH")
        ok = await _put(c, 0)
        node = c.nodes["master"].node
        assert node is not None and node.store is not None
        disk = c.nodes["master"].disk
        flushed = node.store.log.flushed
        disk.fault_rates = DiskFaults(fsync_eio=1.0)  # every fsync from here fails
        failed = await _put(c, 1)
        out = {"ok": ok, "failed": failed, "flushed_before": flushed,
               "flushed_after": node.store.log.flushed, "wrote": node.store.log.wrote,
               "faults": list(disk.faults),
               "durable": len(disk.durable_bytes(os.path.join(
                   DATA_DIR, "commitlog", segment_name(0))).rstrip(b"\0"))}
        disk.fault_rates = DiskFaults()
        await c.stop("slave1")
        await c.stop("master")
        return out

    out = sim_loop.run(main)
    assert out["ok"].status == "PUT_OK" and out["ok"].offset + out["ok"].size == \
        out["flushed_before"]
    assert out["failed"].status != "PUT_OK" and out["failed"].status != INDETERMINATE
    assert out["flushed_after"] == out["flushed_before"] < out["wrote"]
    assert [f["fault"] for f in out["faults"]] == ["fsync-eio"]
    assert out["durable"] <= out["flushed_before"]  # the failed bytes are not on the medium


def _run(tmp: Path, scenario: str, role: str = "SYNC_MASTER", flush: str = "SYNC_FLUSH",
         seed: int = 1, duration_s: float = 10.0, disk_faults: str = "torn") -> str:
    cfg = RunConfig(scenario=scenarios.get(scenario), role=role, flush=flush, seed=seed,
                    out_dir=str(tmp), backend="sim", sim_duration_s=duration_s,
                    sim_disk_faults=disk_faults)
    return SimRun(cfg).execute()


@pytest.mark.parametrize("scenario,kinds", [
    ("slave-pause", [("pause", "slave1"), ("resume", "slave1")]),
    ("partition", [("partition", "master"), ("heal", "master")]),
    ("torn-tail", [("kill", "master"), ("torn_tail", "master"), ("start", "master")]),
    ("bit-flip", [("stop", "master"), ("bit_flip", "master"), ("refused", "master")]),
    ("master-crash-after-ship", [("failpoint", "master"), ("start", "master")]),
    ("fsync-eio", [("kill", "master"), ("start", "master")]),
    ("consumer-crash", [("kill", "consumer"), ("start", "consumer")]),
    ("master-crash-consuming", [("kill", "master"), ("stop", "consumer"), ("start", "master"),
                                ("start", "consumer")]),
    ("slave-crash-consuming", [("kill", "slave1"), ("start", "slave1")]),
])
def test_each_new_step_runs_on_sim(tmp_path: Path, scenario: str,
                                   kinds: list[tuple[str, str]]) -> None:
    # The failpoint's hit comes within a few seconds of load; wait for it.
    run_dir = _run(tmp_path, scenario, duration_s=30.0 if kinds[0][0] == "failpoint" else 10.0)
    assert validate_run_dir(run_dir) == ["master", "slave1"]
    o = run_outcome(run_dir)
    assert [(f["kind"], f["node"]) for f in o.faults] == kinds
    assert o.acked > 0  # (fsync-eio: the failed master refuses puts until its restart)
    assert judge_run(run_dir)["promise_violations"] == 0  # SYNC_MASTER+SYNC_FLUSH keep theirs
    final = load_json_file(os.path.join(run_dir, "nodes", "master", "final.json"))
    assert final["disk_damaged"] is (scenario in ("torn-tail", "bit-flip"))
    if scenario == "torn-tail":
        # Recovery found the torn record the step wrote and cut it.
        (detail,) = [f["detail"] for f in o.faults if f["kind"] == "torn_tail"]
        torn_at = int(detail.split()[3].rstrip(":"))
        assert f"valid to offset {torn_at}" in "".join(final["recoveries"])
    if scenarios.get(scenario).consume:
        # The real consumer ran on the simulated network, and drained.
        summary = load_json_file(os.path.join(run_dir, "consumer.json"))
        assert summary["drained"] and summary["exit_codes"][-1] == 0
        c = o.consumer
        assert c is not None and c["delivered"] >= o.acked
        assert c["stored_never_delivered"] == 0 and c["delivered_then_lost"] == 0
        if scenario != "slave-crash-consuming":  # a kill of a consumer or of the master
            assert c["duplicates_delivered"] > 0  # redelivers since the last persisted commit
    if scenario == "bit-flip":
        (refused,) = [f["detail"] for f in o.faults if f["kind"] == "refused"]
        (detail,) = [f["detail"] for f in o.faults if f["kind"] == "bit_flip"]
        assert "body CRC mismatch" in refused and detail.split()[-1] in refused


def test_drawn_disk_faults_are_recorded_and_keep_the_promises(tmp_path: Path) -> None:
    run_dir = _run(tmp_path, "master-crash", seed=40, duration_s=12.0, disk_faults="drawn")
    sim = load_json_file(os.path.join(run_dir, "params.json"))["sim"]
    rates = sim["disk_fault_rates"]
    assert sim["disk_fault_profile"] == "drawn"
    assert 0 < rates["fsync_eio"] <= 0.0001 and 0 < rates["read_corruption"] <= 0.10
    # This seed's restarted master reads latent errors back from its medium
    # at recovery (each recorded where it struck); nothing acknowledged is lost.
    # (The crash's torn writes are recorded there too.)
    faults = sim["disk_faults"]
    assert any(f["fault"] == "read-corruption" and f["node"] == "master"
               for f in faults), faults
    assert {f["fault"] for f in faults} <= {"read-corruption", "torn-seq"}, faults
    assert judge_run(run_dir)["promise_violations"] == 0
    torn = load_json_file(os.path.join(_run(tmp_path / "t", "master-crash", seed=40,
                                            duration_s=12.0), "params.json"))["sim"]
    assert torn["disk_fault_rates"]["fsync_eio"] == torn["disk_fault_rates"][
        "read_corruption"] == 0.0
    # Turning the drawn faults on draws nothing from the run's own generator.
    assert torn["disk_fault_rates"]["torn_write"] == rates["torn_write"]



@pytest.mark.parametrize("scenario", ["slave-pause", "partition", "torn-tail", "bit-flip",
                                      "master-crash-consuming"])
def test_the_new_steps_give_a_byte_identical_run_directory_per_seed(
        tmp_path: Path, scenario: str) -> None:
    a = tree_hashes(_run(tmp_path / "a", scenario, seed=7, duration_s=8.0,
                          disk_faults="drawn"))
    b = tree_hashes(_run(tmp_path / "b", scenario, seed=7, duration_s=8.0,
                          disk_faults="drawn"))
    assert a == b and "faults.jsonl" in a
    (run_dir,) = os.listdir(tmp_path / "a")
    with open(tmp_path / "a" / run_dir / "faults.jsonl", encoding="utf-8") as f:
        assert len([json.loads(line) for line in f]) >= 2


def test_read_corruption_strikes_only_bytes_read_from_the_medium() -> None:
    """A latent sector error is on the medium: a read the page cache serves
    (bytes written since the disk came up) never returns it; after a power
    cut the survivors are read from the medium, and may."""
    from store.sim.memory_disk import MemoryDisk

    disk = MemoryDisk(random.Random(1), DiskFaults(read_corruption=1.0))
    disk.makedirs("/d")
    f = disk.create("/d/log")
    f.pwrite(b"a" * 4096, 0)
    f.fsync()
    disk.fsync_dir("/d")
    assert f.pread(4096, 0) == b"a" * 4096 and disk.faults == []
    after = disk.crash()
    g = after.open("/d/log")
    assert g.pread(4096, 0) != b"a" * 4096  # from the medium: corrupted
    assert [x["fault"] for x in after.faults] == ["read-corruption"]
    g.pwrite(b"b" * 100, 4096)  # appended since: the page cache's
    assert g.pread(100, 4096) == b"b" * 100
    assert len(after.faults) == 1


def test_a_sim_slave_copies_its_masters_consumer_offsets_over_the_network() -> None:
    """The slave's SlaveSynchronize call goes over the in-memory twin of the
    gRPC call, every 10 s, and not across a partition."""
    from ha.credentials import token_metadata
    from proto import broker_pb2

    async def main(loop: VirtualTimeLoop) -> dict[str, Any]:
        c = await _cluster(loop, Role.ASYNC_MASTER)
        await _put(c, 0)
        await asyncio.sleep(1.5)  # the topic's queue is dispatched
        stub = c.network.stub("10.0.9.9:1", c.nodes["master"].address)
        await stub.CommitOffset(broker_pb2.CommitOffsetRequest(
            group="g", topic="t", queue_id=0, offset=1), metadata=token_metadata("sim-token"),
            timeout=5)
        slave = c.nodes["slave1"].node
        assert slave is not None and slave.store is not None
        await asyncio.sleep(11.0)
        out: dict[str, Any] = {"synced": slave.store.consumer_offsets.query("g", "t", 0)}
        c.partition("master", "slave1")
        await stub.CommitOffset(broker_pb2.CommitOffsetRequest(
            group="g", topic="t", queue_id=0, offset=5), metadata=token_metadata("sim-token"),
            timeout=5)
        await asyncio.sleep(11.0)
        out["cut"] = slave.store.consumer_offsets.query("g", "t", 0)
        c.heal("master", "slave1")
        await asyncio.sleep(11.0)
        out["healed"] = slave.store.consumer_offsets.query("g", "t", 0)
        try:
            await stub.CommitOffset(broker_pb2.CommitOffsetRequest(
                group="g", topic="t", queue_id=0, offset=5), metadata=(), timeout=5)
        except Exception as exc:  # noqa: BLE001 - the error is the point
            out["no_token"] = str(exc)
        await c.stop("slave1")
        await c.stop("master")
        return out

    out = sim_loop.run(main)
    assert out["synced"] == 1 and out["cut"] == 1 and out["healed"] == 5
    assert "UNAUTHENTICATED" in out["no_token"]


def test_a_broker_call_on_the_simulated_network_fails_as_a_grpc_call_does() -> None:
    import grpc

    from ha.credentials import token_metadata
    from proto import broker_pb2

    async def main(loop: VirtualTimeLoop) -> dict[str, str]:
        c = await _cluster(loop, Role.ASYNC_MASTER)
        md = token_metadata("sim-token")
        out: dict[str, str] = {}

        async def code(name: str, address: str, request: Any, timeout: float = 5) -> None:
            try:
                await c.network.stub("10.0.9.9:1", address).Pull(request, metadata=md,
                                                                 timeout=timeout)
                out[name] = "OK"
            except grpc.aio.AioRpcError as exc:
                out[name] = exc.code().name

        master, slave = c.nodes["master"].address, c.nodes["slave1"].address
        await code("good", master, broker_pb2.PullRequest(topic="t", queue_id=0))
        await code("bad", master, broker_pb2.PullRequest(topic="t", queue_id=0, offset=-1))
        c.pause("master")
        await code("paused", master, broker_pb2.PullRequest(topic="t"), timeout=1)
        c.resume("master")
        c.kill("slave1")
        await code("down", slave, broker_pb2.PullRequest(topic="t"))
        await c.stop("master")
        return out

    assert sim_loop.run(main) == {"good": "OK", "bad": "INVALID_ARGUMENT",
                                  "paused": "DEADLINE_EXCEEDED", "down": "UNAVAILABLE"}
