"""HA benchmarks: `dlab bench catch-up` and `dlab bench sync-master`. Each
measures its baselines in the same run, prints a table, then one JSON object
as its last line carrying the figures and `ratio`.

catch-up: a master node holds a backlog (default 512 MiB of 4 KiB-body
  messages); a fresh slave node connects and catches up. The figure is the
  slave's catch-up rate, bytes/s from its first acknowledged range until its
  `flushed` position covers the backlog (received, verified record by
  record, appended, fsynced). `ratio` is that over the slower of two
  baselines measured on the same bytes: raw grpcio streaming between two
  processes (bench_peer's Source, server to client as the HA stream, no
  protobuf, no store) and raw sequential write + fsync into a new file
  (page cache taken from free memory, as the slave's writes are; see
  _baseline_write_fsync), both in 1 MiB messages/writes whatever the HA
  batch (--chunk-bytes). Goal: ratio >= 0.8.
  It also prints CPU seconds per GiB: the master's and the slave's during
  the catch-up, and each baseline's (both processes for the stream). A
  catch-up streams the bytes AND writes them, so it needs at least the sum
  of the baselines' (`goal_cpu_floor_s_per_gib`); at the goal's speed the
  cores give it `goal_cpu_budget_s_per_gib`.

sync-master: a SYNC_MASTER + SYNC_FLUSH master with one SYNC_FLUSH slave,
  1 KiB bodies. Acked (PUT_OK) puts/s with 64 concurrent clients over puts/s
  with 1 client (goal >= 10), and the single client's p99 latency over the
  p99 of one raw gRPC round trip (bench_peer's unary Echo) followed by one
  write + fsync, measured in the same run (goal <= 2). `ratio` is the
  throughput ratio, `p99_ratio` the latency one. The 64 clients take the
  shape of RocketMQ's benchmark Producer (example/.../benchmark/Producer:
  one DefaultMQProducer, 64 threads each sending one message at a time):
  64 senders on one AsyncNodeClient, whose SendStream carries the requests
  ready at once in one stream message. `separate_clients_64` measures 64
  AsyncNodeClients instead, each its own channel object and SendStream
  (grpc core lets them share one TCP connection), where nothing can be
  written together. Both carry CPU-us per put in the clients' process, the
  master and the slave. For context it also measures bare echo over the
  separate-clients shape (bench_peer's EchoStream, one stream per client,
  write then read per message) and bare unary echo RPCs, the transport of
  the unary Send the clients used before.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from cluster.backends.interface import ClusterSpec, NodeSpec
from cluster.backends.local import LocalBackend, node_env
from cluster.backends.procs import ChildProcesses, cpu_seconds, free_ports
from cluster.client.node_client import (
    FAST_RECONNECT,
    AsyncNodeClient,
    NodeCallError,
    NodeClient,
    make_message,
)
from cluster.client.sendload import percentile
from cluster.node.role import Role
from ha import bench_peer
from store.config import MIB, CrashModel, FlushMode, StoreConfig
from store.log.record import Message
from store.store import MessageStore

SEGMENT_BYTES = 128 * MIB
# The baselines' message (and write) size: 1 MiB, whatever the HA batch, so
# a larger batch is compared with raw streaming at its own best.
BASELINE_CHUNK_BYTES = 1 * MIB


def _cpu_s(pid: int | None = None) -> float:
    """CPU seconds (user + system, every thread) used so far by process
    `pid` (Linux /proc), or by this process."""
    return time.process_time() if pid is None else cpu_seconds(pid)


def _cores() -> int:
    return len(os.sched_getaffinity(0))


@contextlib.contextmanager
def _peer(work: str) -> Iterator[tuple[str, int]]:
    """A bench_peer process; yields its address and pid."""
    port_file = os.path.join(work, "peer.port")
    proc = subprocess.Popen([sys.executable, "-m", "ha.bench_peer", "--port-file", port_file],
                            stdin=subprocess.DEVNULL, env=node_env())
    try:
        deadline = time.monotonic() + 30
        while not os.path.exists(port_file):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the benchmark peer process did not start")
            time.sleep(0.01)
        with open(port_file) as f:
            yield f"127.0.0.1:{int(f.read())}", proc.pid
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _segments(commitlog: str) -> list[str]:
    return [os.path.join(commitlog, n) for n in sorted(os.listdir(commitlog))]


def _chunks(commitlog: str, total: int, chunk: int) -> Iterator[bytes]:
    """The backlog's bytes, in file order, `chunk` at a time, up to `total`."""
    left = total
    for path in _segments(commitlog):
        with open(path, "rb", buffering=0) as f:
            while left > 0:
                data = f.read(min(chunk, left))
                if not data:
                    break
                left -= len(data)
                yield data
        if left <= 0:
            return


