"""Failover as changes to a cluster's state (the `cluster.json` dict):
promote a slave, lose a node, rejoin one. Pure: each function checks the
request against the state, changes the state, and returns what the backend
must then do to processes, proxies and files — it runs nothing itself
(docs/design.md, "Failover: routing, promotion, rejoin"). The decide_*
functions hold the rules every backend shares; the plan_* ones add the
link proxies of a backend whose slaves reach their master through one
(local). The order in which a backend carries a decision out is
cluster/backends/failover_steps.py's.

The state's `route` entry ({master, since_ms, epoch}) is what the backend
publishes as route.json (cluster/node/route.py). Each node entry may carry
`lost` (how many times the node was lost; set while it is lost) and
`lost_dirs` (where its stores were moved).

Rules:
- promote NAME: NAME is a running slave. It becomes the master with the old
  master's role and flush mode unless others are given; every other node
  is from then on its slave (local: its link proxy now leads to NAME;
  compose: the master's alias on the replication network moves). The route
  names NAME from now, with the next epoch. A running old master cut off
  from NAME (a partition) is out of the operator's reach, as the sim's is:
  it keeps running as a master (`cut_off`) until it is stopped, and starts
  again as NAME's slave.
- lose NAME: the node is known and is not the last one not lost. It is
  marked lost; losing the master leaves the route with no master (the
  next epoch) until a slave is promoted.
- rejoin NAME: NAME is not running, there is a master to follow and NAME is
  not it. NAME becomes a slave of the current master and is no longer
  lost.
- start / restart NAME: refused while NAME is lost (refuse_lost).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cluster.backends.interface import BackendError
from cluster.node.role import Role
from cluster.node.route import Route
from store.config import FlushMode

# Where link proxies listen (the local backend's proxies, on loopback).
PROXY_HOST = "127.0.0.1"


def route_of(state: dict[str, Any]) -> Route:
    """The route the state describes (a state from before routes were
    recorded: its master since the cluster started, epoch 1)."""
    r = state.get("route") or {"master": state["master"],
                               "since_ms": state.get("started_ms", 0), "epoch": 1}
    master = r["master"]
    address = state["nodes"][master]["address"] if master is not None else None
    return Route(master=master, address=address, since_ms=int(r["since_ms"]),
                 epoch=int(r["epoch"]))


def _set_route(state: dict[str, Any], master: str | None, now_ms: int) -> None:
    epoch = route_of(state).epoch + 1
    state["route"] = {"master": master, "since_ms": now_ms, "epoch": epoch}


def _known(state: dict[str, Any], name: str) -> dict[str, Any]:
    if name not in state["nodes"]:
        raise BackendError(f"no node {name!r} in this cluster; nodes: "
                           f"{', '.join(state['nodes'])}")
    entry: dict[str, Any] = state["nodes"][name]
    return entry


@dataclass(frozen=True)
class Promotion:
    old_master: str
    restart: tuple[str, ...]  # running nodes whose role changes: stop cleanly, start anew
    followers: tuple[str, ...]  # every other node: from now on the new master's slave
    # Backends whose slaves reach the master through link proxies (local):
    # the new master's link proxy when it was a slave (taken out of the
    # state): to end
    dropped_proxy: dict[str, Any] | None = None
    retarget: tuple[str, ...] = ()  # link proxies (by slave) now leading to the new master
    # Running nodes the operator could not reach (cut off from the new
    # master): left running in their old role, a second master until stopped.
    cut_off: tuple[str, ...] = ()


def decide_promote(state: dict[str, Any], name: str, *, running: set[str], now_ms: int,
                   role: Role | None = None, flush: FlushMode | None = None,
                   cut_off: frozenset[str] = frozenset()) -> Promotion:
    """Make running slave `name` the master in `state`: its role and flush
    mode, every other node a slave, the route. `running`: the nodes whose
    process runs (or is paused); `cut_off`: those partitioned from `name`,
    which the operator cannot reach (a running old master among them keeps
    serving as a master). How the followers reach the new master is the
    backend's (plan_promote for link proxies)."""
    entry = _known(state, name)
    old = state["master"]
    if role is not None and role == Role.SLAVE:
        raise BackendError("--role of a promoted node is SYNC_MASTER or ASYNC_MASTER")
    if entry.get("lost"):
        raise BackendError(f"cannot promote {name}: it was lost; `dlab cluster rejoin "
                           f"{name}` brings a replacement as a slave")
    if entry["spec"]["role"] != Role.SLAVE.value:
        raise BackendError(f"cannot promote {name}: it is already the master; promote one "
                           "of its slaves")
    if name not in running:
        raise BackendError(f"cannot promote {name}: it is not running; start it first "
                           f"(`dlab cluster start {name}`) so it is a running slave")
    old_spec = state["nodes"][old]["spec"]
    entry["spec"]["role"] = (role or Role(old_spec["role"])).value
    entry["spec"]["flush"] = (flush or FlushMode(old_spec["flush"])).value
    state["master"] = name
    followers = tuple(other for other in state["nodes"] if other != name)
    for other in followers:
        state["nodes"][other]["spec"]["role"] = Role.SLAVE.value
    _set_route(state, name, now_ms)
    restart = tuple(n for n in (name, old) if n in running and n not in cut_off)
    left = tuple(n for n in (old,) if n in running and n in cut_off and n != name)
    return Promotion(old_master=old, restart=restart, followers=followers, cut_off=left)


