"""`dlab bench catch-up` and `dlab bench sync-master`: their options and
output (a table, then the figures as one JSON line). The benchmarks are
cluster/bench/replication.py."""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from typing import Any

from cluster.bench.replication import BASELINE_CHUNK_BYTES, bench_catch_up, bench_sync_master
from ha.config import HAConfig


def _emit(title: str, rows: list[tuple[str, str]], figures: dict[str, Any]) -> None:
    print(title)
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"  {k:<{width}}  {v}")
    print(json.dumps(figures, sort_keys=True))


def _run(fn: Any, title: str, args: argparse.Namespace) -> int:
    work = tempfile.mkdtemp(prefix="dlab-bench-", dir=args.workdir or None)
    try:
        figures = fn(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows = [(k, json.dumps(v) if isinstance(v, dict) else str(v))
            for k, v in figures.items() if k != "bench"]
    _emit(title, rows, figures)
    return 0


def register(sub: Any, bench_sub: Any) -> None:
    from store.tools.cli_args import parse_size, positive_int, writable_dir

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--workdir", type=writable_dir,
                        help="where the nodes' stores and the baselines' files go (default: "
                        "the system temp dir; put it on the disk you care about)")
    p = bench_sub.add_parser(
        "catch-up", parents=[common],
        help="slave catch-up of a backlog vs raw gRPC streaming and raw write+fsync",
        description="Builds a backlog on a master node, starts an empty slave and times its "
        "catch-up (until its flushed position covers the backlog), then compares bytes/s "
        "with the slower of raw grpcio streaming of the same bytes between two processes "
        "and raw sequential write + fsync of them. Goal: ratio >= 0.8.")
    p.add_argument("--size-mib", type=positive_int, default=512,
                   help="backlog size in MiB (default 512; e.g. 64 for a quick run)")
    p.add_argument("--body-size", type=parse_size, default=4096,
                   help="message body bytes (default 4096)")
    p.add_argument("--batch-bytes", type=parse_size, default=HAConfig().batch_bytes,
                   help="the nodes' HA batch (--ha-batch-bytes; default: the nodes' default, "
                   f"{HAConfig().batch_bytes >> 20}MiB)")
    p.add_argument("--window-bytes", type=parse_size, default=HAConfig().window_bytes,
                   help="the nodes' HA window (--ha-window-bytes; default: the nodes' "
                   f"default, {HAConfig().window_bytes >> 20}MiB)")
    p.add_argument("--chunk-bytes", type=parse_size, default=BASELINE_CHUNK_BYTES,
                   help="the baselines' message/write size (default 1MiB: raw grpcio "
                   "streams no faster with larger messages here)")
    p.add_argument("--flush", default="SYNC_FLUSH", choices=["SYNC_FLUSH", "ASYNC_FLUSH"],
                   help="the nodes' flush mode (default SYNC_FLUSH: the slave flushes as "
                        "it receives)")
    p.set_defaults(handler=lambda a: _run(
        lambda w: bench_catch_up(a.size_mib, a.body_size, w, batch_bytes=a.batch_bytes,
                                 window_bytes=a.window_bytes, flush=a.flush,
                                 chunk_bytes=a.chunk_bytes),
        "slave catch-up", a))

    p = bench_sub.add_parser(
        "sync-master", parents=[common],
        help="SYNC_MASTER+SYNC_FLUSH acked puts/s at 64 vs 1 client, p99 vs RTT+fsync",
        description="Starts a SYNC_MASTER+SYNC_FLUSH master and a slave, sends with 1 client "
        "and with 64 concurrent clients, and compares: puts/s at 64 over 1 (goal >= 10); "
        "1-client p99 over the p99 of one raw gRPC round trip plus one write+fsync (goal "
        "<= 2).")
    p.add_argument("--count-1", type=positive_int, default=2000,
                   help="puts with one client (default 2000)")
    p.add_argument("--count-64", type=positive_int, default=20000,
                   help="puts with the concurrent clients (default 20000)")
    p.add_argument("--clients", type=positive_int, default=64,
                   help="concurrent clients of the second phase (default 64)")
    p.add_argument("--body-size", type=parse_size, default=1024,
                   help="body size: bytes or with a unit, e.g. 4KiB (default 1024 bytes)")
    p.add_argument("--max-seconds", type=positive_int, default=60,
                   help="bound on each load phase (default 60)")
    p.set_defaults(handler=lambda a: _run(
        lambda w: bench_sync_master(a.count_1, a.count_64, a.clients, a.body_size,
                                    a.max_seconds, w), "SYNC_MASTER + SYNC_FLUSH", a))
