"""The route of a cluster, as RocketMQ's name server gives it to clients:
which node is the master, at which address, since when.

A backend publishes it as `route.json` in the cluster directory on every
change (`up`, `promote`, losing the master), written whole and atomically
(write, fsync, rename, fsync the directory), so a client reading it while
it changes sees the old route or the new one, never half of each. Clients
(cluster/client/routing.py) read it at start and again after a failed
call, and send to the master it names.

`epoch` counts the changes of master since `up` (1 at `up`): a client
tells by it that the master it used is no longer the master. `master` is
None while the cluster has none (its master was lost and no slave has been
promoted yet): producers then have nowhere to send, as a RocketMQ producer
finds no route for its topic.

Kept at the bottom of the cluster layer (like cluster/node/role.py) so the
backends, which write it, and the client, which reads it, share one format.

Not modelled: the name server itself (its own availability, the 120 s a
real one takes to notice a dead broker, several broker groups; see
docs/design.md, "Failover: routing, promotion, rejoin").
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from store.log.segments import fsync_dir

ROUTE_FILE = "route.json"
ROUTE_VERSION = 1


class RouteError(RuntimeError):
    """No readable route; the message says where and what to do."""


@dataclass(frozen=True)
class Route:
    master: str | None  # node name; None: the cluster has no master now
    address: str | None  # the master's HOST:PORT
    since_ms: int  # wall clock when this node became the master
    epoch: int  # 1 at `up`, +1 at every change of master

    def __post_init__(self) -> None:
        assert (self.master is None) == (self.address is None), "a master has an address"
        assert self.epoch >= 1, "epochs start at 1"

    def to_dict(self) -> dict[str, Any]:
        return {"version": ROUTE_VERSION, "master": self.master, "address": self.address,
                "since_ms": self.since_ms, "epoch": self.epoch}

    @classmethod
    def from_dict(cls, d: dict[str, Any], *, where: str) -> Route:
        if d.get("version") != ROUTE_VERSION:
            raise RouteError(f"{where} has version {d.get('version')}, this dlab reads "
                             f"{ROUTE_VERSION}")
        try:
            master, address = d["master"], d["address"]
            if (master is None) != (address is None) or int(d["epoch"]) < 1:
                raise ValueError("master and address must both be set or both null")
            return cls(master=None if master is None else str(master),
                       address=None if address is None else str(address),
                       since_ms=int(d["since_ms"]), epoch=int(d["epoch"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise RouteError(f"{where} is not a route ({exc}); the cluster's backend "
                             "rewrites it at its next change of master") from None


def read_route(directory: str) -> Route:
    """DIR/route.json; RouteError when it is missing or unreadable."""
    path = os.path.join(directory, ROUTE_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise RouteError(f"no route in {directory} ({ROUTE_FILE} missing): is a cluster up "
                         f"there? start one with `dlab cluster up --dir {directory}`") from None
    except (OSError, ValueError) as exc:
        raise RouteError(f"cannot read {path}: {exc}") from None
    if not isinstance(data, dict):
        raise RouteError(f"{path} is not a route (not a JSON object)")
    return Route.from_dict(data, where=path)


def route_stamp(directory: str) -> tuple[int, int] | None:
    """Which version of route.json is there (inode and mtime; every change
    renames a new file in), None if it is missing: a client re-reads the
    route only when this moved."""
    try:
        st = os.stat(os.path.join(directory, ROUTE_FILE))
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns


def write_route(directory: str, route: Route) -> None:
    """DIR/route.json, whole and atomically: written to route.json.tmp
    (never through a link), fsynced, renamed over route.json, the directory
    fsynced; a reader sees the old route or the new one."""
    tmp = os.path.join(directory, ROUTE_FILE + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(route.to_dict(), f, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(directory, ROUTE_FILE))
    fsync_dir(directory)