def plan_promote(state: dict[str, Any], name: str, *, running: set[str], now_ms: int,
                 free_port: Callable[[], int], role: Role | None = None,
                 flush: FlushMode | None = None,
                 cut_off: frozenset[str] = frozenset()) -> Promotion:
    """decide_promote, for a backend whose slaves reach the master through
    link proxies: the new master's proxy is dropped, every follower's leads
    to it. `free_port` gives a port for a link proxy a node that never was a
    slave now needs."""
    plan = decide_promote(state, name, running=running, now_ms=now_ms, role=role, flush=flush,
                          cut_off=cut_off)
    state["nodes"][name]["master_via"] = None
    dropped = state["proxies"].pop(name, None)
    address = state["nodes"][name]["address"]
    retarget = [follow_through_proxy(state, other, address, free_port) for other in plan.followers]
    return dataclasses.replace(plan, dropped_proxy=dropped,
                               retarget=tuple(r for r in retarget if r))


def follow_through_proxy(state: dict[str, Any], name: str, master_address: str,
                         free_port: Callable[[], int]) -> str:
    """Point node `name`'s link proxy at `master_address` (giving it one if
    it has none); its name when the proxy must be (re)started, else "".
    A cut (a partition) is of the link to the master it led to: the link to
    another master starts whole, as a partition between two nodes leaves
    each one's links to a third alone (the sim's partitions are pairs)."""
    proxy = state["proxies"].get(name)
    if proxy is None:
        proxy = state["proxies"][name] = {"port": free_port(), "target": master_address,
                                          "pid": None, "start_time": None, "cut": False}
        state["nodes"][name]["master_via"] = f"{PROXY_HOST}:{proxy['port']}"
        return name
    state["nodes"][name]["master_via"] = f"{PROXY_HOST}:{proxy['port']}"
    if proxy["target"] == master_address:
        return ""
    proxy["target"] = master_address
    proxy["cut"] = False
    return name


def plan_lose(state: dict[str, Any], name: str, *, now_ms: int, taken: set[str]) -> str:
    """Mark `name` lost; the name of the directory (under nodes/NAME/) its
    store is to be moved to, none of `taken` (what is there already)."""
    entry = _known(state, name)
    if entry.get("lost"):
        raise BackendError(f"{name} is already lost; `dlab cluster rejoin {name}` brings a "
                           "replacement")
    others = [n for n, v in state["nodes"].items() if n != name and not v.get("lost")]
    if not others:
        raise BackendError(f"cannot lose {name}: it is the only node left with a store; "
                           "the cluster would have no data at all (use `dlab cluster down`)")
    count = int(entry.get("lost_count", 0)) + 1
    while f"lost-{count}" in taken:  # left by an earlier cluster in this directory
        count += 1
    entry["lost"] = True
    entry["lost_count"] = count
    where = f"lost-{count}"
    entry.setdefault("lost_dirs", []).append(where)
    if route_of(state).master == name:
        _set_route(state, None, now_ms)
    return where


def decide_rejoin(state: dict[str, Any], name: str, *, running: set[str]) -> Route:
    """Make stopped node `name` a slave of the current master in `state`;
    the route it is to follow."""
    entry = _known(state, name)
    route = route_of(state)
    if name in running:
        raise BackendError(f"cannot rejoin {name}: it is running; kill, stop or lose it "
                           "first")
    if route.master is None or route.address is None:
        raise BackendError(f"cannot rejoin {name}: the cluster has no master to follow (it "
                           "was lost); promote a slave first (`dlab cluster promote NODE`)")
    if route.master == name:
        raise BackendError(f"cannot rejoin {name}: it is the cluster's master; start it with "
                           f"`dlab cluster start {name}`, or promote a slave first")
    entry["spec"]["role"] = Role.SLAVE.value
    entry["lost"] = False
    return route


def plan_rejoin(state: dict[str, Any], name: str, *, running: set[str],
                free_port: Callable[[], int]) -> bool:
    """decide_rejoin, for a backend whose slaves reach the master through
    link proxies; True when `name`'s link proxy must be (re)started."""
    route = decide_rejoin(state, name, running=running)
    assert route.address is not None, "decide_rejoin refuses a route with no master"
    return bool(follow_through_proxy(state, name, route.address, free_port))


def refuse_lost(state: dict[str, Any], name: str) -> None:
    """A lost node starts again only by `rejoin` (an empty store, as a
    slave), never by `start` or `restart`."""
    entry = _known(state, name)
    if entry.get("lost"):
        raise BackendError(f"node {name} was lost (its store is kept in "
                           f"nodes/{name}/{entry['lost_dirs'][-1]}); bring a "
                           f"replacement with `dlab cluster rejoin {name}`")
