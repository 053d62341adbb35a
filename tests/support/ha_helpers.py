"""Shared helpers for the HA, cluster and client tests: real clusters of real
`dlab node` processes on loopback, with short timings so timeouts and
housekeeping show up in seconds."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import grpc

from cluster.backends.interface import ClusterSpec, NodeSpec
from cluster.backends.local import LocalBackend
from cluster.client.node_client import FAST_RECONNECT, NodeCallError, NodeClient, make_message
from cluster.node.auth import generate_token
from cluster.node.role import Role
from ha.config import ShipLimit, SlaveAheadPolicy

T = TypeVar("T")

SEGMENT = 256 * 1024
# Short HA timings: heartbeat 100 ms, housekeeping 2 s, slave timeout 1 s,
# reconnect backoff 50..300 ms.
FAST = (
    "--max-message-size", "64KiB",
    "--ha-heartbeat-ms", "100",
    "--ha-housekeeping-ms", "2000",
    "--slave-timeout-ms", "1000",
    "--ha-reconnect-min-ms", "50",
    "--ha-reconnect-max-ms", "300",
    "--flush-interval-ms", "50",
    "--flush-thorough-interval-ms", "200",
)
# A node that never flushes by itself (until a clean stop): what a power
# cut would lose is everything it holds.
# (No interval flush, and no wake-up by appends: that needs flush_least_pages.)
NO_FLUSH = ("--flush-interval-ms", "600000", "--flush-thorough-interval-ms", "600000",
            "--flush-least-pages", "1000000")


def spec(directory: str, *, role: Role = Role.SYNC_MASTER, flush: str = "ASYNC_FLUSH",
         slaves: int = 1, crash_model: str = "power",
         policy: SlaveAheadPolicy = SlaveAheadPolicy.REJECT,
         ship_limit: ShipLimit = ShipLimit.WROTE, extra: tuple[str, ...] = (),
         master_extra: tuple[str, ...] = (), slave_extra: tuple[str, ...] = ()) -> ClusterSpec:
    common: dict[str, Any] = dict(flush=flush, crash_model=crash_model,
                                  segment_size_bytes=SEGMENT, slave_ahead_policy=policy,
                                  ha_ship_limit=ship_limit)
    return ClusterSpec(
        directory=directory,
        master=NodeSpec(name="master", role=role, extra_args=FAST + extra + master_extra,
                        **common),
        slaves=tuple(NodeSpec(name=f"slave{i + 1}", role=Role.SLAVE,
                              extra_args=FAST + extra + slave_extra, **common)
                     for i in range(slaves)),
    )


@contextmanager
def running_cluster(directory: str, *, connected: bool = False, **kw: Any
                    ) -> Iterator[tuple[LocalBackend, str]]:
    """A local cluster for one test (`spec`'s options); with `connected`,
    yielded once slave1's stream to the master is up."""
    backend = LocalBackend()
    token = generate_token()
    backend.up(spec(directory, **kw), token=token, timeout_s=90)
    try:
        if connected:
            wait_connected(backend, token)
        yield backend, token
    finally:
        backend.down()


def wait_until(pred: Callable[[], T], timeout_s: float = 60.0, what: str = "condition") -> T:
    """Poll `pred` until it is true. A poll that could not reach a node
    (UNAVAILABLE, DEADLINE_EXCEEDED: a connect that timed out on a loaded
    machine) counts as not yet; the last such error is named on timeout."""
    deadline = time.monotonic() + timeout_s
    unreachable: NodeCallError | None = None
    while True:
        try:
            value = pred()
        except NodeCallError as exc:
            if exc.code not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise
            unreachable, value = exc, None
        if value:
            return value
        if time.monotonic() > deadline:
            last = f" (last poll: {unreachable})" if unreachable is not None else ""
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}{last}")
        time.sleep(0.02)


def client(backend: LocalBackend, token: str, name: str = "master", timeout_s: float = 10.0
           ) -> NodeClient:
    return NodeClient(backend.node(name).address, token=token, timeout_s=timeout_s,
                      channel_options=FAST_RECONNECT)


def status(backend: LocalBackend, token: str, name: str) -> dict[str, Any]:
    with client(backend, token, name) as c:
        return c.status_dict()


def slave_link(backend: LocalBackend, token: str, slave: str = "slave1") -> dict[str, Any]:
    """The master's view of one slave ({} if the master does not know it)."""
    for s in status(backend, token, "master")["slaves"]:
        if s["slave"] == slave:
            return dict(s)
    return {}


def wait_caught_up(backend: LocalBackend, token: str, slave: str = "slave1",
                   timeout_s: float = 30.0) -> int:
    """Wait until the slave's wrote equals the master's; returns it."""
    def same() -> int | None:
        m = status(backend, token, "master")["wrote"]
        s = status(backend, token, slave)["wrote"]
        return m if m == s and m > 0 else None
    result = wait_until(same, timeout_s, f"{slave} to catch up")
    assert result is not None
    return result


def wait_connected(backend: LocalBackend, token: str, slave: str = "slave1",
                   timeout_s: float = 60.0) -> None:
    wait_until(lambda: slave_link(backend, token, slave).get("state") == "connected",
               timeout_s, f"{slave} to connect")


def send_n(backend: LocalBackend, token: str, n: int, *, size: int = 1000, prefix: str = "m",
           timeout_s: float = 10.0) -> list[Any]:
    with client(backend, token, timeout_s=timeout_s) as c:
        return [c.send(make_message("t", os.urandom(size), msg_id=f"{prefix}{i}"))
                for i in range(n)]


def commitlog_bytes(data_dir: str) -> dict[str, bytes]:
    """Every segment file of a store, by name."""
    cl = os.path.join(data_dir, "commitlog")
    out = {}
    for name in sorted(os.listdir(cl)):
        with open(os.path.join(cl, name), "rb") as f:
            out[name] = f.read()
    return out


def log_text(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()
