"""The sim backend under the backend contract: a ClusterBackend over a
SimCluster (chaos/sim/cluster.py) on its own VirtualTimeLoop, so the test
functions of tests/cluster/test_backend_contract.py run unchanged on the simulated
cluster (issue: "the contract suite runs on the sim backend too").

Why in tests/ and not in cluster/backends/: a ClusterBackend's cluster
outlives the command that made it (`dlab cluster up`, later `dlab cluster
kill` from another process); a SimCluster lives in this process and ends
with it. Nothing but this suite would use a synchronous face on it.

How the contract maps onto the sim:
- Operations (up, kill, stop, start, restart, pause, resume, partition,
  heal, down) run the loop until they are done: `start` until the node has
  recovered and serves, `up` until every slave's stream is connected (as the
  local backend's `up`), `stop` until the clean shutdown is over.
- Time. Between calls the loop stands still: virtual time passes only
  while the loop runs. The suite polls in wall time (ha_helpers.wait_until
  sleeps 20 ms between polls), so every observation - nodes(), node(), and
  each broker call a client makes - first lets TICK_S of virtual time pass
  (the time a poll takes on a real cluster). A poll loop thus advances the
  cluster as it waits, and what it waits for (a heartbeat, the master's 2 s
  housekeeping) comes after a fixed number of polls, however loaded the
  machine: the run is the same every time.
- Clients. The suite's NodeClient itself, given a SimStub: each blocking
  method makes the same broker call over the cluster's in-memory network
  (ha/transport/ MemoryNetwork.stub: request and response serialized as
  on the wire, the token checked, UNAVAILABLE when nothing serves the
  address, DEADLINE_EXCEEDED at the call's timeout, in virtual time) and
  runs the loop until it is answered; the node's BrokerServicer answers it
  as it answers gRPC.
- Files. A node's store is a MemoryDisk. Before a NodeInfo is handed out,
  the node's durable disk state is written to DIR/nodes/NAME/data
  (SimCluster.export: what a power cut now would leave, the `abort` marker
  included, as an empty file) and its log lines so far to
  DIR/nodes/NAME/node.log, so the suite's checks read real files.
- NodeInfo.address is the node's address on the in-memory network: nothing
  listens there; clients reach it through `stub(address)`. pid and
  container are None.

Where the sim differs (docs/simulation.md, "Backend contract"):
- A broker call whose server side hits a `crash` failpoint ends at its
  deadline (DEADLINE_EXCEEDED) where a real client sees its connection reset
  (UNAVAILABLE): INDETERMINATE either way.
- `down` closes the loop: later calls fail UNAVAILABLE, as a connection to
  a cluster that is down is refused.
- set_corruption_policy is not offered (the suite does not use it).
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import shutil
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import grpc

from chaos.sim.cluster import OWNER, SimCluster, SimulatedCrash
from cluster.backends.interface import BackendError, ClusterSpec, NodeInfo, NodeState
from cluster.node.role import Role
from ha.transport.memory_calls import rpc_error
from store.config import CorruptionPolicy, CrashModel
from store.failpoints import Failpoints, FailpointSpecError
from store.sim.loop import VirtualTimeLoop
from store.sim.memory_disk import DiskFaults

T = TypeVar("T")

# Virtual time each observation lets pass first (module doc, "Time").
TICK_S = 0.05
# Where the suite's client calls come from on the in-memory network.
CLIENT_ADDRESS = "10.0.9.1:50000"
# A clean stop that takes longer (virtual time) is a hang: the node is killed.
STOP_TIMEOUT_S = 30.0


class _NodeLogs(logging.Handler):
    """The nodes' log lines (the `dlab` loggers), per node, stamped with
    virtual time: what a node's log file would hold."""

    def __init__(self, loop: VirtualTimeLoop) -> None:
        super().__init__(logging.INFO)
        self.loop = loop
        self.lines: dict[str, list[str]] = {}

    def emit(self, record: logging.LogRecord) -> None:
        self.add(OWNER.get() or "harness",
                 f"{record.levelname} {record.name}: {record.getMessage()}")

    def add(self, name: str, line: str) -> None:
        self.lines.setdefault(name, []).append(f"{self.loop.time():10.4f} {line}")


