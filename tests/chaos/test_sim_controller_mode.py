"""Controller mode on the simulated cluster: the real controller (its core,
state file and servicer) on the sim's network and clock, real nodes that
register, heartbeat, take the role the election gives them, keep the
SyncStateSet, and truncate to the last shared epoch point when they rejoin
(cluster/node/replicas_manager.py, chaos/sim/controller.py)."""

from __future__ import annotations

import asyncio
import random
from dataclasses import replace
from typing import Any

from chaos.sim.cluster import SimCluster, SimSender
from cluster.backends.interface import NodeSpec
from cluster.node.role import Role
from ha.config import HAMode
from ha.controller.config import ControllerConfig
from store.log.record import Message
from store.sim import loop as sim_loop
from store.sim.loop import VirtualTimeLoop
from store.sim.memory_disk import DiskFaults
from store.status import PutStatus

CONTROLLER = ControllerConfig(heartbeat_timeout_ms=3_000)


def _specs(slaves: int, **ack: Any) -> tuple[NodeSpec, tuple[NodeSpec, ...]]:
    base = NodeSpec(name="master", role=Role.SYNC_MASTER, flush="ASYNC_FLUSH",
                    segment_size_bytes=8 << 20, ha_mode=HAMode.CONTROLLER, **ack)
    return base, tuple(replace(base, name=f"slave{i + 1}", role=Role.SLAVE)
                       for i in range(slaves))


async def _cluster(loop: VirtualTimeLoop, slaves: int = 2, seed: int = 1,
                   controller: ControllerConfig = CONTROLLER, **ack: Any) -> SimCluster:
    master, followers = _specs(slaves, **ack)
    c = SimCluster(loop, random.Random(seed), master, followers, DiskFaults(),
                   on_crash=lambda _n: None, controller=controller)
    assert c.controller is not None
    c.controller.start()
    assert await c.start("master")
    await _until(loop, lambda: c.master == "master" and _role(c, "master") != Role.SLAVE, 5)
    for s in followers:
        assert await c.start(s.name)
    return c


def _role(c: SimCluster, name: str) -> Role | None:
    n = c.nodes[name].node
    return None if n is None else n.role


def _node(c: SimCluster, name: str) -> Any:
    n = c.nodes[name].node
    assert n is not None, f"{name} is not running"
    return n


async def _until(loop: VirtualTimeLoop, ok: Any, within_s: float) -> None:
    deadline = loop.time() + within_s
    while not ok():
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


def _log_bytes(node: Any) -> bytes:
    out, offset, log = b"", node.store.log.min_offset, node.store.log
    while offset < log.wrote:
        data, offset = log.read_range(offset, 1 << 20)
        out += data
    return out


async def _close(c: SimCluster) -> None:
    for name in c.nodes:
        await c.stop(name)
    assert c.controller is not None
    c.controller.kill()
    await asyncio.sleep(0.1)


async def _send(c: SimCluster, n: int, start: int = 0) -> list[Any]:
    sender = SimSender(c)
    return [await sender.send("t", b"x" * 200, f"m{start + i}", 5.0) for i in range(n)]


def test_the_first_broker_to_ask_is_elected_and_the_others_follow_it() -> None:
    async def main(loop: VirtualTimeLoop) -> None:
        c = await _cluster(loop)
        master = _node(c, "master")
        await _until(loop, lambda: all(_node(c, s).following == master.config.listen
                                       for s in ("slave1", "slave2")), 5)
        # The master's epoch file records epoch 1 from offset 0.
        assert [(e.epoch, e.start_offset) for e in master.epochs.epochs.entries] == [(1, 0)]
        out = await _send(c, 20)
        assert {o.status for o in out} == {"PUT_OK"}
        # The slaves caught up join the SyncStateSet, which starts as the master alone.
        await _until(loop, lambda: master.sync_state_set == {"master", "slave1", "slave2"}, 10)
        # A slave records the master's epoch once its bytes arrived.
        await _until(loop, lambda: c.wrote("slave1") == c.wrote("master"), 5)
        assert [(e.epoch, e.start_offset)
                for e in _node(c, "slave1").epochs.epochs.entries] == [(1, 0)]
        await _close(c)

    sim_loop.run(main)


