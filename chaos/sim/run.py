"""`--backend sim`: a chaos run with the whole cluster in this process, on
simulated time (docs/simulation.md).

The master, its slaves and the producers run on one VirtualTimeLoop
(store/sim/loop.py): time jumps to the next timer, nothing sleeps. The node
code that runs is the real one (cluster/node/server.py's Node: store,
recovery, group commit, the put path with its SYNC_MASTER waits, HA master
and slave) through the seams: its store on a MemoryDisk (store/seams/disk.py: a
page cache, durable only at fsync), its flushes inline
(store/seams/flush_executor.py), its HA stream over a MemoryNetwork
(ha/transport/: FIFO streams, seeded delays, partitions, resets).

Faults:
- kill: the node's objects are dropped (its tasks cancelled, its streams
  reset) and its disk replaced by `disk.crash()`: what a power cut leaves,
  unsynced writes torn with the run's torn-write probability;
- stop: Node.stop (clean: flush, checkpoint, remove `abort`), disk kept;
- a `crash` failpoint crashes the node in-process at that point (the hook
  Failpoints(on_crash=...)), exactly as a kill.

Everything random comes from the seed: the step delays, failpoint hits and
workload from the run plan (chaos/harness/plan.py, the same plan a local run of
that seed gets), and network delays and disk faults from one generator
`stream(seed, "sim")`. Times in the results are simulated milliseconds from
an epoch derived from the seed; nothing process-specific (pids, hostnames,
wall-clock times, the random cluster token) is written. So the same seed
and code give a byte-identical run directory.

At the end each node's durable disk state is written as real files where a
local run keeps its stores (RUN/cluster/nodes/NAME/data/), and read back
with chaos/harness/readback.py like any other run: the report reads a sim run
unchanged.

Also: pause/resume (every callback of the node held while it is paused,
chaos/sim/cluster.py), partitions of the master-slave links, the disk
damage steps (chaos/harness/disk_faults.py on a copy of the durable files), the
consumer (chaos/sim/consumer.py), the rogue HA peer (chaos/harness/rogue_peer.py's
client as a task on the loop), `delay` failpoints (a stalled flusher or
dispatch pass parks just that work, for that much virtual time, while the
cluster goes on: store/sim/cooperative_executor.py), and with
`--sim-disk-faults drawn` fsync EIO and latent read corruption at rates
drawn per seed. Refused: the `process` crash model.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import logging
import os
import random
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

from chaos.harness import disk_faults
from chaos.harness.plan import load_s, stream
from chaos.harness.rogue_peer import OVER_BY, RoguePeerTask
from chaos.harness.run_base import CONTROLLER_KILLED, CONTROLLER_STARTED, RunBase
from chaos.harness.run_config import RUN_CONTROLLER, RunConfig, SimDiskFaults
from chaos.harness.scenarios import Action, Step
from chaos.harness.settle import TIMED_OUT, SettleWatch
from chaos.harness.workload import TOPIC, Workload, with_retries
from chaos.schema import CONSUMER_NODE
from chaos.sim.cluster import (
    NET_DELAY_S,
    OWNER,
    TOKEN,
    FailoverRefused,
    SimCluster,
    SimSender,
    SimulatedCrash,
)
from chaos.sim.consumer import SimConsumer
from chaos.sim.controller import CONTROLLER_NAME
from cluster.backends.interface import NodeState
from cluster.node.role import Role
from ha.config import HAMode
from ha.controller.config import ControllerConfig
from store.config import CrashModel
from store.sim import loop as sim_loop
from store.sim.loop import VirtualTimeLoop
from store.sim.memory_disk import DiskFaults

# Messages per second per producer when the run gives no rate: on simulated
# time "as fast as acks come" has no bound (an ASYNC put takes no time).
DEFAULT_RATE_PER_S = 25.0
# Per seed, the chance a crash tears a file's unsynced writes instead of
# losing them whole (TigerBeetle's VOPR draws 80-100 %).
TORN_WRITE_RANGE = (0.8, 1.0)
# With --sim-disk-faults drawn, per seed: the chance an fsync fails with EIO
# (small: the store then refuses puts until it restarts) and the chance a
# read returns latent corruption (VOPR draws 0-10 %).
FSYNC_EIO_RANGE = (0.0, 0.0001)
READ_CORRUPTION_RANGE = (0.0, 0.10)
SETTLE_QUIET_S = 1.0
ROGUE_ADDRESS = "rogue-peer:0"  # where the rogue HA peer's stream comes from


class SimUnsupportedError(ValueError):
    """A run the sim backend cannot run (yet); the message names what can."""


def check_supported(crash_model: CrashModel | str) -> None:
    """The sim runs every scenario; it refuses only the `process` crash model."""
    if crash_model != CrashModel.POWER:
        raise SimUnsupportedError("the sim backend models the power crash model only: "
                                  "drop --crash-model process or use --backend local")


def draw_disk_faults(seed: int, profile: SimDiskFaults, rng: random.Random) -> DiskFaults:
    """The run's disk fault probabilities. The torn-write one comes from the
    run's generator (as it always has); the drawn ones from their own
    stream, so turning them on leaves every other draw of the seed as it was."""
    torn = round(rng.uniform(*TORN_WRITE_RANGE), 4)
    if profile is not SimDiskFaults.DRAWN:
        return DiskFaults(torn_write=torn)
    own = stream(seed, "sim-disk-faults")
    return DiskFaults(torn_write=torn, fsync_eio=round(own.uniform(*FSYNC_EIO_RANGE), 6),
                      read_corruption=round(own.uniform(*READ_CORRUPTION_RANGE), 4))


def start_epoch_ms(seed: int) -> int:
    """Simulated wall time at the start of a run: a fixed epoch plus a
    whole number of seconds derived from the seed."""
    return sim_loop.DEFAULT_START_WALL_MS + (seed % 1_000_000) * 1000


# The logger every node module logs under (dlab.store, dlab.ha.master,
# dlab.node, ...): a sim run captures it into the nodes' node.log files.
NODE_LOGGER = "dlab"


class _LogCapture(logging.Handler):
    """The nodes' log lines, per node, stamped with simulated time."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.loop: VirtualTimeLoop | None = None  # set as the run's loop starts
        self.lines: dict[str, list[str]] = {}

    def emit(self, record: logging.LogRecord) -> None:
        owner = OWNER.get() or "harness"
        now = self.loop.time() if self.loop is not None else 0.0
        self.lines.setdefault(owner, []).append(
            f"{now:10.4f} {record.levelname} {record.name}: {record.getMessage()}")