class SimContractBackend:
    """A ClusterBackend (cluster/backends/interface.py) over a SimCluster;
    see the module doc for how each part of the contract maps."""

    name = "sim"

    def __init__(self, directory: str, *, seed: int = 0) -> None:
        self.directory = os.path.abspath(directory)
        self.seed = seed
        self._cluster: SimCluster | None = None
        self._logs: _NodeLogs | None = None
        self._old_level = logging.NOTSET
        self.loop_errors: list[str] = []

    # -------------------------------------------------------------- running
    @property
    def cluster(self) -> SimCluster:
        if self._cluster is None:
            raise BackendError(f"no cluster in {self.directory}; start one with up()")
        return self._cluster

    def _run(self, work: Awaitable[T]) -> T:
        """Run the loop until `work` is done."""
        async def until_done() -> T:
            return await work
        return self.cluster.loop.run_until_complete(until_done())

    def _do(self, action: Callable[[], T]) -> T:
        """Run `action` inside the loop (SimCluster's faults act on the
        running loop's tasks)."""
        async def inside() -> T:
            return action()
        return self._run(inside())

    def _tick(self) -> None:
        loop = self.cluster.loop  # raises first when there is no cluster
        loop.run_until_complete(asyncio.sleep(TICK_S))

    def _loop_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if isinstance(exc, SimulatedCrash | asyncio.CancelledError):
            return  # a failpoint's crash, a killed node's task: expected
        # A dead node's leftovers failing on its crashed disk: kept, not fatal
        # (as chaos/sim/run.py keeps them).
        self.loop_errors.append(f"{context.get('message')}: {exc!r}"[:300])

    # ------------------------------------------------------------------- up
    def up(self, spec: ClusterSpec, *, token: str, timeout_s: float = 60.0) -> list[NodeInfo]:
        if self._cluster is not None:
            raise BackendError(f"a cluster is already up in {self.directory}; down it first")
        if spec.master.role == Role.SLAVE:
            raise BackendError("the master's role must be SYNC_MASTER or ASYNC_MASTER")
        for ns in spec.nodes:
            if ns.crash_model != CrashModel.POWER:
                raise BackendError("the sim models the power crash model only")
        self.directory = os.path.abspath(spec.directory)
        loop = VirtualTimeLoop()
        loop.set_exception_handler(self._loop_error)
        self._cluster = SimCluster(
            loop, random.Random(self.seed), spec.master, spec.slaves, DiskFaults(),
            on_crash=lambda _name: None, pausable=True,
            fsync_rng=random.Random(self.seed + 1), token=token)
        self._logs = _NodeLogs(loop)
        dlab = logging.getLogger("dlab")
        self._old_level = dlab.level
        dlab.setLevel(logging.INFO)
        dlab.addHandler(self._logs)
        try:
            for ns in spec.nodes:
                self._start(ns.name)
            if not self._run(self._until(self.cluster.slaves_connected, timeout_s)):
                raise BackendError(f"the slaves did not connect to the master within "
                                   f"{timeout_s:g} s of virtual time")
        except BaseException:
            self.down()
            raise
        return [self._info(n) for n in self.cluster.nodes]

    async def _until(self, done: Callable[[], bool], timeout_s: float) -> bool:
        deadline = self.cluster.loop.time() + timeout_s
        while not done():
            if self.cluster.loop.time() > deadline:
                return False
            await asyncio.sleep(0.01)
        return True

    # ---------------------------------------------------------------- query
    def nodes(self) -> list[NodeInfo]:
        self._tick()
        return [self._info(n) for n in self.cluster.nodes]

    def node(self, name: str) -> NodeInfo:
        self._check_name(name)
        self._tick()
        return self._info(name)

    def _check_name(self, name: str) -> None:
        if name not in self.cluster.nodes:
            raise BackendError(f"no node {name!r} in this cluster; nodes: "
                               f"{', '.join(self.cluster.nodes)}")

    def _path(self, *parts: str) -> str:
        return os.path.join(self.directory, *parts)

    def _info(self, name: str) -> NodeInfo:
        c = self.cluster
        n = c.nodes[name]
        self._export(name)
        state = n.state
        if state is NodeState.RUNNING and c.paused(name):
            state = NodeState.PAUSED
        extra: dict[str, Any] = {"starts": n.incarnation, "failpoints": n.failpoints or ""}
        if state is NodeState.REFUSED:
            extra["refused"] = n.refused
        if name != c.master:
            extra["master_via"] = c.nodes[c.master].address
            extra["partitioned"] = c.partitioned(c.master, name)
        return NodeInfo(name=name, role=n.config.role, address=n.address, state=state,
                        data_dir=self._path("nodes", name, "data"),
                        log_path=self._path("nodes", name, "node.log"), extra=extra)

    def _export(self, name: str) -> None:
        """The node's durable disk state and its log so far, as real files."""
        data_dir = self._path("nodes", name, "data")
        shutil.rmtree(data_dir, ignore_errors=True)  # what the disk no longer holds goes too
        self.cluster.export(name, data_dir)
        os.makedirs(data_dir, exist_ok=True)
        assert self._logs is not None
        with open(self._path("nodes", name, "node.log"), "w", encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in self._logs.lines.get(name, [])))

    # ------------------------------------------------------------ lifecycle
    def _running(self, name: str, what: str) -> None:
        self._check_name(name)
        if self.cluster.nodes[name].state is not NodeState.RUNNING:
            raise BackendError(f"cannot {what} {name}: it is not running (start it first)")

    def _start(self, name: str) -> None:
        n = self.cluster.nodes[name]
        assert self._logs is not None
        self._logs.add(name, f"---- sim: starting {name} (start {n.incarnation + 1})")
        if not self._run(self.cluster.start(name)):
            raise BackendError(f"node {name} refused to start: {n.refused}")

    def _stop(self, name: str) -> None:
        async def stop() -> bool:
            try:
                async with asyncio.timeout(STOP_TIMEOUT_S):
                    await self.cluster.stop(name)
                return True
            except TimeoutError:
                self.cluster.kill(name)
                return False

        if not self._run(stop()):
            raise BackendError(f"node {name} did not shut down within {STOP_TIMEOUT_S:g} s "
                               "(virtual) and was killed")

    def kill(self, name: str) -> None:
        self._running(name, "kill")
        self._do(lambda: self.cluster.kill(name))

    def stop(self, name: str) -> None:
        self._running(name, "stop")
        self._stop(name)

    def start(self, name: str, *, timeout_s: float = 60.0) -> NodeInfo:
        self._check_name(name)
        if self.cluster.nodes[name].state is NodeState.RUNNING:
            raise BackendError(f"node {name} is already running; stop or kill it first")
        self._start(name)
        return self._info(name)

    def restart(self, name: str, *, timeout_s: float = 60.0) -> NodeInfo:
        self._check_name(name)
        if self.cluster.nodes[name].state is NodeState.RUNNING:
            self._stop(name)
        self._start(name)
        return self._info(name)

    def pause(self, name: str) -> None:
        self._running(name, "pause")
        self._do(lambda: self.cluster.pause(name))

    def resume(self, name: str) -> None:
        self._running(name, "resume")
        self._do(lambda: self.cluster.resume(name))

    # ---------------------------------------------------------------- links
    def _link(self, a: str, b: str) -> str:
        """The slave of the master-slave link a-b (either order)."""
        self._check_name(a)
        self._check_name(b)
        master = self.cluster.master
        if master not in (a, b) or a == b:
            raise BackendError(f"no replication link between {a} and {b}: links run between "
                               f"the master ({master}) and each slave")
        return b if a == master else a

    def partition(self, a: str, b: str) -> None:
        slave = self._link(a, b)
        self._do(lambda: self.cluster.partition(self.cluster.master, slave))

    def heal(self, a: str, b: str) -> None:
        slave = self._link(a, b)
        self._do(lambda: self.cluster.heal(self.cluster.master, slave))

    # ------------------------------------------------------------- settings
    def set_failpoints(self, name: str, spec: str) -> None:
        try:
            Failpoints(spec)
        except FailpointSpecError as exc:
            raise BackendError(str(exc)) from None
        self._check_name(name)
        self.cluster.set_failpoints(name, spec)

    def set_corruption_policy(self, name: str, policy: CorruptionPolicy) -> None:
        raise BackendError("the sim contract backend does not change a node's corruption "
                           "policy (the contract suite does not use it)")

    # ------------------------------------------------------------- failover
    # Not on the simulated cluster yet (docs/design.md, "Failover: routing,
    # promotion, rejoin"): refused by name, as the compose backend does.
    def promote(self, name: str, *, role: Role | None = None, flush: Any = None,
                timeout_s: float = 60.0) -> NodeInfo:
        raise BackendError("promote is not supported on the sim backend yet")

    def lose(self, name: str) -> NodeInfo:
        raise BackendError("lose is not supported on the sim backend yet")

    def rejoin(self, name: str, *, timeout_s: float = 60.0) -> NodeInfo:
        raise BackendError("rejoin is not supported on the sim backend yet")

    # ----------------------------------------------------------------- down
    def down(self) -> None:
        """Stop every node cleanly (slaves first), leave their files, close
        the loop (module doc)."""
        c = self.cluster
        try:
            errors = []
            for name in reversed(list(c.nodes)):
                if c.nodes[name].state is NodeState.RUNNING:
                    try:
                        self._stop(name)
                    except BackendError as exc:
                        errors.append(str(exc))
                self._export(name)
            if errors:
                raise BackendError("; ".join(errors))
        finally:
            self._close()

    def _close(self) -> None:
        c, self._cluster = self.cluster, None
        loop = c.loop
        left = asyncio.all_tasks(loop)
        for task in left:
            task.cancel()
        if left:
            loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
        dlab = logging.getLogger("dlab")
        if self._logs is not None:
            dlab.removeHandler(self._logs)
        dlab.setLevel(self._old_level)

    # --------------------------------------------------------------- client
    def stub(self, address: str) -> SimStub:
        """A blocking broker stub to `address` for NodeClient(stub=...)."""
        return SimStub(self, address)

    def call(self, address: str, method: str, request: Any, *, timeout: float | None,
             metadata: Any) -> Any:
        """One broker call over the in-memory network, after TICK_S; raises
        grpc.aio.AioRpcError (a grpc.RpcError) as a gRPC call would."""
        if self._cluster is None:
            raise rpc_error(grpc.StatusCode.UNAVAILABLE, f"failed to connect to {address}: "
                                                         "nothing serves it (the cluster is down)")
        self._tick()
        net_stub = self.cluster.network.stub(CLIENT_ADDRESS, address)
        coro: Coroutine[Any, Any, Any] = getattr(net_stub, method)(
            request, timeout=timeout, metadata=metadata)
        return self._run(coro)


class SimStub:
    """BrokerStub's blocking methods over SimContractBackend.call."""

    def __init__(self, backend: SimContractBackend, address: str) -> None:
        self._backend = backend
        self._address = address

    def __getattr__(self, method: str) -> Callable[..., Any]:
        if method.startswith("_"):
            raise AttributeError(method)

        def call(request: Any, *, timeout: float | None = None, metadata: Any = ()) -> Any:
            return self._backend.call(self._address, method, request, timeout=timeout,
                                      metadata=metadata)

        return call
