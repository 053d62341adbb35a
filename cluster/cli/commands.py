"""`dlab node`, `dlab send` and `dlab cluster ...`: argument parsing and
output only; the work is in cluster/node/server.py, cluster/client/node_client.py,
cluster/client/sendload.py and cluster/backends/local.py."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import random
import shlex
import sys
from typing import Any

from cluster.backends.interface import BackendError, ClusterSpec, NodeInfo, NodeSpec, NodeState
from cluster.node.role import Role
from ha.config import ShipLimit, SlaveAheadPolicy
from store.cli_args import (
    UserError,
    non_negative_float,
    parse_size,
    positive_int,
)


def topic_name(text: str) -> str:
    """A topic as every node accepts it (store/names.py: it names a directory)."""
    from store.names import topic_problem

    if problem := topic_problem(text):
        raise argparse.ArgumentTypeError(problem)
    return text


def address(text: str) -> str:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r}: expected HOST:PORT, e.g. 127.0.0.1:7001")
    return text


def register(sub: Any, bench_sub: Any) -> None:
    _register_node(sub)
    _register_send(sub)
    _register_consume(sub)
    _register_cluster(sub)


# ------------------------------------------------------------------ node
def _register_node(sub: Any) -> None:
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
    p.add_argument("--failpoints", default="",
                   help="name=crash|delay:MS@N,... (default: none armed)")
    _add_corruption_policy(p)
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


def _add_corruption_policy(p: Any) -> None:
    p.add_argument("--corruption-policy", default="refuse",
                   choices=["refuse", "truncate", "repair"],
                   help="what a node does when recovery finds corruption of flushed data (not "
                        "a torn tail, which is always cut): refuse to start (default), "
                        "truncate at it (RocketMQ; logged at ERROR with what is lost), or "
                        "repair the range from a replica (CRC-verified)")


def node_config_from_args(args: argparse.Namespace, *, token: str | None = None) -> Any:
    """The NodeConfig of `dlab node` ARGS; `token` given (a simulated
    cluster, chaos/sim.py) instead of read from --token-file."""
    from cluster.node.auth import TokenError, read_token_file
    from cluster.node.server import NodeConfig
    from ha.config import HAConfig
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
    )
    try:
        return NodeConfig(name=args.name, role=Role(args.role), data_dir=args.data_dir,
                          token=token, listen=args.listen, master=args.master, store=store,
                          ha=ha, failpoints=args.failpoints, repair_from=tuple(args.repair_from),
                          consumer_offset_sync_interval_ms=args.consumer_offset_sync_ms
                          ).validate()
    except ConfigError as exc:
        raise UserError(as_options(str(exc), NODE_OPTIONS)) from None


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
    _setup_logging(args.name, args.log_level, args.log_file)
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
                with open(args.refusal_file, "w", encoding="utf-8") as f:
                    f.write(f"corruption at {exc.damage.offset}: {exc}\n")
            except OSError as err:
                logging.getLogger("dlab.node").error("cannot write %s: %s", args.refusal_file,
                                                     err.strerror)
        print(f"dlab: node {args.name} refused to start: {exc}", file=sys.stderr)
        return EXIT_REFUSED


def _setup_logging(name: str, level: str, log_file: str | None) -> None:
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
def _register_send(sub: Any) -> None:
    p = sub.add_parser(
        "send", help="send messages to a node and report statuses and latencies",
        description="Send messages and print per-status counts and latency percentiles, "
        "and what the node said for each refusing status. A call that failed or timed out "
        "counts as INDETERMINATE (maybe stored), never lost.",
        epilog="exit status: 0 when at least one message was stored (PUT_OK); 1 when none "
        "was (every put refused or failed: the statuses and the node's reason are on "
        "stderr); 2 for bad input or a token the node refused.",
    )
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--dir", help="a cluster started with `dlab cluster up --dir DIR` "
                                     "(sends to its master, token from DIR/token)")
    where.add_argument("--target", type=address, metavar="HOST:PORT",
                       help="a node's address (needs --token-file)")
    # The old name of --target (`dlab consume` says --target too).
    where.add_argument("--to", type=address, dest="to_deprecated", help=argparse.SUPPRESS)
    p.add_argument("--token-file", help="the cluster token (default DIR/token with --dir)")
    p.add_argument("--count", type=positive_int, default=1000,
                   help="messages to send (default 1000)")
    p.add_argument("--size", type=parse_size, default=1024,
                   help="body size: bytes or with a unit, e.g. 4KiB (default 1024 bytes)")
    p.add_argument("--rate", type=non_negative_float, default=0.0, metavar="PER_S",
                   help="messages per second in total (default 0: as fast as possible)")
    p.add_argument("--concurrency", type=positive_int, default=1,
                   help="calls in flight at once (default 1)")
    p.add_argument("--topic", type=topic_name, default="dlab-load",
                   help="topic name (default dlab-load)")
    p.add_argument("--timeout", type=non_negative_float, default=10.0, metavar="SECONDS",
                   help="per-call deadline in seconds (default 10)")
    p.add_argument("--max-seconds", type=non_negative_float, default=300.0,
                   help="stop after this many seconds whatever --count says (default 300)")
    p.add_argument("--seed", type=int, default=0,
                   help="seeds bodies and message ids (default 0)")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object instead of the table, and nothing else on "
                        "stdout")
    p.set_defaults(handler=cmd_send)


def _targets_and_token(args: argparse.Namespace, given: list[str] | None, flag: str
                       ) -> tuple[list[str], str]:
    """Where to connect and with which token: with --dir, the cluster's
    master first, then its other nodes, and DIR/token (unless --token-file);
    otherwise the addresses given by `flag`, which need --token-file."""
    from cluster.client.node_client import cluster_target
    from cluster.node.auth import TokenError, read_token_file

    try:
        if args.dir:
            target = cluster_target(args.dir)
            master = target.master_address
            targets = [master] + [a for a in target.addresses.values() if a != master]
            return targets, (read_token_file(args.token_file) if args.token_file
                             else target.token)
        if not args.token_file:
            raise UserError(f"{flag} needs --token-file (the cluster's DIR/token)")
        assert given, f"argparse requires --dir or {flag}"
        return list(given), read_token_file(args.token_file)
    except (TokenError, FileNotFoundError) as exc:
        raise UserError(str(exc)) from None


def cmd_send(args: argparse.Namespace) -> int:
    from cluster.client.node_client import AsyncNodeClient
    from cluster.client.sendload import format_report, run_load

    if args.size > 64 << 20:
        raise UserError("--size: at most 64MiB")
    if args.to_deprecated:
        print("dlab send: --to is deprecated: use --target (as `dlab consume` does)",
              file=sys.stderr)
    given = args.target or args.to_deprecated
    (addr, *_), token = _targets_and_token(args, [given] if given else None, "--target")

    async def go() -> Any:
        async with AsyncNodeClient(addr, token=token, timeout_s=args.timeout or 10.0) as c:
            return await run_load(c, count=args.count, size=args.size,
                                  concurrency=args.concurrency, rate=args.rate,
                                  topic=args.topic, max_seconds=args.max_seconds or 300.0,
                                  timeout_s=args.timeout or 10.0,
                                  rng=random.Random(args.seed))

    report = asyncio.run(go())
    if args.json:
        print(json.dumps(report.summary(), sort_keys=True))
    else:
        print(format_report(report))
    counts = report.counts()
    auth = [o for o in report.outcomes if o.indeterminate and "UNAUTHENTICATED" in o.detail]
    if auth:
        print(f"dlab: error: the node refused the token: {auth[0].detail}", file=sys.stderr)
        return 2
    if counts.get("PUT_OK", 0):
        return 0
    reasons = report.details()
    print(f"dlab send: no message was stored (no PUT_OK of {len(report.outcomes)}): " + "; ".join(
        f"{status} x{n}" + (f" ({reasons[status]})" if reasons.get(status) else "")
        for status, n in sorted(counts.items())), file=sys.stderr)
    return 1


# --------------------------------------------------------------- consume
def _register_consume(sub: Any) -> None:
    p = sub.add_parser(
        "consume", help="pull a topic's messages as a consumer group and commit offsets",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="""\
