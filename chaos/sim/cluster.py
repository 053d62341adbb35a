"""The simulated cluster of `--backend sim` (chaos/sim/run.py runs the chaos
scenarios on it): a master and its slaves on one VirtualTimeLoop, each a
real Node (cluster/node/server.py) on its own MemoryDisk, HA over one
MemoryNetwork, flushes inline (on cooperative tasks for a node with a
`delay` failpoint armed, so its stalls take virtual time:
store/sim/cooperative_executor.py); and the producers' client calls to it.

A node's tasks (and the callbacks they schedule) carry its name in a context
variable (OWNER), so a kill can cancel exactly that node's tasks, and a log
line can be told whose it is.

A pause is SIGSTOP's twin: every callback the loop would run for a paused
node (its tasks' steps, its timers, its futures' callbacks: whatever runs in
a context owned by it) is held, in order, and run when it resumes, as a
stopped process runs its overdue timers and buffered input at SIGCONT.
Messages already on the wire are the network's (no owner): they arrive in
the paused node's buffers and wait there. A client call to a paused node
waits in its socket until the node resumes; its caller's deadline runs.

A partition cuts the links between two nodes as the local backend's link
proxy does: bytes are held, neither side hears of it but by its own
timeouts, and at heal every stream that lived through the cut is reset.

Failover (docs/design.md, "Failover: routing, promotion, rejoin"): `master`
is the route the producers follow (SimSender without a fixed node sends to
it). A slave reaches its master through a link address
(MemoryNetwork.link), as a local slave through its link proxy. promote
restarts a running slave's Node as master on its own disk, and a running
old master it can reach as its slave; every other slave's link is pointed
at the new master and its HA client reconnects, as the local backend
re-points a link proxy; lose kills a node and moves its
disk aside as evidence, leaving an empty one; rejoin starts a stopped node
as a slave of the current master on whatever disk it has."""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import json
import math
import os
import random
import tempfile
import weakref
from collections.abc import Callable, Coroutine, Generator
from dataclasses import dataclass, field, replace
from typing import Any

from chaos.harness import sparse
from chaos.harness.timings import MachineTimings
from chaos.harness.workload import NO_ROUTE_DETAIL, NO_ROUTE_STATUS, SendOutcome
from chaos.sim.controller import (
    CONTROLLER_ADDRESS,
    CONTROLLER_NAME,
    SCAN_INTERVAL_MS,
    SimController,
)
from cluster.backends.interface import NodeSpec, NodeState
from cluster.node.server import Node, NodeConfig
from ha.controller.config import ControllerConfig
from ha.master import NEVER_REPORTED, note_follower_links
from ha.transport.memory import MemoryNetwork
from ha.transport.streams import Handler, MasterStream
from store.failpoints import Failpoints
from store.log.record import UNIQ_KEY, Message
from store.sim.cooperative_executor import CooperativeFlushExecutor
from store.sim.inline_executor import InlineFlushExecutor
from store.sim.loop import VirtualTimeLoop
from store.sim.memory_disk import DiskFaults, MemoryDisk
from store.status import INDETERMINATE
from store.store import StoreOpenError

# Where network deliveries run: no node's context (a pause holds none of them).
NET_CONTEXT = contextvars.Context()
# One-way delay of a message (HA stream or client call), seconds.
NET_DELAY_S = (0.0002, 0.002)
# How long one group-commit flush (write + fsync) takes. Per run a disk
# speed is drawn (the typical fsync, log-uniform over this range: an idle
# SSD's 0.1 ms to a busy shared disk's 10 ms), and each flush takes 0.5 to
# 1.5 times it. Meanwhile the node goes on and the HA master ships what it
# wrote (store/seams/flush_executor.py), so a crash inside a flush can leave a
# slave ahead under SYNC_FLUSH too, as it can beside a real flusher thread.
FSYNC_S = (0.0001, 0.01)
DATA_DIR = "/data"
# How long a promotion waits for its followers' links to settle, and how
# often it looks: the local backend's promote timeout and poll.
LINK_SETTLE_S = 60.0
LINK_POLL_S = 0.05
TOKEN = "sim-token"  # in-process: nothing to protect, and it must not vary

