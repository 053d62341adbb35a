"""The route clients follow, published by the controller (`dlab controller
run --publish-route DIR`): DIR/route.json (cluster/node/route.py) names the
master the controller holds, at the address of its last heartbeat, and is
rewritten, atomically, whenever that master changes. As RocketMQ 5 can run
its controller inside the name server (enableControllerInNamesrv), the
process that elects the master is the one that tells clients where it is;
`dlab send --dir DIR` and the chaos producers read the file as they do
after a classic failover.

Rules:
- written after the change is durable in the controller's state file (the
  core calls `update` after each request it applied), never before;
- a master whose address is not known yet (a restarted controller that has
  not heard from it) is not published: the old route stays until its
  heartbeat, as a name server keeps a route until it is told otherwise;
- no master (it died and no replica could be elected): published as none,
  so producers stop sending to a dead node and retry;
- `epoch` goes up by one at every change of master or address, from the
  epoch of the route.json found at start (1 for the first master);
- a broker given a client address (`--route-address NAME=HOST:PORT`) is
  published at that address, not at the one it heartbeats from: as a
  RocketMQ broker registers one address for clients (brokerIP1) and
  another for its replicas (brokerIP2), a node in a container is reached by
  its peers at its service name and by clients on the host at its published
  port. It is still published only once it has heartbeaten.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

from cluster.node.route import Route, RouteError, read_route, write_route
from ha.controller.state import ControllerState

log = logging.getLogger("dlab.controller")


class RoutePublisher:
    def __init__(self, directory: str, *,
                 client_addresses: Mapping[str, str] | None = None) -> None:
        """`client_addresses`: broker name to the address clients reach it
        at, where that is not the address it heartbeats from."""
        self.directory = directory
        self.client_addresses = dict(client_addresses or {})
        try:
            found: Route | None = read_route(directory)
        except RouteError:
            found = None
        self.epoch = found.epoch if found is not None else 0
        self.published: tuple[str | None, str | None] | None = (
            None if found is None else (found.master, found.address))

    def update(self, state: ControllerState, addresses: dict[int, str]) -> None:
        """Publish the master `state` holds, if it changed (module docstring)."""
        if state.master is None:
            name, address = None, None
        else:
            member = state.member(state.master)
            address = addresses.get(state.master)
            if member is None or not address:
                return  # not heard from yet: keep the old route
            name = member.name
            address = self.client_addresses.get(name, address)
        if (name, address) == self.published:
            return
        if self.published is None and name is None:
            return  # nothing to say yet
        route = Route(master=name, address=address, since_ms=time.time_ns() // 1_000_000,
                      epoch=self.epoch + 1)
        try:
            write_route(self.directory, route)
        except OSError as exc:
            log.error("cannot publish the route in %s: %s; clients keep the old one until "
                      "the next change is written", self.directory, exc)
            return
        self.epoch = route.epoch
        self.published = (name, address)
        log.warning("route published: master %s at %s (route epoch %d)", name or "none",
                    address or "-", route.epoch)
