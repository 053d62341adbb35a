"""Store benchmarks: `dlab bench store`, `dlab bench group-commit`,
`dlab bench recovery`. Each measures its baseline in the same run and prints
a table, then one JSON object as its last line (`ratio` is the figure).

- store: bytes/s of the batch append API under ASYNC_FLUSH (1 KiB bodies,
  flushed by the flusher as in production, plus the final flush) over raw
  sequential write + fsync of the same bytes.
- group-commit: puts/s of 64 concurrent producers under SYNC_FLUSH over puts/s
  of one fsync per put (write one encoded record, fsync, repeat). The puts
  take the path a node's puts take (store/put_path.py: coalesced per loop
  tick, one append per batch, group commit, answered per submitter); the
  node adds its role check before it and, on a SYNC_MASTER, the replica
  wait (`dlab bench sync-master`).
- durable-mark: flushes/s of one-record flushes (write, fdatasync) followed
  by the durable mark's pwrite (store/log/durable_mark.py) over the same
  flushes without it, alternating rounds (1.0: the mark is free), and the
  mark's own cost per flush.
- recovery: abnormal recovery of a store of N bytes (no checkpoint, so every
  record is verified: size, magic, layout, position, body CRC) over reading
  the same bytes sequentially and computing CRC-32 over all of them; the
  ratio is time over time, so lower is better.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import zlib
from collections.abc import Callable, Iterator
from typing import Any

from store.config import GIB, MIB, NODE_SWITCH_INTERVAL_S, CrashModel, FlushMode, StoreConfig
from store.log import native as native_codec
from store.log.durable_mark import DurableMark
from store.log.record import Message, encode
from store.seams.disk import RealDisk
from store.status import PutStatus
from store.store import MessageStore
from store.tools.cli_args import parse_size, positive_float, positive_int, writable_dir


def _messages(n: int, body_size: int, prefix: str = "m") -> list[Message]:
    body = os.urandom(body_size)
    return [Message("bench", body, {"UNIQ_KEY": f"{prefix}{i:012d}"}) for i in range(n)]


def _emit(title: str, rows: list[tuple[str, str]], figures: dict[str, Any]) -> None:
    print(title)
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"  {k:<{width}}  {v}")
    print(json.dumps(figures, sort_keys=True))


@contextlib.contextmanager
def _as_in_a_node() -> Iterator[None]:
    """Run with the GIL switch interval a node process uses (see
    NODE_SWITCH_INTERVAL_S): the store's threads behave as they do in a node."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(NODE_SWITCH_INTERVAL_S)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def _raw_write_fsync(path: str, data: bytes, chunk: int) -> float:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        t0 = time.perf_counter()
        view = memoryview(data)
        for i in range(0, len(data), chunk):
            os.write(fd, view[i : i + chunk])
        os.fsync(fd)
        return time.perf_counter() - t0
    finally:
        os.close(fd)


