"""`dlab cluster ...`: up, status, faults, down. Argument parsing and output
only; the work is in cluster/backends/."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from typing import Any

from cluster.backends.interface import (
    BackendError,
    ClusterSpec,
    ControllerSpec,
    NodeInfo,
    NodeSpec,
    NodeState,
)
from cluster.cli.controller_settings import ack_settings, add_ack_options, add_elect_unclean
from cluster.cli.failover_commands import register_failover, route_line
from cluster.cli.node_command import NODE_OPTIONS, add_corruption_policy, as_options, emulate_arg
from cluster.node.role import Role
from ha.config import HAMode, ShipLimit, SlaveAheadPolicy
from store.config import CorruptionPolicy, CrashModel, FlushMode
from store.tools.cli_args import UserError, non_negative_float, parse_size


def register_cluster(sub: Any) -> None:
    p = sub.add_parser("cluster", help="a local cluster: up, status, faults, down",
                       description="Run a master and slaves as local processes (each slave "
                       "behind a cuttable link proxy) and inject faults into them.")
    csub = p.add_subparsers(dest="cluster_command", metavar="ACTION", required=True)

    up = csub.add_parser(
        "up", help="start a master and slaves in DIR",
        description="Start a master and --slaves slaves in DIR (each slave replicating "
        "through a link proxy `cluster partition` can cut), wait until every node answers, "
        "and print each node's name, role, address, state and pid. The token is written "
        "to DIR/token; later commands find the cluster by --dir.",
        epilog="exit status: 0 when every node is up; 2 for bad input, a cluster already "
        "up in DIR, or a node that did not start in --timeout (its log is named).")
    up.add_argument("--dir", required=True, help="the cluster's directory (made if missing)")
    up.add_argument("--backend", choices=["local", "compose"], default="local",
                    help="local processes (default) or docker-compose containers (builds "
                    "the node image offline on first use); later commands on DIR use the "
                    "backend that started it")
    up.add_argument("--role", choices=["SYNC_MASTER", "ASYNC_MASTER"],
                    help="the master's role: SYNC_MASTER acks after a slave received the "
                    "message, ASYNC_MASTER at once (default SYNC_MASTER; classic mode only)")
    up.add_argument("--flush", default="ASYNC_FLUSH", choices=["SYNC_FLUSH", "ASYNC_FLUSH"],
                    help="the master's flush mode: SYNC_FLUSH acks after the fsync "
                    "(default ASYNC_FLUSH)")
    up.add_argument("--slave-flush", choices=["SYNC_FLUSH", "ASYNC_FLUSH"],
                    help="slaves' flush mode (default: the master's)")
    up.add_argument("--slaves", type=int, default=1, help="number of slaves (0-8, default 1)")
    up.add_argument("--crash-model", default="power", choices=["power", "process"],
                    help="what `cluster kill` loses: power, unflushed bytes as in a power "
                    "cut; process, nothing the OS holds (default power)")
    up.add_argument("--slave-ahead-policy", default="reject",
                    choices=[x.value for x in SlaveAheadPolicy],
                    help="what a master does with a slave that reports more than it has "
                    "(default reject, RocketMQ 4.9.3+)")
    up.add_argument("--ha-ship-limit", default="wrote", choices=[x.value for x in ShipLimit],
                    help="ship bytes up to the master's written or flushed position "
                    "(default wrote)")
    up.add_argument("--segment-size", type=parse_size, default=64 << 20,
                    help="CommitLog segment size: bytes or with a unit, e.g. 256KiB "
                    "(default 64MiB)")
    add_corruption_policy(up)
    up.add_argument("--token-file", help="use this token instead of generating one")
    up.add_argument("--node-args", default="",
                    help="extra `dlab node` options for every node, e.g. "
                         "'--slave-timeout-ms 1000 --ha-heartbeat-ms 500' (default: none)")
    up.add_argument("--timeout", type=non_negative_float, default=60.0, metavar="SECONDS",
                    help="how long to wait for every node to answer, in seconds (default 60)")
    up.add_argument("--emulate", action="append", default=[], metavar="BUG",
                    help="every node re-introduces this known RocketMQ bug (repeatable; "
                         "see `dlab chaos bugs`; default: none)")
    c = up.add_argument_group(
        "controller mode (RocketMQ 5's automatic failover; defaults are RocketMQ's)",
        "--ha-mode controller starts `dlab controller run` first (state in DIR/controller, "
        "log DIR/controller.log, loopback, the cluster token; on --backend compose a "
        "container of the node image), then the nodes, which it "
        "elects among: `master` first, then `slave1`... It publishes DIR/route.json at "
        "every change of master, so `dlab send --dir DIR` follows its elections.")
    c.add_argument("--ha-mode", choices=["classic", "controller"], default="classic",
                   help="classic: master and slaves as started; controller: the controller "
                   "elects the master (default classic)")
    add_ack_options(c, unset=True)
    add_elect_unclean(c)
    c.add_argument("--controller-heartbeat-timeout-ms", type=int, default=None, metavar="MS",
                   help="a broker silent this long is dead; a master so is replaced "
                   "(default 10000)")
    c.add_argument("--controller-scan-interval-ms", type=int, default=None, metavar="MS",
                   help="how often the controller looks for a dead master (default 5000)")
    up.set_defaults(handler=cmd_cluster_up)

    st = csub.add_parser(
        "status", help="nodes, states, positions and HA links",
        description="Each node's state, written and flushed positions, replication links "
        "and consume side, asked of the node itself.",
        epilog="exit status: 0 when every node is running and answered; 1 when some node "
        "is down (stopped, killed, paused) or did not answer (named on stderr); 2 for bad "
        "input or no cluster in DIR.")
    st.add_argument("--dir", required=True, help="the cluster's directory")
    st.add_argument("--json", action="store_true",
                    help="print one JSON array (a row per node) and nothing else")
    st.set_defaults(handler=cmd_cluster_status)

    down = csub.add_parser("down", help="stop every node and proxy (keeps data and logs)")
    down.add_argument("--dir", required=True, help="the cluster's directory")
    down.set_defaults(handler=lambda a: _backend_call(a, "down"))

    for action, help_text in (
        ("kill", "SIGKILL a node (its crash model applies)"),
        ("stop", "SIGTERM a node (clean shutdown)"),
        ("start", "start a stopped or killed node"),
        ("restart", "clean stop, then start"),
        ("pause", "SIGSTOP a node"),
        ("resume", "SIGCONT a paused node"),
    ):
        a = csub.add_parser(action, help=help_text)
        a.add_argument("node")
        a.add_argument("--dir", required=True, help="the cluster's directory")
        if action in ("start", "restart"):
            a.add_argument("--corruption-policy", choices=["refuse", "truncate", "repair"],
                           help="change the node's corruption policy from this start on "
                                "(e.g. for a node that refused to start)")
        a.set_defaults(handler=lambda args, act=action: _backend_call(args, act, args.node))
    link_doc = (
        "Classic mode: A and B are the master and one of its slaves (either order), and the "
        "link is the slave's replication link. Controller mode: any two nodes (their link "
        "both ways, nothing else: each keeps its links to a third node and to the "
        "controller), or a node and `controller` (its heartbeats and election requests). "
        "The local backend cuts a link proxy, the compose backend takes containers off the "
        "link's network; "
        "either way no peer is told: each side notices by its own timeouts, as in a real "
        "partition. `dlab cluster status` shows what each node is cut from.")
    for action, help_text in (
            ("partition", "cut the link between A and B: the master and a slave; in controller "
                          "mode any two nodes (both ways), or a node and `controller`"),
            ("heal", "restore the link between A and B")):
        a = csub.add_parser(action, help=help_text, description=(
            f"{'Cut' if action == 'partition' else 'Restore'} the link between A and B. "
            f"{link_doc}"
            + (" A connection that lived through the cut is closed: its stream lost bytes."
               if action == "heal" else "")))
        a.add_argument("a", metavar="A", help="a node's name (or `controller`)")
        a.add_argument("b", metavar="B", help="a node's name (or `controller`)")
        a.add_argument("--dir", required=True, help="the cluster's directory")
        a.set_defaults(handler=lambda args, act=action: _backend_call(args, act, args.a,
                                                                         args.b))
    register_failover(csub)


def _backend(directory: str, name: str | None = None) -> Any:
    """The named backend, or the one that made the cluster in `directory`."""
    from cluster.backends.registry import backend_of, open_backend

    try:
        return open_backend(name, directory) if name else backend_of(directory)
    except BackendError as exc:
        raise UserError(str(exc)) from None


def _backend_call(args: argparse.Namespace, action: str, *names: str) -> int:
    backend = _backend(args.dir)
    try:
        if getattr(args, "corruption_policy", None):
            backend.set_corruption_policy(names[0], CorruptionPolicy(args.corruption_policy))
        result = getattr(backend, action)(*names)
    except BackendError as exc:
        raise UserError(str(exc)) from None
    if isinstance(result, NodeInfo):
        _print_nodes([result])
    else:
        print(" ".join([action, *names]) + ": done")
    return 0


def cmd_cluster_up(args: argparse.Namespace) -> int:
    from cluster.node.auth import TokenError, generate_token, read_token_file

    if not 0 <= args.slaves <= 8:
        raise UserError("--slaves must be between 0 and 8")
    try:
        extra = tuple(shlex.split(args.node_args))
    except ValueError as exc:
        raise UserError(f"--node-args: {exc}") from None
    _check_node_args(args.segment_size, extra)
    try:
        token = read_token_file(args.token_file) if args.token_file else generate_token()
    except TokenError as exc:
        raise UserError(str(exc)) from None
    controller, ha = _controller_options(args)
    common: dict[str, Any] = dict(
        **ha, emulate=tuple(sorted(emulate_arg(args.emulate))),
        crash_model=CrashModel(args.crash_model), segment_size_bytes=args.segment_size,
        slave_ahead_policy=SlaveAheadPolicy(args.slave_ahead_policy),
        ha_ship_limit=ShipLimit(args.ha_ship_limit), extra_args=extra,
        corruption_policy=CorruptionPolicy(args.corruption_policy),
    )
    master = NodeSpec(name="master", role=Role(args.role or "SYNC_MASTER"),
                      flush=FlushMode(args.flush), **common)
    slaves = tuple(NodeSpec(name=f"slave{i + 1}", role=Role.SLAVE,
                            flush=FlushMode(args.slave_flush or args.flush), **common)
                   for i in range(args.slaves))
    spec = ClusterSpec(directory=os.path.abspath(args.dir), master=master, slaves=slaves,
                       controller=controller)
    try:
        infos = _backend(args.dir, args.backend).up(spec, token=token,
                                                    timeout_s=args.timeout or 60.0)
    except BackendError as exc:
        raise UserError(str(exc)) from None
    _print_nodes(infos)
    if spec.controller_mode:
        # The roles above are the plan's; the controller's election is this.
        backend = _backend(args.dir)
        print(route_line(backend.route().to_dict(), controller_mode=True))
        print(controller_line(backend.controller()))
    print(f"token: {os.path.join(spec.directory, 'token')}")
    return 0


def _controller_options(args: argparse.Namespace) -> tuple[ControllerSpec | None,
                                                          dict[str, Any]]:
    """The controller's settings and the nodes' controller-mode fields from
    `cluster up`'s options; a UserError for a value out of range or an
    option of controller mode given in classic mode."""
    given = [flag for flag, value in (
        ("--all-ack-in-sync-state-set", args.all_ack_in_sync_state_set),
        ("--in-sync-replicas", args.in_sync_replicas is not None),
        ("--min-in-sync-replicas", args.min_in_sync_replicas is not None),
        ("--elect-unclean", args.elect_unclean),
        ("--controller-heartbeat-timeout-ms", args.controller_heartbeat_timeout_ms is not None),
        ("--controller-scan-interval-ms", args.controller_scan_interval_ms is not None))
        if value]
    if args.ha_mode != "controller":
        if given:
            raise UserError(f"{', '.join(given)}: controller mode only; add --ha-mode "
                            "controller")
        return None, {}
    if args.role is not None:
        raise UserError("--role is for classic mode: in controller mode the controller elects "
                        "the master, and whether a put waits for a slave is "
                        "--in-sync-replicas or --all-ack-in-sync-state-set")
    copies = args.slaves + 1
    for flag, value in (("--in-sync-replicas", args.in_sync_replicas),
                        ("--min-in-sync-replicas", args.min_in_sync_replicas)):
        if value is not None and not 1 <= value <= copies:
            raise UserError(f"{flag} {value}: it counts copies, the master's included: "
                            f"1..{copies} with --slaves {args.slaves}")
    for flag, value, least in (
            ("--controller-heartbeat-timeout-ms", args.controller_heartbeat_timeout_ms, 100),
            ("--controller-scan-interval-ms", args.controller_scan_interval_ms, 10)):
        if value is not None and not least <= value <= 3_600_000:
            raise UserError(f"{flag} {value}: expected {least}..3600000 ms")
    defaults = ControllerSpec()
    controller = ControllerSpec(
        heartbeat_timeout_ms=args.controller_heartbeat_timeout_ms
        or defaults.heartbeat_timeout_ms,
        scan_interval_ms=args.controller_scan_interval_ms or defaults.scan_interval_ms,
        elect_unclean=args.elect_unclean)
    return controller, dict(ha_mode=HAMode.CONTROLLER, **ack_settings(args))


# `dlab node` options `cluster up` sets for every node itself: given in
# --node-args they would override it (a --listen elsewhere leaves the
# cluster waiting on an address nobody answers).
_HARNESS_OPTIONS = {
    "--listen": "each node gets a free port on 127.0.0.1, where the cluster waits for it and "
                "points slaves and clients",
    "--master": "each slave reaches its master through its link proxy",
    "--name": "the nodes are master, slave1, slave2, ...",
    "--role": "use cluster up's --role",
    "--data-dir": "each node's store is DIR/nodes/NAME/data",
    "--token-file": "use cluster up's --token-file",
    "--ha-mode": "use cluster up's --ha-mode",
    "--controller": "in controller mode the cluster starts the controller and gives every "
                    "node its address",
    "--advertise": "in controller mode each node gives the controller the address its peers "
                   "reach it at (on compose, its service name)",
    "--peer-address": "in controller mode each local node reaches the others through its link "
                      "proxies, which `cluster partition` cuts",
}


def _check_node_args(segment_size: int, node_args: tuple[str, ...]) -> None:
    """Refuse, before any node starts, --node-args that set what the cluster
    sets itself, and a --segment-size that cannot hold the nodes' largest
    message (--max-message-size, a node option)."""
    from store.config import ConfigError, StoreConfig

    probe = argparse.ArgumentParser(add_help=False, exit_on_error=False)
    probe.add_argument("--max-message-size", type=parse_size,
                       default=StoreConfig().max_message_size_bytes)
    for option in _HARNESS_OPTIONS:
        probe.add_argument(option)
    try:
        given = vars(probe.parse_known_args(list(node_args))[0])
    except argparse.ArgumentError:
        return  # the node says what is wrong with its arguments
    for option, why in _HARNESS_OPTIONS.items():
        value = given[option.removeprefix("--").replace("-", "_")]
        if value is not None:
            raise UserError(f"--node-args cannot set {option} ({value}): the cluster sets it "
                            f"for every node ({why}); leave it out")
    max_message = given["max_message_size"]
    try:
        StoreConfig(segment_size_bytes=segment_size,
                    max_message_size_bytes=max_message).validate()
    except ConfigError as exc:
        raise UserError(as_options(str(exc), NODE_OPTIONS) + " (--max-message-size is a node "
                        "option: --node-args '--max-message-size 512KiB')") from None


def _print_nodes(infos: list[NodeInfo]) -> None:
    print(f"{'NAME':<10}{'ROLE':<14}{'ADDRESS':<22}{'STATE':<10}PID")
    for i in infos:
        print(f"{i.name:<10}{i.role.value:<14}{i.address:<22}{i.state.value:<10}"
              f"{i.pid if i.pid else '-'}")


def cmd_cluster_status(args: argparse.Namespace) -> int:
    from cluster.client.node_client import NodeCallError, NodeClient, status_to_dict

    backend = _backend(args.dir)
    try:
        infos = backend.nodes()
        token = backend.token()
        route = backend.route().to_dict()
        controller = backend.controller() if hasattr(backend, "controller") else None
    except (BackendError, ValueError) as exc:
        raise UserError(str(exc)) from None
    rows = []
    for i in infos:
        row: dict[str, Any] = {"name": i.name, "role": i.role.value, "address": i.address,
                               "state": i.state.value, "pid": i.pid, **i.extra,
                               "route_master": i.name == route["master"]}
        if i.state == NodeState.RUNNING:
            try:
                with NodeClient(i.address, token=token, timeout_s=3) as c:
                    row["status"] = status_to_dict(c.status())
                if row["status"].get("ha_mode") == "controller":
                    row["role"] = row["status"]["role"]  # the elected role, not the plan's
            except NodeCallError as exc:
                row["status_error"] = str(exc)
        rows.append(row)
    down = [f"{r['name']} is {r['state']}" if r["state"] != NodeState.RUNNING.value
            else f"{r['name']} did not answer ({r['status_error']})"
            for r in rows if r["state"] != NodeState.RUNNING.value or "status_error" in r]
    if controller is not None and controller["state"] != "running":
        down.append(f"the controller is {controller['state']} (see {controller['log']})")
    for line in down:
        print(f"dlab cluster status: {line}", file=sys.stderr)
    if args.json:
        print(json.dumps(rows, indent=2, sort_keys=True))
        return 1 if down else 0
    print(f"{'NAME':<10}{'ROLE':<14}{'ADDRESS':<22}{'STATE':<10}{'WROTE':>14}{'FLUSHED':>14}"
          "  LINK")
    for r in rows:
        st = r.get("status", {})
        link = ""
        if r.get("cut_from"):
            link = f"CUT FROM {','.join(r['cut_from'])} "
        elif r.get("partitioned"):
            link = "PARTITIONED "
        if st.get("master"):
            m = st["master"]
            link += f"master {m['state']} reported={m['reported']}"
            if m.get("last_error") and m["state"] != "streaming":
                link += f" ({m['last_error'][:60]})"
        for s in st.get("slaves", []):
            link += f"{s['slave']}: {s['state']} acked={s['acked']}  "
        if st:
            link += f" [ahead={st['slave_ahead_policy']} ship={st['ha_ship_limit']}]"
        print(f"{r['name']:<10}{r['role']:<14}{r['address']:<22}{r['state']:<10}"
              f"{st.get('wrote', '-'):>14}{st.get('flushed', '-'):>14}  {link.strip()}")
        if st.get("failed"):
            print(f"  WRITES REFUSED: {st['failed']}")
        if st:
            print("  " + consume_summary(st))
        if r.get("refused"):
            print(f"  refused: {r['refused']}")
        rec = st.get("recovery") or {}
        if rec.get("corruption_action"):
            print(f"  recovery {rec['corruption_action']} corruption of flushed data: "
                  f"{rec.get('corruption')}"
                  + (f" ({rec.get('records_lost')} records, {rec.get('bytes_lost')} bytes lost)"
                     if rec["corruption_action"] == "truncated" else ""))
        if r.get("status_error"):
            print(f"  status unavailable: {r['status_error']}")
        if r.get("lost"):
            print(f"  lost: its stores are kept in {', '.join(r['lost'])}")
    print(route_line(route, controller_mode=controller is not None))
    if controller is not None:
        print(controller_line(controller))
    return 1 if down else 0


def controller_line(c: dict[str, Any]) -> str:
    """One line on a controller-mode cluster's controller."""
    return (f"controller {c['address']}: {c['state']}"
            + (f" (pid {c['pid']})" if c["pid"] else "")
            + (f" (container {c['container']})" if c.get("container") else "")
            + f", heartbeat timeout {c['heartbeat_timeout_ms']} ms, scan every "
              f"{c['scan_interval_ms']} ms, unclean election "
              f"{'allowed' if c['elect_unclean'] else 'refused'}; state {c['state_dir']}")