# ------------------------------------------------------------- catch-up
def _build_backlog(path: str, total_bytes: int, body_size: int) -> int:
    cfg = StoreConfig(segment_size_bytes=SEGMENT_BYTES, flush_mode=FlushMode.ASYNC_FLUSH,
                      crash_model=CrashModel.PROCESS)
    store = MessageStore.open(path, cfg)
    try:
        body = os.urandom(body_size)
        i = 0
        while store.log.wrote < total_bytes:
            batch = [Message("backlog", body, {"UNIQ_KEY": f"c{i + k:012d}"}) for k in range(256)]
            i += len(batch)
            store.append(batch)
            if i % 16384 == 0:
                store.log.flush()
        wrote = store.log.wrote
    finally:
        store.close_sync()
    return wrote


def _baseline_grpc_download(addr: str, peer_pid: int, commitlog: str, total: int, chunk: int
                            ) -> tuple[float, float]:
    """Seconds for the peer to stream `total` bytes of the backlog files to this
    process, server to client (the HA stream's direction), grpc.aio at both
    ends as in the nodes, raw bytes (no protobuf, no store); and the CPU
    seconds the two processes spent on it."""

    async def run() -> tuple[float, float]:
        request = json.dumps({"paths": _segments(commitlog), "total": total,
                              "chunk": chunk}).encode()
        async with grpc.aio.insecure_channel(addr, options=bench_peer.OPTIONS) as channel:
            await channel.channel_ready()
            source = channel.unary_stream(bench_peer.SOURCE)
            cpu0 = _cpu_s() + _cpu_s(peer_pid)
            t0 = time.perf_counter()
            got = 0
            async for data in source(request, timeout=600):
                got += len(data)
            dt = time.perf_counter() - t0
            cpu = _cpu_s() + _cpu_s(peer_pid) - cpu0
        if got != total:
            raise RuntimeError(f"baseline stream delivered {got} of {total} bytes")
        return dt, cpu

    return asyncio.run(run())


def _baseline_grpc_upload(addr: str, commitlog: str, total: int, chunk: int) -> float:
    """The other direction (client to server, blocking client): for the table."""
    with grpc.insecure_channel(addr, options=bench_peer.OPTIONS) as channel:
        sink = channel.stream_unary(bench_peer.SINK)
        grpc.channel_ready_future(channel).result(timeout=30)
        t0 = time.perf_counter()
        got = int.from_bytes(sink(_chunks(commitlog, total, chunk), timeout=600), "big")
        dt = time.perf_counter() - t0
    if got != total:
        raise RuntimeError(f"baseline stream delivered {got} of {total} bytes")
    return dt