def test_a_dead_master_is_replaced_by_an_in_sync_slave_and_rejoins_truncated() -> None:
    async def main(loop: VirtualTimeLoop) -> None:
        c = await _cluster(loop, all_ack_in_sync_state_set=True)
        master = _node(c, "master")
        await _until(loop, lambda: master.sync_state_set == {"master", "slave1", "slave2"}, 15)
        acked = [o for o in await _send(c, 30) if o.status == "PUT_OK"]
        assert len(acked) == 30
        # Bytes only the old master holds: written, never replicated.
        for s in ("slave1", "slave2"):
            c.partition("master", s)
        res = await asyncio.wait_for(asyncio.shield(master.put_many(
            [Message(topic="t", body=b"y" * 100, properties={"UNIQ_KEY": "orphan"})])), 10)
        assert res[0].status is PutStatus.FLUSH_SLAVE_TIMEOUT  # all-ack: no member acked
        end_before = c.wrote("master")
        c.kill("master")
        for s in ("slave1", "slave2"):
            c.heal("master", s)
        # The controller notices (heartbeat timeout) and elects from the set.
        await _until(loop, lambda: c.master in ("slave1", "slave2")
                     and _role(c, c.master) != Role.SLAVE, 10)
        new = _node(c, c.master)
        assert [e.epoch for e in new.epochs.epochs.entries] == [1, 2]
        out = await _send(c, 10, start=100)
        assert {o.status for o in out} == {"PUT_OK"}
        # The old master comes back: it follows, cut to the last shared point.
        assert await c.start("master")
        await _until(loop, lambda: _node(c, "master").following == new.config.listen, 10)
        old = _node(c, "master")
        fork = new.epochs.epochs.entries[1].start_offset
        assert fork < end_before  # the orphan was past the point both logs share
        await _until(loop, lambda: c.wrote("master") == c.wrote(c.master or ""), 10)
        # Truncated there and refilled from the new master: the same bytes.
        assert _log_bytes(old) == _log_bytes(new)
        assert b"orphan" not in _log_bytes(old)
        assert [e.epoch for e in old.epochs.epochs.entries] == [1, 2]
        await _close(c)

    sim_loop.run(main)


def test_a_controller_mode_chaos_run_fails_over_by_election_and_loses_nothing(
        tmp_path: Any) -> None:
    """`dlab chaos run --backend sim --ha-mode controller`: the scenario's
    promote waits for the controller's election; the old master rejoins by
    itself; the run is judged as any run."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "chaos.cli", "chaos", "run", "--backend", "sim",
         "--ha-mode", "controller", "--all-ack-in-sync-state-set", "--slaves", "2",
         "--scenario", "master-crash-failover", "--role", "SYNC_MASTER",
         "--flush", "ASYNC_FLUSH", "--seed", "1", "--sim-duration", "30",
         "--out", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "elected by the controller" in out.stdout
    assert "-controller-allack-sim-s1" in out.stdout
    assert " 0 acked lost on the master, 0 lost everywhere" in out.stdout


def test_a_matrix_with_both_ha_modes_runs_classic_roles_and_one_controller_mode() -> None:
    from chaos.matrix.grid import MatrixConfig

    cfg = MatrixConfig(out_dir="out", scenarios=["lone-in-sync-master"], runs=2,
                       template={"ha_mode": HAMode.CONTROLLER, "in_sync_replicas": 2},
                       ha_modes=["classic", "controller"])
    configs = cfg.run_configs()
    classic = [c for c in configs if c.ha_mode is HAMode.CLASSIC]
    controller = [c for c in configs if c.ha_mode is HAMode.CONTROLLER]
    assert len(classic) == 2 * 2 * 2  # roles x flushes x runs
    assert len(controller) == 2 * 2  # flushes x runs: the role is the settings'
    assert {c.role for c in controller} == {Role.SYNC_MASTER}  # in-sync-replicas 2 waits
    assert all(c.in_sync_replicas == 1 for c in classic)  # no controller setting leaks
    assert all("-controller-isr2-" in c.run_id for c in controller)
    # The same seeds on both sides: the modes face the same chaos.
    assert sorted({c.seed for c in classic}) == sorted({c.seed for c in controller}) == [1, 2]


def test_the_report_keeps_classic_and_controller_runs_of_one_role_apart() -> None:
    import pandas as pd

    from chaos.report.blocks import ha_label, modes_in

    v = pd.DataFrame({"role": ["SYNC_MASTER"] * 3, "flush": ["ASYNC_FLUSH"] * 3,
                      "ha": ["classic", "controller all-ack", "controller all-ack"]})
    modes = modes_in(v)
    assert [m.label for m in modes] == ["SYNC_MASTER + ASYNC_FLUSH",
                                        "controller all-ack (SYNC_MASTER) + ASYNC_FLUSH"]
    assert [int(m.select(v).sum()) for m in modes] == [1, 2]
    assert ha_label({"config": {"ha_mode": "controller", "in_sync_replicas": 2,
                                "min_in_sync_replicas": 2, "elect_unclean": True}}) == \
        "controller in-sync-replicas 2, min 2, unclean"
    assert ha_label({"role": "SYNC_MASTER"}) == "classic"  # a run from before the field
