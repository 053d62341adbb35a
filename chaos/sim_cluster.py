"""The simulated cluster of `--backend sim` (chaos/sim.py runs the chaos
scenarios on it): a master and its slaves on one VirtualTimeLoop, each a
real Node (cluster/node/server.py) on its own MemoryDisk, HA over one
MemoryNetwork, flushes inline; and the producers' client calls to it.

A node's tasks (and the callbacks they schedule) carry its name in a context
variable (OWNER), so a kill can cancel exactly that node's tasks, and a log
line can be told whose it is."""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import json
import os
import random
import weakref
from collections.abc import Callable, Coroutine, Generator
from dataclasses import dataclass, field
from typing import Any

from chaos.workload import SendOutcome
from cluster.backends.interface import NodeSpec, NodeState
from cluster.node.server import Node, NodeConfig
from ha.transport import Handler, MasterStream, MemoryNetwork
from store.disk import DiskFaults, MemoryDisk
from store.failpoints import Failpoints
from store.flush_executor import InlineFlushExecutor
from store.record import UNIQ_KEY, Message
from store.sim_loop import VirtualTimeLoop
from store.status import INDETERMINATE
from store.store import StoreOpenError

# One-way delay of a message (HA stream or client call), seconds.
NET_DELAY_S = (0.0002, 0.002)
DATA_DIR = "/data"
TOKEN = "sim-token"  # in-process: nothing to protect, and it must not vary

OWNER: contextvars.ContextVar[str | None] = contextvars.ContextVar("sim_node", default=None)


class SimulatedCrash(BaseException):  # noqa: N818 - a crash, not an error to handle
    """Unwinds the node code that hit a `crash` failpoint (a BaseException,
    so no `except Exception` in node code mistakes it for a failure)."""


def _node_config(spec: NodeSpec, listen: str, master: str | None) -> NodeConfig:
    """The NodeConfig `dlab node` would build from the options a local
    backend gives this spec (so both backends run the same configuration)."""
    from cluster.cli.commands import _register_node, node_config_from_args

    parser = argparse.ArgumentParser(prog="dlab")
    _register_node(parser.add_subparsers(dest="cmd"))
    args = parser.parse_args(["node", *spec.node_args(
        data_dir=DATA_DIR, listen=listen, master=master, token_file="-")])
    cfg: NodeConfig = node_config_from_args(args, token=TOKEN)
    return cfg


class _OwnedNetwork(MemoryNetwork):
    """A MemoryNetwork whose served streams run as the serving node's (its
    logs and tasks are the master's, not those of the slave that opened
    the stream)."""

    def serve(self, address: str, handler: Handler, *, token: str) -> None:
        owner = OWNER.get()

        async def owned(stream: MasterStream) -> None:
            OWNER.set(owner)  # in this stream's task only
            await handler(stream)

        super().serve(address, owned, token=token)


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

    @property
    def address(self) -> str:
        return self.config.listen