def _printable(key: str) -> str:
    # Nodes refuse such groups (store/names.py), but a table persisted
    # before that may still hold one: never a control character or a
    # megabyte on the operator's terminal.
    if key.isprintable() and len(key) <= 400:
        return key
    return repr(key[:80]) + (f"...({len(key)} characters)" if len(key) > 80 else "")


def consume_summary(st: dict[str, Any], *, max_items: int = 6) -> str:
    """One line of a node's consume side: how far consumers may read, each
    queue's (min, max) and the offset table's groups."""
    consume = st.get("consume", {})
    queues = consume.get("queues", {})
    offsets = consume.get("offsets", {})

    def first(items: list[str]) -> str:
        more = f", +{len(items) - max_items} more" if len(items) > max_items else ""
        return ", ".join(items[:max_items]) + more
    parts = [f"consume: confirmed={st.get('confirmed_offset', '-')}",
             f"queues [{first([f'{k} {lo}..{hi}' for k, (lo, hi) in sorted(queues.items())])}]",
             "offsets [" + first([f"{_printable(k)} " + " ".join(f"{q}:{o}" for q, o in sorted(
                 v.items(), key=lambda x: int(x[0]))) for k, v in sorted(offsets.items())]) + "]"]
    if consume.get("malformed_offset_entries"):
        parts.append(f"+{consume['malformed_offset_entries']} malformed offset entries "
                     "(not shown, not synced)")
    sync = consume.get("offset_sync")
    if sync:
        parts.append(f"synced {sync['syncs']}x" + (f" ({sync['last_error'][:60]})"
                                                   if sync.get("last_error") else ""))
    return "  ".join(parts)