def _write_fsync(data: list[bytes], path: str) -> tuple[float, float]:
    """Seconds to write `data` to a new file at `path` and fsync it, and the
    CPU seconds; the file is left in place."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        cpu0 = _cpu_s()
        t0 = time.perf_counter()
        for d in data:
            os.write(fd, d)
        os.fsync(fd)
        return time.perf_counter() - t0, _cpu_s() - cpu0
    finally:
        os.close(fd)


def _baseline_write_fsync(commitlog: str, total: int, chunk: int, out: str
                          ) -> tuple[tuple[float, float], tuple[float, float],
                                     tuple[list[bytes], list[str]]]:
    """Write + fsync of the backlog's bytes: (seconds, CPU seconds) at best
    of two runs into page cache taken from free memory, as a catching-up
    slave's writes are; and one run right after a run's file was deleted,
    into the page cache it just freed, for context. Also returns what it
    holds (the bytes read, the files written): the caller lets go of them
    after the catch-up, so that the slave cannot take the pages they hold
    either.

    Why: on a VM that hands freed memory back to its host (free page
    reporting, within seconds), a page taken from free memory costs a host
    fault, several times the cost of a page just freed (see
    docs/performance-notes.md). A slave filling its page cache with new data
    gets the first case, unless something freed as much just before it (a
    baseline that deleted its file before the slave started would)."""
    data = list(_chunks(commitlog, total, chunk))  # read first: time only write + fsync
    paths = [f"{out}.{i}" for i in range(2)]
    fresh = min(_write_fsync(data, p) for p in paths)
    os.unlink(paths[0])
    recycled = _write_fsync(data, paths[0])
    return fresh, recycled, (data, paths)


def _watch_catch_up(client: NodeClient, slave_gone: Callable[[], bool],
                    nodes_cpu: Callable[[], tuple[float, float]], total: int,
                    ) -> tuple[tuple[float, tuple[float, float], int],
                               tuple[float, tuple[float, float]]]:
    """Poll the slave until it has flushed `total` bytes: (time, CPU, bytes)
    when its first bytes were seen, and (time, CPU) when it finished."""
    start: tuple[float, tuple[float, float], int] | None = None
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        try:
            st = client.status()
        except NodeCallError:
            if slave_gone():
                raise RuntimeError("the slave exited; see its log") from None
            time.sleep(0.005)
            continue
        now = time.perf_counter()
        if start is None and st.wrote > 0:
            start = (now, nodes_cpu(), st.wrote)
        if os.environ.get("DLAB_BENCH_TRACE"):
            print(f"{now:.3f} wrote={st.wrote} flushed={st.flushed}", file=sys.stderr)
        if st.flushed >= total:
            return start or (now, nodes_cpu(), total), (now, nodes_cpu())
        time.sleep(0.01)
    raise RuntimeError("the slave did not catch up within 600 s")


def _catch_up_figures(*, total: int, caught: int, catch_s: float, grpc: tuple[float, float],
                      disk: tuple[float, float], upload_s: float, recycled_s: float,
                      cpu: tuple[tuple[float, float], tuple[float, float]],
                      ) -> dict[str, Any]:
    """The catch-up's figures against its baselines (gRPC streaming of the
    same bytes, write + fsync of them), each (seconds, CPU seconds)."""
    (grpc_s, grpc_cpu), (disk_s, disk_cpu), (cpu0, cpu1) = grpc, disk, cpu
    catch_bps = caught / catch_s
    grpc_bps = total / grpc_s
    disk_bps = total / disk_s
    slower = min(grpc_bps, disk_bps)
    # CPU accounting, per GiB moved. A catch-up streams the bytes over grpc
    # AND writes + fsyncs them, so it needs at least the CPU of both
    # baselines; at the goal's speed the cores can give at most `cores`
    # seconds per second of it.
    gib = 1 << 30
    floor = (grpc_cpu + disk_cpu) / total * gib
    budget = _cores() * gib / (0.8 * slower)
    return {
        "timed_bytes": caught,
        "catch_up_mib_s": round(catch_bps / MIB, 1),
        "grpc_stream_mib_s": round(grpc_bps / MIB, 1),
        "grpc_upload_mib_s": round(total / upload_s / MIB, 1),
        "write_fsync_mib_s": round(disk_bps / MIB, 1),
        "write_fsync_into_just_freed_pages_mib_s": round(total / recycled_s / MIB, 1),
        "baseline": "grpc_stream" if grpc_bps <= disk_bps else "write_fsync",
        "cpu_s_per_gib": {"master": round((cpu1[0] - cpu0[0]) / caught * gib, 2),
                          "slave": round((cpu1[1] - cpu0[1]) / caught * gib, 2),
                          "grpc_stream": round(grpc_cpu / total * gib, 2),
                          "write_fsync": round(disk_cpu / total * gib, 2)},
        "cores": _cores(),
        "goal_cpu_floor_s_per_gib": round(floor, 2),
        "goal_cpu_budget_s_per_gib": round(budget, 2),
        "ratio": round(catch_bps / slower, 3), "goal": ">= 0.8",
        "met": catch_bps / slower >= 0.8,
    }


def bench_catch_up(size_mib: int, body_size: int, work: str, *, batch_bytes: int,
                   window_bytes: int, flush: str = "SYNC_FLUSH",
                   chunk_bytes: int = BASELINE_CHUNK_BYTES) -> dict[str, Any]:
    from cluster.node.auth import generate_token

    cluster_dir = os.path.join(work, "cluster")
    master_dir = os.path.join(cluster_dir, "nodes", "master", "data")
    total = _build_backlog(master_dir, size_mib * MIB, body_size)
    commitlog = os.path.join(master_dir, "commitlog")
    # Each baseline at its best of two runs (a baseline measured on a bad
    # moment of this shared machine would flatter the ratio).
    with _peer(work) as (addr, peer_pid):
        grpc_s, grpc_cpu = min(_baseline_grpc_download(addr, peer_pid, commitlog, total,
                                                       chunk_bytes) for _ in range(2))
        upload_s = min(_baseline_grpc_upload(addr, commitlog, total, chunk_bytes)
                       for _ in range(2))
    (disk_s, disk_cpu), (recycled_s, _), held = _baseline_write_fsync(
        commitlog, total, chunk_bytes, os.path.join(work, "raw"))
    extra = ("--ha-batch-bytes", str(batch_bytes), "--ha-window-bytes", str(window_bytes))
    common: dict[str, Any] = dict(flush=FlushMode(flush), segment_size_bytes=SEGMENT_BYTES,
                                  crash_model=CrashModel.POWER, extra_args=extra)
    token = generate_token()
    backend = LocalBackend()
    # The master alone first; the slave is started below so that its whole
    # catch-up happens while this process watches.
    backend.up(ClusterSpec(directory=cluster_dir,
                           master=NodeSpec(name="master", role=Role.ASYNC_MASTER, **common)),
               token=token, timeout_s=120)
    slave_proc = None
    children = ChildProcesses()  # the slave this benchmark starts itself
    try:
        (port,) = free_ports(1)
        slave_addr = f"127.0.0.1:{port}"
        args = NodeSpec(name="slave1", role=Role.SLAVE, **common).node_args(
            data_dir=os.path.join(work, "slave", "data"), listen=slave_addr,
            master=backend.node("master").address, token_file=os.path.join(cluster_dir, "token"))
        os.makedirs(os.path.join(work, "slave"), exist_ok=True)
        slave_proc = children.spawn([sys.executable, "-m", "cluster.cli", "node", *args],
                                    log_path=os.path.join(work, "slave", "node.log"),
                                    env=node_env())
        master_pid = backend.node("master").pid
        assert master_pid is not None

        def nodes_cpu() -> tuple[float, float]:
            assert slave_proc is not None
            return _cpu_s(master_pid), _cpu_s(slave_proc.pid)

        with NodeClient(slave_addr, token=token, timeout_s=5,
                        channel_options=FAST_RECONNECT) as client:
            (t0, cpu0, start_bytes), (t1, cpu1) = _watch_catch_up(
                client, lambda: children.state(slave_proc) == "gone", nodes_cpu, total)
        caught = total - start_bytes
        if t1 <= t0 or caught < total // 2:
            raise RuntimeError("catch-up finished before it could be timed; use a larger "
                               "--size-mib")
        catch_s = t1 - t0
    finally:
        if slave_proc is not None:
            children.signal(slave_proc, signal.SIGTERM)
            children.wait_state(slave_proc, {"gone"}, 30)
        backend.down()
        held[0].clear()  # the baseline's bytes and files, held through the catch-up
        for path in held[1]:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
    return {
        "bench": "catch-up", "backlog_bytes": total, "body_size": body_size, "flush": flush,
        "batch_bytes": batch_bytes, "window_bytes": window_bytes,
        "baseline_chunk_bytes": chunk_bytes,
        **_catch_up_figures(total=total, caught=caught, catch_s=catch_s,
                            grpc=(grpc_s, grpc_cpu), disk=(disk_s, disk_cpu),
                            upload_s=upload_s, recycled_s=recycled_s, cpu=(cpu0, cpu1)),
    }


# ---------------------------------------------------------- sync-master
def _baseline_rtt_fsync(addr: str, n: int, body_size: int, path: str) -> list[float]:
    payload = os.urandom(body_size)
    lat: list[float] = []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        with grpc.insecure_channel(addr, options=bench_peer.OPTIONS) as channel:
            echo = channel.unary_unary(bench_peer.ECHO)
            grpc.channel_ready_future(channel).result(timeout=30)
            for _ in range(50):
                echo(payload, timeout=10)
            for _ in range(n):
                t0 = time.perf_counter()
                echo(payload, timeout=10)
                os.write(fd, payload)
                os.fsync(fd)
                lat.append(time.perf_counter() - t0)
    finally:
        os.close(fd)
        os.unlink(path)
    return sorted(lat)


async def _clients(addr: str, token: str, clients: int, count: int, body_size: int,
                   max_seconds: float, node_pids: tuple[int, ...] = (), *, shared: bool = False
                   ) -> tuple[int, float, list[float], dict[str, int], list[float]]:
    """`clients` independent producers, each its own AsyncNodeClient (its own
    grpc channel and its own SendStream call), sending one message at a
    time. (grpc core shares one TCP connection among channels to the same
    address with the same options, as one process's RocketMQ producers
    share one remoting connection per broker.) Also returns the CPU seconds
    this process and each of `node_pids` spent in the timed window."""
    body = os.urandom(body_size)
    producers = [AsyncNodeClient(addr, token=token, timeout_s=30)
                 for _ in range(1 if shared else clients)]
    lat: list[float] = []
    counts: dict[str, int] = {}
    issued = 0
    try:
        for c in producers:  # connect and open each stream before timing
            out = await c.send(make_message("bench", body, msg_id=f"w{id(c)}"))
            if out.indeterminate:
                raise RuntimeError(f"warm-up send failed: {out.detail}")
        cpu0 = [_cpu_s(), *(_cpu_s(p) for p in node_pids)]
        t0 = time.perf_counter()
        deadline = t0 + max_seconds

        async def one(k: int) -> None:
            nonlocal issued
            c = producers[k % len(producers)]
            while issued < count and time.perf_counter() < deadline:
                issued += 1
                out = await c.send(make_message("bench", body, msg_id=f"s{k}-{issued}"))
                counts[out.status] = counts.get(out.status, 0) + 1
                if out.status == "PUT_OK":
                    lat.append(out.latency_s)

        await asyncio.gather(*(one(k) for k in range(clients)))
        elapsed = time.perf_counter() - t0
        cpu = [b - a for a, b in zip(cpu0, [_cpu_s(), *(_cpu_s(p) for p in node_pids)],
                                     strict=True)]
    finally:
        for c in producers:
            await c.close()
    lat.sort()
    return counts.get("PUT_OK", 0), elapsed, lat, counts, cpu


async def _echo_rate(addr: str, peer_pid: int, clients: int, count: int, body_size: int
                     ) -> tuple[float, float]:
    """Messages per second echoed by the peer over bare grpc.aio streams,
    `clients` concurrent callers shaped as _clients' producers (each its own
    channel and its own stream, one message at a time: write, then read its
    echo): the ceiling any put path over the SendStream can reach here.
    Also returns the CPU seconds both processes spent per message."""
    payload = os.urandom(body_size)
    channels = [grpc.aio.insecure_channel(addr) for _ in range(clients)]
    calls = []
    try:
        for ch in channels:
            await ch.channel_ready()
            call = ch.stream_stream(bench_peer.ECHO_STREAM)()
            await call.write(payload)  # open the stream before timing
            await call.read()
            calls.append(call)
        issued = 0

        async def one(k: int) -> None:
            nonlocal issued
            call = calls[k]
            while issued < count:
                issued += 1
                await call.write(payload)
                await call.read()

        cpu0 = _cpu_s() + _cpu_s(peer_pid)
        t0 = time.perf_counter()
        await asyncio.gather(*(one(k) for k in range(clients)))
        rate = count / (time.perf_counter() - t0)
        return rate, (_cpu_s() + _cpu_s(peer_pid) - cpu0) / count
    finally:
        for call in calls:
            call.cancel()
        for ch in channels:
            await ch.close()


async def _unary_echo_rate(addr: str, clients: int, count: int, body_size: int) -> float:
    """The same with one unary Echo RPC per message (the transport the
    broker's unary Send uses), for comparison."""
    payload = os.urandom(body_size)
    channels = [grpc.aio.insecure_channel(addr) for _ in range(clients)]
    try:
        for ch in channels:
            await ch.channel_ready()
        calls = [ch.unary_unary(bench_peer.ECHO) for ch in channels]
        issued = 0

        async def one(k: int) -> None:
            nonlocal issued
            while issued < count:
                issued += 1
                await calls[k](payload, timeout=10)

        t0 = time.perf_counter()
        await asyncio.gather(*(one(k) for k in range(clients)))
        return count / (time.perf_counter() - t0)
    finally:
        for ch in channels:
            await ch.close()


def bench_sync_master(count_1: int, count_64: int, clients: int, body_size: int,
                      max_seconds: float, work: str) -> dict[str, Any]:
    from cluster.node.auth import generate_token

    with _peer(work) as (addr, peer_pid):
        base = _baseline_rtt_fsync(addr, max(200, count_1 // 2), body_size,
                                   os.path.join(work, "fsync-probe"))
        echo_n, echo_cpu = asyncio.run(_echo_rate(addr, peer_pid, clients, count_64, body_size))
        unary_echo_n = asyncio.run(_unary_echo_rate(addr, clients, count_64 // 4, body_size))
    backend = LocalBackend()
    common: dict[str, Any] = dict(flush=FlushMode.SYNC_FLUSH, segment_size_bytes=SEGMENT_BYTES,
                                  crash_model=CrashModel.POWER)
    spec = ClusterSpec(directory=os.path.join(work, "cluster"),
                       master=NodeSpec(name="master", role=Role.SYNC_MASTER, **common),
                       slaves=(NodeSpec(name="slave1", role=Role.SLAVE, **common),))
    token = generate_token()
    backend.up(spec, token=token, timeout_s=120)
    try:
        master = backend.node("master").address
        pids = (backend.node("master").pid or 0, backend.node("slave1").pid or 0)
        # Wait until the slave's stream is up, then warm up.
        with NodeClient(master, token=token) as c:
            deadline = time.monotonic() + 30
            while not any(s.state == "connected" for s in c.status().slaves):
                if time.monotonic() > deadline:
                    raise RuntimeError("the slave did not connect within 30 s")
                time.sleep(0.05)
        asyncio.run(_clients(master, token, 4, 200, body_size, 10))
        ok1, dt1, lat1, counts1, _ = asyncio.run(_clients(master, token, 1, count_1,
                                                          body_size, max_seconds))
        # RocketMQ's benchmark Producer's shape: one producer (one client,
        # one stream), `clients` threads sending on it one message at a time.
        okn, dtn, latn, countsn, cpun = asyncio.run(_clients(
            master, token, clients, count_64, body_size, max_seconds, node_pids=pids,
            shared=True))
        # And `clients` separate clients, each its own stream.
        oks, dts, lats, countss, cpus = asyncio.run(_clients(
            master, token, clients, count_64, body_size, max_seconds, node_pids=pids))
    finally:
        backend.down()
    puts1, putsn, putss = ok1 / dt1, okn / dtn, oks / dts
    lat1 = [x * 1000 for x in lat1]
    latn = [x * 1000 for x in latn]
    lats = [x * 1000 for x in lats]
    base = [x * 1000 for x in base]
    p99_1, p99_n = percentile(lat1, 99), percentile(latn, 99)
    base_p99 = percentile(base, 99)
    ratio = putsn / puts1 if puts1 else 0.0
    p99_ratio = p99_1 / base_p99 if base_p99 else 0.0
    # CPU accounting: CPU-us per acked put in the clients' process, the
    # master and the slave. At the goal's rate, 10x the single client's, the
    # cores have `budget` CPU-us per put for all of it.
    budget = _cores() / (10 * puts1) * 1e6 if puts1 else 0.0

    def per_put(cpu: list[float], ok: int) -> dict[str, int]:
        us = [c / max(1, ok) * 1e6 for c in cpu]
        return {"clients": round(us[0]), "master": round(us[1]), "slave": round(us[2]),
                "total": round(sum(us))}

    return {
        "bench": "sync-master", "body_size": body_size, "clients": clients,
        "puts_per_s_1": round(puts1, 1), f"puts_per_s_{clients}": round(putsn, 1),
        "p99_ms_1": round(p99_1, 3), f"p99_ms_{clients}": round(p99_n, 3),
        "p50_ms_1": percentile(lat1, 50),
        "baseline_rtt_fsync_p99_ms": round(base_p99, 3),
        "baseline_rtt_fsync_p50_ms": percentile(base, 50),
        f"bare_echo_stream_msg_per_s_{clients}": round(echo_n, 1),
        f"bare_echo_unary_rpc_per_s_{clients}": round(unary_echo_n, 1),
        f"cpu_us_per_put_{clients}": per_put(cpun, okn),
        f"cores_busy_{clients}": round(sum(cpun) / dtn, 2), "cores": _cores(),
        "bare_echo_cpu_us_per_msg": round(echo_cpu * 1e6),
        "goal_cpu_budget_us_per_put": round(budget),
        "statuses_1": counts1, f"statuses_{clients}": countsn,
        f"separate_clients_{clients}": {
            "puts_per_s": round(putss, 1), "p99_ms": round(percentile(lats, 99), 3),
            "ratio": round(putss / puts1, 2) if puts1 else 0.0,
            "cpu_us_per_put": per_put(cpus, oks), "statuses": countss},
        "ratio": round(ratio, 2), "goal": ">= 10",
        "p99_ratio": round(p99_ratio, 3), "p99_goal": "<= 2",
        "met": ratio >= 10 and p99_ratio <= 2,
    }