class SimCluster:
    """A master and its slaves on one VirtualTimeLoop: start, clean stop,
    kill (power cut), partition and heal, as a backend does for a run."""

    def __init__(self, loop: VirtualTimeLoop, rng: random.Random, master: NodeSpec,
                 slaves: tuple[NodeSpec, ...], disk_faults: DiskFaults,
                 on_crash: Callable[[str], object]) -> None:
        self.loop = loop
        self.rng = rng
        self.clock = loop.clock()
        self.network = _OwnedNetwork(loop, delay=lambda _msg: self.net_delay())
        self.disk_faults = disk_faults
        self._on_crash = on_crash  # told the node's name when a failpoint crashes it
        # Each node's tasks, in creation order (weakly: a finished task goes).
        self._tasks: dict[str, weakref.WeakKeyDictionary[asyncio.Task[Any], int]] = {}
        self._created = 0
        loop.set_task_factory(self._task_factory)
        addr = "10.0.0.1:7001"
        self.master = master.name
        self.nodes: dict[str, SimNode] = {
            master.name: self._sim_node(master, addr, None)}
        for i, s in enumerate(slaves):
            self.nodes[s.name] = self._sim_node(s, f"10.0.0.{i + 2}:7001", addr)

    def _sim_node(self, spec: NodeSpec, listen: str, master: str | None) -> SimNode:
        return SimNode(spec.name, spec, _node_config(spec, listen, master),
                       MemoryDisk(self.rng, self.disk_faults, self.clock))

    def net_delay(self) -> float:
        return self.rng.uniform(*NET_DELAY_S)

    def _task_factory(self, loop: asyncio.AbstractEventLoop,
                      coro: Coroutine[Any, Any, Any] | Generator[Any, None, Any],
                      context: contextvars.Context | None = None) -> asyncio.Task[Any]:
        task = asyncio.Task(coro, loop=loop, context=context)
        owner = (context or contextvars.copy_context()).get(OWNER)
        if owner is not None:
            self._created += 1
            self._tasks.setdefault(owner, weakref.WeakKeyDictionary())[task] = self._created
        return task

    # ------------------------------------------------------------ lifecycle
    async def start(self, name: str) -> bool:
        """Start (recover) a node; False when its store refused to open."""
        n = self.nodes[name]
        assert n.state is not NodeState.RUNNING, name
        n.incarnation += 1
        n.calls = {}
        node = Node(n.config, clock=self.clock, executor=InlineFlushExecutor(),
                    network=self.network, disk=n.disk)
        spec = n.spec.failpoints if n.incarnation == 1 else ""  # fires once per run
        node.failpoints = Failpoints(spec, on_crash=lambda: self._crash(name))
        ctx = contextvars.copy_context()
        ctx.run(OWNER.set, name)
        try:
            await self.loop.create_task(node.start(), context=ctx)
        except StoreOpenError as exc:
            n.state, n.refused = NodeState.REFUSED, str(exc)
            return False
        n.node, n.state = node, NodeState.RUNNING
        return True

    async def stop(self, name: str) -> None:
        n = self.nodes[name]
        if n.node is not None and n.state is NodeState.RUNNING:
            await n.node.stop()
        n.node, n.state = None, NodeState.STOPPED

    def kill(self, name: str) -> None:
        """A power cut of the node's machine: its process is gone (tasks
        cancelled, streams reset), its disk keeps what was durable."""
        n = self.nodes[name]
        if n.state is not NodeState.RUNNING:
            return
        n.disk = n.disk.crash()
        n.node, n.state = None, NodeState.STOPPED
        calls, n.calls = n.calls, {}
        for call in calls:  # fails each as its connection reset
            _answer(call, SendOutcome(INDETERMINATE, None, None,
                                      f"UNAVAILABLE: {name} went down during the call"))
        if name == self.master:
            self.network.unserve(n.address)
        else:
            self.network.reset(n.address)
        current = asyncio.current_task()
        owned = self._tasks.pop(name, weakref.WeakKeyDictionary())
        for task, _n in sorted(owned.items(), key=lambda item: item[1]):
            if task is not current:
                task.cancel()

    def _crash(self, name: str) -> None:
        self.kill(name)
        self._on_crash(name)
        raise SimulatedCrash(name)

    def partition(self, a: str, b: str) -> None:
        self.network.partition(self.nodes[a].address, self.nodes[b].address)

    def heal(self, a: str, b: str) -> None:
        self.network.heal(self.nodes[a].address, self.nodes[b].address)

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
        n = self.nodes[self.master].node
        if n is None or n.ha_master is None:
            return False
        return sum(s.state == "connected" for s in n.ha_master.status()) >= len(self.nodes) - 1

    def rejected_slaves(self) -> list[str]:
        n = self.nodes[self.master].node
        if n is None or n.ha_master is None:
            return []
        return sorted(s.slave for s in n.ha_master.status() if s.state == "rejected")

    def export(self, name: str, dest: str) -> None:
        """Write the node's durable disk state as real files under `dest`
        (no lock file; an `abort` marker without the pid it holds)."""
        disk = self.nodes[name].disk

        def walk(src: str, out: str) -> None:
            os.makedirs(out, exist_ok=True)
            for entry in disk.listdir(src):
                path = os.path.join(src, entry)
                if disk.isdir(path):
                    walk(path, os.path.join(out, entry))
                elif entry != "lock":
                    data = b"" if entry == "abort" else disk.durable_bytes(path)
                    with open(os.path.join(out, entry), "wb") as f:
                        f.write(data)

        if disk.isdir(DATA_DIR):
            walk(DATA_DIR, dest)


class SimSender:
    """A producer's client calls: a network delay each way, the node's put
    path (Node.submit) in between. A call to a node that is down, or whose
    node dies before answering, is INDETERMINATE, as a gRPC client sees it.
    (Timers and one future per call, no task: this is the hot path.)"""

    def __init__(self, cluster: SimCluster, name: str) -> None:
        self.cluster = cluster
        self.name = name

    async def send(self, topic: str, body: bytes, msg_id: str, timeout_s: float
                   ) -> SendOutcome:
        c = self.cluster
        loop = c.loop
        answer: asyncio.Future[SendOutcome] = loop.create_future()
        timer = loop.call_later(timeout_s, _answer, answer, SendOutcome(
            INDETERMINATE, None, None, "DEADLINE_EXCEEDED: Deadline Exceeded"))
        msg = Message(topic, body, {UNIQ_KEY: msg_id}, born_timestamp_ms=c.clock.wall_ms())
        loop.call_later(c.net_delay(), self._arrive, answer, msg)
        try:
            return await answer
        finally:
            timer.cancel()

    def _arrive(self, answer: asyncio.Future[SendOutcome], msg: Message) -> None:
        c = self.cluster
        n = c.nodes[self.name]
        node = n.node
        if answer.done():
            return
        if node is None:
            _answer(answer, SendOutcome(INDETERMINATE, None, None,
                                        f"UNAVAILABLE: {self.name} is down (connection refused)"))
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
                r.detail or None))

        node.submit([msg], done)


def _answer(fut: asyncio.Future[SendOutcome], outcome: SendOutcome) -> None:
    if not fut.done():
        fut.set_result(outcome)