@contextlib.contextmanager
def _capturing(handler: _LogCapture) -> Iterator[None]:
    """The nodes' INFO lines to `handler`, and only there, for the run: the
    node logger is set for it and restored after, the root logger and its
    handlers are left alone (a sweep's or a test's logging is theirs)."""
    logger = logging.getLogger(NODE_LOGGER)
    level, propagate = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate


class SimRun(RunBase):
    """One chaos run on the sim backend; writes the same result directory
    as chaos/harness/runner.py's Run (chaos/schema.py), with backend=sim, through
    the same recorder (chaos/harness/recorder.py)."""

    def __init__(self, cfg: RunConfig, log: Callable[[str], None] = lambda s: None) -> None:
        super().__init__(cfg, log)
        check_supported(cfg.crash_model)
        self.rng = stream(cfg.seed, "sim")
        self.disk_faults = draw_disk_faults(cfg.seed, cfg.sim_disk_faults, self.rng)
        workload = cfg.workload
        if workload.rate_per_s is None:
            workload = replace(workload, rate_per_s=DEFAULT_RATE_PER_S)
        self.workload = workload
        self.consumer: SimConsumer | None = None
        self.loop_errors: list[str] = []
        self.crashed_at: dict[str, int] = {}
        self._slave_offsets: dict[str, int] = {}
        self.rogues: list[RoguePeerTask] = []

    # ---------------------------------------------------------------- run
    def execute(self) -> str:
        self.record.open()
        logs = _LogCapture()

        async def main(loop: VirtualTimeLoop) -> None:
            logs.loop = loop
            loop.set_exception_handler(self._loop_error)
            await self._main(loop, logs)

        with _capturing(logs):
            sim_loop.run(main, start_wall_ms=start_epoch_ms(self.cfg.seed))
        return self.run_dir

    def _loop_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if isinstance(exc, SimulatedCrash | asyncio.CancelledError):
            return
        # A dead node's leftovers fail on its crashed disk: expected; kept
        # for the record, never fatal.
        self.loop_errors.append(f"{context.get('message')}: {exc!r}"[:300])

    async def _up(self, loop: VirtualTimeLoop) -> SimCluster:
        """The cluster, every node started and recovered, the slaves connected."""
        cfg = self.cfg
        cluster = SimCluster(loop, self.rng, self._spec(self.acting_master, cfg.role),
                             tuple(self._spec(s, Role.SLAVE) for s in self.slaves),
                             self.disk_faults,
                             on_crash=lambda name: self.crashed_at.setdefault(
                                 name, loop.wall_ms()),
                             pausable=any(s.action is Action.PAUSE for s in cfg.scenario.steps),
                             fsync_rng=stream(cfg.seed, "sim-fsync"), timings=cfg.sim_timings,
                             controller=self._controller_config(),
                             controller_scan_ms=RUN_CONTROLLER.scan_interval_ms)
        self.cluster = cluster
        if cluster.controller is not None:
            cluster.controller.start()
        for name in self.nodes:
            await cluster.start(name)
            self.record.recovery(name, cluster.recovery(name))
            if name == self.acting_master and cluster.controller is not None:
                # The first broker to ask is elected: the run's master asks first.
                deadline = loop.time() + 10.0
                while not self._serving(cluster, name) and loop.time() < deadline:
                    await asyncio.sleep(0.05)
        deadline = loop.time() + 30.0
        while not cluster.slaves_connected() and loop.time() < deadline:
            await asyncio.sleep(0.01)
        if cluster.controller is not None:
            # Up means in sync: the controller's SyncStateSet holds every
            # node before the load starts (a set of the master alone would
            # acknowledge the first puts by itself).
            while (cluster.controller.sync_state_set() != set(self.nodes)
                   and loop.time() < deadline):
                await asyncio.sleep(0.01)
        return cluster

    def _controller_config(self) -> ControllerConfig | None:
        cfg = self.cfg
        if cfg.ha_mode is not HAMode.CONTROLLER:
            return None
        return ControllerConfig(heartbeat_timeout_ms=RUN_CONTROLLER.heartbeat_timeout_ms,
                                enable_elect_unclean_master=cfg.elect_unclean)

    @staticmethod
    def _serving(cluster: SimCluster, name: str) -> bool:
        """Controller mode: `name` is the controller's master and serves as one."""
        n = cluster.nodes[name].node
        return cluster.master == name and n is not None and n.ha_master is not None

    def _follow_election(self, cluster: SimCluster, t: int, detail: str) -> bool:
        """Controller mode: the controller elected a master the run does not
        have as its master yet: record it as a promotion, as the classic
        scenarios' by hand. True when it did."""
        if cluster.controller is None:
            return False
        return self._take_election(cluster.master, lambda n: self._serving(cluster, n),
                                   cluster.controller.master_since_ms, t,
                                   cluster.clock.wall_ms, detail)

    async def _await_election(self, cluster: SimCluster, t: int) -> None:
        """Controller mode's PROMOTE step: no operator; wait for the
        controller's election (its heartbeat timeout, a scan, a heartbeat
        round), then follow it."""
        assert cluster.controller is not None
        wait_s = cluster.controller.config.heartbeat_timeout_ms / 1000 + 10.0
        deadline = cluster.loop.time() + wait_s
        while cluster.loop.time() < deadline:
            if self._follow_election(cluster, t, "elected by the controller"):
                return
            await asyncio.sleep(0.05)
        self.record.fault("promote", self.acting_master, t, end=t,
                          detail=f"refused: the controller elected no new master within "
                                 f"{wait_s:g} s (master: {cluster.master})")

    async def _main(self, loop: VirtualTimeLoop, logs: _LogCapture) -> None:
        cfg = self.cfg
        started = loop.wall_ms()
        cluster = await self._up(loop)
        # The producers follow the route (a failover moves it), retrying.
        workload = Workload(with_retries(self.workload, cfg.scenario.retries),
                            SimSender(cluster), seed=self.plan.workload_seed,
                            node=self.acting_master,
                            run_tag=f"s{cfg.seed}", clock_ns=loop.wall_ns, monotonic=loop.time)
        duration = load_s(cfg.scenario, "sim", cfg.sim_duration_s)
        load = asyncio.create_task(workload.run(duration + 60.0))
        if cfg.scenario.consume:
            self.consumer = SimConsumer(
                loop, cluster.network, self.run_dir, token=TOKEN, topic=TOPIC,
                commit_interval_ms=cfg.scenario.consumer_commit_interval_ms,
                targets={n: cluster.nodes[n].address for n in self.nodes})
            self._start_consumer()
        t0 = loop.time()
        for delay, step in zip(self.plan.step_delays_s, cfg.scenario.steps, strict=True):
            await asyncio.sleep(delay)
            if step.action is not Action.PROMOTE:
                # An election since the last step (a promote step waits for
                # one itself, and records it), as the local runner does.
                self._follow_election(cluster, loop.wall_ms(), "elected by the controller")
            await self._apply(cluster, step)
        left = duration - (loop.time() - t0)
        await asyncio.sleep(max(left, cfg.scenario.settle_s))
        workload.stop()
        history = await load
        await self._end_phase(cluster)
        self._write(cluster, history, started, loop.wall_ms(), loop.time() - t0, logs)

    def _start_consumer(self) -> None:
        assert self.consumer is not None
        ctx = contextvars.copy_context()
        ctx.run(OWNER.set, CONSUMER_NODE)  # its log lines are its own
        self.consumer.start(ctx)

    async def _consumer_step(self, action: Action, t: int) -> None:
        assert self.consumer is not None
        if action is Action.START:
            self._start_consumer()
            detail = f"consumer incarnation {self.consumer.incarnations}"
        else:
            detail = await self.consumer.apply(action)
        self.record.fault(action, CONSUMER_NODE, t, detail=detail,
                          end=None if action is Action.KILL else self.cluster.clock.wall_ms())

    async def _apply(self, cluster: SimCluster, step: Step) -> None:
        t = cluster.clock.wall_ms()
        # The local runner's draw for a disk damage step (chaos/harness/run_base.py).
        rng = self._damage_rng()
        if step.action is Action.PARTITION:  # the master-slave links
            master = self.acting_master
            peers = list(self.slaves)
            if step.target == "master_and_controller" and cluster.controller is not None:
                peers.append(CONTROLLER_NAME)
            for peer in peers:
                cluster.partition(master, peer)
                self._record_partition(master, peer, t)
            return
        if step.action is Action.HEAL:  # every link cut, whoever is master now
            self._heal_all(cluster, t, None)
            return
        if (step.target == "master_and_controller" and cluster.controller is not None
                and step.action in (Action.KILL, Action.START)):
            # The local runner's twin (chaos/harness/runner.py _with_controller).
            master = self.acting_master
            if step.action is Action.KILL:
                cluster.controller.kill()
                cluster.kill(master)
                self.record.kill(master, t, detail=CONTROLLER_KILLED)
            else:
                cluster.controller.start()
                await self._start(cluster, master, "start", t, CONTROLLER_STARTED)
            return
        for name in self._targets(step.target, cluster.wrote):
            if name == CONSUMER_NODE:
                await self._consumer_step(step.action, t)
            else:
                await self._node_step(cluster, step.action, name, t, rng)

    async def _node_step(self, cluster: SimCluster, action: Action, name: str, t: int,
                         rng: random.Random) -> None:
        if action is Action.KILL:
            cluster.kill(name)
            self.record.kill(name, t)
        elif action is Action.STOP:
            await cluster.stop(name)
            self.record.fault("stop", name, t)
        elif action in (Action.START, Action.RESTART):
            if action is Action.RESTART:
                await cluster.stop(name)
            await self._start(cluster, name, action, t, None)
        elif action is Action.AWAIT_CRASH:
            await self._await_crash(cluster, name, t)
        elif action is Action.PAUSE:
            cluster.pause(name)
            self.record.fault("pause", name, t)
        elif action is Action.RESUME:
            cluster.resume(name)
            self.record.close_fault("pause", name, t)
            self.record.fault("resume", name, t, end=t)
        elif action in (Action.TORN_TAIL, Action.BIT_FLIP):
            fn = disk_faults.torn_tail if action is Action.TORN_TAIL else disk_faults.bit_flip
            detail = cluster.damage(name, fn, rng)
            self.record.damage(action, name, t, cluster.clock.wall_ms(), detail)
        elif action is Action.ROGUE_PEER:
            self._rogue_peer(cluster, name, t)
        elif action in (Action.LOSE, Action.PROMOTE, Action.REJOIN):
            await self._failover_step(cluster, action, name, t)
        else:  # an action added to chaos/harness/scenarios.py without its twin here
            raise SimUnsupportedError(f"step {action} is not simulated")

    def _heal_all(self, cluster: SimCluster, t: int, detail: str | None) -> None:
        for a, b in sorted(cluster.partitions()):
            cluster.heal(a, b)
            self._record_heal(a, b, t, t, detail)

    async def _failover_step(self, cluster: SimCluster, action: Action, name: str,
                             t: int) -> None:
        """lose, promote, rejoin (chaos/harness/scenarios.py), recorded as
        faults of those kinds; one the cluster's state refuses is recorded
        with why, and the run goes on."""
        try:
            if action is Action.LOSE:
                cluster.lose(name)
                self.record.killed.add(name)
                self.record.fault("lose", name, t, detail="the machine is gone (killed, "
                                                          "its store moved aside)")
                self._lost_node(name)
            elif action is Action.PROMOTE and cluster.controller is not None:
                await self._await_election(cluster, t)
            elif action is Action.PROMOTE:
                await self._promote(cluster, name, t)
            else:
                await self._rejoin(cluster, name, t, None)
        except FailoverRefused as exc:
            self.record.fault(action.value, name, t, end=t, detail=f"refused: {exc}")

    async def _promote(self, cluster: SimCluster, name: str, t: int) -> None:
        old = self.acting_master
        before = self._slave_ends(cluster.wrote)
        links = await cluster.promote(
            name, self._spec(name, Role(self.cfg.role)),
            lambda other: self._spec(other, Role.SLAVE), start_s=self._start_s())
        self._promoted(name)
        now = cluster.clock.wall_ms()
        self.record.fault("promote", name, t, peer=old, end=now,
                          detail="followers: " + (", ".join(
                              f"{n} {v}" for n, v in sorted(links.items())) or "none"))
        self.record.recovery(name, cluster.recovery(name))
        self._record_followers(name, before, links, now)

    async def _rejoin(self, cluster: SimCluster, name: str, t: int,
                      detail: str | None) -> None:
        master = cluster.master
        ahead_of = cluster.wrote(master) if master is not None else None
        if cluster.controller is not None:
            # The node starts and asks the controller whom to follow.
            if cluster.nodes[name].state is NodeState.RUNNING:
                raise FailoverRefused(f"cannot rejoin {name}: it is running (in controller "
                                      "mode it follows the elected master by itself)")
            if start_s := self._start_s():
                await asyncio.sleep(start_s)
            started = await cluster.start(name)
        else:
            started = await cluster.rejoin(name, self._spec(name, Role.SLAVE),
                                           start_s=self._start_s())
        if not started:
            self.record.refused(name, t, cluster.nodes[name].refused)
            return
        self.lost.discard(name)
        now = cluster.clock.wall_ms()
        self.record.fault("rejoin", name, t, peer=master, end=now, detail=detail)
        self.record.recovery(name, cluster.recovery(name))
        n = cluster.nodes[name].node
        if master is not None and ahead_of is not None and n is not None \
                and n.store is not None:
            # The rejoining node against the master it follows: an old
            # master holding unreplicated bytes is ahead of it.
            self.record.slave_ahead(now, master, ahead_of,
                                    {name: n.store.recovery.max_valid_offset})

    def _rogue_peer(self, cluster: SimCluster, name: str, t: int) -> None:
        """chaos/harness/runner.py's rogue HA peer: chaos/harness/rogue_peer.py's client as a
        task on this loop, over the in-memory network, with the token. It
        belongs to no node: a pause or kill of one does not hold or end it."""
        first = cluster.wrote(name)
        if first is None:
            self.record.fault("rogue_peer", name, t, detail="not started: the node is down")
            return
        rogue = RoguePeerTask(cluster.clock.wall_ms)
        rogue.start(cluster.network.connector(ROGUE_ADDRESS), cluster.nodes[name].address,
                    TOKEN, first, incarnation=f"rogue{len(self.rogues)}")
        self.rogues.append(rogue)
        self.record.rogue_peer(name, t, first, OVER_BY)

    def _start_s(self) -> float:
        """How long a node's process takes to start: the machine's, when
        the run was given its timings (compare-backends), else 0."""
        timings = self.cfg.sim_timings
        return timings.start_s if timings is not None else 0.0

    async def _start(self, cluster: SimCluster, name: str, action: str, t: int,
                     detail: str | None) -> None:
        if name != self.master and self.old_master is not None and cluster.master is not None:
            # After a failover a node comes back as a slave of the route's
            # master: a rejoin (an old master's first report goes through the
            # slave-ahead policy).
            await self._rejoin(cluster, name, t, detail)
            return
        if start_s := self._start_s():
            await asyncio.sleep(start_s)  # the process starting: the node is down
        if name == self.master:
            self._slave_offsets = {s: w for s in self.slaves
                                   if (w := cluster.wrote(s)) is not None}
        if not await cluster.start(name):
            self.record.refused(name, t, cluster.nodes[name].refused)
            return
        now = cluster.clock.wall_ms()
        self.record.fault(action, name, t, end=now, detail=detail)
        self.record.recovery(name, cluster.recovery(name))
        n = cluster.nodes[name].node
        if name == self.master and n is not None and n.store is not None:
            self.record.slave_ahead(now, name, n.store.recovery.max_valid_offset,
                                    self._slave_offsets)
            self._slave_offsets = {}

    async def _await_crash(self, cluster: SimCluster, name: str, t: int) -> None:
        spec = self._armed(name)
        # A local run's load comes as fast as acks (the hit comes within
        # 10 s); a sim run's at a rate, over a longer run: half of it.
        wait_s = max(10.0, (self.cfg.sim_duration_s or self.cfg.scenario.load_s) / 2)
        deadline = cluster.loop.time() + wait_s
        while cluster.loop.time() < deadline:
            if cluster.nodes[name].state is NodeState.STOPPED:
                self.record.killed.add(name)
                self.record.fault("failpoint", name, self.crashed_at.get(name, t),
                                  detail=f"fired: {spec}")
                return
            await asyncio.sleep(0.05)
        cluster.kill(name)
        self.record.kill(name, cluster.clock.wall_ms(),
                         detail=f"failpoint {spec} did not fire in {wait_s:g} s")

    async def _end_phase(self, cluster: SimCluster) -> None:
        t = cluster.clock.wall_ms()
        for rogue in self.rogues:
            if rogue.stop():
                self.record.close_fault("rogue_peer", self.acting_master, t)
        for name in self.nodes:
            if cluster.paused(name):
                cluster.resume(name)
                self.record.close_fault("pause", name, t)
                self.record.fault("resume", name, t, end=t, detail="end of run")
        self._heal_all(cluster, t, "end of run")
        if cluster.controller is not None:
            await self._one_elected_master(cluster)
        else:
            await self._one_master(cluster)
        for name in self.nodes:
            if cluster.nodes[name].state is NodeState.STOPPED and name not in self.lost:
                t = cluster.clock.wall_ms()
                await self._start(cluster, name, "start", t, "end of run")
        await self._settle(cluster)
        if self.consumer is not None:
            # It drains what the cluster holds before the nodes stop (the
            # load has ended), as on the local backend.
            if not self.consumer.running:
                t = cluster.clock.wall_ms()
                self._start_consumer()
                self.record.fault("start", CONSUMER_NODE, t, end=cluster.clock.wall_ms(),
                                  detail="end of run: consumer incarnation "
                                         f"{self.consumer.incarnations}")
            await self.consumer.drain()
        for name in (*self.slaves, self.acting_master):
            await cluster.stop(name)

    async def _one_master(self, cluster: SimCluster) -> None:
        """A node still serving as a master that the route no longer names
        (an isolated master, promoted over while cut off) is stopped and
        rejoins as a slave of the route's master with its own disk: two
        masters until here, one from here (the checker judges what each
        acknowledged)."""
        for name in self.nodes:
            n = cluster.nodes[name].node
            if name != cluster.master and n is not None and n.ha_master is not None:
                t = cluster.clock.wall_ms()
                await cluster.stop(name)
                self.record.fault("stop", name, t, detail="end of run: a second master")
                await self._rejoin(cluster, name, t, "end of run: a second master rejoins as "
                                                     "a slave")

    async def _one_elected_master(self, cluster: SimCluster) -> None:
        """Controller mode: the controller's master is the one master. A
        deposed master still serving learns it at its next heartbeat and
        follows (truncating to the point it shares); a controller with no
        master gets one from the next election. Waited for here, bounded."""
        assert cluster.controller is not None
        deadline = cluster.loop.time() + cluster.controller.config.heartbeat_timeout_ms / 1000 + 10
        while cluster.loop.time() < deadline:
            self._follow_election(cluster, cluster.clock.wall_ms(),
                                  "elected by the controller")
            second = [n for n in self.nodes if n != cluster.master
                      and (node := cluster.nodes[n].node) is not None
                      and node.ha_master is not None]
            if not second and cluster.master is not None and self._serving(cluster,
                                                                           cluster.master):
                return
            await asyncio.sleep(0.1)

    async def _settle(self, cluster: SimCluster) -> None:
        loop = cluster.loop
        deadline = loop.time() + self.cfg.settle_timeout_s
        master = self.acting_master
        live = [s for s in self.slaves if s not in self.lost]
        watch = SettleWatch(len(live), loop.time(), quiet_s=SETTLE_QUIET_S)
        detail = TIMED_OUT
        while loop.time() < deadline:
            verdict = watch.verdict(loop.time(), cluster.wrote(master),
                                    [cluster.wrote(s) for s in live],
                                    cluster.rejected_slaves())
            if verdict is not None:
                detail = verdict
                break
            await asyncio.sleep(0.1)
        self.record.settle(cluster.clock.wall_ms(), master, cluster.wrote(master), detail)

    def _write(self, cluster: SimCluster, history: list[dict[str, Any]], started: int,
               ended: int, simulated_s: float, logs: _LogCapture) -> None:
        for name in self.nodes:
            data_dir = os.path.join(self.cluster_dir, "nodes", name, "data")
            cluster.export(name, data_dir)
            self.record.node(name, cluster.nodes[name].config.role, data_dir,
                             log_lines=logs.lines.get(name, []))
        for i, rogue in enumerate(self.rogues):
            with open(os.path.join(self.run_dir, f"rogue_peer{i}.log"), "w",
                      encoding="utf-8") as f:
                f.write("".join(line + "\n" for line in rogue.lines))
        self.record.run_files(history, self.consumer)
        self._write_params(backend="sim",
                           roles={n: cluster.nodes[n].config.role for n in self.nodes},
                           started_ms=started, ended_ms=ended,
                           extra={"sim": self._sim_params(cluster, simulated_s),
                                  **({} if cluster.controller is None else {
                                      "controller": dataclasses.asdict(dataclasses.replace(
                                          RUN_CONTROLLER,
                                          elect_unclean=self.cfg.elect_unclean))})})
        if not self.cfg.keep_cluster_dir:
            self.record.drop_cluster_dir()

    def _sim_params(self, cluster: SimCluster, simulated_s: float) -> dict[str, Any]:
        """What only a simulated run has (params.json `sim`)."""
        disk_faults: list[dict[str, Any]] = []
        for name in self.nodes:
            disk_faults += [{"node": name, **f} for f in cluster.nodes[name].disk.faults]
        return {"simulated_s": round(simulated_s, 3),
                "rate_per_s": self.workload.rate_per_s,
                "producers": self.workload.producers,
                "net_delay_s": (list(NET_DELAY_S) if cluster.timings is None
                                else [v / 1e6 for v in cluster.timings.net_us]),
                "fsync_typical_s": round(cluster.fsync_typical_s, 6),
                "disk_fault_profile": self.cfg.sim_disk_faults,
                "disk_fault_rates": {"torn_write": self.disk_faults.torn_write,
                                     "fsync_eio": self.disk_faults.fsync_eio,
                                     "read_corruption": self.disk_faults.read_corruption},
                "disk_faults": disk_faults,
                "loop_errors": len(self.loop_errors)}
