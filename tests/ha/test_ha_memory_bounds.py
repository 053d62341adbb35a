"""What a master holds for replication streams stays bounded, whoever holds
the cluster token (docs/design.md, "What a master holds for its slaves").

A peer with the token can open HA streams that report offset 0 and then
never read what the master ships. These tests run such peers against a
real master process over real gRPC on loopback (and, for the per-stream
window, against the real master code over the in-memory transport on a
virtual clock): the master's memory stays bounded, streams beyond the limit
are refused with RESOURCE_EXHAUSTED, a stream that does not read is closed
within the housekeeping interval, and the slave-link table forgets the
names such streams used while a real slave keeps replicating.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
from support.ha_helpers import (
    client,
    log_text,
    running_cluster,
    send_n,
    slave_link,
    status,
    wait_caught_up,
    wait_connected,
    wait_until,
)

from cluster.client.node_client import make_message
from cluster.node.role import Role
from cluster.node.server import Node, NodeConfig
from ha import frames
from ha.config import HAConfig
from ha.transport.grpc_transport import GrpcConnector
from ha.transport.memory import MemoryNetwork
from ha.transport.streams import EOF, HAConnector, SlaveCall
from proto import ha_pb2
from store.config import StoreConfig
from store.log.record import Message
from store.sim import loop as sim_loop
from store.sim.inline_executor import InlineFlushExecutor
from store.sim.loop import VirtualTimeLoop

REPORT_EVERY_S = 0.3  # the idle peers report (offset 0) this often: never "silent"
# A long housekeeping interval where a test is about limits, not closing.
LONG_HOUSEKEEPING = ("--ha-housekeeping-ms", "30000")
# A range never crosses a segment's end: with the helpers' 256 KiB segments
# no range would reach the default 1 MiB batch.
BIG_SEGMENTS = ("--segment-size", "64MiB")


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for process {pid}")


def _fill_master(backend: Any, token: str, mib: int) -> int:
    """Put about `mib` MiB (16 KB bodies, 64 a batch) into the master."""
    with client(backend, token, timeout_s=60) as c:
        for k in range(mib):
            batch = [make_message("t", os.urandom(16_000), msg_id=f"fill{k}_{j}")
                     for j in range(64)]
            assert {o.status for o in c.send_batch(batch)} == {"PUT_OK"}
    return int(status(backend, token, "master")["wrote"])


async def _idle_stream(call: SlaveCall, name: str, stop: asyncio.Event) -> None:
    """Report offset 0 as slave `name`, and again every REPORT_EVERY_S until
    `stop` or the stream fails; never read."""
    report = ha_pb2.Report(max_offset=0, slave=name, incarnation=f"idle-{name}")
    while not stop.is_set():
        try:
            await call.write(report)
        except (grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError,
                RuntimeError):
            return  # the master ended (or refused) the stream
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), REPORT_EVERY_S)


async def _hold_idle_streams(connector: HAConnector, address: str, token: str,
                             names: list[str], stop: asyncio.Event) -> None:
    async def one(name: str) -> None:
        async with connector.open(address, token) as call:
            await _idle_stream(call, name, stop)

    await asyncio.gather(*(one(n) for n in names))


class IdlePeers:
    """Idle streams held by a thread of this process (their own event loop)
    until `close`."""

    def __init__(self, address: str, token: str, names: list[str]) -> None:
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(self._loop)

            async def main() -> None:
                self._stop = asyncio.Event()
                ready.set()
                await _hold_idle_streams(GrpcConnector(), address, token, names, self._stop)

            self._loop.run_until_complete(main())

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        assert ready.wait(30)

    def close(self) -> None:
        stop = self._stop
        assert stop is not None
        self._loop.call_soon_threadsafe(stop.set)
        self._thread.join(60)
        assert not self._thread.is_alive(), "the idle peers did not stop"
        self._loop.close()


async def _stream_status(address: str, token: str, name: str
                         ) -> tuple[grpc.StatusCode | None, str]:
    """Open a stream as `name`, report 0, read until the master ends it
    (None: it was still being served after 15 s)."""
    async with GrpcConnector().open(address, token) as call:
        await call.write(ha_pb2.Report(max_offset=0, slave=name, incarnation=f"probe-{name}"))
        try:
            async with asyncio.timeout(15):
                while (await call.read()) is not EOF:
                    pass
        except grpc.aio.AioRpcError as exc:
            return exc.code(), exc.details() or ""
        except TimeoutError:
            call.cancel()
            return None, "the master served the stream for 15 s"
        return await call.code(), await call.details()


# ----------------------------------------------------------------- (a)
IDLE_PEERS = Path(__file__).resolve().parents[1] / "support" / "ha_idle_peers.py"


@contextlib.contextmanager
def stopped_idle_peers(address: str, token_file: str, count: int, prefix: str
                       ) -> Iterator[subprocess.Popen[str]]:
    """tests/support/ha_idle_peers.py holding `count` streams, stopped (SIGSTOP) once
    they are open: their sockets are not read at all. Killed on exit."""
    proc = subprocess.Popen([sys.executable, str(IDLE_PEERS), address, token_file, str(count),
                             prefix], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready", "the idle peers did not start"
        os.kill(proc.pid, signal.SIGSTOP)
        yield proc
    finally:
        proc.kill()
        proc.wait(30)


def test_many_idle_streams_leave_the_master_memory_bounded(tmp_path: Path) -> None:
    """48 streams that report 0 and then read nothing (their process is
    stopped), against a master holding about 48 MiB of log (4 MiB batches,
    32 MiB window): the old master admitted every one and kept what it
    shipped to each in its buffers (RSS up by about 570 MiB on a 2-core
    machine); now at most the configured slave and two other names get a
    stream, each shipped one batch until it acknowledges it."""
    window = ("--ha-batch-bytes", "4MiB", "--ha-window-bytes", "32MiB")
    with running_cluster(str(tmp_path), role=Role.ASYNC_MASTER, connected=True,
                         extra=BIG_SEGMENTS, master_extra=window + LONG_HOUSEKEEPING
                         ) as (b, tok):
        wrote = _fill_master(b, tok, 48)
        wait_caught_up(b, tok, timeout_s=120)
        pid = b.node("master").pid
        assert pid is not None
        base = peak = _rss_mib(pid)
        with stopped_idle_peers(b.node("master").address, str(tmp_path / "token"), 48,
                                "idle"):
            deadline = time.monotonic() + 12
            while time.monotonic() < deadline:
                peak = max(peak, _rss_mib(pid))
                time.sleep(0.1)
        assert peak - base < 150, (f"master RSS grew from {base:.0f} MiB to {peak:.0f} MiB "
                                   f"with 48 idle streams over {wrote} bytes of log")
        # The real slave was not starved of its stream meanwhile.
        assert slave_link(b, tok)["state"] == "connected"
        assert {o.status for o in send_n(b, tok, 5, prefix="after")} == {"PUT_OK"}
        wait_caught_up(b, tok)


# ----------------------------------------------------------------- (b)
def test_streams_beyond_the_limit_are_refused_with_a_clear_status(tmp_path: Path) -> None:
    """One configured slave plus two other names hold streams; a third
    other name is refused with RESOURCE_EXHAUSTED naming the limit and how
    to raise it, and the configured slave keeps its stream."""
    with running_cluster(str(tmp_path), role=Role.ASYNC_MASTER, connected=True,
                         master_extra=LONG_HOUSEKEEPING) as (b, tok):
        _fill_master(b, tok, 4)
        address = b.node("master").address
        before = slave_link(b, tok)
        peers = IdlePeers(address, tok, ["idle0", "idle1"])
        try:
            wait_until(lambda: {"idle0", "idle1"} <= {
                s["slave"] for s in status(b, tok, "master")["slaves"]
                if s["state"] == "connected"}, 30, "both idle streams to be served")
            code, details = asyncio.run(_stream_status(address, tok, "idle2"))
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, (code, details)
            assert "slave idle2 is not one this master is configured with" in details
            assert "configured slaves: slave1" in details
            assert "--ha-extra-streams" in details and "--ha-slave" in details
        finally:
            peers.close()
        after = slave_link(b, tok)
        assert after["state"] == "connected" and after["sessions"] == before["sessions"]
        assert "refusing a replication stream" in log_text(b.node("master").log_path)


# ----------------------------------------------------------------- (c)
def test_a_stream_that_does_not_read_is_closed_within_the_housekeeping_interval(
        tmp_path: Path) -> None:
    """A peer holding configured slave slave2's name (slave2 itself is
    stopped) reports 0 every 0.3 s, so it is never silent, but reads
    nothing. The master closes its stream one housekeeping interval (2 s)
    after it shipped the first batch, and says why; the old master kept it
    open for as long as it kept reporting."""
    housekeeping_s = 2.0
    with running_cluster(str(tmp_path), role=Role.ASYNC_MASTER, slaves=2,
                         connected=True) as (b, tok):
        wait_connected(b, tok, "slave2")
        b.stop("slave2")
        wait_until(lambda: slave_link(b, tok, "slave2").get("state") == "disconnected",
                   30, "slave2's stream to end")
        _fill_master(b, tok, 4)
        sessions = slave_link(b, tok, "slave2")["sessions"]
        opened = time.monotonic()
        peers = IdlePeers(b.node("master").address, tok, ["slave2"])
        try:
            wait_until(lambda: slave_link(b, tok, "slave2")["sessions"] == sessions + 1, 30,
                       "the idle stream to be served")
            link = wait_until(lambda: (lambda s: s if s.get("state") == "disconnected"
                                       else None)(slave_link(b, tok, "slave2")),
                              housekeeping_s + 10, "the idle stream to be closed")
            closed_after = time.monotonic() - opened
        finally:
            peers.close()
        assert "not reading the stream" in link["detail"], link
        assert "housekeeping interval" in link["detail"], link
        # Not before its housekeeping interval (less a little for the
        # stream's set-up, counted here but not by the master).
        assert closed_after >= housekeeping_s - 0.5, closed_after
        assert slave_link(b, tok)["state"] == "connected"


# ----------------------------------------------------------------- (d)
def test_closed_unknown_names_are_forgotten_and_a_real_slave_still_replicates(
        tmp_path: Path) -> None:
    """Twelve peers under names no slave is configured with come and go, two
    at a time (within the margin); once their streams are closed the
    slave-link table holds only the configured slave, which still
    replicates every put."""
    with running_cluster(str(tmp_path), role=Role.SYNC_MASTER, connected=True) as (b, tok):
        address = b.node("master").address
        _fill_master(b, tok, 2)
        def table() -> set[str]:
            return {s["slave"] for s in status(b, tok, "master")["slaves"]}

        def served(names: set[str]) -> bool:
            return names <= table()

        def forgotten(names: set[str]) -> bool:
            return not names & table()

        for k in range(0, 12, 2):
            names = {f"passer{k}", f"passer{k + 1}"}
            peers = IdlePeers(address, tok, sorted(names))
            try:
                wait_until(functools.partial(served, names), 30, f"{sorted(names)} to be served")
            finally:
                peers.close()
            # Gone once their streams have closed (and only then is the
            # next pair within the margin of two streams for other names).
            wait_until(functools.partial(forgotten, names), 30,
                       f"{sorted(names)} to be forgotten")
        assert table() == {"slave1"}
        assert slave_link(b, tok)["state"] == "connected"
        outcomes = send_n(b, tok, 20, prefix="still")
        assert {o.status for o in outcomes} == {"PUT_OK"}, outcomes
        wait_caught_up(b, tok)


# ------------------------------------------- the window, over the memory twin
MASTER = "10.0.0.1:7001"
PEER = "10.0.0.9:7001"
TOKEN = "sim-token"


def test_a_peer_that_never_reads_is_shipped_one_batch_then_closed(tmp_path: Path) -> None:
    """The real master code over the in-memory transport, on a virtual
    clock: a peer that reports 0 every 0.3 s and reads nothing is shipped one
    batch (256 KiB) of the master's 4 MiB, not its 2 MiB window; what it
    finds when it finally reads, after the housekeeping interval (10 s), is
    that batch and the stream's end with the reason."""
    ha = HAConfig(batch_bytes=256 << 10, window_bytes=2 << 20, heartbeat_interval_ms=1_000,
                  housekeeping_interval_ms=10_000)
    store = StoreConfig(segment_size_bytes=16 << 20, max_message_size_bytes=64 << 10)

    async def main(loop: VirtualTimeLoop) -> tuple[int, grpc.StatusCode, str]:
        net = MemoryNetwork(loop, delay=lambda _msg: 0.001)
        master = Node(NodeConfig(name="master", role=Role.ASYNC_MASTER, listen=MASTER,
                                 data_dir=str(tmp_path / "master"), token=TOKEN, store=store,
                                 ha=ha), clock=loop.clock(), executor=InlineFlushExecutor(),
                      network=net)
        await master.start()
        for k in range(64):
            await master.put_many([Message("t", bytes([k]) * 60_000, {"UNIQ_KEY": f"m{k}"},
                                           born_timestamp_ms=loop.wall_ms())])
        stop = asyncio.Event()
        async with net.connector(PEER).open(MASTER, TOKEN) as call:
            idle = asyncio.create_task(_idle_stream(call, "idle", stop))
            await asyncio.sleep(12.0)  # past the housekeeping interval
            shipped = 0
            code, details = grpc.StatusCode.OK, "still open"
            try:
                while (msg := await asyncio.wait_for(call.read(), 1.0)) is not EOF:
                    frame = frames.decode(msg)
                    if isinstance(frame, frames.RangeFrame):
                        shipped += len(frame.data)
                code, details = await call.code(), await call.details()
            except TimeoutError:
                pass
            stop.set()
            await idle
        await master.stop()
        return shipped, code, details

    shipped, code, details = sim_loop.run(main)
    assert 0 < shipped <= (256 << 10) + (64 << 10), shipped  # a batch (ends on a record)
    assert code == grpc.StatusCode.UNAVAILABLE, (code, details)
    assert "not reading the stream" in details, details
