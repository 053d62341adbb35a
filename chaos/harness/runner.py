"""One chaos run, start to finish, written as a result directory
(chaos/schema.py).

Phases:
1. up: a master and its slaves on the chosen backend; failpoints from the
   run plan armed on their nodes.
2. load + faults: the workload runs against the master while the scenario's
   steps fire at seeded times. When a crashed master is started again, the
   harness records the slaves' offsets (read while the master was down, so
   nothing has moved them) against the recovered master's: the slave-ahead
   observation.
3. end, the same for every run: paused nodes resumed, links healed, downed
   nodes started (recovered), replication given time to settle, every node
   stopped cleanly, every store read back from disk.

In a scenario that consumes while producing, a consumer process
(chaos/harness/consumer_proc.py) starts with the load and is a step target like a
node; after the settle, with the load over, it is (re)started if down and
drained before the nodes stop, so what the master holds and no consumer got
is measured against a consumer that had every chance to get it.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import random
import secrets
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from chaos.harness import disk_faults
from chaos.harness.consumer_proc import ConsumerProcess
from chaos.harness.plan import RunPlan, plan_run
from chaos.harness.readback import read_back
from chaos.harness.rogue_peer import OVER_BY, RoguePeerProcess
from chaos.harness.scenarios import Scenario, Step
from chaos.harness.workload import TOPIC, Sender, Workload, WorkloadConfig
from chaos.schema import CONSUMER_NODE, SCHEMA_VERSION, write_json, write_jsonl
from cluster.backends.interface import (
    BackendError,
    ClusterBackend,
    ClusterSpec,
    NodeSpec,
    NodeState,
)
from cluster.node.role import Role
from ha.config import ShipLimit, SlaveAheadPolicy
from store.config import CorruptionPolicy, CrashModel, FlushMode
from store.emulate import SWITCHES

ROLES = ("SYNC_MASTER", "ASYNC_MASTER")
FLUSHES = ("SYNC_FLUSH", "ASYNC_FLUSH")
CORRUPTION_POLICIES = tuple(p.value for p in CorruptionPolicy)
SIM_DISK_FAULTS = ("torn", "drawn")


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    scenario: Scenario
    role: str
    flush: str
    seed: int
    out_dir: str
    backend: str = "local"
    crash_model: str = "power"
    slave_ahead_policy: str = "reject"
    ha_ship_limit: str = "wrote"
    # What a node does about corruption of flushed data at recovery (the
    # bit-flip scenario shows each policy's cost): refuse, truncate, repair.
    corruption_policy: str = "refuse"
    slaves: int = 1
    segment_size_bytes: int = 8 * 1024 * 1024  # rolls a few times per run; holds a 4 MiB message
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    settle_timeout_s: float = 5.0
    keep_cluster_dir: bool = True
    # Extra `dlab node` options for the master (recorded in params.json), for
    # runs that must hold a timing window open, e.g. a lazy flusher so that a
    # crash surely finds acknowledged bytes unflushed.
    master_args: tuple[str, ...] = ()
    # The same for the slaves, e.g. a short reconnect backoff so that a
    # slave is back before a restarted master passes its offset.
    slave_args: tuple[str, ...] = ()
    # Known RocketMQ bugs every node re-introduces (store/emulate.py; the
    # corpus is chaos/commands/bugs.py), recorded in params.json.
    emulate: tuple[str, ...] = ()
    # Cluster time a sim-backend run covers (chaos/sim/run.py; the load goes on
    # after the steps); other backends run the scenario's load_s.
    sim_duration_s: float = 60.0
    # Disk faults a sim-backend run draws (chaos/sim/run.py): "torn" (crash-time
    # torn writes only) or "drawn" (also fsync EIO and latent read
    # corruption, with probabilities drawn per seed).
    sim_disk_faults: str = "torn"

    def validate(self) -> RunConfig:
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}, got {self.role!r}")
        if self.flush not in FLUSHES:
            raise ValueError(f"flush must be one of {', '.join(FLUSHES)}, got {self.flush!r}")
        if self.crash_model not in ("power", "process"):
            raise ValueError("crash model must be power or process")
        SlaveAheadPolicy(self.slave_ahead_policy)
        ShipLimit(self.ha_ship_limit)
        if self.corruption_policy not in CORRUPTION_POLICIES:
            raise ValueError(f"corruption policy must be one of {', '.join(CORRUPTION_POLICIES)}"
                             f", got {self.corruption_policy!r}")
        if self.sim_duration_s <= 0:
            raise ValueError("the simulated duration must be positive")
        if self.sim_disk_faults not in SIM_DISK_FAULTS:
            raise ValueError(f"sim disk faults must be one of {', '.join(SIM_DISK_FAULTS)}, "
                             f"got {self.sim_disk_faults!r}")
        if self.slaves < 1:
            raise ValueError("a chaos run needs at least one slave")
        self.workload.validate()
        unknown = sorted(set(self.emulate) - set(SWITCHES))
        if unknown:
            raise ValueError(f"unknown bug(s) to emulate: {', '.join(unknown)}; known: "
                             f"{', '.join(sorted(SWITCHES))}")
        return self

    def to_record(self) -> dict[str, Any]:
        """Every field but out_dir, as JSON (params.json's `config`): what
        `dlab chaos replay` needs to run it again (chaos/commands/replay.py)."""
        rec: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)
                               if f.name != "out_dir"}
        rec |= {"scenario": self.scenario.name, "workload": asdict(self.workload),
                "master_args": list(self.master_args), "slave_args": list(self.slave_args),
                "emulate": sorted(self.emulate)}
        return rec

    @property
    def run_id(self) -> str:
        policy = "" if self.corruption_policy == "refuse" else f"-{self.corruption_policy}"
        emulated = "".join(f"-{bug}" for bug in sorted(self.emulate))
        drawn = "-diskfaults" if self.sim_disk_faults == "drawn" else ""
        # The same cell and seed on two backends are two runs one report may
        # read side by side (dlab chaos compare-backends): local is unmarked.
        backend = "" if self.backend == "local" else f"-{self.backend}"
        return (f"{self.scenario.name}-{self.role}-{self.flush}-{self.crash_model}-"
                f"{self.slave_ahead_policy}{policy}{emulated}{drawn}{backend}-s{self.seed}")


BackendFactory = Callable[[str, str], ClusterBackend]  # (backend name, cluster dir)
SenderFactory = Callable[[str, str], Any]  # (address, token) -> async context manager Sender
StatusFn = Callable[[str, str], dict[str, Any]]  # (address, token) -> node status (blocking)


@dataclass
class _State:
    faults: list[dict[str, Any]] = field(default_factory=list)
    observations: list[dict[str, Any]] = field(default_factory=list)
    recoveries: dict[str, list[str]] = field(default_factory=dict)
    killed: set[str] = field(default_factory=set)
    damaged: set[str] = field(default_factory=set)
    paused: set[str] = field(default_factory=set)
    partitioned: set[tuple[str, str]] = field(default_factory=set)
    slave_offsets_while_master_down: dict[str, int] = field(default_factory=dict)


class Run:
    def __init__(self, cfg: RunConfig, *, backend_factory: BackendFactory,
                 sender_factory: SenderFactory, status: StatusFn,
                 log: Callable[[str], None] = lambda s: None) -> None:
        self.cfg = cfg.validate()
        self.plan: RunPlan = plan_run(cfg.scenario, cfg.seed)
        self.run_dir = os.path.join(cfg.out_dir, cfg.run_id)
        self.cluster_dir = os.path.join(self.run_dir, "cluster")
        self._backend_factory = backend_factory
        self._sender_factory = sender_factory
        self._status = status
        self._log = log
        self.state = _State()
        self.master = "master"
        self.slaves = [f"slave{i + 1}" for i in range(cfg.slaves)]
        self.token = secrets.token_hex(16)
        self.consumer: ConsumerProcess | None = None
        self.rogue_peers: list[RoguePeerProcess] = []

    # ------------------------------------------------------------ helpers
    def _targets(self, target: str) -> list[str]:
        if target == "consumer":
            return [CONSUMER_NODE]
        if target == "master":
            return [self.master]
        if target == "slave":
            return [self.slaves[0]]
        return [self.master, *self.slaves]

    def _fault(self, kind: str, node: str | None, start: int, *, peer: str | None = None,
               damages: bool = False, detail: str | None = None, end: int | None = None) -> None:
        self.state.faults.append({
            "fault_id": len(self.state.faults), "kind": kind, "node": node, "peer": peer,
            "start_ms": start, "end_ms": end, "damages_disk": damages, "detail": detail,
        })
        self._log(f"  fault {kind} {node or ''} {detail or ''}".rstrip())

    def _record_recovery(self, backend: ClusterBackend, name: str) -> dict[str, Any] | None:
        try:
            st = self._status(backend.node(name).address, self.token)
        except Exception as exc:  # a status failure must not end the run
            self.state.recoveries.setdefault(name, []).append(f"status unavailable: {exc}")
            return None
        self.state.recoveries.setdefault(name, []).append(str(st.get("recovery", "")))
        return st

    def _wrote(self, backend: ClusterBackend, name: str) -> int | None:
        try:
            return int(self._status(backend.node(name).address, self.token)["wrote"])
        except Exception:
            return None

    # -------------------------------------------------------------- steps
    def _apply(self, backend: ClusterBackend, step: Step) -> None:
        t = now_ms()
        rng = random.Random(self.plan.disk_fault_seed + len(self.state.faults))
        for name in self._targets(step.target):
            if name == CONSUMER_NODE:
                assert self.consumer is not None
                if step.action == "kill":
                    self.consumer.kill()
                    self._fault("kill", name, t, detail="consumer process (SIGKILL)")
                elif step.action == "stop":
                    was_running = self.consumer.running
                    clean = self.consumer.stop()
                    self._fault("stop", name, t, end=now_ms(),
                                detail="consumer stopped cleanly (committed)" if clean
                                else "consumer did not stop cleanly in 10 s: SIGKILLed"
                                if was_running else "consumer had already exited")
                else:
                    self.consumer.start()
                    self._fault("start", name, t, end=now_ms(),
                                detail=f"consumer incarnation {self.consumer.incarnations}")
                continue
            if step.action == "kill":
                backend.kill(name)
                self.state.killed.add(name)
                self._fault("kill", name, t)
            elif step.action == "stop":
                backend.stop(name)
                self._fault("stop", name, t)
            elif step.action in ("start", "restart"):
                if name == self.master:
                    self._before_master_start(backend)
                if not self._start(backend, name, step.action, t):
                    continue
                self._fault(step.action, name, t, end=now_ms())
                st = self._record_recovery(backend, name)
                if name == self.master and st is not None:
                    self._observe_slave_ahead(_recovered(st))
            elif step.action == "pause":
                backend.pause(name)
                self.state.paused.add(name)
                self._fault("pause", name, t)
            elif step.action == "resume":
                backend.resume(name)
                self.state.paused.discard(name)
                self._close_fault("pause", name)
                self._fault("resume", name, t, end=t)
            elif step.action in ("partition", "heal"):
                for s in self.slaves:
                    if step.action == "partition":
                        backend.partition(self.master, s)
                        self.state.partitioned.add((self.master, s))
                        self._fault("partition", self.master, t, peer=s)
                    else:
                        backend.heal(self.master, s)
                        self.state.partitioned.discard((self.master, s))
                        self._close_fault("partition", self.master)
                        self._fault("heal", self.master, t, peer=s, end=t)
                return
            elif step.action == "await_crash":
                self._await_crash(backend, name, t)
            elif step.action == "rogue_peer":
                self._rogue_peer(backend, name, t)
            elif step.action in ("torn_tail", "bit_flip"):
                info = backend.node(name)
                fn = disk_faults.torn_tail if step.action == "torn_tail" else disk_faults.bit_flip
                detail = fn(info.data_dir, rng)
                self.state.damaged.add(name)
                self._fault(step.action, name, t, damages=True, detail=detail, end=now_ms())
            else:  # pragma: no cover - scenarios are validated at definition
                raise ValueError(step.action)

    def _rogue_peer(self, backend: ClusterBackend, name: str, t: int) -> None:
        first = self._wrote(backend, name)
        if first is None:
            self._fault("rogue_peer", name, t, detail="not started: the node's status (its "
                                                      "end offset) was unavailable")
            return
        rogue = RoguePeerProcess(os.path.join(self.run_dir, f"rogue_peer{len(self.rogue_peers)}"
                                                            ".log"))
        rogue.start(backend.node(name).address, os.path.join(self.cluster_dir, "token"), first)
        self.rogue_peers.append(rogue)
        self._fault("rogue_peer", name, t, detail=f"HA stream with the cluster token: first "
                                                  f"report {first}, then {first + OVER_BY}")

    def _stop_rogue_peers(self) -> None:
        for rogue in self.rogue_peers:
            if rogue.stop() is not None:
                self._close_fault("rogue_peer", self.master)

    def _close_fault(self, kind: str, node: str) -> None:
        for f in reversed(self.state.faults):
            if f["kind"] == kind and f["node"] == node and f["end_ms"] is None:
                f["end_ms"] = now_ms()
                return

    def _await_crash(self, backend: ClusterBackend, name: str, t: int) -> None:
        spec = self.plan.failpoints.get("master" if name == self.master else "slave", "")
        # The restarted node runs without it: _start clears the plan's failpoints.
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            if backend.node(name).state == NodeState.STOPPED:
                self.state.killed.add(name)
                self._fault("failpoint", name, now_ms(), detail=f"fired: {spec}")
                return
            time.sleep(0.05)
        backend.kill(name)
        self.state.killed.add(name)
        self._fault("kill", name, now_ms(), detail=f"failpoint {spec} did not fire in 10 s")

    def _before_master_start(self, backend: ClusterBackend) -> None:
        """Read each slave's max offset while the master is down: nothing
        can move it until the master is back."""
        self.state.slave_offsets_while_master_down.clear()
        for s in self.slaves:
            if backend.node(s).state == NodeState.RUNNING and s not in self.state.paused:
                w = self._wrote(backend, s)
                if w is not None:
                    self.state.slave_offsets_while_master_down[s] = w

    def _observe_slave_ahead(self, master_wrote: int) -> None:
        for s, off in self.state.slave_offsets_while_master_down.items():
            self.state.observations.append({
                "time_ms": now_ms(), "kind": "slave_ahead", "master": self.master, "slave": s,
                "master_offset": master_wrote, "slave_offset": off,
                "detail": f"slave ahead by {off - master_wrote} bytes"
                if off > master_wrote else "slave not ahead",
            })
        self.state.slave_offsets_while_master_down.clear()

    # ---------------------------------------------------------------- run
    def execute(self) -> str:
        cfg = self.cfg
        if os.path.exists(self.run_dir):
            shutil.rmtree(self.run_dir)
        os.makedirs(self.run_dir)
        started = now_ms()
        backend = self._backend_factory(cfg.backend, self.cluster_dir)
        master = NodeSpec(
            name=self.master, role=Role(cfg.role), flush=FlushMode(cfg.flush),
            crash_model=CrashModel(cfg.crash_model),
            segment_size_bytes=cfg.segment_size_bytes,
            slave_ahead_policy=SlaveAheadPolicy(cfg.slave_ahead_policy),
            ha_ship_limit=ShipLimit(cfg.ha_ship_limit),
            failpoints=self.plan.failpoints.get("master", ""),
            corruption_policy=CorruptionPolicy(cfg.corruption_policy),
            extra_args=cfg.master_args, emulate=cfg.emulate,
            consumer_offset_persist_interval_ms=cfg.scenario.offset_persist_interval_ms,
        )
        slaves = tuple(NodeSpec(
            name=s, role=Role.SLAVE, flush=FlushMode(cfg.flush),
            crash_model=CrashModel(cfg.crash_model),
            segment_size_bytes=cfg.segment_size_bytes,
            slave_ahead_policy=SlaveAheadPolicy(cfg.slave_ahead_policy),
            ha_ship_limit=ShipLimit(cfg.ha_ship_limit),
            failpoints=self.plan.failpoints.get("slave", "") if i == 0 else "",
            corruption_policy=CorruptionPolicy(cfg.corruption_policy),
            extra_args=cfg.slave_args, emulate=cfg.emulate,
            consumer_offset_persist_interval_ms=cfg.scenario.offset_persist_interval_ms,
        ) for i, s in enumerate(self.slaves))
        spec = ClusterSpec(directory=self.cluster_dir, master=master, slaves=slaves)
        history: list[dict[str, Any]] = []
        try:
            backend.up(spec, token=self.token)
            for name in (self.master, *self.slaves):
                self._record_recovery(backend, name)
            history = asyncio.run(self._drive(backend))
            self._end_phase(backend)
            self._write(backend, history, started)
        finally:
            if self.consumer is not None:
                self.consumer.kill()
            for rogue in self.rogue_peers:
                rogue.stop()
            try:
                backend.down()
            except Exception as exc:  # report, but keep the results written
                self._log(f"  cluster down failed: {exc}")
        return self.run_dir

    async def _drive(self, backend: ClusterBackend) -> list[dict[str, Any]]:
        cfg = self.cfg
        address = backend.node(self.master).address
        loop = asyncio.get_running_loop()
        async with self._sender_factory(address, self.token) as sender:
            sender_: Sender = sender
            workload = Workload(cfg.workload, sender_, seed=self.plan.workload_seed,
                                node=self.master, run_tag=f"s{cfg.seed}")
            load = asyncio.create_task(workload.run(cfg.scenario.load_s + 60.0))
            if cfg.scenario.consume:
                self.consumer = ConsumerProcess(
                    self.run_dir, token_file=os.path.join(self.cluster_dir, "token"),
                    topic=TOPIC, commit_interval_ms=cfg.scenario.consumer_commit_interval_ms,
                    targets={n: backend.node(n).address for n in (self.master, *self.slaves)})
                self.consumer.start()
                if cfg.scenario.consumer_ready != "start":
                    await self._consumer_ready(cfg.scenario.consumer_ready)
            t0 = loop.time()
            for delay, step in zip(self.plan.step_delays_s, cfg.scenario.steps, strict=True):
                await asyncio.sleep(delay)
                await loop.run_in_executor(None, self._apply, backend, step)
            left = cfg.scenario.load_s - (loop.time() - t0)
            await asyncio.sleep(max(left, cfg.scenario.settle_s))
            workload.stop()
            return await load

    async def _consumer_ready(self, kind: str, timeout_s: float = 60.0) -> None:
        """Until the consumer has written its first `kind` row (a delivery, a
        commit): the steps of a consuming scenario act on a consumer that is
        consuming, however long its process took to start."""
        assert self.consumer is not None
        deadline = asyncio.get_running_loop().time() + timeout_s
        while not self.consumer.has_written(kind):
            if not self.consumer.running:
                raise RuntimeError(f"the consumer exited before its first {kind}; see "
                                   f"{os.path.join(self.run_dir, 'consumer', '1.log')}")
            if asyncio.get_running_loop().time() > deadline:
                raise RuntimeError(f"the consumer wrote no {kind} in {timeout_s:g} s")
            await asyncio.sleep(0.05)

    def _end_phase(self, backend: ClusterBackend) -> None:
        self._stop_rogue_peers()
        t = now_ms()
        for name in list(self.state.paused):
            backend.resume(name)
            self._close_fault("pause", name)
            self._fault("resume", name, t, end=t, detail="end of run")
        self.state.paused.clear()
        for a, b in list(self.state.partitioned):
            backend.heal(a, b)
            self._close_fault("partition", a)
            self._fault("heal", a, t, peer=b, end=t, detail="end of run")
        self.state.partitioned.clear()
        for name in (self.master, *self.slaves):
            if backend.node(name).state == NodeState.STOPPED:
                if name == self.master:
                    self._before_master_start(backend)
                if not self._start(backend, name, "start", t):
                    continue
                self._fault("start", name, t, end=now_ms(), detail="end of run")
                st = self._record_recovery(backend, name)
                if name == self.master and st is not None:
                    self._observe_slave_ahead(_recovered(st))
        self._settle(backend)
        if self.consumer is not None:
            # The consumer drains what the cluster holds before the nodes stop
            # (the load has ended), so "stored but never delivered" means
            # what it says.
            if not self.consumer.running:
                t = now_ms()
                self.consumer.start()
                self._fault("start", CONSUMER_NODE, t, end=now_ms(),
                            detail=f"end of run: consumer incarnation "
                                   f"{self.consumer.incarnations}")
            self.consumer.drain()
        for name in (*self.slaves, self.master):
            if backend.node(name).state != NodeState.REFUSED:
                backend.stop(name)

    def _start(self, backend: ClusterBackend, name: str, action: str, t: int) -> bool:
        """Start (or restart) a node; False when it refused to (its store holds
        corruption of flushed data and its corruption policy is refuse, or a
        repair found no replica): recorded as a `refused` fault, and the node
        stays down for the rest of the run, its store as it was.

        A failpoint fires once per run, as on the sim backend: the node
        starts again without the ones the plan armed (a backend keeps a
        node's failpoints across its restarts)."""
        armed = self.plan.failpoints.get("master" if name == self.master else "slave", "")
        if armed and (name == self.master or name == self.slaves[0]):
            backend.set_failpoints(name, "")
        try:
            if action == "restart":
                backend.restart(name)
            else:
                backend.start(name)
        except BackendError:
            info = backend.node(name)
            if info.state != NodeState.REFUSED:
                raise
            self._fault("refused", name, t, detail=str(info.extra.get("refused", "")))
            self.state.recoveries.setdefault(name, []).append(
                f"refused: {info.extra.get('refused', '')}")
            return False
        return True

    def _settle(self, backend: ClusterBackend) -> None:
        deadline = time.monotonic() + self.cfg.settle_timeout_s
        last: list[int | None] = []
        last_change = time.monotonic()
        while time.monotonic() < deadline:
            try:
                st = self._status(backend.node(self.master).address, self.token)
            except Exception:
                st = {}
            mw = st.get("wrote")
            sw = [self._wrote(backend, s) for s in self.slaves]
            if mw is not None and all(w is not None and w >= mw for w in sw):
                detail = "replication settled"
                break
            rejected = [link.get("slave") for link in st.get("slaves", [])
                        if link.get("state") == "rejected"]
            if rejected and len(rejected) == len(self.slaves):
                # The policy refused a slave that is ahead: it will not catch up.
                detail = f"slave(s) {', '.join(map(str, rejected))} rejected as ahead; logs kept"
                break
            if sw != last:
                last, last_change = sw, time.monotonic()
            elif time.monotonic() - last_change > 1.0:
                # No slave moved for a second with no load running: a
                # diverged or refused slave will not catch up by waiting.
                detail = (f"replication stalled: master at {mw}, slaves at {sw} "
                          f"({'; '.join(str(x.get('detail', '')) for x in st.get('slaves', []))})")
                break
            time.sleep(0.1)
        else:
            detail = "replication did not settle in time"
        self.state.observations.append({
            "time_ms": now_ms(), "kind": "settle", "master": self.master, "slave": None,
            "master_offset": self._wrote(backend, self.master), "slave_offset": None,
            "detail": detail,
        })

    def _write(self, backend: ClusterBackend, history: list[dict[str, Any]], started: int
               ) -> None:
        cfg = self.cfg
        nodes_dir = os.path.join(self.run_dir, "nodes")
        for name in (self.master, *self.slaves):
            info = backend.node(name)
            rb = read_back(info.data_dir)
            d = os.path.join(nodes_dir, name)
            os.makedirs(d, exist_ok=True)
            write_jsonl(os.path.join(d, "records.jsonl"), rb.records)
            write_json(os.path.join(d, "final.json"), {
                "name": name, "role": info.role.value, "min_offset": rb.min_offset,
                "flushed": rb.end_offset, "wrote": rb.end_offset,
                "first_bad_offset": rb.first_bad_offset,
                "recoveries": self.state.recoveries.get(name, []),
                "disk_damaged": name in self.state.damaged,
                "killed": name in self.state.killed,
            })
            if os.path.exists(info.log_path):
                shutil.copyfile(info.log_path, os.path.join(d, "node.log"))
        write_jsonl(os.path.join(self.run_dir, "history.jsonl"), history)
        write_jsonl(os.path.join(self.run_dir, "faults.jsonl"), self.state.faults)
        write_jsonl(os.path.join(self.run_dir, "observations.jsonl"), self.state.observations)
        if self.consumer is not None:
            consumed, committed, summary = self.consumer.collect()
            write_jsonl(os.path.join(self.run_dir, "consumed.jsonl"), consumed)
            write_jsonl(os.path.join(self.run_dir, "committed.jsonl"), committed)
            write_json(os.path.join(self.run_dir, "consumer.json"), summary)
        write_json(os.path.join(self.run_dir, "params.json"), {
            "schema_version": SCHEMA_VERSION, "run_id": cfg.run_id, "role": cfg.role,
            "flush": cfg.flush, "scenario": cfg.scenario.name, "seed": cfg.seed,
            "backend": cfg.backend, "crash_model": cfg.crash_model,
            "slave_ahead_policy": cfg.slave_ahead_policy, "ha_ship_limit": cfg.ha_ship_limit,
            "corruption_policy": cfg.corruption_policy,
            "nodes": [{"name": n, "role": backend.node(n).role.value}
                      for n in (self.master, *self.slaves)],
            "failpoints": {self.master if t == "master" else self.slaves[0]: s
                           for t, s in self.plan.failpoints.items()},
            "versions": _versions(), "started_ms": started, "ended_ms": now_ms(),
            "plan": {"step_delays_s": list(self.plan.step_delays_s),
                     "workload_seed": self.plan.workload_seed},
            "master_args": list(cfg.master_args),
            "slave_args": list(cfg.slave_args),
            "emulate": sorted(cfg.emulate),
            "config": cfg.to_record(),
        })
        if not cfg.keep_cluster_dir:
            shutil.rmtree(self.cluster_dir, ignore_errors=True)


def _recovered(status: dict[str, Any]) -> int:
    """The master's offset right after its recovery (its `wrote` may already
    include new puts by the time the status is read)."""
    off = status.get("recovered_offset")
    return int(off) if off is not None else int(status["wrote"])


def _versions() -> dict[str, str]:
    from importlib import metadata

    out = {"python": platform.python_version()}
    for dist in ("durability-lab", "grpcio"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "unknown"
    return out


def dump_plan(plan: RunPlan) -> str:
    return json.dumps({"seed": plan.seed, "scenario": plan.scenario,
                       "step_delays_s": plan.step_delays_s, "failpoints": plan.failpoints,
                       "workload_seed": plan.workload_seed}, sort_keys=True)
