"""`dlab controller run|status|elect`: the controller of controller mode as
a process (cluster/controller/), and the operator's view of it. Argument
parsing, output and logging set-up only."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from typing import Any

from cluster.cli.arg_types import address
from cluster.cli.controller_settings import add_elect_unclean
from store.tools.cli_args import UserError, positive_int

DESCRIPTION = """\
The controller of controller mode (RocketMQ 5's automatic failover, RIP-44):
brokers register with it and heartbeat to it; it elects a master from the
SyncStateSet (the replicas holding everything acknowledged) when the master's
heartbeats stop, and fences SyncStateSet changes by the master epoch and the
set's epoch. One controller, as RocketMQ's single-node controller deployment:
its durability is its state file (docs/design.md, "The controller process").
"""

RUN_EPILOG = """\
The state (brokers, master, epochs, SyncStateSet) is DIR/controller-state.json,
rewritten durably (temp file, fsync, rename, directory fsync) before any
change is answered, and read back at start; a damaged file stops the start
(exit 2) with the fix. DIR/lock keeps a second controller off the directory.
Every RPC needs the cluster token (`x-dlab-token` metadata); gRPC health
checking stays open. SIGTERM stops it cleanly; SIGKILL loses nothing answered.

  dlab controller run --dir ctl --token-file cluster/token --listen 127.0.0.1:9876
  dlab controller status --address 127.0.0.1:9876 --token-file cluster/token
"""


def register_controller(sub: Any) -> None:
    p = sub.add_parser("controller", help="the controller of controller mode: run it, "
                       "ask its state, elect by hand", description=DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = p.add_subparsers(dest="controller_action", metavar="ACTION", required=True)
    _register_run(actions)
    _register_status(actions)
    _register_elect(actions)


def _register_run(actions: Any) -> None:
    p = actions.add_parser(
        "run", help="run the controller in the foreground",
        description="Run the controller: serve the Controller gRPC service "
        "(proto/controller.proto) until SIGTERM.", epilog=RUN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", required=True,
                   help="the controller's state directory (created if missing)")
    p.add_argument("--token-file", required=True,
                   help="file holding the cluster token (DIR/token of `dlab cluster up`)")
    p.add_argument("--listen", type=address, default="127.0.0.1:9876",
                   help="gRPC address (default 127.0.0.1:9876, loopback only; port 0 "
                   "takes a free one, logged at start)")
    p.add_argument("--heartbeat-timeout-ms", type=positive_int, default=10_000,
                   help="a broker silent this long is not alive; a master so is replaced "
                   "(default 10000, RocketMQ's controllerHeartBeatTimeoutMills)")
    p.add_argument("--scan-interval-ms", type=positive_int, default=5_000,
                   help="how often the liveness scan looks for a dead master (default "
                   "5000, RocketMQ's scanNotActiveBrokerInterval)")
    add_elect_unclean(p)
    p.add_argument("--publish-route", metavar="DIR",
                   help="also publish the route clients follow as DIR/route.json, rewritten "
                   "atomically at every change of master (`dlab send --dir DIR` reads it; "
                   "`dlab cluster up --ha-mode controller` sets it; default: none)")
    p.add_argument("--route-address", action="append", default=[], type=_route_address,
                   metavar="NAME=HOST:PORT",
                   help="with --publish-route: name broker NAME's address in the route as "
                   "HOST:PORT, not the address it heartbeats from (repeatable; for brokers "
                   "clients reach at another address than their peers do, e.g. a "
                   "container's published port; default: none)")
    p.add_argument("--log-file", help="also append the log to this file")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING"],
                   help="log messages at this level and above (default INFO; DEBUG adds "
                   "refused heartbeats)")
    p.set_defaults(handler=cmd_run)


def _route_address(value: str) -> tuple[str, str]:
    name, sep, addr = value.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"{value!r}: expected NAME=HOST:PORT")
    return name, address(addr)


def _register_status(actions: Any) -> None:
    p = actions.add_parser(
        "status", help="a running controller's health, master, epochs and brokers",
        description="Ask a running controller: its gRPC health, then its metadata (the "
        "master, the epochs, the SyncStateSet, each broker's last heartbeat). Exit 0 when "
        "it serves, 1 when it cannot be reached or does not serve, 2 on a usage error "
        "(a wrong token among them).")
    _add_target(p)
    p.add_argument("--json", action="store_true", help="print one JSON object instead")
    p.set_defaults(handler=cmd_status)


def _register_elect(actions: Any) -> None:
    p = actions.add_parser(
        "elect", help="ask the controller to elect a master (an operator's request)",
        description="Ask for an election, as RocketMQ's `electMaster` admin command: with "
        "--broker, elect that broker if it is a live SyncStateSet member (or any live "
        "replica under --elect-unclean); without, elect only if the master is not alive. "
        "Prints the decision; exit 0 when a master stands afterwards, 1 when none does.")
    _add_target(p)
    p.add_argument("--broker", type=positive_int, default=0, metavar="ID",
                   help="the broker id to prefer (see `dlab controller status`)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead")
    p.set_defaults(handler=cmd_elect)


def _add_target(p: Any) -> None:
    p.add_argument("--address", type=address, default="127.0.0.1:9876",
                   help="the controller's HOST:PORT (default 127.0.0.1:9876)")
    p.add_argument("--token-file", required=True, help="file holding the cluster token")
    p.add_argument("--timeout-s", type=float, default=5.0,
                   help="deadline of each call, seconds (default 5)")


# ------------------------------------------------------------------ run
def cmd_run(args: argparse.Namespace) -> int:
    from cluster.cli.node_command import setup_logging
    from cluster.controller.server import (
        ControllerProcessConfig,
        ControllerStartError,
        serve,
    )
    from cluster.controller.state_file import ControllerStateFileError
    from ha.controller.config import ControllerConfig
    from store.config import ConfigError

    try:
        config = ControllerProcessConfig(
            state_dir=args.dir, token=_token(args.token_file), listen=args.listen,
            scan_interval_ms=args.scan_interval_ms, publish_route=args.publish_route,
            route_addresses=tuple(args.route_address),
            controller=ControllerConfig(heartbeat_timeout_ms=args.heartbeat_timeout_ms,
                                        enable_elect_unclean_master=args.elect_unclean),
        ).validate()
    except ConfigError as exc:
        raise UserError(str(exc)) from None
    setup_logging("controller", args.log_level, args.log_file)
    host = config.listen.rpartition(":")[0]
    if host not in ("127.0.0.1", "localhost", "::1", "[::1]"):
        logging.getLogger("dlab.controller").warning(
            "listening on %s: reachable from other hosts (the token still guards it)", host)
    try:
        return asyncio.run(serve(config))
    except (ControllerStartError, ControllerStateFileError) as exc:
        raise UserError(str(exc)) from None


def _token(path: str) -> str:
    from cluster.node.auth import TokenError, read_token_file

    try:
        return read_token_file(path)
    except TokenError as exc:
        raise UserError(str(exc)) from None


# --------------------------------------------------------------- status
def _client(args: argparse.Namespace) -> Any:
    from cluster.controller.client import ControllerClient

    if not 0 < args.timeout_s <= 3600:
        raise UserError(f"--timeout-s {args.timeout_s}: expected 0 < seconds <= 3600")
    return ControllerClient(args.address, _token(args.token_file), timeout_s=args.timeout_s)


def _unreachable(args: argparse.Namespace, exc: Any) -> int:
    """A failed call: a wrong token is the user's to fix (exit 2); anything
    else means the controller does not serve there (exit 1)."""
    import grpc

    code = exc.code() if hasattr(exc, "code") else None
    if code == grpc.StatusCode.UNAUTHENTICATED:
        raise UserError(f"controller {args.address} refused the token in "
                        f"{args.token_file}: {exc.details()}")
    detail = exc.details() if hasattr(exc, "details") else str(exc)
    print(f"dlab: controller {args.address} does not answer ({code.name if code else exc}: "
          f"{detail}); is `dlab controller run --listen {args.address}` running?",
          file=sys.stderr)
    return 1


def replica_info_dict(info: Any) -> dict[str, Any]:
    return {"master_id": info.master_id or None, "master_name": info.master_name or None,
            "master_address": info.master_address or None,
            "master_epoch": info.master_epoch, "sync_state_set": list(info.sync_state_set),
            "sync_state_set_epoch": info.sync_state_set_epoch}


def metadata_dict(health: str, md: Any) -> dict[str, Any]:
    return {
        "health": health, "pid": md.pid, "uptime_ms": md.uptime_ms,
        "state_file": md.state_file, "heartbeat_timeout_ms": md.heartbeat_timeout_ms,
        "scan_interval_ms": md.scan_interval_ms,
        "elect_unclean_master": md.elect_unclean_master,
        **replica_info_dict(md.replica_info),
        "brokers": [{
            "broker_id": m.broker_id, "name": m.name, "address": m.address or None,
            "heard": m.heard, "alive": m.alive,
            "last_heartbeat_age_ms": m.last_heartbeat_age_ms if m.heard else None,
            "epoch": m.epoch, "max_offset": m.max_offset,
            "confirmed_offset": m.confirmed_offset, "priority": m.priority,
        } for m in md.members],
    }


def cmd_status(args: argparse.Namespace) -> int:
    import grpc

    with _client(args) as client:
        try:
            health = client.health()
            md = client.metadata()
        except grpc.RpcError as exc:
            return _unreachable(args, exc)
    doc = metadata_dict(health, md)
    if args.json:
        print(json.dumps(doc, indent=2, sort_keys=True))
    else:
        _print_status(args.address, doc)
    return 0 if health == "SERVING" else 1


def _print_status(address: str, doc: dict[str, Any]) -> None:
    print(f"controller {address}: {doc['health']} (pid {doc['pid']}, up "
          f"{doc['uptime_ms'] / 1000:.1f} s), state {doc['state_file']}")
    master = ("none" if doc["master_id"] is None else
              f"{doc['master_name']} (id {doc['master_id']}) at "
              f"{doc['master_address'] or 'an address not yet heard'}")
    print(f"master: {master}; master epoch {doc['master_epoch']}")
    print(f"SyncStateSet: {doc['sync_state_set']} (epoch {doc['sync_state_set_epoch']})")
    print(f"heartbeat timeout {doc['heartbeat_timeout_ms']} ms, scan every "
          f"{doc['scan_interval_ms']} ms, unclean election "
          f"{'allowed' if doc['elect_unclean_master'] else 'refused'}")
    if not doc["brokers"]:
        print("no broker has registered")
        return
    print(f"{'id':>3} {'name':<16} {'address':<22} {'alive':<6} {'heartbeat':>10} "
          f"{'epoch':>6} {'max offset':>12} {'confirmed':>12} {'prio':>4}")
    for b in doc["brokers"]:
        age = ("never" if b["last_heartbeat_age_ms"] is None
               else f"{b['last_heartbeat_age_ms'] / 1000:.1f}s ago")
        print(f"{b['broker_id']:>3} {b['name']:<16} {b['address'] or '-':<22} "
              f"{'yes' if b['alive'] else 'no':<6} {age:>10} {b['epoch']:>6} "
              f"{b['max_offset']:>12} {b['confirmed_offset']:>12} {b['priority']:>4}")


# ---------------------------------------------------------------- elect
def cmd_elect(args: argparse.Namespace) -> int:
    import grpc

    with _client(args) as client:
        try:
            answer = client.elect_master(preferred=args.broker)
        except grpc.RpcError as exc:
            return _unreachable(args, exc)
    doc = {"outcome": answer.outcome, "refusal": answer.refusal or None,
           "reason": answer.reason or None, "unclean": answer.unclean,
           **replica_info_dict(answer.replica_info)}
    if args.json:
        print(json.dumps(doc, indent=2, sort_keys=True))
    else:
        print(f"{answer.outcome}: {answer.reason or answer.refusal or '-'}")
        print(f"master {doc['master_name'] or 'none'} (id {doc['master_id']}), master epoch "
              f"{doc['master_epoch']}, SyncStateSet {doc['sync_state_set']}")
    return 0 if answer.replica_info.master_id else 1
