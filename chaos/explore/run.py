"""One run of an exploration: the sim run (chaos/sim/run.py) of the small
workload, watched for crash points, and crashed at one of them.

A crash point is an event where a node's durable or replicated state
changes, from the moment the cluster is up (every node started, the slaves
connected) until the load ends: each file write or size change, fsync and
directory fsync completing (store/sim/memory_disk.py tells them), and the
failpoints a replication frame shipped (`after_ship_before_ack`), a range
received and applied (`slave_after_append_before_report`), a report of a
new offset (`slave_after_report`) and an answer sent to a client
(`after_put_answered`) pass (store/failpoints.py). The run is deterministic,
so the k-th event of the reference run is the k-th of every run of the same
options until it crashes there.

The reference run (no crash) records every event with the disk states a
crash of each target could leave there (chaos/explore/disk_states.py). A
crash run kills its target nodes right after its event, as a power cut:
each crashed disk becomes the chosen state (MemoryDisk.crash(kept=...)),
nothing drawn; the node that was running the event's code is unwound there
(SimulatedCrash), as a `crash` failpoint does.

When the load ends the crashed nodes restart and recover; with a load
after the restart (`after`), the run waits until the master has heard
from every running slave again (each accepted, rejected as ahead, or told
to truncate: RESTART_WAIT_S at most), then the producers send that many
more puts to the recovered cluster, answered and judged as the others
(their history rows follow the first phase's). Its events are no crash
points. The end of the run is every sim run's: replication settled, the
stores read back.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from chaos.explore import disk_states
from chaos.explore.disk_states import CrashState, States
from chaos.explore.workload import ELECTED
from chaos.harness.run_config import RunConfig
from chaos.harness.scenarios import Action
from chaos.harness.workload import Workload, WorkloadConfig
from chaos.sim.cluster import OWNER, SimCluster, SimSender, SimulatedCrash
from chaos.sim.run import SimRun
from cluster.backends.interface import NodeState
from ha.master import SlaveLink
from store.sim.loop import VirtualTimeLoop
from store.sim.memory_disk import NO_FAULTS, Kept

# Failpoints whose passing changes replicated state or what a client knows,
# and the event each names.
FAILPOINT_EVENTS = {
    "after_ship_before_ack": "ship-sent",
    "slave_after_append_before_report": "ship-applied",
    "slave_after_report": "report-sent",
    "after_put_answered": "answer-sent",
}
TARGETS = ("master", "slave", "both")
# At most this long (simulated) for the master to hear from its slaves
# after the restart: a slave's reconnect backoff is at most 5 s (ha/config.py).
RESTART_WAIT_S = 10.0
POLL_S = 0.01


@dataclass(frozen=True)
class Event:
    """One crash point: the index-th event of the run."""

    index: int
    node: str
    kind: str  # write, fsync, dir-fsync, ship-sent, ship-applied, report-sent, answer-sent
    detail: str  # the file, for a disk event
    at_ms: int

    def label(self) -> str:
        return f"{self.node} {self.kind}" + (f" {self.detail}" if self.detail else "")

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "node": self.node, "kind": self.kind,
                "detail": self.detail, "at_ms": self.at_ms}


@dataclass(frozen=True)
class CrashPlan:
    """Crash `nodes` right after event `event` (which must be `expect`),
    leaving each the disk state `state` says."""

    event: int
    target: str
    nodes: tuple[str, ...]
    state: CrashState
    expect: str = ""  # the event's label in the reference run ("" : not checked)
    # When the load ends: "" the crashed nodes restart in place; a slave's
    # name: it is promoted by hand (classic); ELECTED: the controller's
    # election is awaited (controller mode). The old master then rejoins.
    promote: str = ""


@dataclass
class Probe:
    """Counts the run's events once armed; at the planned one, crashes."""

    plan: CrashPlan | None
    on_event: Callable[[Event], None]
    armed: bool = False
    events: list[Event] = field(default_factory=list)
    crashed: Event | None = None


