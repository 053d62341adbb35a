"""The link proxies of a controller-mode cluster on the local backend, as
changes to the cluster's state (the `cluster.json` dict): which proxies
exist, what each node is told to reach through them, and which ones a
partition cuts. Pure: the backend (cluster/backends/local.py) starts,
signals and ends the proxy processes (cluster/backends/proxy.py).

In controller mode any node may be elected, so every node may follow every
other: for each ordered pair (FROM, TO) of nodes there is one proxy
FROM.TO, forwarding to TO's real port, and FROM starts with
`--peer-address TO=` its address: when the controller names TO master, FROM's
HA stream, its status call and its copy of the consumer offsets go through
that proxy (cluster/node/replicas_manager.py), as does a repair from TO.
Each node also reaches the controller through a proxy of its own,
FROM.controller (its `--controller`): its heartbeats, elect requests and
SyncStateSet changes. Clients, the harness and the controller's route use
the nodes' real addresses, untouched by any cut.

A partition of two nodes cuts both directions of their pair (FROM.TO and
TO.FROM), so whichever of them is master, the other cannot follow it, and
nothing else: each keeps its links to a third node and to the controller
(the sim's partitions are such pairs). A partition of a node and
CONTROLLER_NAME cuts that node's link to the controller alone.

A proxy's state entry: {"port", "target" (HOST:PORT it forwards to),
"from", "to" (node names, or CONTROLLER_NAME), "pid", "start_time",
"cut"}; its key is "FROM.TO" (a node name holds no dot), which also names
its files DIR/proxies/FROM.TO.json and .log.
"""

from __future__ import annotations

from typing import Any

from cluster.backends.interface import CONTROLLER_NAME, BackendError
from cluster.backends.state_dir import check_name


def link_key(src: str, dst: str) -> str:
    """The key (and file name) of the proxy that carries src's calls to dst."""
    return f"{src}.{dst}"


def plan_links(nodes: list[str], controller_address: str, host: str, ports: list[int],
               node_addresses: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Every proxy of a controller-mode cluster of `nodes` (not started:
    no pid), on `host` at `ports` (len: links_needed(len(nodes)))."""
    assert len(ports) == links_needed(len(nodes)), (len(ports), len(nodes))
    pairs = [(a, b) for a in nodes for b in nodes if a != b]
    pairs += [(a, CONTROLLER_NAME) for a in nodes]
    links = {}
    for (src, dst), port in zip(pairs, ports, strict=True):
        target = controller_address if dst == CONTROLLER_NAME else node_addresses[dst]
        links[link_key(src, dst)] = {"port": port, "target": target, "from": src, "to": dst,
                                     "pid": None, "start_time": None, "cut": False}
    return links


def links_needed(n_nodes: int) -> int:
    """How many proxies a controller-mode cluster of n nodes has."""
    return n_nodes * (n_nodes - 1) + n_nodes


def address_of(link: dict[str, Any], host: str) -> str:
    return f"{host}:{link['port']}"


def node_routes(state: dict[str, Any], name: str, host: str
                ) -> tuple[str, tuple[tuple[str, str], ...]]:
    """What node `name` is started with: its --controller (its own proxy to
    the controller) and its --peer-address pairs (a proxy to every other
    node)."""
    proxies = state["proxies"]
    if link_key(name, CONTROLLER_NAME) not in proxies:
        raise BackendError("this controller-mode cluster was made with no link proxies (by "
                           "an earlier dlab): `down` it and `up` it again")
    controller = address_of(proxies[link_key(name, CONTROLLER_NAME)], host)
    peers = tuple((other, address_of(proxies[link_key(name, other)], host))
                  for other in state["nodes"] if other != name)
    return controller, peers


def links_between(state: dict[str, Any], a: str, b: str) -> list[str]:
    """The proxies a partition (or heal) of a and b acts on: both
    directions of two nodes, or one node's link to the controller."""
    if a == b:
        raise BackendError(f"no link between {a} and itself")
    if not any(p.get("to") == CONTROLLER_NAME for p in state["proxies"].values()):
        raise BackendError("this controller-mode cluster was made with no link proxies (by "
                           "an earlier dlab): `down` it and `up` it again to cut its links")
    if CONTROLLER_NAME in (a, b):
        node = b if a == CONTROLLER_NAME else a
        check_name(state, node)
        return [link_key(node, CONTROLLER_NAME)]
    check_name(state, a)
    check_name(state, b)
    return [link_key(a, b), link_key(b, a)]


def cut_from(state: dict[str, Any], name: str) -> list[str]:
    """The nodes (and CONTROLLER_NAME) node `name` is cut off from now."""
    cut = set()
    for p in state["proxies"].values():
        if p.get("cut") and name in (p.get("from"), p.get("to")):
            cut.add(p["to"] if p["from"] == name else p["from"])
    return sorted(cut)
