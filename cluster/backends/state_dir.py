"""A cluster directory as every backend keeps it: `cluster.json` (the
cluster's state, replaced atomically), `cluster.lock` (held while the state
is read and changed, so concurrent `dlab cluster` commands take turns) and
the paths under it.

A backend class mixes in ClusterDir and sets `directory` and `name`."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cluster.backends.dir_files import append_no_link, open_no_link, replace_no_link
from cluster.backends.failover import route_of
from cluster.backends.interface import REFUSAL_FILE, BackendError, NodeInfo, read_refusal
from cluster.node.auth import read_token_file
from cluster.node.route import ROUTE_FILE, Route, RouteError, read_route
from ha.credentials import token_metadata
from ha.master import NEVER_REPORTED, note_follower_links
from proto import broker_pb2, broker_pb2_grpc
from store.config import CorruptionPolicy, CrashModel
from store.failpoints import Failpoints, FailpointSpecError
from store.log.durable_mark import PowerCut, power_cut
from store.log.segments import fsync_dir

STATE_FILE = "cluster.json"
STATE_VERSION = 1


class NodeRefusedError(BackendError):
    """A node would not open its store (corruption under the refuse or a
    failed repair policy): the cluster around it is fine."""

    def __init__(self, node: str, message: str) -> None:
        super().__init__(message)
        self.node = node


class ClusterDir:
    directory: str | None
    name: str  # the backend's name, recorded in the state as "backend"

    def _dir(self) -> str:
        if self.directory is None:
            raise BackendError("no cluster directory: call up() first or pass the directory")
        return self.directory

    def _path(self, *parts: str) -> str:
        return os.path.join(self._dir(), *parts)

    @contextlib.contextmanager
    def _locked(self, *, create: bool = False) -> Iterator[None]:
        """Hold cluster.lock. Only `up` (create) makes the directory and the
        lock; every other command needs a cluster there and creates nothing
        (`status --dir` with a typo must not leave a directory behind)."""
        directory = self._dir()
        if os.path.exists(directory) and not os.path.isdir(directory):
            raise BackendError(f"--dir {directory} is a file, not a directory: give a "
                               "directory for the cluster (it is created if missing)")
        try:
            if create:
                os.makedirs(directory, exist_ok=True)
            elif not os.path.exists(self._path(STATE_FILE)):
                self._load()  # raises: "no cluster in DIR; start one with ..."
            fd = open_no_link(self._path("cluster.lock"), os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise BackendError(f"cannot use {directory} as a cluster directory: "
                               f"{exc.strerror or exc} ({exc.filename or directory}); "
                               "give a directory this user can create and write") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def _load(self) -> dict[str, Any]:
        path = self._path(STATE_FILE)
        try:
            with open(path) as f:
                state: dict[str, Any] = json.load(f)
        except FileNotFoundError:
            backend = "" if self.name == "local" else f" --backend {self.name}"
            raise BackendError(f"no cluster in {self._dir()}; start one with "
                               f"`dlab cluster up{backend} --dir {self._dir()}`") from None
        except (OSError, ValueError) as exc:
            raise BackendError(f"cannot read {path}: {exc}") from None
        if state.get("version") != STATE_VERSION:
            raise BackendError(f"{path} has version {state.get('version')}, this dlab writes "
                               f"{STATE_VERSION}; `down` it with the dlab that made it")
        if state.get("backend", "local") != self.name:
            raise BackendError(f"{path} is a {state.get('backend')} cluster, not a {self.name} "
                               f"one; use --backend {state.get('backend')}")
        return state

    # ------------------------------------------------------------- reading
    def _info(self, state: dict[str, Any], name: str) -> NodeInfo:
        raise NotImplementedError  # each backend knows how to tell a node's state

    def nodes(self) -> list[NodeInfo]:
        with self._locked():
            state = self._load()
            return [self._info(state, n) for n in state["nodes"]]

    def node(self, name: str) -> NodeInfo:
        with self._locked():
            state = self._load()
            check_name(state, name)
            return self._info(state, name)

    def token(self) -> str:
        return read_token_file(self._path("token"))

    # -------------------------------------------- settings for the next start
    def set_failpoints(self, name: str, spec: str) -> None:
        try:
            Failpoints(spec)
        except FailpointSpecError as exc:
            raise BackendError(str(exc)) from None
        with self._locked():
            state = self._load()
            check_name(state, name)
            state["nodes"][name]["failpoints"] = spec
            self._save(state)

    def set_corruption_policy(self, name: str, policy: CorruptionPolicy) -> None:
        with self._locked():
            state = self._load()
            check_name(state, name)
            entry = state["nodes"][name]
            entry["spec"]["corruption_policy"] = CorruptionPolicy(policy).value
            self._spec_changed(entry)
            self._save(state)

    def _wait_serving(self, name: str, address: str, deadline: float, *,
                      exit_output: Callable[[], str | None], see: str) -> None:
        """Until node `name`'s gRPC health service answers SERVING at
        `address` (what a container's health check asks, without waiting for
        Docker's interval), and then an authenticated Status call: the RPC a
        client makes, through the address it uses (on compose, the published
        port and docker-proxy). `exit_output()` is None while the node runs,
        else what it left to read (a log tail); `see` says where to look next."""
        metadata = token_metadata(read_token_file(self._path("token")))
        with grpc.insecure_channel(address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            broker = broker_pb2_grpc.BrokerStub(channel)
            last = "nothing answered a health check"
            while True:
                output = exit_output()
                if output is not None:
                    refused = read_refusal(self._path("nodes", name, REFUSAL_FILE))
                    if refused:
                        raise NodeRefusedError(name, f"node {name} refused to start: {refused}")
                    raise BackendError(f"node {name} exited during start; {output}")
                try:
                    resp = stub.Check(health_pb2.HealthCheckRequest(), timeout=0.5)
                    if resp.status == health_pb2.HealthCheckResponse.SERVING:
                        last = "its Status call failed"
                        broker.Status(broker_pb2.StatusRequest(), timeout=2.0,
                                      metadata=metadata)
                        return
                except grpc.RpcError as exc:
                    if exc.code() == grpc.StatusCode.UNAUTHENTICATED:
                        raise BackendError(
                            f"node {name} refuses the cluster's token ({exc.details()}): "
                            f"it was started with another token file; see {see}") from None
                    if last != "nothing answered a health check":
                        last = f"its Status call failed: {exc.code().name} {exc.details()}"
                if time.monotonic() > deadline:
                    raise BackendError(
                        f"node {name} did not become healthy in time: {last} at {address}, "
                        f"the address the cluster gave it (--listen); see {see}")
                time.sleep(0.05)

    def _down_locked(self, state: dict[str, Any]) -> None:
        """Stop every node (and proxy, and controller) of `state`, under the lock."""
        raise NotImplementedError

    @contextlib.contextmanager
    def _coming_up(self, state: dict[str, Any]) -> Iterator[None]:
        """Around `up` starting a new cluster's nodes. A node refusing to
        start (damage in its store under corruption policy refuse) leaves
        the others running, for `dlab cluster start` with a policy: a
        BackendError that says so. Anything else (a timeout, an interrupt)
        takes the whole cluster down before it goes on, so no process is
        left behind. The state is saved first either way."""
        try:
            yield
        except NodeRefusedError as exc:
            self._save(state)
            raise BackendError(f"{exc} {self._refusal_hint(exc.node)}") from None
        except BaseException:
            self._save(state)
            with contextlib.suppress(BackendError):
                self._down_locked(state)
            raise

    def _refusal_hint(self, refused: str) -> str:
        # A refusal in `up` leaves the cluster as it is, so the documented
        # next step (README, "Corruption") works: start that node with a policy.
        d = self._dir()
        return (f"The other nodes of the cluster in {d} keep running: `dlab cluster start "
                f"{refused} --dir {d} --corruption-policy repair` (or truncate), or "
                f"`dlab cluster down --dir {d}`.")

    def _wait_replicating(self, state: dict[str, Any], deadline: float) -> None:
        """Until the master reports every slave's replication stream
        connected, so `up` hands over a cluster whose first SYNC_MASTER put
        can be PUT_OK (before a slave's first report it is
        SLAVE_NOT_AVAILABLE). Call once every node serves."""
        master = state["master"]
        slaves = [n for n in state["nodes"] if n != master]
        if not slaves:
            return
        metadata = token_metadata(read_token_file(self._path("token")))
        waiting, last = slaves, "no status yet"
        with grpc.insecure_channel(state["nodes"][master]["address"]) as channel:
            stub = broker_pb2_grpc.BrokerStub(channel)
            while True:
                try:
                    status = stub.Status(broker_pb2.StatusRequest(), timeout=2.0,
                                         metadata=metadata)
                    links = {link.slave: link for link in status.slaves}
                    waiting = [n for n in slaves
                               if n not in links or links[n].state != "connected"]
                    if not waiting:
                        return
                    last = "; ".join(f"{n}: {links[n].state} {links[n].detail}".strip()
                                     if n in links else f"{n}: never reported"
                                     for n in waiting)
                except grpc.RpcError as exc:
                    last = f"the master's status call failed: {exc.code().name}"
                if time.monotonic() > deadline:
                    raise BackendError(
                        f"every node serves, but {', '.join(waiting)} did not connect to the "
                        f"master {master} in time ({last}); see "
                        f"{', '.join(self._path('nodes', n, 'node.log') for n in waiting)}")
                time.sleep(0.02)

    def _spec_changed(self, entry: dict[str, Any]) -> None:
        """A node's command line changed; a backend that must recreate
        something at the next start says so here (under the lock)."""

    def _power_cut(self, state: dict[str, Any], name: str) -> PowerCut | None:
        """A node that died (killed, or crashed at a failpoint) under the
        power crash model: leave its store as a power cut would, before it
        restarts or anyone reads it — every byte no completed fsync covered
        is discarded (store/log/durable_mark.py). Call with the node's process
        gone. A cut removes the mark, so it happens once per death: a later
        call (the next start after a kill) leaves alone what was written
        since (a torn-tail or bit-flip step on the stopped node). Nothing
        for a node that closed cleanly. The node's log says what was cut."""
        spec = state["nodes"][name]["spec"]
        if spec.get("crash_model", CrashModel.POWER.value) != CrashModel.POWER.value:
            return None
        cut = power_cut(self._path("nodes", name, "data"))
        if cut.applied:
            with contextlib.suppress(OSError, BackendError), \
                    open(append_no_link(self._path("nodes", name, "node.log")), "a") as f:
                f.write(f"---- dlab cluster: {cut.describe()}\n")
        return cut

    # ------------------------------------------------------------ failover
    # (the operations: cluster/backends/failover_steps.py)
    def route(self) -> Route:
        """The route clients follow now (what route.json says)."""
        with self._locked():
            state = self._load()
        if state.get("controller"):
            # Controller mode: the controller publishes it (cluster/controller/
            # route_publisher.py); none until its first master is heard from.
            try:
                return read_route(self._dir())
            except RouteError:
                return Route(master=None, address=None, since_ms=int(state["started_ms"]),
                             epoch=1)
        return route_of(state)

    def _publish_route(self, state: dict[str, Any]) -> None:
        """Write route.json from the state: whole, fsynced, renamed in, the
        directory fsynced (cluster/node/route.py), so a client sees the old
        route or the new one. Not in controller mode: the controller
        publishes the route there."""
        if state.get("controller"):
            return
        route = route_of(state)
        tmp = self._path(ROUTE_FILE + ".tmp")
        with open(replace_no_link(tmp), "w") as f:
            json.dump(route.to_dict(), f, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self._path(ROUTE_FILE))
        fsync_dir(self._dir())

    def _link_states(self, state: dict[str, Any], slaves: list[str], deadline: float
                     ) -> dict[str, str]:
        """Each slave's link as the master reports it, once every one has
        settled (connected, rejected by slave_ahead_policy, or diverged) or the
        deadline passed ("never reported" for one the master does not know)."""
        master = state["master"]
        found = {n: NEVER_REPORTED for n in slaves}
        if not slaves:
            return found
        metadata = token_metadata(read_token_file(self._path("token")))
        with grpc.insecure_channel(state["nodes"][master]["address"]) as channel:
            stub = broker_pb2_grpc.BrokerStub(channel)
            settled = False
            while True:
                with contextlib.suppress(grpc.RpcError):
                    status = stub.Status(broker_pb2.StatusRequest(), timeout=2.0,
                                         metadata=metadata)
                    settled = note_follower_links(found, status.slaves)
                if settled or time.monotonic() > deadline:
                    return found
                time.sleep(0.05)

    def _save(self, state: dict[str, Any]) -> None:
        tmp = self._path(STATE_FILE + ".tmp")
        with open(replace_no_link(tmp), "w") as f:
            json.dump(state, f, indent=2, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self._path(STATE_FILE))


def check_name(state: dict[str, Any], name: str) -> None:
    if name not in state["nodes"]:
        raise BackendError(f"no node {name!r} in this cluster; nodes: "
                           f"{', '.join(state['nodes'])}")