class ExploreRun(SimRun):
    """A sim run watched for crash points (the module docstring): with
    `plan` None the reference run, recording each event and the states a
    crash of each target would leave there; with a plan, a crash run."""

    def __init__(self, cfg: RunConfig, *, plan: CrashPlan | None, limit: int,
                 sector_bytes: int = disk_states.SECTOR_BYTES, fsync_s: float | None = None,
                 explore_record: Mapping[str, Any] | None = None,
                 after: tuple[WorkloadConfig, float] | None = None) -> None:
        super().__init__(cfg)
        # Nothing drawn at a crash: the states are chosen (the torn-write
        # probability is the one draw the sim run makes for its disks).
        self.disk_faults = NO_FAULTS
        self.limit = limit
        self.sector_bytes = sector_bytes
        self.crash_plan = plan
        self.fsync_s = fsync_s
        self.explore_record = dict(explore_record or {})
        self.probe = Probe(plan, self._event)
        # Per event (reference run): target -> the states a crash there leaves.
        self.states: list[dict[str, States]] = []
        self.after = after  # the load after the restart and how long it runs
        self.after_history: list[dict[str, Any]] = []

    def target_nodes(self, target: str) -> tuple[str, ...]:
        return tuple(self._targets(target))

    async def _up(self, loop: VirtualTimeLoop) -> SimCluster:
        cluster = await super()._up(loop)
        if self.fsync_s is not None:  # the disk's speed from here on (each fsync 0.5-1.5x it)
            cluster.fsync_typical_s = self.fsync_s
        for name in self.nodes:
            self._watch(cluster, name)
        self.probe.armed = True
        return cluster

    def _watch(self, cluster: SimCluster, name: str) -> None:
        n = cluster.nodes[name]
        assert n.node is not None, f"{name} did not start"
        clock = cluster.clock

        def on_disk(kind: str, path: str) -> None:
            self._seen(name, kind, path, clock.wall_ms())

        def on_failpoint(fp: str) -> None:
            kind = FAILPOINT_EVENTS.get(fp)
            if kind is not None:
                self._seen(name, kind, "", clock.wall_ms())

        n.disk.observe = on_disk
        n.node.failpoints.observe = on_failpoint

    @property
    def promoted(self) -> str | None:
        """The node promoted in the crashed master's place (None: none)."""
        return self.master if self.old_master is not None else None

    async def _end_phase(self, cluster: SimCluster) -> None:
        self.probe.armed = False  # the load is over: the clean stops are no crash points
        plan = self.crash_plan
        promote = plan.promote if plan is not None and self.probe.crashed is not None else ""
        if promote:
            await self._take_over(cluster, promote)
        if self.after is not None or promote:
            await self._restart_crashed(cluster)
        if self.after is not None:
            await self._load_after(cluster, *self.after)
        await super()._end_phase(cluster)

    async def _take_over(self, cluster: SimCluster, promote: str) -> None:
        """The failover of a crashed master: `promote` (a running slave)
        promoted by hand, as a scenario's promote step does; or in
        controller mode the controller's election, awaited (its heartbeat
        timeout, a scan). Either is recorded as a `promote` fault."""
        t = cluster.clock.wall_ms()
        if promote == ELECTED:
            await self._await_election(cluster, t)
        else:
            await self._failover_step(cluster, Action.PROMOTE, promote, t)

    async def _restart_crashed(self, cluster: SimCluster) -> None:
        """The crashed nodes restart and recover (as the end phase would
        restart them; after a failover they rejoin as slaves), and the
        master hears from every running slave."""
        since = cluster.clock.wall_ms()
        restarted = [n for n in self.nodes if cluster.nodes[n].state is NodeState.STOPPED
                     and n not in self.lost]
        for name in restarted:
            await self._start(cluster, name, "start", cluster.clock.wall_ms(),
                              "explore: restarted after the crash")
        deadline = cluster.loop.time() + RESTART_WAIT_S
        while not self._heard(cluster, set(restarted), since) and cluster.loop.time() < deadline:
            await asyncio.sleep(POLL_S)

    def _heard(self, cluster: SimCluster, restarted: set[str], since_ms: int) -> bool:
        """The route's master serves and has heard from every running slave
        (a restarted one since `since_ms`): each is connected, rejected as
        ahead, truncating or diverged, none still on its way back."""
        master = cluster.master
        node = cluster.nodes[master].node if master is not None else None
        if node is None or node.ha_master is None:
            return False
        links = {link.slave: link for link in node.ha_master.status()}
        for name in self.nodes:
            if name == master or cluster.nodes[name].state is not NodeState.RUNNING:
                continue
            link = links.get(name)
            if link is None or link.state is SlaveLink.DISCONNECTED or (
                    name in restarted and link.last_report_ms < since_ms):
                return False
        return True

    async def _load_after(self, cluster: SimCluster, config: WorkloadConfig,
                          duration_s: float) -> None:
        """The puts after the restart, to the route's master; their rows
        numbered after the first phase's (_write joins them)."""
        workload = Workload(config, SimSender(cluster), seed=self.plan.workload_seed + 1,
                            node=self.acting_master, run_tag=f"s{self.cfg.seed}-after",
                            clock_ns=cluster.loop.wall_ns, monotonic=cluster.loop.time)
        self.after_history = await workload.run(duration_s)

    def _write(self, cluster: SimCluster, history: list[dict[str, Any]], *args: Any) -> None:
        first = len(history)
        after = [{**row, "op_id": first + row["op_id"]} for row in self.after_history]
        super()._write(cluster, [*history, *after], *args)

    def _seen(self, node: str, kind: str, detail: str, at_ms: int) -> None:
        probe = self.probe
        if not probe.armed or probe.crashed is not None:
            return
        event = Event(len(probe.events), node, kind, detail, at_ms)
        probe.events.append(event)
        probe.on_event(event)

    def _event(self, event: Event) -> None:
        plan = self.crash_plan
        if plan is None:
            per_node = {name: self._node_states(name) for name in self.nodes}
            self.states.append({t: disk_states.crash_states(
                {n: per_node[n] for n in self.target_nodes(t)}, self.limit) for t in TARGETS})
            return
        if event.index != plan.event:
            return
        if plan.expect and event.label() != plan.expect:
            raise RuntimeError(f"event {event.index} is {event.label()!r} where the reference "
                               f"run had {plan.expect!r}: the run is not deterministic")
        self._crash(event, plan)

    def _node_states(self, name: str) -> tuple[list[list[tuple[str, Kept]]], int]:
        disk = self.cluster.nodes[name].disk
        return disk_states.node_states(disk.unsynced(), disk.durable_range,
                                       sector_bytes=self.sector_bytes)

    def _crash(self, event: Event, plan: CrashPlan) -> None:
        cluster = self.cluster
        self.probe.crashed = event
        t = cluster.clock.wall_ms()
        for name in plan.nodes:
            n = cluster.nodes[name]
            if n.state is not NodeState.RUNNING:
                continue
            before = n.disk
            cluster.kill(name)
            n.disk = before.crash(kept=plan.state.get(name, {}))
            self.crashed_at.setdefault(name, t)
            self.record.kill(name, t, detail=f"explore: crash at event {event.index} "
                                             f"({event.label()})")
        if OWNER.get() in plan.nodes:
            raise SimulatedCrash(OWNER.get())

    def _write_params(self, **kw: Any) -> None:
        record = dict(self.explore_record)
        record["trace"] = [e.to_json() for e in self.probe.events]
        kw["extra"] = {**kw.get("extra", {}), "explore": record}
        super()._write_params(**kw)
