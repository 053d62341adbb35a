"""Sending to whichever node is the master now, as a RocketMQ producer does
with the routes its name server gives it: the cluster's route
(cluster/node/route.py, DIR/route.json) is read at start and again after a
failed send, and a failed send is retried, same message id, up to
`retries` times (a producer's retryTimesWhenSendFailed).

Retried: a call that failed or timed out (INDETERMINATE: the message may be
stored already, so a retry can store it twice — the same msg_id lets the
checker count that duplicate), a node that refuses puts because it is not
a master or is shutting down (SERVICE_NOT_AVAILABLE), and a route with no
master (NO_ROUTE, the client's own outcome: nothing was sent). Not
retried: a node's answer about the message itself (PUT_OK and the
stored-but-not-guaranteed statuses, MESSAGE_ILLEGAL) and a refused token.

A message stored by a node that the route no longer names as the master
when its answer arrives (it was failed over meanwhile: a split brain) is
marked `stale_master` in its outcome; `dlab send` counts those.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import Sequence
from typing import Any, Protocol

from cluster.client.node_client import AsyncNodeClient, SendOutcome, cluster_target
from cluster.node.route import Route, RouteError, read_route, route_stamp
from store.log.record import Message
from store.status import INDETERMINATE

NO_ROUTE = "NO_ROUTE"  # the route names no master: the message was not sent
# Outcomes a retry may turn into a stored message.
RETRIED = frozenset({INDETERMINATE, "SERVICE_NOT_AVAILABLE", NO_ROUTE})
RETRY_DELAY_S = 0.2  # before a retry (doubling, at most RETRY_DELAY_MAX_S): a
RETRY_DELAY_MAX_S = 2.0  # promotion takes a node restart


class Routes(Protocol):
    def current(self) -> Route: ...


class FixedRoute:
    """One node, named by its address (`dlab send --target`): retries go
    to it again."""

    def __init__(self, address: str) -> None:
        self._route = Route(master=address, address=address, since_ms=0, epoch=1)

    def current(self) -> Route:
        return self._route


class RouteSource:
    """The route of the cluster in `directory`, re-read only when
    route.json changed. A cluster whose backend publishes no route (an
    older cluster.json) is routed to the master its cluster.json names."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self._stamp: tuple[int, int] | None = None
        self._route: Route | None = None

    def current(self) -> Route:
        stamp = route_stamp(self.directory)
        if self._route is not None and stamp == self._stamp:
            return self._route
        if stamp is None and os.path.exists(os.path.join(self.directory, "cluster.json")):
            target = cluster_target(self.directory)
            master = next(n for n, a in target.addresses.items() if a == target.master_address)
            self._route = Route(master=master, address=target.master_address, since_ms=0,
                                epoch=1)
        else:
            self._route = read_route(self.directory)  # RouteError when there is none
        self._stamp = stamp
        return self._route


class RoutedClient:
    """AsyncNodeClient's `send`, to the master of the route, with retries.
    One AsyncNodeClient per master address, made when the route first
    names it."""

    def __init__(self, routes: Routes, *, token: str, timeout_s: float = 10.0,
                 retries: int = 0, channel_options: Sequence[tuple[str, Any]] = ()) -> None:
        if retries < 0:
            raise ValueError("retries must be 0 or more")
        self.routes = routes
        self.token = token
        self.timeout_s = timeout_s
        self.retries = retries
        self.channel_options = list(channel_options)
        self._clients: dict[str, AsyncNodeClient] = {}
        route = routes.current()  # RouteError: no route at all
        self.address = route.address or "(no master)"

    async def __aenter__(self) -> RoutedClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        for c in self._clients.values():
            await c.close()

    def _client(self, address: str) -> AsyncNodeClient:
        if address not in self._clients:
            self._clients[address] = AsyncNodeClient(
                address, token=self.token, timeout_s=self.timeout_s,
                channel_options=self.channel_options)
        return self._clients[address]

    async def max_message_size(self, *, timeout_s: float | None = None) -> int | None:
        """The current master's max message size (AsyncNodeClient's); None
        when the route names no master (the sends then say so)."""
        route = self.routes.current()
        if route.address is None:
            return None
        return await self._client(route.address).max_message_size(timeout_s=timeout_s)

    async def send(self, msg: Message, *, timeout_s: float | None = None) -> SendOutcome:
        """Send to the route's master; after a retriable outcome wait, read
        the route again and send again, `retries` times at most. The
        outcome returned is the last attempt's, with `node`, `attempts` and
        `stale_master` set."""
        attempt = 0
        while True:
            attempt += 1
            outcome = await self._attempt(msg, timeout_s)
            outcome = dataclasses.replace(outcome, attempts=attempt)
            if (outcome.status not in RETRIED or attempt > self.retries
                    or "UNAUTHENTICATED" in outcome.detail):
                return outcome
            await asyncio.sleep(min(RETRY_DELAY_S * 2 ** (attempt - 1), RETRY_DELAY_MAX_S))

    async def _attempt(self, msg: Message, timeout_s: float | None) -> SendOutcome:
        try:
            route = self.routes.current()
        except RouteError as exc:
            return SendOutcome(status=NO_ROUTE, msg_id=msg.msg_id or "", detail=str(exc))
        if route.address is None:
            return SendOutcome(status=NO_ROUTE, msg_id=msg.msg_id or "",
                               detail=f"the route names no master (epoch {route.epoch}): "
                                      "its master was lost and no slave promoted yet")
        self.address = route.address
        outcome = await self._client(route.address).send(msg, timeout_s=timeout_s)
        outcome = dataclasses.replace(outcome, node=route.address)
        if outcome.offset is not None:  # stored: was the node still the master?
            with_route = self._route_or_none()
            if with_route is not None and with_route.address != route.address:
                outcome = dataclasses.replace(outcome, stale_master=True)
        return outcome

    def _route_or_none(self) -> Route | None:
        try:
            return self.routes.current()
        except RouteError:
            return None
