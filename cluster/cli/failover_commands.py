"""`dlab cluster promote | lose | rejoin`: failing a cluster over by hand,
as an operator of RocketMQ's classic master-slave mode does. Argument
parsing and output only; the rules are in cluster/backends/failover.py, the
order of the steps in cluster/backends/failover_steps.py, the steps in the
backend, local or compose (docs/design.md, "Failover: routing, promotion, rejoin")."""

from __future__ import annotations

import argparse
import json
from typing import Any

from cluster.backends.interface import BackendError, NodeInfo
from cluster.node.role import Role
from store.config import FlushMode
from store.tools.cli_args import UserError, non_negative_float

_EXIT = ("exit status: 0 when done; 2 for bad input (an unknown node, {what}) or a step the "
         "backend could not take (a node that would not start or stop), with the reason on "
         "stderr. Works on local and compose clusters alike.")


def register_failover(csub: Any) -> None:
    """Add promote, lose and rejoin to `dlab cluster`'s subcommands."""
    p = csub.add_parser(
        "promote", help="make a running slave the master (the others follow it)",
        description="Make running slave NODE the master, with its own log: it restarts as "
        "master (role and flush mode the old master's unless --role/--flush say otherwise), "
        "every other node becomes its slave, and the cluster's route (DIR/route.json, what "
        "`dlab send --dir` and `dlab consume --dir` follow) names it from now on. A running "
        "old master restarts as a slave; one that is down comes back as a slave with "
        "`dlab cluster rejoin`.",
        epilog=_EXIT.format(what="a node that is not a running slave"))
    _common(p)
    p.add_argument("--role", choices=[Role.SYNC_MASTER.value, Role.ASYNC_MASTER.value],
                   help="the new master's role (default: the old master's)")
    p.add_argument("--flush", choices=[m.value for m in FlushMode],
                   help="the new master's flush mode (default: the old master's)")
    _timeout(p)
    p.set_defaults(handler=cmd_promote)

    p = csub.add_parser(
        "lose", help="the node's machine is gone: kill it, move its store aside",
        description="NODE's machine is gone: its process is killed (SIGKILL, under its "
        "crash model) and its store moved aside to DIR/nodes/NODE/lost-N, kept as evidence "
        "(no node opens it). Losing the master leaves the cluster without one until a slave "
        "is promoted. `dlab cluster rejoin NODE` brings a replacement with an empty store.",
        epilog=_EXIT.format(what="the last node with a store, a node already lost"))
    _common(p)
    p.set_defaults(handler=cmd_lose)

    p = csub.add_parser(
        "rejoin", help="start a node again as a slave of the current master",
        description="Start NODE (not running) as a slave of the current master: on its own "
        "store after a crash (an old master may be ahead of the new one), or on an empty one "
        "after `lose` (a replacement that catches up). Its first report goes through the "
        "cluster's --slave-ahead-policy: reject keeps both logs and the link down, truncate "
        "cuts the node back to the master's log, trust believes it. Prints the link as the "
        "master reports it.",
        epilog=_EXIT.format(what="a node that is running, a cluster with no master, the "
                                 "master itself"))
    _common(p)
    _timeout(p)
    p.set_defaults(handler=cmd_rejoin)


def _common(p: Any) -> None:
    p.add_argument("node", help="the node's name (see `dlab cluster status`)")
    p.add_argument("--dir", required=True, help="the cluster's directory")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object (the node, the route, links) and nothing else")


def _timeout(p: Any) -> None:
    p.add_argument("--timeout", type=non_negative_float, default=60.0, metavar="SECONDS",
                   help="how long to wait for the nodes to serve and their links to settle "
                        "(default 60)")


def _backend(directory: str) -> Any:
    from cluster.backends.registry import backend_of

    try:
        return backend_of(directory)
    except BackendError as exc:
        raise UserError(str(exc)) from None


def cmd_promote(args: argparse.Namespace) -> int:
    backend = _backend(args.dir)
    try:
        info = backend.promote(args.node, role=Role(args.role) if args.role else None,
                               flush=FlushMode(args.flush) if args.flush else None,
                               timeout_s=args.timeout or 60.0)
    except BackendError as exc:
        raise UserError(str(exc)) from None
    _report(backend, info, f"promoted {info.name} (was {info.extra.get('promoted_from')}'s "
                           "slave) to master", args.json)
    return 0


def cmd_lose(args: argparse.Namespace) -> int:
    backend = _backend(args.dir)
    try:
        info = backend.lose(args.node)
    except BackendError as exc:
        raise UserError(str(exc)) from None
    where = (info.extra.get("lost") or ["?"])[-1]
    _report(backend, info, f"lost {info.name}: its store is kept in {where}", args.json)
    return 0


def cmd_rejoin(args: argparse.Namespace) -> int:
    backend = _backend(args.dir)
    try:
        info = backend.rejoin(args.node, timeout_s=args.timeout or 60.0)
    except BackendError as exc:
        raise UserError(str(exc)) from None
    _report(backend, info, f"{info.name} rejoined as a slave; its link: "
                           f"{info.extra.get('link')}", args.json)
    return 0


def _report(backend: Any, info: NodeInfo, line: str, as_json: bool) -> None:
    try:
        route = backend.route()
    except BackendError as exc:
        raise UserError(str(exc)) from None
    if as_json:
        print(json.dumps({"node": {"name": info.name, "role": info.role.value,
                                   "address": info.address, "state": info.state.value,
                                   "pid": info.pid, **info.extra},
                          "route": route.to_dict()}, indent=2, sort_keys=True))
        return
    print(line)
    links = info.extra.get("links") or {}
    for name, link in sorted(links.items()):
        print(f"  {name}: {link}")
    for name in info.extra.get("cut_off") or ():
        print(f"  {name}: cut off from {info.name}, not reached: it still runs as a master "
              f"(stop it, then `dlab cluster rejoin {name}`)")
    print(route_line(route.to_dict()))


def route_line(route: dict[str, Any], *, controller_mode: bool = False) -> str:
    """One line of the route (route.json's fields)."""
    if route.get("master") is None and controller_mode:
        return (f"route: no master (epoch {route.get('epoch')}); the controller elects one "
                "once a SyncStateSet member heartbeats (`dlab controller status`)")
    if route.get("master") is None:
        return (f"route: no master (epoch {route.get('epoch')}); promote a slave with "
                "`dlab cluster promote NODE`")
    return (f"route: master {route['master']} at {route['address']} since_ms "
            f"{route['since_ms']} (epoch {route['epoch']})")
