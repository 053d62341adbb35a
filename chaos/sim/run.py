"""`--backend sim`: a chaos run with the whole cluster in this process, on
simulated time (issue 17).

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
import logging
import os
import random
import shutil
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from chaos.harness import disk_faults
from chaos.harness.plan import RunPlan, plan_run, stream
from chaos.harness.readback import read_back
from chaos.harness.rogue_peer import OVER_BY, RoguePeerTask
from chaos.harness.runner import RunConfig, _versions
from chaos.harness.scenarios import Step
from chaos.harness.workload import TOPIC, Workload
from chaos.schema import CONSUMER_NODE, SCHEMA_VERSION, write_json, write_jsonl
from chaos.sim.cluster import NET_DELAY_S, OWNER, TOKEN, SimCluster, SimSender, SimulatedCrash
from chaos.sim.consumer import SimConsumer
from cluster.backends.interface import NodeSpec, NodeState
from cluster.node.role import Role
from ha.config import ShipLimit, SlaveAheadPolicy
from store.config import CorruptionPolicy, CrashModel, FlushMode
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


def check_supported(crash_model: str) -> None:
    """The sim runs every scenario; it refuses only the `process` crash model."""
    if crash_model != "power":
        raise SimUnsupportedError("the sim backend models the power crash model only: "
                                  "drop --crash-model process or use --backend local")


def draw_disk_faults(seed: int, profile: str, rng: random.Random) -> DiskFaults:
    """The run's disk fault probabilities. The torn-write one comes from the
    run's generator (as it always has); the drawn ones from their own
    stream, so turning them on leaves every other draw of the seed as it was."""
    torn = round(rng.uniform(*TORN_WRITE_RANGE), 4)
    if profile != "drawn":
        return DiskFaults(torn_write=torn)
    own = stream(seed, "sim-disk-faults")
    return DiskFaults(torn_write=torn, fsync_eio=round(own.uniform(*FSYNC_EIO_RANGE), 6),
                      read_corruption=round(own.uniform(*READ_CORRUPTION_RANGE), 4))


def start_epoch_ms(seed: int) -> int:
    """Simulated wall time at the start of a run: a fixed epoch plus a
    whole number of seconds derived from the seed."""
    return sim_loop.DEFAULT_START_WALL_MS + (seed % 1_000_000) * 1000


class _LogCapture(logging.Handler):
    """The nodes' log lines, per node, stamped with simulated time."""

    def __init__(self, loop: VirtualTimeLoop) -> None:
        super().__init__(logging.INFO)
        self.loop = loop
        self.lines: dict[str, list[str]] = {}

    def emit(self, record: logging.LogRecord) -> None:
        owner = OWNER.get() or "harness"
        self.lines.setdefault(owner, []).append(
            f"{self.loop.time():10.4f} {record.levelname} {record.name}: {record.getMessage()}")


