"""How the harness reaches a cluster: the backend by name, a sender for the
workload, a node's status. The one place chaos/ touches cluster/'s client."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from chaos.harness.workload import NO_ROUTE_DETAIL, NO_ROUTE_STATUS, SendOutcome
from cluster.backends.image import CheckedImages
from cluster.backends.interface import ClusterBackend
from cluster.backends.registry import open_backend
from cluster.client.node_client import AsyncNodeClient, NodeClient, make_message
from cluster.client.routing import NO_ROUTE, RoutedClient, RouteSource


def backend_factory(images: CheckedImages | None = None) -> Callable[[str, str],
                                                                     ClusterBackend]:
    """A run's backend by name and cluster directory; `images` are the
    node images its command has brought up to date (one check per command,
    not per run)."""
    return lambda name, directory: open_backend(name, directory, images=images)


class _Sender:
    """The workload's Sender over the async client (one channel per run)."""

    def __init__(self, address: str, token: str) -> None:
        self._client = AsyncNodeClient(address, token=token)

    async def __aenter__(self) -> _Sender:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._client.close()

    async def send(self, topic: str, body: bytes, msg_id: str, timeout_s: float
                   ) -> SendOutcome:
        out = await self._client.send(make_message(topic, body, msg_id=msg_id),
                                      timeout_s=timeout_s)
        return SendOutcome(out.status, out.offset, out.size, out.detail or None,
                           out.evidence)


class _RoutedSender:
    """The workload's Sender to the master of the cluster's route
    (cluster/client/routing.py's RoutedClient: the route read before each
    call; the workload does the retrying). The outcome names the node."""

    def __init__(self, directory: str, token: str) -> None:
        self._client = RoutedClient(RouteSource(directory), token=token)

    async def __aenter__(self) -> _RoutedSender:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._client.close()

    async def send(self, topic: str, body: bytes, msg_id: str, timeout_s: float
                   ) -> SendOutcome:
        route = self._client.routes.current()
        out = await self._client.send(make_message(topic, body, msg_id=msg_id),
                                      timeout_s=timeout_s)
        if out.status == NO_ROUTE:
            return SendOutcome(NO_ROUTE_STATUS, None, None, NO_ROUTE_DETAIL)
        return SendOutcome(out.status, out.offset, out.size, out.detail or None,
                           out.evidence, node=route.master)


ROUTE_PREFIX = "route:"  # a target that is a cluster directory's route


def sender_factory(address: str, token: str) -> _Sender | _RoutedSender:
    """A sender to `address`, or to the route of cluster directory D when
    `address` is "route:D"."""
    if address.startswith(ROUTE_PREFIX):
        return _RoutedSender(address.removeprefix(ROUTE_PREFIX), token)
    return _Sender(address, token)


def status_of(address: str, token: str) -> dict[str, Any]:
    """The node's status as a dict: at least `wrote`, `flushed`, `recovery`
    (the summary line of its last recovery) and `recovered_offset` (where
    that recovery left the log, before any new write)."""
    with NodeClient(address, token=token, timeout_s=3.0) as client:
        st = client.status_dict()
    recovery = st.get("recovery") or {}
    if isinstance(recovery, dict):
        st["recovery"] = recovery.get("summary", "")
        st["recovered_offset"] = recovery.get("max_valid_offset")
    else:
        st["recovery"] = str(recovery)
    return st