OWNER: contextvars.ContextVar[str | None] = contextvars.ContextVar("sim_node", default=None)


class FailoverRefused(ValueError):
    """A promote or rejoin the cluster's state does not allow; the message
    says why."""


class SimulatedCrash(BaseException):  # noqa: N818 - a crash, not an error to handle
    """Unwinds the node code that hit a `crash` failpoint (a BaseException,
    so no `except Exception` in node code mistakes it for a failure)."""


def _node_config(spec: NodeSpec, listen: str, master: str | None, token: str = TOKEN,
                 slaves: tuple[str, ...] = (), controller: str | None = None) -> NodeConfig:
    """The NodeConfig `dlab node` would build from the options a local
    backend gives this spec (so both backends run the same configuration);
    `slaves`: a master's slaves by name."""
    from cluster.cli.node_command import node_config_from_args, register_node

    parser = argparse.ArgumentParser(prog="dlab")
    register_node(parser.add_subparsers(dest="cmd"))
    args = parser.parse_args(["node", *spec.node_args(
        data_dir=DATA_DIR, listen=listen, master=master, token_file="-", slaves=slaves,
        controller=controller)])
    cfg: NodeConfig = node_config_from_args(args, token=token)
    # The same store, without write buffers zero-filled at open: memory, not
    # behaviour (buffers are still made as appends need them), and most of
    # a short sim run's memory (docs/performance-notes.md, "The simulated
    # cluster").
    return replace(cfg, store=cfg.store.with_(write_buffers_preallocated=0))


