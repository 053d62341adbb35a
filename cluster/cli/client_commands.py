"""`dlab send` and `dlab consume`: argument parsing and output only; the work
is in cluster/client/node_client.py, cluster/client/sendload.py and
cluster/client/consumer.py."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
from typing import Any

from cluster.cli.arg_types import address, group_name, topic_name
from store.tools.cli_args import UserError, non_negative_float, parse_size, positive_int


def register_send(sub: Any) -> None:
    p = sub.add_parser(
        "send", help="send messages to a node and report statuses and latencies",
        description="Send messages and print per-status counts and latency percentiles, "
        "and what the node said for each refusing status. A call that failed or timed out "
        "counts as INDETERMINATE (maybe stored), never lost; NO_ROUTE: the cluster's route "
        "names no master (nothing sent). A message stored by a node the route no longer "
        "names master when it answered is counted as a stale-master ack.",
        epilog="exit status: 0 when at least one message was stored (PUT_OK); 1 when none "
        "was (every put refused or failed: the statuses and the node's reason are on "
        "stderr); 2 for bad input (such as a --size over the node's max message size) or "
        "a token the node refused.",
    )
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--dir", help="a cluster started with `dlab cluster up --dir DIR` "
                                     "(sends to the master its route names, DIR/route.json, "
                                     "re-read after a failure; token from DIR/token)")
    where.add_argument("--target", type=address, metavar="HOST:PORT",
                       help="a node's address (needs --token-file)")
    # The old name of --target (`dlab consume` says --target too).
    where.add_argument("--to", type=address, dest="to_deprecated", help=argparse.SUPPRESS)
    p.add_argument("--token-file", help="the cluster token (default DIR/token with --dir)")
    p.add_argument("--count", type=positive_int, default=1000,
                   help="messages to send (default 1000)")
    p.add_argument("--size", type=parse_size, default=1024,
                   help="body size: bytes or with a unit, e.g. 4KiB (default 1024 bytes); "
                   "at most the node's max message size (its --max-message-size), which "
                   "is asked of the node before sending")
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
    p.add_argument("--retries", type=int, default=0, metavar="N",
                   help="re-send a message whose send failed, timed out or reached a node "
                        "that is not the master, up to N times, same message id (a failed "
                        "call may have stored it: a retry can store it twice); with --dir "
                        "each retry follows the cluster's route, re-read after the failure, "
                        "to the current master (default 0)")
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


def _sender(args: argparse.Namespace, addr: str, token: str) -> Any:
    """Where `dlab send` sends: with --dir the cluster's route (its master
    now, followed across a failover), else the node given; both retry."""
    from cluster.client.node_client import send_options
    from cluster.client.routing import FixedRoute, RoutedClient, Routes, RouteSource
    from cluster.node.route import RouteError

    timeout = args.timeout or 10.0
    routes: Routes = RouteSource(args.dir) if args.dir else FixedRoute(addr)
    try:
        return RoutedClient(routes, token=token, timeout_s=timeout, retries=args.retries,
                            channel_options=send_options(args.size))
    except RouteError as exc:
        raise UserError(str(exc)) from None


def cmd_send(args: argparse.Namespace) -> int:
    from cluster.client.sendload import format_report, run_load
    from cluster.node.wire import MAX_BODY_BYTES

    if args.size > MAX_BODY_BYTES:
        raise UserError(f"--size: at most {MAX_BODY_BYTES} bytes (a put travels as one gRPC "
                        "message, which gRPC caps at 2 GiB)")
    if args.retries < 0:
        raise UserError(f"--retries {args.retries}: give 0 or more")
    if args.to_deprecated:
        print("dlab send: --to is deprecated: use --target (as `dlab consume` does)",
              file=sys.stderr)
    given = args.target or args.to_deprecated
    (addr, *_), token = _targets_and_token(args, [given] if given else None, "--target")

    async def go() -> Any:
        async with _sender(args, addr, token) as c:
            await _check_size(c, args.size, args.timeout or 10.0)
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


async def _check_size(client: Any, size: int, timeout_s: float) -> None:
    """Refuse (exit 2) a --size over the node's max message size before
    sending anything: each put would only come back MESSAGE_ILLEGAL. A node
    that cannot be asked is left to the load, whose puts report why."""
    import grpc

    from cluster.client.node_client import NodeCallError
    from cluster.client.sendload import size_refusal

    try:
        max_size = await client.max_message_size(timeout_s=timeout_s)
    except NodeCallError as exc:
        if exc.code == grpc.StatusCode.UNAUTHENTICATED:
            raise UserError(f"the node refused the token: {exc}") from None
        return
    refusal = None if max_size is None else size_refusal(size, max_size)
    if refusal is not None:
        raise UserError(refusal)


# --------------------------------------------------------------- consume
def register_consume(sub: Any) -> None:
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
    p.add_argument("--group", type=group_name, required=True,
                   help="the consumer group (1..255 of letters, digits, '%%', '|', '_', '-')")
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


def _route_master(directory: str) -> Any:
    """The address the cluster's route names master now (None while it
    names none), re-read when the route changes."""
    from cluster.client.routing import RouteSource
    from cluster.node.route import RouteError

    routes = RouteSource(directory)

    def master() -> str | None:
        try:
            return routes.current().address
        except RouteError:
            return None
    return master


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
                            offset_file=args.offset_file,
                            master=_route_master(args.dir) if args.dir else None) as c:
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
