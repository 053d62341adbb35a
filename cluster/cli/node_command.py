"""`dlab node`: run one node (master or slave) in the foreground. Argument
parsing and logging set-up only; the node is cluster/node/server.py."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import sys
from typing import Any

from cluster.cli.arg_types import address
from cluster.cli.controller_settings import add_ack_options
from cluster.node.role import Role
from ha.config import ShipLimit, SlaveAheadPolicy
from store.tools.cli_args import UserError, parse_size, positive_int


def register_node(sub: Any) -> None:
    p = sub.add_parser(
        "node", help="run one node (master or slave) in the foreground",
        description="Run one node: a store, the broker gRPC service and HA. SIGTERM shuts it "
        "down cleanly (flush, remove `abort`); SIGKILL is a crash under --crash-model.",
    )
    p.add_argument("--name", required=True, help="node name (letters, digits, - _)")
    p.add_argument("--role", required=True, choices=[r.value for r in Role],
                   help="a master's role (SYNC_MASTER acks after a slave received the "
                   "message, ASYNC_MASTER at once), or SLAVE")
    p.add_argument("--flush", default="ASYNC_FLUSH", choices=["SYNC_FLUSH", "ASYNC_FLUSH"],
                   help="SYNC_FLUSH acks after the fsync (default ASYNC_FLUSH)")
    p.add_argument("--crash-model", default="power", choices=["power", "process"],
                   help="what a SIGKILL loses: power, unflushed bytes as in a power cut; "
                   "process, nothing the OS holds (default power)")
    p.add_argument("--segment-size", type=parse_size, default=64 << 20,
                   help="CommitLog segment size (default 64MiB)")
    p.add_argument("--max-message-size", type=parse_size, default=4 << 20,
                   help="largest message body (default 4MiB)")
    p.add_argument("--data-dir", required=True, help="the store directory")
    p.add_argument("--listen", type=address, default="127.0.0.1:0",
                   help="gRPC address (default 127.0.0.1 on a free port)")
    p.add_argument("--token-file", required=True, help="file holding the cluster token")
    p.add_argument("--master", type=address, help="a slave's master address (HOST:PORT)")
    p.add_argument("--slave-ahead-policy", default="reject",
                   choices=[x.value for x in SlaveAheadPolicy],
                   help="what a master does with a slave that reports more than it has "
                   "(default reject, RocketMQ 4.9.3+)")
    p.add_argument("--ha-ship-limit", default="wrote", choices=[x.value for x in ShipLimit],
                   help="ship bytes up to the master's written or flushed position "
                   "(default wrote)")
    p.add_argument("--ha-slave", action="append", default=[], metavar="NAME",
                   help="a master: a slave it is configured with (repeatable); each may "
                   "always hold one replication stream and stays in status while away "
                   "(cluster backends name every slave; default: none)")
    p.add_argument("--ha-extra-streams", type=int, default=2, metavar="N",
                   help="a master: replication streams at once from names not given by "
                   "--ha-slave; more are refused (default 2)")
    c = p.add_argument_group(
        "controller mode (RocketMQ 5's automatic failover; defaults are RocketMQ's)")
    c.add_argument("--ha-mode", default="classic", choices=["classic", "controller"],
                   help="classic: --role fixes the role; controller: the controller at "
                   "--controller elects the master and the node takes the role it is given "
                   "(default classic)")
    c.add_argument("--controller", type=address, metavar="HOST:PORT",
                   help="the controller's address (controller mode)")
    add_ack_options(c)
    c.add_argument("--priority", type=int, default=0, metavar="N",
                   help="election priority among equals, lower preferred (default 0)")
    c.add_argument("--advertise", type=address, metavar="HOST:PORT",
                   help="the address the controller and the other nodes reach this node at "
                   "(default: --listen; set it when listening on 0.0.0.0, e.g. in a container)")
    c.add_argument("--peer-address", type=peer_address, action="append", default=[],
                   metavar="NAME=HOST:PORT",
                   help="reach broker NAME at HOST:PORT when the controller names it master, "
                   "instead of the address it advertises (repeatable; the local backend's "
                   "link proxies, which `dlab cluster partition` cuts; default: none)")
    p.add_argument("--failpoints", default="",
                   help="name=crash|delay:MS@N,... (default: none armed)")
    add_corruption_policy(p)
    p.add_argument("--repair-from", action="append", type=address, default=[],
                   metavar="HOST:PORT",
                   help="a replica to repair a damaged range from (repeatable; a master "
                        "names its slaves; a slave repairs from its --master by default)")
    p.add_argument("--refusal-file", metavar="FILE",
                   help="if the node refuses to start (corruption of flushed data), write why "
                        "to FILE (removed at each start); cluster backends read it")
    p.add_argument("--emulate", action="append", default=[], metavar="BUG",
                   help="re-introduce a known RocketMQ bug on purpose (repeatable or "
                        "comma-separated; see `dlab chaos bugs`; default: none)")
    g = p.add_argument_group("timing (defaults follow RocketMQ; sizes take a unit, e.g. 1MiB)")
    g.add_argument("--flush-interval-ms", type=positive_int, default=500,
                   help="ASYNC_FLUSH: the flusher's longest wait, ms (default 500)")
    g.add_argument("--flush-thorough-interval-ms", type=positive_int, default=10_000,
                   help="flush whatever is dirty at least this often, ms (default 10000)")
    g.add_argument("--flush-least-pages", type=int, default=4,
                   help="ASYNC_FLUSH: flush only once this many 4 KiB pages are dirty "
                   "(default 4)")
    g.add_argument("--sync-flush-timeout-ms", type=positive_int, default=5_000,
                   help="SYNC_FLUSH: a put waits this long for its fsync, ms (default 5000)")
    g.add_argument("--slave-timeout-ms", type=positive_int, default=3_000,
                   help="SYNC_MASTER: a put waits this long for a slave, ms (default 3000)")
    g.add_argument("--ha-max-gap-bytes", type=parse_size, default=256 << 20,
                   help="a slave further behind than this is not in sync (default 256MiB)")
    g.add_argument("--ha-batch-bytes", type=parse_size, default=1 << 20,
                   help="largest range shipped at once (default 1MiB)")
    g.add_argument("--ha-window-bytes", type=parse_size, default=8 << 20,
                   help="bytes shipped but not yet acked by the slave (default 8MiB)")
    g.add_argument("--ha-heartbeat-ms", type=positive_int, default=5_000,
                   help="a slave reports its offset at least this often, ms (default 5000)")
    g.add_argument("--ha-housekeeping-ms", type=positive_int, default=20_000,
                   help="a link silent this long is closed, ms (default 20000)")
    g.add_argument("--ha-reconnect-min-ms", type=positive_int, default=100,
                   help="a slave's first reconnect delay, ms (default 100)")
    g.add_argument("--ha-reconnect-max-ms", type=positive_int, default=5_000,
                   help="a slave's longest reconnect delay, ms (default 5000)")
    g.add_argument("--consume-queue-flush-ms", type=positive_int, default=1_000,
                   help="how often the consume queues are flushed (default 1000)")
    g.add_argument("--consumer-offset-persist-ms", type=positive_int, default=5_000,
                   help="how often the consumer offset table is persisted (default 5000); "
                        "offsets committed since are lost by a crash")
    g.add_argument("--consumer-offset-sync-ms", type=positive_int, default=10_000,
                   help="how often a slave copies its master's offset table (default 10000)")
    p.add_argument("--log-file", help="also append the log to this file")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING"],
                   help="log messages at this level and above (default INFO)")
    p.set_defaults(handler=cmd_node)


def add_corruption_policy(p: Any) -> None:
    p.add_argument("--corruption-policy", default="refuse",
                   choices=["refuse", "truncate", "repair"],
                   help="what a node does when recovery finds corruption of flushed data (not "
                        "a torn tail, which is always cut): refuse to start (default), "
                        "truncate at it (RocketMQ; logged at ERROR with what is lost), or "
                        "repair the range from a replica (CRC-verified)")


def node_config_from_args(args: argparse.Namespace, *, token: str | None = None) -> Any:
    """The NodeConfig of `dlab node` ARGS; `token` given (a simulated
    cluster, chaos/sim/run.py) instead of read from --token-file."""
    from cluster.node.auth import TokenError, read_token_file
    from cluster.node.server import NodeConfig
    from ha.config import HAConfig, HAMode
    from store.config import ConfigError, CorruptionPolicy, CrashModel, FlushMode, StoreConfig

    emulate = emulate_arg(args.emulate)
    if token is None:
        try:
            token = read_token_file(args.token_file)
        except TokenError as exc:
            raise UserError(str(exc)) from None
    store = StoreConfig(emulate=emulate,
        segment_size_bytes=args.segment_size, max_message_size_bytes=args.max_message_size,
        flush_mode=FlushMode(args.flush), crash_model=CrashModel(args.crash_model),
        flush_interval_ms=args.flush_interval_ms,
        flush_thorough_interval_ms=max(args.flush_thorough_interval_ms, args.flush_interval_ms),
        flush_least_pages=args.flush_least_pages,
        sync_flush_timeout_ms=args.sync_flush_timeout_ms,
        consume_queue_flush_interval_ms=args.consume_queue_flush_ms,
        consumer_offset_persist_interval_ms=args.consumer_offset_persist_ms,
        corruption_policy=CorruptionPolicy(args.corruption_policy),
    )
    ha = HAConfig(
        emulate=emulate, slave_ahead_policy=SlaveAheadPolicy(args.slave_ahead_policy),
        ship_limit=ShipLimit(args.ha_ship_limit), batch_bytes=args.ha_batch_bytes,
        window_bytes=args.ha_window_bytes, heartbeat_interval_ms=args.ha_heartbeat_ms,
        housekeeping_interval_ms=args.ha_housekeeping_ms,
        slave_timeout_ms=args.slave_timeout_ms, max_gap_not_in_sync_bytes=args.ha_max_gap_bytes,
        reconnect_min_ms=args.ha_reconnect_min_ms, reconnect_max_ms=args.ha_reconnect_max_ms,
        slaves=frozenset(args.ha_slave), extra_streams=args.ha_extra_streams,
        ha_mode=HAMode(args.ha_mode), all_ack_in_sync_state_set=args.all_ack_in_sync_state_set,
        in_sync_replicas=args.in_sync_replicas, min_in_sync_replicas=args.min_in_sync_replicas,
    )
    try:
        return NodeConfig(name=args.name, role=Role(args.role), data_dir=args.data_dir,
                          token=token, listen=args.listen, master=args.master, store=store,
                          ha=ha, failpoints=args.failpoints, repair_from=tuple(args.repair_from),
                          consumer_offset_sync_interval_ms=args.consumer_offset_sync_ms,
                          controller=args.controller, priority=args.priority,
                          advertise=args.advertise,
                          peer_addresses=tuple(args.peer_address)).validate()
    except ConfigError as exc:
        raise UserError(as_options(str(exc), NODE_OPTIONS)) from None


def peer_address(text: str) -> tuple[str, str]:
    """--peer-address NAME=HOST:PORT as (NAME, HOST:PORT)."""
    name, sep, addr = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=HOST:PORT, e.g. "
                                         "slave1=127.0.0.1:7101")
    return name, address(addr)


def emulate_arg(values: list[str]) -> frozenset[str]:
    """--emulate values as bug ids; a usage error names the known ones."""
    from store.emulate import EmulateError, parse

    try:
        return parse(values)
    except EmulateError as exc:
        raise UserError(str(exc)) from None


# Config fields whose `dlab node` option is not simply the field's name.
NODE_OPTIONS = {"segment_size_bytes": "--segment-size",
                "max_message_size_bytes": "--max-message-size"}


def as_options(message: str, options: dict[str, str]) -> str:
    """A config error as a command line user reads it: field names as the
    options that set them."""
    for field_name, option in options.items():
        message = message.replace(field_name, option)
    return message


# `dlab node`'s exit code when it refuses to open a store holding corruption
# of flushed data (2 is a usage error).
EXIT_REFUSED = 3


def cmd_node(args: argparse.Namespace) -> int:
    from cluster.node.server import NodeStartError, serve
    from store.config import NODE_SWITCH_INTERVAL_S
    from store.failpoints import Failpoints, FailpointSpecError
    from store.store import CorruptionRefusedError

    try:
        Failpoints(args.failpoints)
    except FailpointSpecError as exc:
        raise UserError(f"--failpoints: {exc}") from None
    config = node_config_from_args(args)
    setup_logging(args.name, args.log_level, args.log_file)
    host = config.listen.rpartition(":")[0]
    if host not in ("127.0.0.1", "localhost", "::1", "[::1]"):
        logging.getLogger("dlab.node").warning(
            "listening on %s: reachable from other hosts (the token still guards it)", host)
    # A node's flush thread and gRPC poller give the GIL up for every write,
    # fsync and socket read; with the default 5 ms switch interval each
    # return waits out the event loop's slice (a slave catching up spent
    # most of its time so). 0.5 ms keeps that wait short for little cost.
    sys.setswitchinterval(NODE_SWITCH_INTERVAL_S)
    if args.refusal_file:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(args.refusal_file)  # this start decides anew
    try:
        return asyncio.run(serve(config))
    except NodeStartError as exc:
        raise UserError(str(exc)) from None
    except CorruptionRefusedError as exc:
        logging.getLogger("dlab.node").error("node %s refused to start: %s", args.name, exc)
        if args.refusal_file:
            try:
                fd = os.open(args.refusal_file,  # never through a link
                             os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
                with open(fd, "w", encoding="utf-8") as f:
                    f.write(f"corruption at {exc.damage.offset}: {exc}\n")
            except OSError as err:
                logging.getLogger("dlab.node").error("cannot write %s: %s", args.refusal_file,
                                                     err.strerror)
        print(f"dlab: node {args.name} refused to start: {exc}", file=sys.stderr)
        return EXIT_REFUSED


def setup_logging(name: str, level: str, log_file: str | None) -> None:
    fmt = logging.Formatter(f"%(asctime)s.%(msecs)03d %(levelname)s {name} %(name)s: "
                            "%(message)s", datefmt="%Y-%m-%d %H:%M:%S")
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_file:
        handlers.append(logging.FileHandler(log_file))
    root = logging.getLogger()
    root.setLevel(level)
    for h in handlers:
        h.setFormatter(fmt)
        root.addHandler(h)


# ------------------------------------------------------------------ send