class _OwnedNetwork(MemoryNetwork):
    """A MemoryNetwork whose served streams and calls run as the serving
    node's (its logs and tasks are the master's, not those of the slave that
    opened the stream)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, *,
                 delay: Callable[[Any], float]) -> None:
        super().__init__(loop, delay=delay)
        self._call_owners: dict[str, contextvars.Context] = {}

    def serve(self, address: str, handler: Handler, *, token: str) -> None:
        owner = OWNER.get()

        async def owned(stream: MasterStream) -> None:
            OWNER.set(owner)  # in this stream's task only
            await handler(stream)

        super().serve(address, owned, token=token)

    def serve_calls(self, address: str, servicer: Any, *, token: str) -> None:
        self._call_owners[address] = contextvars.copy_context()
        super().serve_calls(address, servicer, token=token)

    def _run_call(self, address: str, coro: Any) -> asyncio.Task[Any]:
        owner = self._call_owners.get(address)
        return self._loop.create_task(coro, context=None if owner is None else owner.copy())


@dataclass
class SimNode:
    name: str
    spec: NodeSpec
    config: NodeConfig
    disk: MemoryDisk
    state: NodeState = NodeState.STOPPED
    node: Node | None = None
    incarnation: int = 0
    # Client calls the running incarnation has taken and not answered.
    # (A dict: insertion order, so a kill fails them in a reproducible order.)
    calls: dict[asyncio.Future[SendOutcome], None] = field(default_factory=dict)
    refused: str | None = None
    # The running incarnation's context (OWNER = name): its client calls run in it.
    context: contextvars.Context = field(default_factory=contextvars.Context)
    # The running incarnation's flush executor if it has `delay` failpoints.
    stalls: CooperativeFlushExecutor | None = None
    # Failpoints armed at every later start (SimCluster.set_failpoints); None:
    # the spec's, at the first start only.
    failpoints: str | None = None
    # With machine timings: when the running incarnation's put path is free
    # again (each put holds it for timings.put_us, one after another).
    busy_until: float = 0.0
    # Set by lose: the disk the machine had (its durable state, read by the
    # checker, opened by no node) until the node rejoins.
    lost_disk: MemoryDisk | None = None

    # The address this node reaches its master at when it is a slave: a
    # link (MemoryNetwork.link) the cluster points at the master.
    link: str = ""

    @property
    def address(self) -> str:
        return self.config.listen


class SimCluster:
    """A master and its slaves on one VirtualTimeLoop: start, clean stop,
    kill (power cut), partition and heal, as a backend does for a run."""

    def __init__(self, loop: VirtualTimeLoop, rng: random.Random, master: NodeSpec,
                 slaves: tuple[NodeSpec, ...], disk_faults: DiskFaults,
                 on_crash: Callable[[str], object], *, pausable: bool = False,
                 fsync_rng: random.Random | None = None, token: str = TOKEN,
                 timings: MachineTimings | None = None,
                 controller: ControllerConfig | None = None,
                 controller_scan_ms: int = SCAN_INTERVAL_MS) -> None:
        self.loop = loop
        self.rng = rng
        self.clock = loop.clock()
        self.network = _OwnedNetwork(loop, delay=lambda _msg: self.net_delay())
        self.disk_faults = disk_faults
        # Its own generator: the fsync draws shift no other draw of the run.
        self.fsync_rng = fsync_rng if fsync_rng is not None else random.Random(0)
        # A machine's measured times (chaos/harness/timings.py), or a disk
        # speed drawn for the run.
        self.timings = timings
        self.fsync_typical_s = (timings.fsync_us[len(timings.fsync_us) // 2] / 1e6 if timings
                                else math.exp(self.fsync_rng.uniform(*map(math.log, FSYNC_S))))
        self._on_crash = on_crash  # told the node's name when a failpoint crashes it
        # Each node's tasks, in creation order (weakly: a finished task goes).
        self._tasks: dict[str, weakref.WeakKeyDictionary[asyncio.Task[Any], int]] = {}
        self._created = 0
        loop.set_task_factory(self._task_factory)
        # Callbacks held for each paused node, in the order they came due.
        self._held: dict[str, list[tuple[contextvars.Context, Callable[..., object],
                                         tuple[Any, ...]]]] = {}
        self._partitions: set[tuple[str, str]] = set()
        self._soon = loop.call_soon
        # The gate costs every owned callback a call: only a run that pauses has it.
        self.pausable = pausable
        self.token = token  # what the nodes check on calls and streams
        if pausable:
            self._install_pause_gate()
        addr = "10.0.0.1:7001"
        # Controller mode: the controller elects the master and the route
        # follows it (`master`); each node is configured with every other
        # as a possible slave.
        self.controller = (None if controller is None else SimController(
            loop, self.network, self.clock, MemoryDisk(self.rng, self.disk_faults, self.clock),
            controller, token=token, owner=OWNER, scan_interval_ms=controller_scan_ms))
        # The route: the node producers send to (None: its master was lost
        # and no slave is promoted yet).
        self._route: str | None = master.name
        names = (master.name, *(s.name for s in slaves))
        self.nodes: dict[str, SimNode] = {
            master.name: self._sim_node(master, 1, None, tuple(s.name for s in slaves))}
        for i, s in enumerate(slaves):
            self.nodes[s.name] = self._sim_node(
                s, i + 2, addr, tuple(o for o in names if o != s.name) if self.controller else ())

    @property
    def master(self) -> str | None:
        """The route's master. In controller mode, the controller's master
        (kept while the controller is down, as a name server's route is)."""
        if self.controller is not None and self.controller.running:
            self._route = self.controller.master_name()
        return self._route

    @master.setter
    def master(self, name: str | None) -> None:
        self._route = name

    def _sim_node(self, spec: NodeSpec, index: int, master: str | None,
                  slaves: tuple[str, ...] = ()) -> SimNode:
        """Node number `index` (from 1): it listens at 10.0.0.INDEX:7001 and,
        as a slave, reaches its master through its link at
        10.0.1.INDEX:7001, which leads to `master` (an address)."""
        listen, link = f"10.0.0.{index}:7001", f"10.0.1.{index}:7001"
        if self.controller is not None:
            config = _node_config(spec, listen, None, self.token, slaves, CONTROLLER_ADDRESS)
        else:
            if master is not None:
                self.network.link(link, master)
            config = _node_config(spec, listen, None if master is None else link, self.token,
                                  slaves)
        return SimNode(spec.name, spec, config,
                       MemoryDisk(self.rng, self.disk_faults, self.clock), link=link)

    def net_delay(self) -> float:
        if self.timings is not None:
            return self.timings.net_s(self.rng)
        return self.rng.uniform(*NET_DELAY_S)

    def fsync_latency(self) -> float:
        if self.timings is not None:
            return self.timings.fsync_s(self.fsync_rng)
        return self.fsync_typical_s * self.fsync_rng.uniform(0.5, 1.5)

    def _task_factory(self, loop: asyncio.AbstractEventLoop,
                      coro: Coroutine[Any, Any, Any] | Generator[Any, None, Any],
                      context: contextvars.Context | None = None) -> asyncio.Task[Any]:
        task = asyncio.Task(coro, loop=loop, context=context)
        owner = (context or contextvars.copy_context()).get(OWNER)
        if owner is not None:
            self._created += 1
            self._tasks.setdefault(owner, weakref.WeakKeyDictionary())[task] = self._created
        return task

    def _install_pause_gate(self) -> None:
        """Route every callback run in a node-owned context through a gate
        that holds it while that node is paused (see the module doc). The
        loop's call_soon/call_at are replaced on this loop object only;
        asyncio's own scheduling (task steps, future callbacks, call_later)
        goes through them."""
        loop = self.loop
        soon, at = loop.call_soon, loop.call_at
        held = self._held

        def gated(owner: str, ctx: contextvars.Context, cb: Callable[..., object],
                  *args: Any) -> None:
            parked = held.get(owner)
            if parked is not None:
                parked.append((ctx, cb, args))
                return
            cb(*args)

        def call_soon(cb: Callable[..., object], *args: Any,
                      context: contextvars.Context | None = None) -> asyncio.Handle:
            ctx = context if context is not None else contextvars.copy_context()
            owner = ctx.get(OWNER)
            if owner is None:
                return soon(cb, *args, context=ctx)
            return soon(gated, owner, ctx, cb, *args, context=ctx)

        def call_at(when: float, cb: Callable[..., object], *args: Any,
                    context: contextvars.Context | None = None) -> asyncio.TimerHandle:
            ctx = context if context is not None else contextvars.copy_context()
            owner = ctx.get(OWNER)
            if owner is None:
                return at(when, cb, *args, context=ctx)
            return at(when, gated, owner, ctx, cb, *args, context=ctx)

        loop.call_soon = call_soon  # type: ignore[method-assign,assignment]
        loop.call_at = call_at  # type: ignore[method-assign,assignment]

    # ------------------------------------------------------------ lifecycle
    async def start(self, name: str, start_s: float = 0.0) -> bool:
        """Start (recover) a node, its process taking `start_s` to start (a
        machine's, measured; 0: at once), the node down meanwhile; False
        when its store refused to open."""
        n = self.nodes[name]
        assert n.state is not NodeState.RUNNING, name
        if start_s:
            await asyncio.sleep(start_s)
        n.incarnation += 1
        n.calls = {}
        n.busy_until = 0.0
        spec = n.failpoints if n.failpoints is not None else (
            n.spec.failpoints if n.incarnation == 1 else "")  # a run: first start only
        # Its stalls take virtual time and hold back only the work that hit
        # them (store/sim/cooperative_executor.py); other nodes run inline.
        n.stalls = stalls = CooperativeFlushExecutor(
            self.loop, fsync_latency_s=self.fsync_latency) if Failpoints(spec).delays() else None
        node = Node(n.config, clock=self.clock, network=self.network, disk=n.disk,
                    executor=stalls or InlineFlushExecutor(fsync_latency_s=self.fsync_latency))
        node.failpoints = Failpoints(spec, on_crash=lambda: self._crash(name),
                                     stall=stalls.stall if stalls else None)
        ctx = contextvars.copy_context()
        ctx.run(OWNER.set, name)
        n.context = ctx.copy()
        try:
            await self.loop.create_task(node.start(), context=ctx)
        except StoreOpenError as exc:
            n.state, n.refused = NodeState.REFUSED, str(exc)
            return False
        n.node, n.state = node, NodeState.RUNNING
        return True

    async def stop(self, name: str) -> None:
        n = self.nodes[name]
        self.resume(name)
        if n.node is not None and n.state is NodeState.RUNNING:
            await n.node.stop()
        if n.stalls is not None:  # the process exits: its stalled threads end with it
            n.stalls.abandon()
        n.node, n.state = None, NodeState.STOPPED

    def kill(self, name: str) -> None:
        """A power cut of the node's machine: its process is gone (tasks
        cancelled, streams reset), its disk keeps what was durable."""
        n = self.nodes[name]
        if n.state is not NodeState.RUNNING:
            return
        parked = self._held.pop(name, [])  # SIGKILL of a stopped process: it never runs again
        if n.stalls is not None:
            n.stalls.abandon()
        n.disk = n.disk.crash()
        serving_ha = n.node is not None and n.node.ha_master is not None
        n.node, n.state = None, NodeState.STOPPED
        calls, n.calls = n.calls, {}
        for call in calls:  # fails each as its connection reset
            _answer(call, SendOutcome(INDETERMINATE, None, None,
                                      f"UNAVAILABLE: {name} went down during the call",
                                      node=name))
        if serving_ha:
            self.network.unserve(n.address)
        else:
            self.network.reset(n.address)
        self.network.unserve_calls(n.address)
        current = asyncio.current_task()
        owned = self._tasks.pop(name, weakref.WeakKeyDictionary())
        for task, _n in sorted(owned.items(), key=lambda item: item[1]):
            if task is not current:
                task.cancel()
        # What a pause held: task steps now unwind (their tasks are
        # cancelled); the rest runs against the dead node's objects, as any
        # of its callbacks still scheduled at a kill does.
        for ctx, cb, args in parked:
            self._soon(cb, *args, context=ctx)

    def _crash(self, name: str) -> None:
        self.kill(name)
        self._on_crash(name)
        raise SimulatedCrash(name)

    def set_failpoints(self, name: str, spec: str) -> None:
        """Arm `spec` at every later start of the node, as a backend's
        set_failpoints does (a run's planned failpoints arm only its first)."""
        self.nodes[name].failpoints = spec

    def pause(self, name: str) -> None:
        """SIGSTOP: nothing of the node runs until resume (module doc)."""
        assert self.pausable, "a SimCluster made without pausable=True cannot pause"
        n = self.nodes[name]
        if n.state is NodeState.RUNNING:
            self._held.setdefault(name, [])

    def resume(self, name: str) -> None:
        """SIGCONT: what came due while paused runs now, in order."""
        for ctx, cb, args in self._held.pop(name, []):
            self._soon(cb, *args, context=ctx)

    def paused(self, name: str) -> bool:
        return name in self._held

    def _address(self, name: str) -> str:
        """A node's address, or the controller's (CONTROLLER_NAME)."""
        if name == CONTROLLER_NAME:
            return CONTROLLER_ADDRESS
        return self.nodes[name].address

    def partition(self, a: str, b: str) -> None:
        self._partitions.add((a, b))
        self.network.partition(self._address(a), self._address(b))

    def partitioned(self, a: str, b: str) -> bool:
        return (a, b) in self._partitions

    def partitions(self) -> set[tuple[str, str]]:
        """The links cut now, as (a, b) of each partition call."""
        return set(self._partitions)

    def heal(self, a: str, b: str) -> None:
        """Reconnect a and b; the streams that lived through the cut are
        reset first (their held bytes are lost, as the link proxy's are)."""
        if (a, b) not in self._partitions:
            return
        self._partitions.discard((a, b))
        if CONTROLLER_NAME not in (a, b):  # its calls are unary: no stream to reset
            client = b if not self._follows(a) else a
            self.network.reset(self.nodes[client].address)
        self.network.heal(self._address(a), self._address(b))

    def _follows(self, name: str) -> bool:
        """The node is a slave: configured as one, or following a master
        the controller named."""
        n = self.nodes[name]
        if n.node is not None and n.config.controller_mode:
            return n.node.following is not None
        return n.config.master is not None

    def wrote(self, name: str) -> int | None:
        n = self.nodes[name]
        if n.node is None or n.node.store is None:
            return None
        return n.node.store.log.wrote

    def recovery(self, name: str) -> str:
        n = self.nodes[name]
        if n.node is None or n.node.store is None:
            return f"refused: {n.refused}" if n.refused else "not running"
        return json.dumps(n.node.store.state()["recovery"], sort_keys=True)

    def slaves_connected(self) -> bool:
        if self.master is None:
            return False
        n = self.nodes[self.master].node
        if n is None or n.ha_master is None:
            return False
        followers = sum(o.state is NodeState.RUNNING for name, o in self.nodes.items()
                        if name != self.master)
        return sum(s.state == "connected" for s in n.ha_master.status()) >= followers

    def rejected_slaves(self) -> list[str]:
        if self.master is None:
            return []
        n = self.nodes[self.master].node
        if n is None or n.ha_master is None:
            return []
        return sorted(s.slave for s in n.ha_master.status() if s.state == "rejected")

    # ------------------------------------------------------------ failover
    def reconfigure(self, name: str, spec: NodeSpec, master: str | None) -> None:
        """Node `name` runs as `spec` from its next start: a slave of node
        `master`, or (None) a master of every other node. A slave reaches
        its master through its link address (as the local backend's slave
        through its link proxy): pointing that at `master` resets the
        streams through it, so a running slave's HA client reconnects to
        `master` without a restart."""
        n = self.nodes[name]
        slaves = () if master is not None else tuple(o for o in self.nodes if o != name)
        if master is not None:
            self.network.link(n.link, self.nodes[master].address)
        n.spec = spec
        n.config = _node_config(spec, n.address, None if master is None else n.link,
                                self.token, slaves)

    async def promote(self, name: str, spec: NodeSpec,
                      follower_spec: Callable[[str], NodeSpec],
                      start_s: float = 0.0) -> dict[str, str]:
        """Make running slave `name` the master (`spec`) on its own disk, as
        the local backend does (cluster/backends/failover_steps.py
        promote): the route names it at once (producers retry towards it
        while it restarts); it stops cleanly and starts as master, and a
        running old master it can reach restarts as its slave the same way,
        both at once. Every other slave only changes master: its link now
        leads to `name` and its HA client reconnects. Nodes down or cut off
        from `name` (an isolated old master the operator cannot reach) follow
        it from their next start. `start_s`: how long each restarted process
        takes to start (a machine's, measured; 0: at once).
        Returns each running follower's link as `name` reports it once every
        one has settled (connected, rejected, diverged) or LINK_SETTLE_S has
        passed; raises FailoverRefused when `name` is not a running slave
        (nothing changed then)."""
        n = self.nodes[name]
        if n.state is not NodeState.RUNNING or n.config.master is None:
            raise FailoverRefused(f"cannot promote {name}: it is not a running slave "
                                  f"({n.state.value}, {n.config.role.value})")
        old = self._route
        restart = [name]
        if old is not None and old != name and self.nodes[old].state is NodeState.RUNNING \
                and not self._cut(old, name):
            restart.append(old)
        self.master = name
        for r in restart:
            await self.stop(r)
        for other in self.nodes:
            self.reconfigure(other, spec if other == name else follower_spec(other),
                             None if other == name else name)
        started = await asyncio.gather(*(self.start(r, start_s) for r in restart))
        if not started[0]:
            return {}
        followers = [o for o, on in self.nodes.items() if o != name
                     and on.state is NodeState.RUNNING and not self._cut(o, name)]
        return await self._settled_links(name, followers, LINK_SETTLE_S)

    def _cut(self, a: str, b: str) -> bool:
        return self.partitioned(a, b) or self.partitioned(b, a)

    async def _settled_links(self, master: str, followers: list[str], timeout_s: float
                             ) -> dict[str, str]:
        """Each follower's link as `master` reports it ("never reported" for
        one it does not know), once all have settled or `timeout_s` passed
        (cluster/backends/state_dir.py _link_states, on simulated time)."""
        deadline = self.loop.time() + timeout_s
        while True:
            node = self.nodes[master].node
            found = {f: NEVER_REPORTED for f in followers}
            settled = note_follower_links(
                found, node.ha_master.status() if node is not None and node.ha_master is not None
                else ())
            if settled or self.loop.time() >= deadline:
                return found
            await asyncio.sleep(LINK_POLL_S)

    def lose(self, name: str) -> None:
        """The node's machine is gone: killed (a power cut) and its disk
        moved aside (lost_disk) for an empty one; losing the route's master
        leaves the route without one."""
        n = self.nodes[name]
        self.kill(name)
        n.lost_disk = n.disk
        n.disk = MemoryDisk(self.rng, self.disk_faults, self.clock)
        if self.master == name:
            self.master = None

    async def rejoin(self, name: str, spec: NodeSpec, start_s: float = 0.0) -> bool:
        """Start stopped node `name` as a slave (`spec`) of the route's
        master, on its own disk (empty after lose), its process taking
        `start_s` to start; False when its store refused to open. Raises
        FailoverRefused with no master to follow."""
        n = self.nodes[name]
        if self.master is None or self.master == name or n.state is NodeState.RUNNING:
            raise FailoverRefused(f"cannot rejoin {name}: it is running, or the cluster has "
                                  f"no other master to follow (route: {self.master})")
        self.reconfigure(name, spec, self.master)
        return await self.start(name, start_s)

    def export(self, name: str, dest: str) -> None:
        """Write the node's durable disk state as real files under `dest`
        (no lock file; an `abort` marker without the pid it holds); a lost
        node that never rejoined: the disk moved aside."""
        n = self.nodes[name]
        disk = n.lost_disk if n.lost_disk is not None and n.state is not NodeState.RUNNING \
            and not n.disk.isdir(DATA_DIR) else n.disk

        def walk(src: str, out: str) -> None:
            os.makedirs(out, exist_ok=True)
            for entry in disk.listdir(src):
                path = os.path.join(src, entry)
                if disk.isdir(path):
                    walk(path, os.path.join(out, entry))
                elif entry != "lock":
                    data, size = (b"", 0) if entry == "abort" else disk.durable_extent(path)
                    # A preallocated segment is mostly zeros: written with
                    # a hole past its data (reads the same, costs its data).
                    sparse.write_sparse(os.path.join(out, entry), data, size)

        if disk.isdir(DATA_DIR):
            walk(DATA_DIR, dest)


    def damage(self, name: str, fault: Callable[[str, random.Random], str],
               rng: random.Random) -> str:
        """A disk damage step on a stopped node (chaos/harness/disk_faults.py's
        torn_tail or bit_flip): the same function, applied to a real copy
        of the node's durable files; what it changed is written back to
        the MemoryDisk, durably. Returns the fault's detail."""
        n = self.nodes[name]
        assert n.state is not NodeState.RUNNING, f"{name} must be stopped to damage its disk"
        with tempfile.TemporaryDirectory(prefix="dlab-sim-damage-") as tmp:
            self.export(name, tmp)
            detail = fault(tmp, rng)
            commitlog = os.path.join(tmp, "commitlog")
            for entry in sorted(os.listdir(commitlog)):
                path = os.path.join(DATA_DIR, "commitlog", entry)
                with open(os.path.join(commitlog, entry), "rb") as f:
                    data = f.read()
                if n.disk.durable_bytes(path) != data:
                    n.disk.write_file(path, data)
        return detail


class SimSender:
    """A producer's client calls: a network delay each way, the node's put
    path (Node.submit) in between. A call to a node that is down, or whose
    node dies before answering, is INDETERMINATE, as a gRPC client sees it.
    Without a fixed node `name` each call goes to the route's master when it
    is made (cluster/client/routing.py's RoutedClient reads the route before
    every attempt too); a route without a master is SERVICE_NOT_AVAILABLE,
    nothing sent. The outcome names the node that answered.
    (Timers and one future per call, no task: this is the hot path.)"""

    def __init__(self, cluster: SimCluster, name: str | None = None) -> None:
        self.cluster = cluster
        self.name = name

    async def send(self, topic: str, body: bytes, msg_id: str, timeout_s: float
                   ) -> SendOutcome:
        c = self.cluster
        loop = c.loop
        name = self.name or c.master
        if name is None:
            return SendOutcome(NO_ROUTE_STATUS, None, None, NO_ROUTE_DETAIL)
        answer: asyncio.Future[SendOutcome] = loop.create_future()
        timer = loop.call_later(timeout_s, _answer, answer, SendOutcome(
            INDETERMINATE, None, None, "DEADLINE_EXCEEDED: Deadline Exceeded", node=name))
        msg = Message(topic, body, {UNIQ_KEY: msg_id}, born_timestamp_ms=c.clock.wall_ms())
        loop.call_later(c.net_delay(), self._arrive, answer, msg, name)
        try:
            return await answer
        finally:
            timer.cancel()

    def _arrive(self, answer: asyncio.Future[SendOutcome], msg: Message, name: str,
                queued: int | None = None) -> None:
        """The call reached node `name` (`queued`: the incarnation whose put
        path it waited for, with machine timings)."""
        c = self.cluster
        n = c.nodes[name]
        node = n.node
        if answer.done():
            return
        if queued is not None and (node is None or n.incarnation != queued):
            _answer(answer, SendOutcome(INDETERMINATE, None, None,
                                        f"UNAVAILABLE: {name} went down during the call",
                                        node=name))
            return
        if node is None:
            _answer(answer, SendOutcome(INDETERMINATE, None, None,
                                        f"UNAVAILABLE: {name} is down (connection refused)",
                                        node=name))
            return
        held = c._held.get(name)
        if held is not None:  # waits in the socket until the node resumes
            held.append((NET_CONTEXT, self._arrive, (answer, msg, name, queued)))
            return
        timings = c.timings
        if timings is not None and timings.put_us and queued is None:
            # The node's own time per put: puts take its put path one after
            # another, each for put_us, before their append.
            now = c.loop.time()
            n.busy_until = max(now, n.busy_until) + timings.put_s
            c.loop.call_at(n.busy_until, self._arrive, answer, msg, name, n.incarnation,
                           context=NET_CONTEXT)
            return
        calls = n.calls
        calls[answer] = None

        def done(results: list[Any]) -> None:
            calls.pop(answer, None)
            if n.calls is not calls:  # the node died first: its answer reaches no one
                return
            r = results[0]
            stored = r.status.stored
            c.loop.call_later(c.net_delay(), _answer, answer, SendOutcome(
                r.status.value, r.offset if stored else None, r.size if stored else None,
                r.detail or None, None if r.evidence is None else r.evidence.as_json(),
                node=name), context=NET_CONTEXT)

        n.context.run(node.submit, [msg], done)


def _answer(fut: asyncio.Future[SendOutcome], outcome: SendOutcome) -> None:
    if not fut.done():
        fut.set_result(outcome)
