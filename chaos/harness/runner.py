"""One chaos run on local processes or compose containers, start to
finish, written as a result directory (chaos/schema.py) through the
recorder every backend shares (chaos/harness/recorder.py); chaos/sim/run.py is its
twin on the sim, both chaos/harness/run_base.py's RunBase.

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

In controller mode (local and compose backends) the backend also runs the
controller (LOCAL_CONTROLLER's timings): a promote step waits for its
election instead of promoting, a rejoin starts the node, and the end waits
for one elected master before starting the nodes that are down, as on the
sim (docs/design.md, "Controller mode: the broker side").
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import random
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from chaos.harness import disk_faults
from chaos.harness.connect import ROUTE_PREFIX
from chaos.harness.consumer_proc import ConsumerProcess
from chaos.harness.rogue_peer import OVER_BY, RoguePeerProcess
from chaos.harness.run_base import CONTROLLER_KILLED, CONTROLLER_STARTED, RunBase
from chaos.harness.run_config import RUN_CONTROLLER, RunConfig
from chaos.harness.scenarios import Action, Step
from chaos.harness.settle import TIMED_OUT, SettleWatch
from chaos.harness.workload import TOPIC, Sender, Workload, with_retries
from chaos.schema import CONSUMER_NODE
from cluster.backends.interface import (
    CONTROLLER_NAME,
    BackendError,
    ClusterBackend,
    ClusterSpec,
    ControllerSpec,
    NodeState,
)
from cluster.node.role import Role
from ha.config import HAMode

__all__ = ["Run", "RunConfig"]


def now_ms() -> int:
    return time.time_ns() // 1_000_000


BackendFactory = Callable[[str, str], ClusterBackend]  # (backend name, cluster dir)
SenderFactory = Callable[[str, str], Any]  # (address, token) -> async context manager Sender
StatusFn = Callable[[str, str], dict[str, Any]]  # (address, token) -> node status (blocking)

# The controller's timings of a run (every backend's: chaos/harness/run_config.py).
LOCAL_CONTROLLER = RUN_CONTROLLER
# How long a promote step (and the end of a run) waits for an election
# beyond the heartbeat timeout and a scan: the new master's next heartbeat,
# a loaded machine's scheduling.
ELECTION_MARGIN_S = 20.0


@dataclass
class _Links:
    """What the end phase undoes, and the slaves' offsets read while the
    master was down (the slave-ahead observation at its restart)."""

    paused: set[str] = field(default_factory=set)
    partitioned: set[tuple[str, str]] = field(default_factory=set)
    # Old masters a promotion could not reach (cut off), still serving as
    # masters: the end phase stops each and rejoins it as a slave.
    second_masters: set[str] = field(default_factory=set)
    # Pairs partitioned whose link a promotion replaced (both now slaves of
    # the new master): nothing left to heal on the backend, the heal step
    # still records them, as the sim's pairwise partitions are.
    replaced: set[tuple[str, str]] = field(default_factory=set)
    slave_offsets_while_master_down: dict[str, int] = field(default_factory=dict)


class Run(RunBase):
    def __init__(self, cfg: RunConfig, *, backend_factory: BackendFactory,
                 sender_factory: SenderFactory, status: StatusFn,
                 log: Callable[[str], None] = lambda s: None) -> None:
        super().__init__(cfg, log)
        self._backend_factory = backend_factory
        self._sender_factory = sender_factory
        self._status = status
        self.state = _Links()
        self.token = secrets.token_hex(16)
        self.consumer: ConsumerProcess | None = None
        self.rogue_peers: list[RoguePeerProcess] = []
        self.controller: ControllerSpec | None = (
            dataclasses.replace(LOCAL_CONTROLLER, elect_unclean=cfg.elect_unclean)
            if cfg.ha_mode is HAMode.CONTROLLER else None)

    # ------------------------------------------------------------ helpers
    def _record_recovery(self, backend: ClusterBackend, name: str) -> dict[str, Any] | None:
        try:
            st = self._status(backend.node(name).address, self.token)
        except Exception as exc:  # a status failure must not end the run
            self.record.recovery(name, f"status unavailable: {exc}")
            return None
        self.record.recovery(name, str(st.get("recovery", "")))
        return st

    def _wrote(self, backend: ClusterBackend, name: str) -> int | None:
        try:
            return int(self._status(backend.node(name).address, self.token)["wrote"])
        except Exception:
            return None

    # -------------------------------------------------------------- steps
    def _apply(self, backend: ClusterBackend, step: Step) -> None:
        t = now_ms()
        rng = self._damage_rng()
        if step.action is Action.PARTITION:  # the master-slave links
            master = self.acting_master
            peers = list(self.slaves)
            if step.target == "master_and_controller" and self.controller is not None:
                peers.append(CONTROLLER_NAME)  # its link proxy to the controller
            for peer in peers:
                backend.partition(master, peer)
                self.state.partitioned.add((master, peer))
                self._record_partition(master, peer, t)
            return
        if step.action is Action.HEAL:  # every link cut, whoever is master now
            self._heal_all(backend, t, None)
            return
        if (step.target == "master_and_controller" and self.controller is not None
                and step.action in (Action.KILL, Action.START)):
            self._with_controller(backend, step.action, t)
            return
        for name in self._targets(step.target, lambda s: self._wrote(backend, s)):
            if name == CONSUMER_NODE:
                self._consumer_step(step.action, t)
            else:
                self._node_step(backend, step.action, name, t, rng)

    def _with_controller(self, backend: ClusterBackend, action: Action, t: int) -> None:
        """Controller mode: kill the controller's process and then the
        master (no election can follow while the controller is down), or
        start the controller and then the master (which asks it whom to
        serve). Recorded on the master's kill and start, the controller
        named in their detail (it is no node of the run)."""
        master = self.acting_master
        if action is Action.KILL:
            backend.kill_controller()
            backend.kill(master)
            self.record.kill(master, t, detail=CONTROLLER_KILLED)
        else:
            backend.start_controller()
            self._start_recorded(backend, master, "start", t, detail=CONTROLLER_STARTED)

    def _consumer_step(self, action: Action, t: int) -> None:
        assert self.consumer is not None
        if action is Action.KILL:
            self.consumer.kill()
            self.record.fault("kill", CONSUMER_NODE, t, detail="consumer process (SIGKILL)")
        elif action is Action.STOP:
            was_running = self.consumer.running
            clean = self.consumer.stop()
            self.record.fault("stop", CONSUMER_NODE, t, end=now_ms(),
                              detail="consumer stopped cleanly (committed)" if clean
                              else "consumer did not stop cleanly in 10 s: SIGKILLed"
                              if was_running else "consumer had already exited")
        else:
            self.consumer.start()
            self.record.fault("start", CONSUMER_NODE, t, end=now_ms(),
                              detail=f"consumer incarnation {self.consumer.incarnations}")

    def _node_step(self, backend: ClusterBackend, action: Action, name: str, t: int,
                   rng: random.Random) -> None:
        if action is Action.KILL:
            backend.kill(name)
            self.record.kill(name, t)
        elif action is Action.STOP:
            backend.stop(name)
            self.record.fault("stop", name, t)
        elif action in (Action.START, Action.RESTART):
            self._start_recorded(backend, name, action, t)
        elif action is Action.PAUSE:
            backend.pause(name)
            self.state.paused.add(name)
            self.record.fault("pause", name, t)
        elif action is Action.RESUME:
            backend.resume(name)
            self.state.paused.discard(name)
            self.record.close_fault("pause", name, now_ms())
            self.record.fault("resume", name, t, end=t)
        elif action is Action.AWAIT_CRASH:
            self._await_crash(backend, name, t)
        elif action is Action.ROGUE_PEER:
            self._rogue_peer(backend, name, t)
        elif action in (Action.LOSE, Action.PROMOTE, Action.REJOIN):
            self._failover_step(backend, action, name, t)
        elif action in (Action.TORN_TAIL, Action.BIT_FLIP):
            fn = disk_faults.torn_tail if action is Action.TORN_TAIL else disk_faults.bit_flip
            detail = fn(backend.node(name).data_dir, rng)
            self.record.damage(action, name, t, now_ms(), detail)
        else:  # pragma: no cover - partition and heal act on links (_apply)
            raise ValueError(action)

    def _heal_all(self, backend: ClusterBackend, t: int, detail: str | None) -> None:
        for a, b in sorted(self.state.partitioned | self.state.replaced):
            if (a, b) in self.state.partitioned:
                backend.heal(a, b)
            self._record_heal(a, b, t, now_ms(), detail)
        self.state.partitioned.clear()
        self.state.replaced.clear()

    def _failover_step(self, backend: ClusterBackend, action: Action, name: str,
                       t: int) -> None:
        """lose, promote, rejoin through the backend's failover operations
        (cluster/backends/failover.py has the rules); one the cluster's
        state refuses is recorded with why, and the run goes on."""
        try:
            if action is Action.LOSE:
                backend.lose(name)
                self.record.killed.add(name)
                self.record.fault("lose", name, t, detail="the machine is gone (killed, its "
                                                          "store moved aside)")
                self._lost_node(name)
            elif action is Action.PROMOTE and self.controller is not None:
                self._await_election(backend, t)
            elif action is Action.PROMOTE:
                old = self.acting_master
                before = self._slave_ends(lambda s: self._wrote(backend, s))
                info = backend.promote(name)
                self._promoted(name)
                links = info.extra.get("links") or {}
                cut_off = sorted(info.extra.get("cut_off") or ())
                self.state.second_masters.update(cut_off)
                now = now_ms()
                self.record.fault("promote", name, t, peer=old, end=now,
                                  detail="followers: " + (", ".join(
                                      f"{n} {v}" for n, v in sorted(links.items())) or "none")
                                  + "".join(f"; {n} cut off, still a master" for n in cut_off))
                self._record_recovery(backend, name)
                self._record_followers(name, before, links, now)
                # A follower's cut link led to the old master; its new one
                # is whole (cluster/backends/failover.py follow_through_proxy).
                moved = {p for p in self.state.partitioned if name not in p}
                self.state.partitioned -= moved
                self.state.replaced |= moved
            else:
                self._rejoin(backend, name, t, None)
        except BackendError as exc:
            self.record.fault(action.value, name, t, end=now_ms(), detail=f"refused: {exc}")

    def _rejoin(self, backend: ClusterBackend, name: str, t: int, detail: str | None) -> None:
        """Start `name` as a slave of the route's master, recording how far
        ahead of that master its recovered log is (an old master's may be)."""
        master = self.acting_master
        ahead_of = self._wrote(backend, master)
        if self._armed(name):
            backend.set_failpoints(name, "")
        if self.controller is not None:
            # The node starts and asks the controller whom to follow (it
            # cuts its log to the point it shares with that master).
            if not self._start(backend, name, "start", t):
                return
        else:
            backend.rejoin(name)
        self.lost.discard(name)
        self.record.fault("rejoin", name, t, peer=master, end=now_ms(), detail=detail)
        st = self._record_recovery(backend, name)
        if st is not None and ahead_of is not None:
            self.record.slave_ahead(now_ms(), master, ahead_of, {name: _recovered(st)})

    def _start_recorded(self, backend: ClusterBackend, name: str, action: str, t: int,
                        detail: str | None = None) -> None:
        """Start (or restart) a node and record it: its fault, its recovery,
        and for the master whether a slave is ahead of what it recovered.
        After a failover a node other than the master comes back by a rejoin."""
        if name != self.master and self.old_master is not None and self.master is not None:
            self._rejoin(backend, name, t, detail)
            return
        if name == self.master:
            self._before_master_start(backend)
        if not self._start(backend, name, action, t):
            return
        self.record.fault(action, name, t, end=now_ms(), detail=detail)
        st = self._record_recovery(backend, name)
        if name == self.master and st is not None:
            self.record.slave_ahead(now_ms(), name, _recovered(st),
                                    self.state.slave_offsets_while_master_down)
            self.state.slave_offsets_while_master_down = {}

    def _rogue_peer(self, backend: ClusterBackend, name: str, t: int) -> None:
        first = self._wrote(backend, name)
        if first is None:
            self.record.fault("rogue_peer", name, t, detail="not started: the node's status "
                                                            "(its end offset) was unavailable")
            return
        rogue = RoguePeerProcess(os.path.join(self.run_dir, f"rogue_peer{len(self.rogue_peers)}"
                                                            ".log"))
        rogue.start(backend.node(name).address, os.path.join(self.cluster_dir, "token"), first)
        self.rogue_peers.append(rogue)
        self.record.rogue_peer(name, t, first, OVER_BY)

    def _stop_rogue_peers(self) -> None:
        for rogue in self.rogue_peers:
            if rogue.stop() is not None:
                self.record.close_fault("rogue_peer", self.acting_master, now_ms())

    def _await_crash(self, backend: ClusterBackend, name: str, t: int) -> None:
        spec = self._armed(name)
        # The restarted node runs without it: _start clears the plan's failpoints.
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            if backend.node(name).state == NodeState.STOPPED:
                self._failpoint_fired(name, spec)
                return
            time.sleep(0.05)
        try:
            backend.kill(name)
        except BackendError:
            # It fired between the last look and the kill (a loaded machine
            # reaches the hit count late): the failpoint's crash, not ours.
            if backend.node(name).state != NodeState.STOPPED:
                raise
            self._failpoint_fired(name, spec)
            return
        self.record.kill(name, now_ms(), detail=f"failpoint {spec} did not fire in 10 s")

    def _failpoint_fired(self, name: str, spec: str) -> None:
        self.record.killed.add(name)
        self.record.fault("failpoint", name, now_ms(), detail=f"fired: {spec}")

    # ------------------------------------------------------ controller mode
    def _serving(self, backend: ClusterBackend, name: str) -> bool:
        """Controller mode: node `name` serves as a master (the role its
        election gave it)."""
        try:
            st = self._status(backend.node(name).address, self.token)
        except Exception:
            return False
        return str(st.get("role")) != Role.SLAVE.value

    def _follow_election(self, backend: ClusterBackend, t: int, detail: str) -> bool:
        """Controller mode: the route names a master the run does not have
        as its master yet, serving: record it as a promotion, as the classic
        scenarios' by hand (chaos/sim/run.py's twin). True when it did."""
        try:
            route = backend.route()
        except BackendError:
            return False
        return self._take_election(route.master, lambda n: self._serving(backend, n),
                                   route.since_ms, t, now_ms, detail)

    def _await_sync_state_set(self, backend: ClusterBackend) -> None:
        """Controller mode: up means in sync, as on the sim: the load starts
        once the controller's SyncStateSet holds every node (a set of the
        master alone would acknowledge the first puts by itself). Bounded:
        a run whose set never fills starts anyway, and its log says so."""
        sync_state_set = getattr(backend, "sync_state_set", None)
        if sync_state_set is None:
            return
        deadline = time.monotonic() + 30.0
        while time.monotonic() < deadline:
            if sync_state_set() >= set(self.nodes):
                return
            time.sleep(0.05)
        self._log(f"  the SyncStateSet holds {sorted(sync_state_set())} after 30 s, not "
                  "every node: the load starts anyway")

    def _election_wait_s(self) -> float:
        c = self.controller
        assert c is not None
        return (c.heartbeat_timeout_ms + c.scan_interval_ms) / 1000 + ELECTION_MARGIN_S

    def _await_election(self, backend: ClusterBackend, t: int) -> None:
        """Controller mode's PROMOTE step: no operator; wait for the
        controller's election (its heartbeat timeout, a scan, the new
        master's next heartbeat), then follow it."""
        wait_s = self._election_wait_s()
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if self._follow_election(backend, t, "elected by the controller"):
                return
            time.sleep(0.05)
        self.record.fault("promote", self.acting_master, t, end=now_ms(),
                          detail=f"refused: the controller elected no new master within "
                                 f"{wait_s:g} s (route: {backend.route().master})")

    def _one_elected_master(self, backend: ClusterBackend) -> None:
        """Controller mode: the controller's master is the one master. A
        deposed master still serving learns it at its next heartbeat and
        follows; a controller with no master gets one from the next
        election. Waited for here, bounded."""
        deadline = time.monotonic() + self._election_wait_s()
        while time.monotonic() < deadline:
            self._follow_election(backend, now_ms(), "elected by the controller")
            master = backend.route().master
            running = [n for n in self.nodes
                       if backend.node(n).state == NodeState.RUNNING]
            second = [n for n in running if n != master and self._serving(backend, n)]
            if not second and master is not None and self._serving(backend, master):
                return
            time.sleep(0.1)

    def _before_master_start(self, backend: ClusterBackend) -> None:
        """Read each slave's max offset while the master is down: nothing
        can move it until the master is back."""
        self.state.slave_offsets_while_master_down.clear()
        for s in self.slaves:
            if backend.node(s).state == NodeState.RUNNING and s not in self.state.paused:
                w = self._wrote(backend, s)
                if w is not None:
                    self.state.slave_offsets_while_master_down[s] = w

    # ---------------------------------------------------------------- run
    def execute(self) -> str:
        self.record.open()
        started = now_ms()
        backend = self._backend_factory(self.cfg.backend, self.cluster_dir)
        spec = ClusterSpec(directory=self.cluster_dir,
                           master=self._spec(self.acting_master, self.cfg.role),
                           slaves=tuple(self._spec(s, Role.SLAVE) for s in self.slaves),
                           controller=self.controller)
        history: list[dict[str, Any]] = []
        try:
            backend.up(spec, token=self.token)
            for name in self.nodes:
                self._record_recovery(backend, name)
            if self.controller is not None:
                self._await_sync_state_set(backend)
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
        master = self.acting_master
        # A failover scenario's producers follow the cluster's route
        # (cluster/client/routing.py), retrying.
        target = (f"{ROUTE_PREFIX}{self.cluster_dir}" if _fails_over(cfg.scenario.steps)
                  else backend.node(master).address)
        loop = asyncio.get_running_loop()
        async with self._sender_factory(target, self.token) as sender:
            sender_: Sender = sender
            workload = Workload(with_retries(cfg.workload, cfg.scenario.retries), sender_,
                                seed=self.plan.workload_seed, node=master,
                                run_tag=f"s{cfg.seed}")
            load = asyncio.create_task(workload.run(cfg.scenario.load_s + 60.0))
            if cfg.scenario.consume:
                self.consumer = ConsumerProcess(
                    self.run_dir, token_file=os.path.join(self.cluster_dir, "token"),
                    topic=TOPIC, commit_interval_ms=cfg.scenario.consumer_commit_interval_ms,
                    targets={n: backend.node(n).address for n in self.nodes})
                self.consumer.start()
                if cfg.scenario.consumer_ready != "start":
                    await self._consumer_ready(cfg.scenario.consumer_ready)
            t0 = loop.time()
            for delay, step in zip(self.plan.step_delays_s, cfg.scenario.steps, strict=True):
                await asyncio.sleep(delay)
                if self.controller is not None and step.action is not Action.PROMOTE:
                    # An election since the last step (a promote step waits
                    # for one itself, and records it).
                    await loop.run_in_executor(None, self._follow_election, backend, now_ms(),
                                               "elected by the controller")
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
            self.record.close_fault("pause", name, now_ms())
            self.record.fault("resume", name, t, end=t, detail="end of run")
        self.state.paused.clear()
        self._heal_all(backend, t, "end of run")
        if self.controller is not None:
            self._one_elected_master(backend)
        else:
            self._one_master(backend)
        for name in self.nodes:
            if backend.node(name).state == NodeState.STOPPED and name not in self.lost:
                self._start_recorded(backend, name, "start", t, detail="end of run")
        self._settle(backend)
        if self.consumer is not None:
            # The consumer drains what the cluster holds before the nodes stop
            # (the load has ended), so "stored but never delivered" means
            # what it says.
            if not self.consumer.running:
                t = now_ms()
                self.consumer.start()
                self.record.fault("start", CONSUMER_NODE, t, end=now_ms(),
                                  detail=f"end of run: consumer incarnation "
                                         f"{self.consumer.incarnations}")
            self.consumer.drain()
        for name in (*self.slaves, self.acting_master):
            if backend.node(name).state not in (NodeState.REFUSED, NodeState.LOST):
                backend.stop(name)

    def _one_master(self, backend: ClusterBackend) -> None:
        """A node still serving as a master that the route no longer names
        (an isolated master, promoted over while cut off) is stopped and
        rejoins as a slave of the route's master with its own disk, as on
        the sim (chaos/sim/run.py): two masters until here, one from here."""
        for name in sorted(self.state.second_masters):
            t = now_ms()
            backend.stop(name)
            self.record.fault("stop", name, t, end=now_ms(), detail="end of run: a second master")
            self._rejoin(backend, name, t, "end of run: a second master rejoins as a slave")
        self.state.second_masters.clear()

    def _start(self, backend: ClusterBackend, name: str, action: str, t: int) -> bool:
        """Start (or restart) a node; False when it refused to (its store holds
        corruption of flushed data and its corruption policy is refuse, or a
        repair found no replica): recorded as a `refused` fault, and the node
        stays down for the rest of the run, its store as it was.

        A failpoint fires once per run, as on the sim backend: the node
        starts again without the ones the plan armed (a backend keeps a
        node's failpoints across its restarts)."""
        if self._armed(name):
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
            self.record.refused(name, t, str(info.extra.get("refused", "")))
            return False
        return True

    def _settle(self, backend: ClusterBackend) -> None:
        deadline = time.monotonic() + self.cfg.settle_timeout_s
        master = self.acting_master
        live = [s for s in self.slaves if s not in self.lost]
        watch = SettleWatch(len(live), time.monotonic())
        detail = TIMED_OUT
        while time.monotonic() < deadline:
            try:
                st = self._status(backend.node(master).address, self.token)
            except Exception:
                st = {}
            rejected = [link.get("slave") for link in st.get("slaves", [])
                        if link.get("state") == "rejected"]
            links = "; ".join(str(x.get("detail", "")) for x in st.get("slaves", []))
            verdict = watch.verdict(time.monotonic(), st.get("wrote"),
                                    [self._wrote(backend, s) for s in live], rejected,
                                    stall_note=links)
            if verdict is not None:
                detail = verdict
                break
            time.sleep(0.1)
        self.record.settle(now_ms(), master, self._wrote(backend, master), detail)

    def _write(self, backend: ClusterBackend, history: list[dict[str, Any]], started: int
               ) -> None:
        for name in self.nodes:
            info = backend.node(name)
            # A node lost for good is read back from its moved-aside store.
            lost_dirs = info.extra.get("lost") if name in self.lost else None
            data_dir = lost_dirs[-1] if lost_dirs else info.data_dir
            self.record.node(name, info.role, data_dir, log_path=info.log_path)
        self.record.run_files(history, self.consumer)
        extra = ({} if self.controller is None
                 else {"controller": dataclasses.asdict(self.controller)})
        self._write_params(backend=self.cfg.backend,
                           roles={n: backend.node(n).role for n in self.nodes},
                           started_ms=started, ended_ms=now_ms(), extra=extra)
        if not self.cfg.keep_cluster_dir:
            self.record.drop_cluster_dir()


def _fails_over(steps: tuple[Step, ...]) -> bool:
    return any(s.action in (Action.LOSE, Action.PROMOTE, Action.REJOIN) for s in steps)


def _recovered(status: dict[str, Any]) -> int:
    """The master's offset right after its recovery (its `wrote` may already
    include new puts by the time the status is read)."""
    off = status.get("recovered_offset")
    return int(off) if off is not None else int(status["wrote"])
