"""Controller mode as every backend that runs a controller carries it out
(local processes, compose containers): waiting for the controller to serve
and to elect its first master, reading the route it publishes, its
SyncStateSet, rejoining a node, and refusing what only classic mode has.
A backend that can run either mode derives from ControllerSteps (failover
steps that know controller mode) and keeps, in a controller-mode state, a
`controller` entry with at least the `address` the host reaches the
controller at and its `settings` (interface.ControllerSpec as a dict).

Every backend starts the same way (docs/design.md, "The controller
process"): the controller first, then the node the spec calls master alone
(the first broker to ask for an election in a new broker set is its first
master), then the slaves; the controller publishes DIR/route.json at
every change of master, so the backend writes no route of its own.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cluster.backends.failover_steps import FailoverSteps
from cluster.backends.interface import CONTROLLER_NAME, BackendError, ClusterSpec, NodeInfo
from cluster.backends.state_dir import check_name
from cluster.controller.client import ControllerClient
from cluster.controller.server import CONTROLLER_SERVICE
from cluster.node.role import Role
from cluster.node.route import RouteError, read_route
from ha.credentials import token_metadata
from proto import broker_pb2, broker_pb2_grpc
from store.config import FlushMode


def check_controller_spec(spec: ClusterSpec) -> None:
    """A controller-mode spec every node of which is in controller mode."""
    if any(ns.ha_mode is not spec.master.ha_mode for ns in spec.nodes):
        raise BackendError("controller mode: every node must have --ha-mode controller")
    if any(ns.name == CONTROLLER_NAME for ns in spec.nodes):
        raise BackendError(f"controller mode: no node may be called {CONTROLLER_NAME!r} "
                           "(`partition NODE controller` names the controller)")


class ControllerSteps(FailoverSteps):
    # ------------------------------------------------ a backend supplies this
    def _start_node(self, state: dict[str, Any], name: str, deadline: float) -> None:
        """Start node `name` (not running) as the state describes it, save
        the state, and wait until it serves."""
        raise NotImplementedError

    # ------------------------------------------------------------ operations
    def promote(self, name: str, *, role: Role | None = None, flush: FlushMode | None = None,
                timeout_s: float = 60.0) -> NodeInfo:
        """Classic mode: FailoverSteps.promote. Controller mode: refused,
        naming how to ask the controller instead."""
        with self._locked():
            self._refuse_promotion(self._load())
        return super().promote(name, role=role, flush=flush, timeout_s=timeout_s)

    def rejoin(self, name: str, *, timeout_s: float = 60.0) -> NodeInfo:
        """Controller mode: start the node (lost or not) on what its data
        directory holds; it asks the controller whom to follow and cuts its
        log to the point it shares with that master. The returned info's
        extra["link"]: its link as the route's master reports it once
        settled, or as it was at the timeout (none while the route names no
        master, or names this node). Classic mode: as FailoverSteps.rejoin."""
        with self._locked():
            controller_mode = bool(self._load().get("controller"))
        if not controller_mode:
            return super().rejoin(name, timeout_s=timeout_s)
        with self._locked():
            state = self._load()
            check_name(state, name)
            if name in self._running_names(state):
                raise BackendError(f"cannot rejoin {name}: it is running; kill, stop or lose "
                                   "it first")
            state["nodes"][name]["lost"] = False
            master: str | None = None
            with contextlib.suppress(RouteError):
                master = read_route(self._dir()).master
            if master is not None:  # the state's is the one `up` found
                state["master"] = master
            deadline = time.monotonic() + timeout_s
            self._start_node(state, name, deadline)
            link = (self._link_states(state, [name], deadline)[name]
                    if master is not None and master != name else None)
            info = self._info(state, name)
            info.extra["link"] = link
            return info

    # ----------------------------------------------------------------- steps
    def _controller_client(self, state: dict[str, Any]) -> ControllerClient:
        return ControllerClient(state["controller"]["address"], self.token(), timeout_s=2.0)

    def sync_state_set(self) -> set[str]:
        """Controller mode: the names in the controller's SyncStateSet now
        (empty when it has none or cannot be asked)."""
        state = self._load()
        if not state.get("controller"):
            return set()
        try:
            with self._controller_client(state) as client:
                meta = client.metadata()
        except grpc.RpcError:
            return set()
        members = set(meta.replica_info.sync_state_set)
        return {m.name for m in meta.members if m.broker_id in members}

    def _wait_controller_serving(self, state: dict[str, Any], deadline: float, *,
                                 exited: Callable[[], str | None]) -> None:
        """Until the controller's health check says SERVING (its state read,
        its port bound) at the address the host reaches it at. `exited()`
        is None while the controller runs, else what it left to read."""
        address = state["controller"]["address"]
        with grpc.insecure_channel(address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while True:
                output = exited()
                if output is not None:
                    raise BackendError(f"the controller exited at start; {output}")
                with contextlib.suppress(grpc.RpcError):
                    if stub.Check(health_pb2.HealthCheckRequest(service=CONTROLLER_SERVICE),
                                  timeout=0.5).status == \
                            health_pb2.HealthCheckResponse.SERVING:
                        return
                if time.monotonic() > deadline:
                    raise BackendError(f"the controller did not serve at {address} in "
                                       f"time; see {self._path('controller.log')}")
                time.sleep(0.05)

    def _wait_controller_master(self, state: dict[str, Any], deadline: float) -> None:
        """Until the controller holds a master (the first node's election)."""
        last = "no answer yet"
        with self._controller_client(state) as client:
            while True:
                try:
                    if client.replica_info().replica_info.master_id:
                        return
                    last = "no master elected"
                except grpc.RpcError as exc:
                    last = f"{exc.code().name} {exc.details()}"
                if time.monotonic() > deadline:
                    raise BackendError(
                        f"the controller elected no master in time ({last}); see "
                        f"{self._path('controller.log')} and "
                        f"{self._path('nodes', state['master'], 'node.log')}")
                time.sleep(0.05)

    def _wait_route_master(self, deadline: float) -> str:
        """Until route.json names a master that serves as one, at the address
        it names (the one clients use); its name."""
        metadata = token_metadata(self.token())
        last = "no route published"
        while True:
            with contextlib.suppress(RouteError):
                route = read_route(self._dir())
                last = f"the route names {route.master or 'no master'}"
                if route.master is not None and route.address is not None:
                    with grpc.insecure_channel(route.address) as channel, \
                            contextlib.suppress(grpc.RpcError):
                        st = broker_pb2_grpc.BrokerStub(channel).Status(
                            broker_pb2.StatusRequest(), timeout=2.0, metadata=metadata)
                        if st.role != Role.SLAVE.value:
                            return route.master
                        last += f", which is still a {st.role}"
            if time.monotonic() > deadline:
                raise BackendError(f"no elected master serves in time ({last}); see "
                                   f"{self._path('controller.log')}")
            time.sleep(0.05)

    def _refuse_promotion(self, state: dict[str, Any]) -> None:
        """Controller mode: the controller elects; the operator may ask it."""
        if state.get("controller"):
            raise BackendError(
                "in controller mode the controller elects the master: ask it with `dlab "
                f"controller elect --address {state['controller']['address']} --token-file "
                f"{self._path('token')} --broker ID` (ids: `dlab controller status`)")