# ----------------------------------------------------------------- append
def bench_store(total_mib: int, body_size: int, batch: int, workdir: str,
                rounds: int = 5) -> dict[str, Any]:
    """A warm-up round, then `rounds` rounds of (store run, raw run of the
    same bytes); the figure is the median store bytes/s over the median raw
    bytes/s. One round alone measured mostly where the machine found memory:
    the first touch of memory in this VM is slow, and whichever phase ran
    first paid it (the raw run always came second, into page cache the store
    run had just freed). Every round's figures are printed, the warm-up's
    too."""
    seg = 256 * MIB
    msgs_total = total_mib * MIB // (body_size + 120)
    batches = [
        _messages(batch, body_size, f"b{j}-") for j in range(max(1, msgs_total // batch))
    ]
    cfg = StoreConfig(segment_size_bytes=seg, flush_mode=FlushMode.ASYNC_FLUSH,
                      crash_model=CrashModel.POWER)
    path = os.path.join(workdir, "append")

    async def run() -> tuple[float, int]:
        store = MessageStore.open(path, cfg)
        await store.start()
        t0 = time.perf_counter()
        for i, msgs in enumerate(batches):
            store.append(msgs)
            if i % 16 == 15:
                await asyncio.sleep(0)  # let the flusher run, as in a node
        await store.flush()
        dt = time.perf_counter() - t0
        wrote = store.log.wrote
        await store.close()
        return dt, wrote

    store_runs: list[float] = []
    raw_runs: list[float] = []
    nbytes = 0
    for r in range(rounds + 1):
        with _as_in_a_node():
            dt, nbytes = asyncio.run(run())
        data = b"".join(bytes(store_bytes) for store_bytes in _read_all(path, nbytes))
        shutil.rmtree(path)
        raw = _raw_write_fsync(os.path.join(workdir, "raw"), data, 1 * MIB)
        os.unlink(os.path.join(workdir, "raw"))
        del data
        name = f"round {r}/{rounds}" if r else "warm-up"
        print(f"  {name}: store {nbytes / dt / 1e6:.0f} MB/s, "
              f"raw write + fsync {nbytes / raw / 1e6:.0f} MB/s", flush=True)
        if r:
            store_runs.append(nbytes / dt)
            raw_runs.append(nbytes / raw)
    store_bps = statistics.median(store_runs)
    raw_bps = statistics.median(raw_runs)
    return {
        "bench": "store", "bytes": nbytes, "messages": len(batches) * batch,
        "body_size": body_size, "batch": batch, "rounds": rounds,
        "store_bytes_per_s": round(store_bps), "raw_write_fsync_bytes_per_s": round(raw_bps),
        "store_bytes_per_s_rounds": [round(x) for x in store_runs],
        "raw_write_fsync_bytes_per_s_rounds": [round(x) for x in raw_runs],
        "codec": native_codec.codec(),
        "ratio": round(store_bps / raw_bps, 3), "goal": ">= 0.5",
    }


def _read_all(path: str, nbytes: int) -> list[bytes]:
    out = []
    d = os.path.join(path, "commitlog")
    left = nbytes
    for name in sorted(os.listdir(d)):
        with open(os.path.join(d, name), "rb") as f:
            chunk = f.read(min(left, os.path.getsize(os.path.join(d, name))))
        out.append(chunk)
        left -= len(chunk)
        if left <= 0:
            break
    return out


# ----------------------------------------------------------- group commit
def bench_group_commit(producers: int, seconds: float, body_size: int, workdir: str
                       ) -> dict[str, Any]:
    path = os.path.join(workdir, "gc")
    cfg = StoreConfig(segment_size_bytes=256 * MIB, flush_mode=FlushMode.SYNC_FLUSH)

    async def run(n_producers: int) -> tuple[int, float, int, int]:
        store = MessageStore.open(path, cfg)
        await store.start()
        body = os.urandom(body_size)
        count = 0
        stop_at = time.perf_counter() + seconds

        async def producer(p: int) -> None:
            nonlocal count
            i = 0
            while time.perf_counter() < stop_at:
                r = await store.put(Message("bench", body, {"UNIQ_KEY": f"p{p}-{i}"}))
                assert r.status is PutStatus.PUT_OK, r
                i += 1
                count += 1

        t0 = time.perf_counter()
        await asyncio.gather(*(producer(p) for p in range(n_producers)))
        dt = time.perf_counter() - t0
        fsyncs = store.log.fsyncs
        batches = store.puts.batches
        await store.close()
        shutil.rmtree(path)
        return count, dt, fsyncs, batches

    with _as_in_a_node():
        n, dt, fsyncs, batches = asyncio.run(run(producers))
    # Baseline: one fsync per put, the same encoded record bytes.
    record = encode(Message("bench", os.urandom(body_size), {"UNIQ_KEY": "p0-000000"}),
                    offset=0, queue_offset=0, store_timestamp_ms=0)
    raw_path = os.path.join(workdir, "raw")
    fd = os.open(raw_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    base_n = 0
    t0 = time.perf_counter()
    stop_at = t0 + seconds
    while time.perf_counter() < stop_at:
        os.write(fd, record)
        os.fdatasync(fd)
        base_n += 1
    base_dt = time.perf_counter() - t0
    os.close(fd)
    os.unlink(raw_path)
    with _as_in_a_node():
        single_n, single_dt, _, _ = asyncio.run(run(1))
    puts = n / dt
    base = base_n / base_dt
    return {
        "bench": "group-commit", "producers": producers, "puts": n,
        "puts_per_s": round(puts), "fsyncs": fsyncs, "puts_per_fsync": round(n / max(1, fsyncs), 1),
        "puts_per_batch": round(n / max(1, batches), 1),
        "one_fsync_per_put_per_s": round(base), "store_one_producer_puts_per_s":
        round(single_n / single_dt), "ratio": round(puts / base, 2), "goal": ">= 20",
    }


# ----------------------------------------------------------- durable mark
def bench_durable_mark(flushes: int, rounds: int, workdir: str) -> dict[str, Any]:
    """The mark's worst case: a flush of one record (SYNC_FLUSH with one
    producer) is a write and an fdatasync; the mark adds one 8-byte pwrite.
    Rounds alternate with and without it (the order swapping every round)
    over one segment file, so the machine's drift hits both sides alike."""
    disk = RealDisk()
    seg = disk.open(os.path.join(workdir, "segment"), create=True)
    record = encode(Message("bench", os.urandom(1024), {"UNIQ_KEY": "p0-000000"}),
                    offset=0, queue_offset=0, store_timestamp_ms=0)
    size = 2 * rounds * flushes * len(record) + MIB
    seg.allocate(size)
    # Zeros written and synced ahead, as the SYNC_FLUSH path keeps them
    # (CommitLog._zero_ahead): the loop's fsyncs then commit no extent
    # conversion, as in the store.
    seg.pwrite(bytes(size), 0)
    seg.fsync()
    mark = DurableMark.open(disk, workdir, 0)
    pos = 0

    def one_round(with_mark: bool) -> float:
        nonlocal pos
        t0 = time.perf_counter()
        for _ in range(flushes):
            seg.pwrite(record, pos)
            pos += len(record)
            seg.fdatasync()
            if with_mark:
                mark.commitlog_synced(pos)
        return flushes / (time.perf_counter() - t0)

    rates: dict[bool, list[float]] = {True: [], False: []}
    try:
        for r in range(rounds):
            for with_mark in ((True, False) if r % 2 else (False, True)):
                rates[with_mark].append(one_round(with_mark))
        t0 = time.perf_counter()
        for i in range(20_000):
            mark.commitlog_synced(i)
        mark_us = (time.perf_counter() - t0) / 20_000 * 1e6
    finally:
        seg.close()
        mark.close()
    marked, without = statistics.median(rates[True]), statistics.median(rates[False])
    return {
        "bench": "durable-mark", "flushes_per_round": flushes, "rounds": rounds,
        "with_mark_flushes_per_s": round(marked),
        "without_mark_flushes_per_s": round(without),
        "rounds_with": [round(x) for x in rates[True]],
        "rounds_without": [round(x) for x in rates[False]],
        "mark_write_us": round(mark_us, 2),
        "mark_share_of_a_flush": round(mark_us / 1e6 * without, 4),
        "ratio": round(marked / without, 3), "goal": ">= 0.95",
    }


# --------------------------------------------------------------- recovery
def _baseline_crc_scan(commitlog: str, nbytes: int) -> float:
    """Read the segment files sequentially and CRC every byte of data, in
    8 MiB chunks: the IO and checksum cost of the same bytes, with none of the
    per-record work recovery adds."""
    t0 = time.perf_counter()
    left = nbytes
    chunk = 8 * MIB
    for name in sorted(os.listdir(commitlog)):
        if left <= 0:
            break
        fd = os.open(os.path.join(commitlog, name), os.O_RDONLY)
        try:
            crc = 0
            while left > 0:
                data = os.read(fd, min(chunk, left))
                if not data:
                    break
                crc = zlib.crc32(data, crc)
                left -= len(data)
        finally:
            os.close(fd)
    return time.perf_counter() - t0


def _drop_caches(path: str) -> None:
    """Evict the files from the page cache where the OS allows (both sides of
    the comparison then read from the same state)."""
    for root, _, files in os.walk(path):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def bench_recovery(total_mib: int, body_size: int, workdir: str) -> dict[str, Any]:
    path = os.path.join(workdir, "recovery")
    seg = min(GIB, 256 * MIB)
    cfg = StoreConfig(segment_size_bytes=seg, flush_mode=FlushMode.ASYNC_FLUSH)
    store = MessageStore.open(path, cfg)
    batch = _messages(1000, body_size)
    target = total_mib * MIB
    while store.log.wrote < target:
        store.append(batch)
        if store.log.dirty_bytes > 64 * MIB:
            store.log.flush()
    store.close_sync()
    # Make the next open abnormal with a checkpoint older than every record.
    open(os.path.join(path, "abort"), "wb").close()
    os.unlink(os.path.join(path, "checkpoint"))
    _drop_caches(path)
    t0 = time.perf_counter()
    store = MessageStore.open(path, cfg)
    rec_dt = time.perf_counter() - t0
    report = store.recovery
    store.close_sync()
    _drop_caches(path)
    base_dt = _baseline_crc_scan(os.path.join(path, "commitlog"), report.max_valid_offset)
    shutil.rmtree(path)
    return {
        "bench": "recovery", "bytes": report.max_valid_offset, "records": report.records_scanned,
        "abnormal": report.abnormal, "recovery_s": round(rec_dt, 3),
        "read_and_crc_s": round(base_dt, 3), "ratio": round(rec_dt / base_dt, 3),
        "goal": "<= 1.5",
    }


# -------------------------------------------------------------------- CLI
def _workdir(args: argparse.Namespace) -> str:
    base = args.workdir or None
    return tempfile.mkdtemp(prefix="dlab-bench-", dir=base)


def _run(fn: Callable[[str], dict[str, Any]], title: str, args: argparse.Namespace) -> int:
    work = _workdir(args)
    try:
        figures = fn(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows = [(k, str(v)) for k, v in figures.items() if k != "bench"]
    _emit(title, rows, figures)
    return 0


def register(sub: Any, bench_sub: Any) -> None:
    def body_size(text: str) -> int:
        n = parse_size(text)
        limit = StoreConfig().max_message_size_bytes
        if n > limit:
            raise argparse.ArgumentTypeError(
                f"{text} is over the store's max_message_size ({limit} bytes): every put "
                "would be refused as MESSAGE_ILLEGAL")
        return n

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--workdir", type=writable_dir, help="where to write the benchmark's files "
                        "(default: the system temp dir; put it on the disk you care about)")
    p = bench_sub.add_parser(
        "store", parents=[common], help="batch append under ASYNC_FLUSH vs raw write+fsync",
        description="Appends 1 KiB messages through the batch API under ASYNC_FLUSH "
        "(the flusher running as in a node), then compares bytes/s with a raw "
        "sequential write + fsync of the same bytes, in alternating rounds after a "
        "warm-up round (the figure compares the medians). Goal: ratio >= 0.5.")
    p.add_argument("--mib", type=positive_int, default=512,
                   help="bytes to append, MiB (default 512)")
    p.add_argument("--body-size", type=body_size, default=1024, help="body bytes (default 1024)")
    p.add_argument("--batch", type=positive_int, default=256,
                   help="messages per batch (default 256)")
    p.add_argument("--rounds", type=positive_int, default=5,
                   help="store and raw runs, alternating, after one warm-up round; the "
                   "figure compares medians (default 5)")
    p.set_defaults(handler=lambda a: _run(
        lambda w: bench_store(a.mib, a.body_size, a.batch, w, a.rounds), "store append", a))

    p = bench_sub.add_parser(
        "group-commit", parents=[common],
        help="SYNC_FLUSH puts/s with 64 producers vs one fsync per put",
        description="64 concurrent producers put under SYNC_FLUSH (group commit) for "
        "--seconds; the baseline writes one record and fsyncs, per put, for as long. "
        "Goal: ratio >= 20.")
    p.add_argument("--producers", type=positive_int, default=64,
                   help="concurrent producers (default 64)")
    p.add_argument("--seconds", type=positive_float, default=5.0,
                   help="how long each side runs, in seconds (default 5)")
    p.add_argument("--body-size", type=body_size, default=1024,
                   help="body bytes (default 1024)")
    p.set_defaults(handler=lambda a: _run(
        lambda w: bench_group_commit(a.producers, a.seconds, a.body_size, w),
        "group commit", a))

    p = bench_sub.add_parser(
        "durable-mark", parents=[common],
        help="one-record flushes/s with the durable mark's write vs without",
        description="Writes one 1 KiB record and fdatasyncs it, --flushes times a round, "
        "with the durable mark's 8-byte pwrite after each fsync (the power crash model's "
        "record of completed fsyncs) and without, in alternating rounds; the figure is the "
        "ratio of the medians. Goal: ratio >= 0.95.")
    p.add_argument("--flushes", type=positive_int, default=300,
                   help="flushes per round (default 300)")
    p.add_argument("--rounds", type=positive_int, default=10,
                   help="rounds per side, alternating (default 10)")
    p.set_defaults(handler=lambda a: _run(
        lambda w: bench_durable_mark(a.flushes, a.rounds, w), "durable mark", a))

    p = bench_sub.add_parser(
        "recovery", parents=[common],
        help="abnormal recovery time vs reading and CRC-checking the same bytes",
        description="Writes --mib of 1 KiB messages, marks the store as crashed with no "
        "checkpoint (so recovery checks everything), times the recovery, then times "
        "reading the same files and CRC-checking every record body. Goal: ratio <= 1.5.")
    p.add_argument("--mib", type=positive_int, default=1024, help="store size, MiB (default 1024)")
    p.add_argument("--body-size", type=body_size, default=1024,
                   help="body bytes (default 1024)")
    p.set_defaults(handler=lambda a: _run(
        lambda w: bench_recovery(a.mib, a.body_size, w), "abnormal recovery", a))