class SimRun:
    """One chaos run on the sim backend; writes the same result directory
    as chaos/harness/runner.py's Run (chaos/schema.py), with backend=sim."""

    def __init__(self, cfg: RunConfig, log: Callable[[str], None] = lambda s: None) -> None:
        self.cfg = cfg.validate()
        check_supported(cfg.crash_model)
        self.plan: RunPlan = plan_run(cfg.scenario, cfg.seed)
        self.run_dir = os.path.join(cfg.out_dir, cfg.run_id)
        self.cluster_dir = os.path.join(self.run_dir, "cluster")
        self._log = log
        self.rng = stream(cfg.seed, "sim")
        self.disk_faults = draw_disk_faults(cfg.seed, cfg.sim_disk_faults, self.rng)
        self.master = "master"
        self.slaves = [f"slave{i + 1}" for i in range(cfg.slaves)]
        workload = cfg.workload
        if workload.rate_per_s is None:
            workload = replace(workload, rate_per_s=DEFAULT_RATE_PER_S)
        self.workload = workload
        self.faults: list[dict[str, Any]] = []
        self.observations: list[dict[str, Any]] = []
        self.recoveries: dict[str, list[str]] = {}
        self.killed: set[str] = set()
        self.damaged: set[str] = set()
        self.consumer: SimConsumer | None = None
        self.loop_errors: list[str] = []
        self.crashed_at: dict[str, int] = {}
        self._slave_offsets: dict[str, int] = {}
        self.rogues: list[RoguePeerTask] = []

    # ------------------------------------------------------------ records
    def _fault(self, kind: str, node: str | None, start: int, *, peer: str | None = None,
               detail: str | None = None, end: int | None = None,
               damages: bool = False) -> None:
        self.faults.append({
            "fault_id": len(self.faults), "kind": kind, "node": node, "peer": peer,
            "start_ms": start, "end_ms": end, "damages_disk": damages, "detail": detail,
        })
        self._log(f"  fault {kind} {node or ''} {detail or ''}".rstrip())

    def _spec(self, name: str, role: Role, failpoints: str) -> NodeSpec:
        cfg = self.cfg
        return NodeSpec(
            name=name, role=role, flush=FlushMode(cfg.flush),
            crash_model=CrashModel(cfg.crash_model),
            segment_size_bytes=cfg.segment_size_bytes,
            slave_ahead_policy=SlaveAheadPolicy(cfg.slave_ahead_policy),
            ha_ship_limit=ShipLimit(cfg.ha_ship_limit), failpoints=failpoints,
            corruption_policy=CorruptionPolicy(cfg.corruption_policy),
            extra_args=cfg.master_args if role is not Role.SLAVE else cfg.slave_args,
            emulate=cfg.emulate,
            consumer_offset_persist_interval_ms=cfg.scenario.offset_persist_interval_ms)

    # ---------------------------------------------------------------- run
    def execute(self) -> str:
        if os.path.exists(self.run_dir):
            shutil.rmtree(self.run_dir)
        os.makedirs(self.run_dir)
        capture: list[_LogCapture] = []
        root = logging.getLogger()
        old_level = root.level

        async def main(loop: VirtualTimeLoop) -> None:
            handler = _LogCapture(loop)
            capture.append(handler)
            root.addHandler(handler)
            root.setLevel(logging.INFO)
            loop.set_exception_handler(self._loop_error)
            await self._main(loop, handler)

        try:
            sim_loop.run(main, start_wall_ms=start_epoch_ms(self.cfg.seed))
        finally:
            for h in capture:
                root.removeHandler(h)
            root.setLevel(old_level)
        return self.run_dir

    def _loop_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if isinstance(exc, SimulatedCrash | asyncio.CancelledError):
            return
        # A dead node's leftovers fail on its crashed disk: expected; kept
        # for the record, never fatal.
        self.loop_errors.append(f"{context.get('message')}: {exc!r}"[:300])

    async def _main(self, loop: VirtualTimeLoop, logs: _LogCapture) -> None:
        cfg = self.cfg
        started = loop.wall_ms()
        master = self._spec(self.master, Role(cfg.role), self.plan.failpoints.get("master", ""))
        slaves = tuple(self._spec(s, Role.SLAVE, self.plan.failpoints.get("slave", "")
                                  if i == 0 else "") for i, s in enumerate(self.slaves))
        cluster = SimCluster(loop, self.rng, master, slaves, self.disk_faults,
                             on_crash=lambda name: self.crashed_at.setdefault(
                                 name, loop.wall_ms()),
                             pausable=any(s.action == "pause" for s in cfg.scenario.steps),
                             fsync_rng=stream(cfg.seed, "sim-fsync"))
        self.cluster = cluster
        for name in (self.master, *self.slaves):
            await cluster.start(name)
            self.recoveries.setdefault(name, []).append(cluster.recovery(name))
        deadline = loop.time() + 30.0
        while not cluster.slaves_connected() and loop.time() < deadline:
            await asyncio.sleep(0.01)
        workload = Workload(self.workload, SimSender(cluster, self.master),
                            seed=self.plan.workload_seed, node=self.master,
                            run_tag=f"s{cfg.seed}", clock_ns=loop.wall_ns, monotonic=loop.time)
        duration = max(cfg.scenario.load_s, cfg.sim_duration_s)
        load = asyncio.create_task(workload.run(duration + 60.0))
        if cfg.scenario.consume:
            self.consumer = SimConsumer(
                loop, cluster.network, self.run_dir, token=TOKEN, topic=TOPIC,
                commit_interval_ms=cfg.scenario.consumer_commit_interval_ms,
                targets={n: cluster.nodes[n].address for n in (self.master, *self.slaves)})
            self._start_consumer()
        t0 = loop.time()
        for delay, step in zip(self.plan.step_delays_s, cfg.scenario.steps, strict=True):
            await asyncio.sleep(delay)
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

    async def _consumer_step(self, action: str, t: int) -> None:
        assert self.consumer is not None
        if action == "start":
            self._start_consumer()
            detail = f"consumer incarnation {self.consumer.incarnations}"
        else:
            detail = await self.consumer.apply(action)
        self._fault(action, CONSUMER_NODE, t, detail=detail,
                    end=None if action == "kill" else self.cluster.clock.wall_ms())

    def _targets(self, target: str) -> list[str]:
        if target == "consumer":
            return [CONSUMER_NODE]
        if target == "master":
            return [self.master]
        if target == "slave":
            return [self.slaves[0]]
        return [self.master, *self.slaves]

    async def _apply(self, cluster: SimCluster, step: Step) -> None:
        t = cluster.clock.wall_ms()
        # The local runner's draw for a disk damage step (chaos/harness/runner.py).
        rng = random.Random(self.plan.disk_fault_seed + len(self.faults))
        if step.action in ("partition", "heal"):  # the master-slave links
            for s in self.slaves:
                if step.action == "partition":
                    cluster.partition(self.master, s)
                    self._fault("partition", self.master, t, peer=s)
                else:
                    cluster.heal(self.master, s)
                    self._close_fault("partition", self.master, t)
                    self._fault("heal", self.master, t, peer=s, end=t)
            return
        for name in self._targets(step.target):
            if name == CONSUMER_NODE:
                await self._consumer_step(step.action, t)
            elif step.action == "kill":
                cluster.kill(name)
                self.killed.add(name)
                self._fault("kill", name, t)
            elif step.action == "stop":
                await cluster.stop(name)
                self._fault("stop", name, t)
            elif step.action in ("start", "restart"):
                if step.action == "restart":
                    await cluster.stop(name)
                await self._start(cluster, name, step.action, t, None)
            elif step.action == "await_crash":
                await self._await_crash(cluster, name, t)
            elif step.action == "pause":
                cluster.pause(name)
                self._fault("pause", name, t)
            elif step.action == "resume":
                cluster.resume(name)
                self._close_fault("pause", name, t)
                self._fault("resume", name, t, end=t)
            elif step.action in ("torn_tail", "bit_flip"):
                fn = disk_faults.torn_tail if step.action == "torn_tail" else disk_faults.bit_flip
                detail = cluster.damage(name, fn, rng)
                self.damaged.add(name)
                self._fault(step.action, name, t, damages=True, detail=detail,
                            end=cluster.clock.wall_ms())
            elif step.action == "rogue_peer":
                self._rogue_peer(cluster, name, t)
            else:  # a step added to chaos/harness/scenarios.py without its twin here
                raise SimUnsupportedError(f"step {step.action} is not simulated")

    def _rogue_peer(self, cluster: SimCluster, name: str, t: int) -> None:
        """chaos/harness/runner.py's rogue HA peer: chaos/harness/rogue_peer.py's client as a
        task on this loop, over the in-memory network, with the token. It
        belongs to no node: a pause or kill of one does not hold or end it."""
        first = cluster.wrote(name)
        if first is None:
            self._fault("rogue_peer", name, t, detail="not started: the node is down")
            return
        rogue = RoguePeerTask(cluster.clock.wall_ms)
        rogue.start(cluster.network.connector(ROGUE_ADDRESS), cluster.nodes[name].address,
                    TOKEN, first, incarnation=f"rogue{len(self.rogues)}")
        self.rogues.append(rogue)
        self._fault("rogue_peer", name, t, detail=f"HA stream with the cluster token: first "
                                                  f"report {first}, then {first + OVER_BY}")

    def _close_fault(self, kind: str, node: str, t: int) -> None:
        for f in reversed(self.faults):
            if f["kind"] == kind and f["node"] == node and f["end_ms"] is None:
                f["end_ms"] = t
                return

    async def _start(self, cluster: SimCluster, name: str, action: str, t: int,
                     detail: str | None) -> None:
        if name == self.master:
            self._slave_offsets = {s: w for s in self.slaves
                                   if (w := cluster.wrote(s)) is not None}
        if not await cluster.start(name):
            refused = cluster.nodes[name].refused
            self._fault("refused", name, t, detail=refused)
            self.recoveries.setdefault(name, []).append(f"refused: {refused}")
            return
        now = cluster.clock.wall_ms()
        self._fault(action, name, t, end=now, detail=detail)
        self.recoveries.setdefault(name, []).append(cluster.recovery(name))
        n = cluster.nodes[name].node
        if name == self.master and n is not None and n.store is not None:
            recovered = n.store.recovery.max_valid_offset
            for s, off in self._slave_offsets.items():
                self.observations.append({
                    "time_ms": now, "kind": "slave_ahead", "master": self.master, "slave": s,
                    "master_offset": recovered, "slave_offset": off,
                    "detail": f"slave ahead by {off - recovered} bytes"
                    if off > recovered else "slave not ahead"})
            self._slave_offsets = {}

    async def _await_crash(self, cluster: SimCluster, name: str, t: int) -> None:
        spec = self.plan.failpoints.get("master" if name == self.master else "slave", "")
        # A local run's load comes as fast as acks (the hit comes within
        # 10 s); a sim run's at a rate, over a longer run: half of it.
        wait_s = max(10.0, self.cfg.sim_duration_s / 2)
        deadline = cluster.loop.time() + wait_s
        while cluster.loop.time() < deadline:
            if cluster.nodes[name].state is NodeState.STOPPED:
                self.killed.add(name)
                self._fault("failpoint", name, self.crashed_at.get(name, t),
                            detail=f"fired: {spec}")
                return
            await asyncio.sleep(0.05)
        cluster.kill(name)
        self.killed.add(name)
        self._fault("kill", name, cluster.clock.wall_ms(),
                    detail=f"failpoint {spec} did not fire in {wait_s:g} s")

    async def _end_phase(self, cluster: SimCluster) -> None:
        t = cluster.clock.wall_ms()
        for rogue in self.rogues:
            if rogue.stop():
                self._close_fault("rogue_peer", self.master, t)
        for name in (self.master, *self.slaves):
            if cluster.paused(name):
                cluster.resume(name)
                self._close_fault("pause", name, t)
                self._fault("resume", name, t, end=t, detail="end of run")
        for s in self.slaves:
            if cluster.partitioned(self.master, s):
                cluster.heal(self.master, s)
                self._close_fault("partition", self.master, t)
                self._fault("heal", self.master, t, peer=s, end=t, detail="end of run")
        for name in (self.master, *self.slaves):
            if cluster.nodes[name].state is NodeState.STOPPED:
                t = cluster.clock.wall_ms()
                await self._start(cluster, name, "start", t, "end of run")
        await self._settle(cluster)
        if self.consumer is not None:
            # It drains what the cluster holds before the nodes stop (the
            # load has ended), as on the local backend.
            if not self.consumer.running:
                t = cluster.clock.wall_ms()
                self._start_consumer()
                self._fault("start", CONSUMER_NODE, t, end=cluster.clock.wall_ms(),
                            detail="end of run: consumer incarnation "
                                   f"{self.consumer.incarnations}")
            await self.consumer.drain()
        for name in (*self.slaves, self.master):
            await cluster.stop(name)

    async def _settle(self, cluster: SimCluster) -> None:
        loop = cluster.loop
        deadline = loop.time() + self.cfg.settle_timeout_s
        last: list[int | None] = []
        last_change = loop.time()
        detail = "replication did not settle in time"
        while loop.time() < deadline:
            mw = cluster.wrote(self.master)
            sw = [cluster.wrote(s) for s in self.slaves]
            if mw is not None and all(w is not None and w >= mw for w in sw):
                detail = "replication settled"
                break
            rejected = cluster.rejected_slaves()
            if rejected and len(rejected) == len(self.slaves):
                # The policy refused a slave that is ahead: it will not catch up.
                detail = f"slave(s) {', '.join(rejected)} rejected as ahead; logs kept"
                break
            if sw != last:
                last, last_change = sw, loop.time()
            elif loop.time() - last_change > SETTLE_QUIET_S:
                detail = f"replication stalled: master at {mw}, slaves at {sw}"
                break
            await asyncio.sleep(0.1)
        self.observations.append({
            "time_ms": cluster.clock.wall_ms(), "kind": "settle", "master": self.master,
            "slave": None, "master_offset": cluster.wrote(self.master), "slave_offset": None,
            "detail": detail})

    def _write(self, cluster: SimCluster, history: list[dict[str, Any]], started: int,
               ended: int, simulated_s: float, logs: _LogCapture) -> None:
        cfg = self.cfg
        for name in (self.master, *self.slaves):
            data_dir = os.path.join(self.cluster_dir, "nodes", name, "data")
            cluster.export(name, data_dir)
            rb = read_back(data_dir)
            d = os.path.join(self.run_dir, "nodes", name)
            os.makedirs(d, exist_ok=True)
            write_jsonl(os.path.join(d, "records.jsonl"), rb.records)
            write_json(os.path.join(d, "final.json"), {
                "name": name, "role": cluster.nodes[name].config.role.value,
                "min_offset": rb.min_offset, "flushed": rb.end_offset, "wrote": rb.end_offset,
                "first_bad_offset": rb.first_bad_offset,
                "recoveries": self.recoveries.get(name, []), "disk_damaged": name in self.damaged,
                "killed": name in self.killed,
            })
            with open(os.path.join(d, "node.log"), "w", encoding="utf-8") as f:
                f.write("".join(line + "\n" for line in logs.lines.get(name, [])))
        for i, rogue in enumerate(self.rogues):
            with open(os.path.join(self.run_dir, f"rogue_peer{i}.log"), "w",
                      encoding="utf-8") as f:
                f.write("".join(line + "\n" for line in rogue.lines))
        write_jsonl(os.path.join(self.run_dir, "history.jsonl"), history)
        write_jsonl(os.path.join(self.run_dir, "faults.jsonl"), self.faults)
        write_jsonl(os.path.join(self.run_dir, "observations.jsonl"), self.observations)
        if self.consumer is not None:
            consumed, committed, summary = self.consumer.collect()
            write_jsonl(os.path.join(self.run_dir, "consumed.jsonl"), consumed)
            write_jsonl(os.path.join(self.run_dir, "committed.jsonl"), committed)
            write_json(os.path.join(self.run_dir, "consumer.json"), summary)
        disk_faults: list[dict[str, Any]] = []
        for name in (self.master, *self.slaves):
            disk_faults += [{"node": name, **f} for f in cluster.nodes[name].disk.faults]
        write_json(os.path.join(self.run_dir, "params.json"), {
            "schema_version": SCHEMA_VERSION, "run_id": cfg.run_id, "role": cfg.role,
            "flush": cfg.flush, "scenario": cfg.scenario.name, "seed": cfg.seed,
            "backend": "sim", "crash_model": cfg.crash_model,
            "slave_ahead_policy": cfg.slave_ahead_policy, "ha_ship_limit": cfg.ha_ship_limit,
            "corruption_policy": cfg.corruption_policy,
            "nodes": [{"name": n, "role": cluster.nodes[n].config.role.value}
                      for n in (self.master, *self.slaves)],
            "failpoints": {self.master if t == "master" else self.slaves[0]: s
                           for t, s in self.plan.failpoints.items()},
            "versions": _versions(), "started_ms": started, "ended_ms": ended,
            "plan": {"step_delays_s": list(self.plan.step_delays_s),
                     "workload_seed": self.plan.workload_seed},
            "master_args": list(cfg.master_args),
            "slave_args": list(cfg.slave_args),
            "emulate": sorted(cfg.emulate),
            "config": cfg.to_record(),
            # What only a simulated run has (chaos/sim/run.py).
            "sim": {"simulated_s": round(simulated_s, 3),
                    "rate_per_s": self.workload.rate_per_s,
                    "producers": self.workload.producers,
                    "net_delay_s": list(NET_DELAY_S),
                    "fsync_typical_s": round(cluster.fsync_typical_s, 6),
                    "disk_fault_profile": cfg.sim_disk_faults,
                    "disk_fault_rates": {"torn_write": self.disk_faults.torn_write,
                                         "fsync_eio": self.disk_faults.fsync_eio,
                                         "read_corruption": self.disk_faults.read_corruption},
                    "disk_faults": disk_faults,
                    "loop_errors": len(self.loop_errors)},
        })
        if not cfg.keep_cluster_dir:
            with contextlib.suppress(OSError):
                shutil.rmtree(self.cluster_dir)