Pull every queue of a topic as consumer group GROUP, print one line per
message (or only a count), and commit the group's offsets every
--commit-interval-ms and once more when it stops:
  cluster mode (default, RocketMQ's clustering): offsets live on the broker;
    a restarted consumer of the group resumes where the broker says.
  broadcast mode: offsets live in --offset-file, one per consumer.
With no stored offset a queue is read from its first message.

At-least-once: an offset moves only after its message was handled and
reaches the broker or file only at the interval. A consumer killed between
commits gets the messages after its last commit again; a broker killed
before persisting its offset table (every 5 s) forgets commits too.

Reads go to the master; while it is down, to its slaves (RocketMQ's slave
read). Consumers only see messages up to a node's confirmed offset (its
flushed position under SYNC_FLUSH).

Output, one tab-separated line per message:
  queue_id  queue_offset  commitlog_offset  msg_id  body_size  node_role
then "consumed N message(s) ..." on stderr.""",
        epilog="""\
examples:
  dlab consume --dir ./c1 --group g1 --topic dlab-load --idle-exit 2
  dlab consume --target 127.0.0.1:7001 --target 127.0.0.1:7002 \\
      --token-file ./c1/token --group g1 --topic dlab-load --max 100 --count-only
  dlab consume --dir ./c1 --group g2 --topic dlab-load --idle-exit 2 \\
      --mode broadcast --offset-file ./g2.offsets.json""",
    )
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--dir", help="a cluster started with `dlab cluster up --dir DIR` "
                                     "(reads from its master, then its slaves; token from "
                                     "DIR/token)")
    where.add_argument("--target", "--from", dest="targets", type=address, action="append",
                       metavar="HOST:PORT",
                       help="a node's address, master first (repeat for slaves; needs "
                            "--token-file)")
    p.add_argument("--token-file", help="the cluster token (default DIR/token with --dir)")
    p.add_argument("--group", required=True, help="the consumer group")
    p.add_argument("--topic", type=topic_name, required=True, help="the topic to consume")
    p.add_argument("--mode", choices=["cluster", "broadcast"], default="cluster",
                   help="where offsets live: the broker (cluster, the default) or "
                   "--offset-file (broadcast)")
    p.add_argument("--offset-file", help="broadcast mode's local offset file")
    p.add_argument("--commit-interval-ms", type=positive_int, default=5_000,
                   help="how often offsets are committed (default 5000, RocketMQ's)")
    p.add_argument("--max", type=positive_int, metavar="N",
                   help="stop after this many messages")
    p.add_argument("--idle-exit", type=non_negative_float, default=None, metavar="SECONDS",
                   help="stop after this many seconds without a message (give this or --max)")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--count-only", action="store_true", help="print only the total")
    out.add_argument("--jsonl", action="store_true",
                     help="print one JSON object per delivery, for tools (flushed before the "
                          "offset moves, so a killed consumer has printed all it was handed)")
    p.set_defaults(handler=cmd_consume)


def _check_offset_file(path: str) -> None:
    """Before consuming: the offsets must be savable there, or every
    message consumed would be consumed again by the next run."""
    parent = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise UserError(f"--offset-file {path} is a directory; give a file name")
    if not os.path.isdir(parent):
        raise UserError(f"--offset-file {path}: directory {parent} does not exist; create it "
                        "or give a file in an existing directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UserError(f"--offset-file {path}: directory {parent} is not writable by this "
                        "user; give a file in a directory you can write")


def cmd_consume(args: argparse.Namespace) -> int:
    from cluster.client.consumer import Consumer, ConsumerError, Delivery

    if args.mode == "broadcast" and not args.offset_file:
        raise UserError("--mode broadcast keeps offsets in a local file: add --offset-file FILE")
    if args.mode == "cluster" and args.offset_file:
        raise UserError("--offset-file is for --mode broadcast; in cluster mode the broker "
                        "keeps the group's offsets")
    if args.max is None and args.idle_exit is None:
        raise UserError("give --max N or --idle-exit SECONDS so the consumer knows when to stop")
    if args.offset_file:
        _check_offset_file(args.offset_file)
    targets, token = _targets_and_token(args, args.targets, "--target")

    def show(d: Delivery) -> None:
        if args.jsonl:
            # Written (unbuffered) before the consumer's offset moves past it,
            # so a killed consumer has printed every message it was handed.
            print(json.dumps({"msg_id": d.msg_id, "topic": d.topic, "queue_id": d.queue_id,
                              "queue_offset": d.queue_offset,
                              "commitlog_offset": d.commitlog_offset, "node": d.node,
                              "node_role": d.node_role, "time_ms": d.time_ms}), flush=True)
        elif not args.count_only:
            print(f"{d.queue_id}\t{d.queue_offset}\t{d.commitlog_offset}\t{d.msg_id}\t"
                  f"{len(d.body)}B\t{d.node_role}", flush=True)

    async def go() -> int:
        async with Consumer(targets, token=token, group=args.group, topic=args.topic,
                            mode=args.mode, commit_interval_ms=args.commit_interval_ms,
                            offset_file=args.offset_file) as c:
            return await c.run(show, max_messages=args.max, idle_exit_s=args.idle_exit)

    try:
        n = asyncio.run(go())
    except ConsumerError as exc:
        raise UserError(str(exc)) from None
    if args.count_only:
        print(n)
    print(f"consumed {n} message(s) from {args.topic} as group {args.group}", file=sys.stderr)
    return 0


# --------------------------------------------------------------- cluster
def _register_cluster(sub: Any) -> None:
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
    up.add_argument("--role", default="SYNC_MASTER", choices=["SYNC_MASTER", "ASYNC_MASTER"],
                    help="the master's role: SYNC_MASTER acks after a slave received the "
                    "message, ASYNC_MASTER at once (default SYNC_MASTER)")
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
    _add_corruption_policy(up)
    up.add_argument("--token-file", help="use this token instead of generating one")
    up.add_argument("--node-args", default="",
                    help="extra `dlab node` options for every node, e.g. "
                         "'--slave-timeout-ms 1000 --ha-heartbeat-ms 500' (default: none)")
    up.add_argument("--timeout", type=non_negative_float, default=60.0, metavar="SECONDS",
                    help="how long to wait for every node to answer, in seconds (default 60)")
    up.add_argument("--emulate", action="append", default=[], metavar="BUG",
                    help="every node re-introduces this known RocketMQ bug (repeatable; "
                         "see `dlab chaos bugs`; default: none)")
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
    for action, help_text in (("partition", "cut the replication link between A and B"),
                              ("heal", "restore the link between A and B")):
        a = csub.add_parser(action, help=help_text)
        a.add_argument("a")
        a.add_argument("b")
        a.add_argument("--dir", required=True, help="the cluster's directory")
        a.set_defaults(handler=lambda args, act=action: _backend_call(args, act, args.a,
                                                                         args.b))


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
            from store.config import CorruptionPolicy

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
    from store.config import CorruptionPolicy

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
    common: dict[str, Any] = dict(
        emulate=tuple(sorted(emulate_arg(args.emulate))),
        crash_model=args.crash_model, segment_size_bytes=args.segment_size,
        slave_ahead_policy=SlaveAheadPolicy(args.slave_ahead_policy),
        ha_ship_limit=ShipLimit(args.ha_ship_limit), extra_args=extra,
        corruption_policy=CorruptionPolicy(args.corruption_policy),
    )
    master = NodeSpec(name="master", role=Role(args.role), flush=args.flush, **common)
    slaves = tuple(NodeSpec(name=f"slave{i + 1}", role=Role.SLAVE,
                            flush=args.slave_flush or args.flush, **common)
                   for i in range(args.slaves))
    spec = ClusterSpec(directory=os.path.abspath(args.dir), master=master, slaves=slaves)
    try:
        infos = _backend(args.dir, args.backend).up(spec, token=token,
                                                    timeout_s=args.timeout or 60.0)
    except BackendError as exc:
        raise UserError(str(exc)) from None
    _print_nodes(infos)
    print(f"token: {os.path.join(spec.directory, 'token')}")
    return 0


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
    except (BackendError, ValueError) as exc:
        raise UserError(str(exc)) from None
    rows = []
    for i in infos:
        row: dict[str, Any] = {"name": i.name, "role": i.role.value, "address": i.address,
                               "state": i.state.value, "pid": i.pid, **i.extra}
        if i.state == NodeState.RUNNING:
            try:
                with NodeClient(i.address, token=token, timeout_s=3) as c:
                    row["status"] = status_to_dict(c.status())
            except NodeCallError as exc:
                row["status_error"] = str(exc)
        rows.append(row)
    down = [f"{r['name']} is {r['state']}" if r["state"] != NodeState.RUNNING.value
            else f"{r['name']} did not answer ({r['status_error']})"
            for r in rows if r["state"] != NodeState.RUNNING.value or "status_error" in r]
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
        if r.get("partitioned"):
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
    return 1 if down else 0


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
             "offsets [" + first([f"{k} " + " ".join(f"{q}:{o}" for q, o in sorted(
                 v.items(), key=lambda x: int(x[0]))) for k, v in sorted(offsets.items())]) + "]"]
    sync = consume.get("offset_sync")
    if sync:
        parts.append(f"synced {sync['syncs']}x" + (f" ({sync['last_error'][:60]})"
                                                   if sync.get("last_error") else ""))
    return "  ".join(parts)
