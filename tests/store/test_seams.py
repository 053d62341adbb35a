"""The seams a simulation drives are real: a master node and a slave node —
their stores, group commit, HA master and HA slave, the node's put path —
run on a VirtualTimeLoop (store/sim/loop.py) with the inline flush executor
(store/seams/flush_executor.py) and the in-memory HA transport (ha/transport/),
on real store directories. Time jumps to the next event: a test that waits
seconds of cluster time takes milliseconds of wall time, and the same
inputs give the same event log."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from typing import Any

import grpc

from cluster.node import consume_service
from cluster.node.role import Role
from cluster.node.server import Node, NodeConfig
from ha.config import HAConfig
from ha.transport.memory import MemoryNetwork
from ha.transport.streams import EOF, MasterStream
from proto import broker_pb2, ha_pb2
from store.config import FlushMode, StoreConfig
from store.log.record import Message
from store.sim import loop as sim_loop
from store.sim.inline_executor import InlineFlushExecutor
from store.sim.loop import VirtualTimeLoop
from store.status import PutResult, PutStatus
from store.store import MessageStore

MASTER = "10.0.0.1:7001"
SLAVE = "10.0.0.2:7001"
TOKEN = "sim-token"
HA = HAConfig(heartbeat_interval_ms=1_000, housekeeping_interval_ms=10_000,
              slave_timeout_ms=3_000, reconnect_min_ms=100, reconnect_max_ms=1_000)
STORE = StoreConfig(segment_size_bytes=1 << 20, max_message_size_bytes=64 << 10,
                    flush_mode=FlushMode.SYNC_FLUSH)


class Cluster:
    """One SYNC_MASTER and one SLAVE on one virtual-time loop."""

    def __init__(self, loop: VirtualTimeLoop, tmp: Any, net: MemoryNetwork,
                 master_fsync_s: float | None = None) -> None:
        self.loop, self.net = loop, net
        self.events: list[tuple[float, str]] = []
        common: dict[str, Any] = dict(token=TOKEN, store=STORE, ha=HA)
        fsync = None if master_fsync_s is None else (lambda: master_fsync_s)
        self.master = Node(NodeConfig(name="master", role=Role.SYNC_MASTER, listen=MASTER,
                                      data_dir=str(tmp / "master"), **common),
                           clock=loop.clock(), executor=InlineFlushExecutor(fsync), network=net)
        self.slave = Node(NodeConfig(name="slave1", role=Role.SLAVE, listen=SLAVE,
                                     master=MASTER, data_dir=str(tmp / "slave"), **common),
                          clock=loop.clock(), executor=InlineFlushExecutor(), network=net)

    def note(self, what: str) -> None:
        self.events.append((self.loop.time(), what))

    async def start(self) -> None:
        await self.master.start()
        await self.slave.start()
        assert self.master.ha_master is not None
        while not any(s.state == "connected" for s in self.master.ha_master.status()):
            await asyncio.sleep(0.001)
        self.note("slave connected")

    async def put(self, i: int) -> PutResult:
        msg = Message("sim", b"x" * (100 + i), {"UNIQ_KEY": f"m{i}"},
                      born_timestamp_ms=self.loop.wall_ms())
        (result,) = await self.master.put_many([msg])
        self.note(f"put {i}: {result.status.value} at {result.offset}")
        return result

    async def stop(self) -> None:
        await self.slave.stop()
        await self.master.stop()
        assert self.master.store is not None and self.slave.store is not None
        self.note(f"stopped: master wrote {self.master.store.log.wrote}, "
                  f"slave wrote {self.slave.store.log.wrote}")


def _run(main: Any) -> Any:
    return sim_loop.run(main)


def test_sync_master_put_waits_for_the_slaves_ack(tmp_path: Any) -> None:
    # Threads other tests of the same process left running are not ours.
    before = set(threading.enumerate())
    threads: set[threading.Thread] = set()

    async def main(loop: VirtualTimeLoop) -> tuple[PutResult, float, int, Any]:
        net = MemoryNetwork(loop, delay=lambda _msg: 0.005)  # 5 ms each way
        c = Cluster(loop, tmp_path, net)
        await c.start()
        t0 = loop.time()
        result = await c.put(1)
        waited = loop.time() - t0
        threads.update(set(threading.enumerate()) - before)
        assert c.slave.store is not None and c.master.store is not None
        slave_wrote = c.slave.store.log.wrote
        # The consume side without gRPC too: what the Pull servicer calls.
        pulled = consume_service.pull(c.master.store, broker_pb2.PullRequest(
            topic="sim", queue_id=0, offset=0, max_count=8), c.master.role.value)
        await c.stop()
        return result, waited, slave_wrote, pulled

    result, waited, slave_wrote, pulled = _run(main)
    assert result.status is PutStatus.PUT_OK, result
    assert [m.body for m in pulled.messages] == [b"x" * 101], pulled
    # No hidden threads: the flushes ran inline, the stream in memory.
    assert not threads, [t.name for t in threads]
    # The range went to the slave (5 ms) and its report came back (5 ms)
    # before the put was answered.
    assert abs(waited - 0.010) < 1e-6, waited
    assert slave_wrote >= result.offset + result.size


def test_partitioned_slave_times_out_after_exactly_slave_timeout(tmp_path: Any) -> None:
    async def main(loop: VirtualTimeLoop) -> tuple[PutResult, float]:
        net = MemoryNetwork(loop)
        c = Cluster(loop, tmp_path, net)
        await c.start()
        assert (await c.put(1)).status is PutStatus.PUT_OK
        net.partition(MASTER, SLAVE)
        t0 = loop.time()
        result = await c.put(2)
        waited = loop.time() - t0
        net.heal(MASTER, SLAVE)
        await c.stop()
        return result, waited

    wall0 = time.monotonic()
    result, waited = _run(main)
    wall = time.monotonic() - wall0
    assert result.status is PutStatus.FLUSH_SLAVE_TIMEOUT, result
    assert abs(waited - HA.slave_timeout_ms / 1000) < 1e-6, waited
    # Seconds of cluster time, a fraction of that in wall time.
    assert wall < HA.slave_timeout_ms / 1000 / 2, wall


def test_a_slave_whose_stream_the_master_still_holds_reconnects_at_once(tmp_path: Any) -> None:
    """The slave sees its stream fail while the master's end looks open (as
    on a restarted container: "Internal error from Core" on the slave's side
    only). The same slave process reconnects, and its new stream supersedes
    the stale one instead of being refused until the master expires it
    (housekeeping, 10 s here); a stream from another process naming the
    same slave is still refused."""

    async def main(loop: VirtualTimeLoop) -> tuple[float, PutResult, tuple[Any, str]]:
        net = MemoryNetwork(loop)
        c = Cluster(loop, tmp_path, net)
        await c.start()
        assert c.master.ha_master is not None
        assert (await c.put(1)).status is PutStatus.PUT_OK
        net.half_open(SLAVE)
        t0 = loop.time()
        while not any(s.state == "connected" and s.sessions >= 2
                      for s in c.master.ha_master.status()):
            await asyncio.sleep(0.01)
        reconnected_after = loop.time() - t0
        result = await c.put(2)
        # Another process (another incarnation) naming slave1 while its
        # stream is live: refused, and the real slave stays connected.
        impostor = await _one_report(net, ha_pb2.Report(max_offset=0, slave="slave1",
                                                        incarnation="another-process"))
        await c.stop()
        return reconnected_after, result, impostor

    reconnected_after, result, impostor = _run(main)
    assert reconnected_after < HA.reconnect_max_ms / 1000 + 0.5, reconnected_after
    assert result.status is PutStatus.PUT_OK, result
    assert impostor[0] is grpc.StatusCode.ALREADY_EXISTS, impostor


async def _one_report(net: MemoryNetwork, report: ha_pb2.Report) -> tuple[Any, str]:
    """Open a stream to the master, send one report, and return how it ended."""
    async with net.connector("10.0.0.9:7001").open(MASTER, token=TOKEN) as call:
        await call.write(report)
        while await call.read() is not EOF:
            pass
        return await call.code(), await call.details()


def test_a_flush_that_takes_time_lets_the_slave_get_ahead_of_the_masters_disk(
        tmp_path: Any) -> None:
    """With an fsync latency (the sim draws one per run) a SYNC_FLUSH master's
    flush takes virtual time and the loop goes on meanwhile: the HA master
    ships what it wrote, so the slave holds bytes the master has not made
    durable (a crash then leaves the slave ahead, as beside a real flusher
    thread). Without it the flush is instant and the window never opens."""

    async def main(loop: VirtualTimeLoop, fsync_s: float | None) -> tuple[int, int, PutStatus]:
        c = Cluster(loop, tmp_path / str(fsync_s), MemoryNetwork(loop, delay=lambda _m: 0.001),
                    master_fsync_s=fsync_s)
        await c.start()
        put = asyncio.ensure_future(c.put(1))
        await asyncio.sleep(0.005)  # the range is at the slave (1 ms), the fsync takes 10
        assert c.master.store is not None and c.slave.store is not None
        slave_wrote, master_flushed = c.slave.store.log.wrote, c.master.store.log.flushed
        status = (await put).status
        await c.stop()
        return slave_wrote, master_flushed, status

    slave_wrote, master_flushed, status = _run(lambda loop: main(loop, 0.010))
    assert slave_wrote > master_flushed and status is PutStatus.PUT_OK
    slave_wrote, master_flushed, status = _run(lambda loop: main(loop, None))
    assert slave_wrote <= master_flushed and status is PutStatus.PUT_OK


def _scenario(tmp: Any, seed: int) -> list[tuple[float, str]]:
    """Puts over a network with seeded delays, a partition longer than the
    housekeeping interval (both ends drop the stream, the slave reconnects
    with backoff), a reset, and more puts: everything a run does, logged
    with its virtual time."""

    async def main(loop: VirtualTimeLoop) -> list[tuple[float, str]]:
        rng = random.Random(seed)
        net = MemoryNetwork(loop, delay=lambda _msg: rng.uniform(0.0005, 0.02))
        c = Cluster(loop, tmp, net)
        await c.start()
        await asyncio.gather(*(c.put(i) for i in range(20)))
        net.partition(MASTER, SLAVE)
        await asyncio.gather(*(c.put(i) for i in range(20, 25)))
        await asyncio.sleep(HA.housekeeping_interval_ms / 1000 + 1)
        assert c.master.ha_master is not None and c.slave.ha_slave is not None
        c.note(f"during the partition: {[(s.state, s.detail) for s in c.master.ha_master.status()]}"
               f" slave link {c.slave.ha_slave.link.state} {c.slave.ha_slave.link.last_error}")
        net.heal(MASTER, SLAVE)
        while not any(s.state == "connected" for s in c.master.ha_master.status()):
            await asyncio.sleep(0.01)
        c.note("slave reconnected")
        await asyncio.gather(*(c.put(i) for i in range(25, 40)))
        net.reset(SLAVE)
        await asyncio.gather(*(c.put(i) for i in range(40, 45)))
        await asyncio.sleep(5)
        c.note(f"slave link {c.slave.ha_slave.link.state} connects "
               f"{c.slave.ha_slave.link.connects}")
        await c.stop()
        return c.events

    return list(_run(main))


def test_same_inputs_same_event_log(tmp_path: Any) -> None:
    first = _scenario(tmp_path / "a", seed=7)
    second = _scenario(tmp_path / "b", seed=7)
    assert first == second
    text = "\n".join(what for _t, what in first)
    # The run did what the scenario says, so the comparison compares something.
    assert "FLUSH_SLAVE_TIMEOUT" in text and "PUT_OK" in text, text
    assert "slave reconnected" in text
    other = _scenario(tmp_path / "c", seed=8)
    assert [t for t, _w in other] != [t for t, _w in first]  # the seed matters


def test_virtual_time_loop_jumps_to_the_next_timer() -> None:
    async def main(loop: VirtualTimeLoop) -> list[tuple[float, str]]:
        seen: list[tuple[float, str]] = []

        async def sleeper(name: str, s: float) -> None:
            await asyncio.sleep(s)
            seen.append((loop.time(), name))

        await asyncio.gather(sleeper("hour", 3600), sleeper("second", 1),
                             sleeper("also a second", 1))
        try:
            async with asyncio.timeout(5):
                await asyncio.Event().wait()
        except TimeoutError:
            seen.append((loop.time(), "timeout"))
        assert loop.clock().monotonic() == loop.time()
        assert loop.clock().wall_ms() == loop.wall_ms() == 1_700_000_000_000 + 3_605_000
        return seen

    wall0 = time.monotonic()
    seen = _run(main)
    assert time.monotonic() - wall0 < 1.0
    assert seen == [(1.0, "second"), (1.0, "also a second"), (3600.0, "hour"),
                    (3605.0, "timeout")]


def test_memory_stream_is_fifo_whatever_the_delays() -> None:
    """A later message that draws a shorter delay still arrives after the
    earlier ones (a gRPC stream never reorders); a partition holds them all
    until heal; the master's abort status reaches the slave's call."""

    async def main(loop: VirtualTimeLoop) -> tuple[list[int], list[float], Any, str]:
        rng = random.Random(3)
        net = MemoryNetwork(loop, delay=lambda _msg: rng.uniform(0.0, 0.05))
        got: list[int] = []
        at: list[float] = []

        async def handler(stream: MasterStream) -> None:
            while (msg := await stream.read()) is not EOF:
                got.append(msg.max_offset)
                at.append(loop.time())
                if msg.max_offset == 99:
                    await stream.abort(grpc.StatusCode.FAILED_PRECONDITION, "enough")

        net.serve(MASTER, handler, token=TOKEN)
        async with net.connector(SLAVE).open(MASTER, TOKEN) as call:
            for i in range(50):
                await call.write(ha_pb2.Report(max_offset=i, slave="s"))
            await asyncio.sleep(1)  # every delay is under 50 ms
            net.partition(MASTER, SLAVE)
            for i in range(50, 100):
                await call.write(ha_pb2.Report(max_offset=i, slave="s"))
            await asyncio.sleep(10)
            held_until = loop.time()
            assert len(got) == 50
            net.heal(MASTER, SLAVE)
            end = await call.read()
            assert at[-1] >= held_until
            return got, at, end, await call.details()

    got, at, end, details = _run(main)
    assert got == list(range(100))
    assert at == sorted(at)
    assert end is EOF and details == "enough"


def test_a_link_leads_to_its_target_and_repointing_it_resets_its_streams() -> None:
    """MemoryNetwork.link is the sim's link proxy: a stream opened to the
    link reaches its target (a partition is between the two real ends);
    pointing the link at another master resets the stream (as restarting
    the proxy does) and the next one reaches the new master."""
    link, other = "10.0.1.2:7001", "10.0.0.3:7001"

    async def main(loop: VirtualTimeLoop) -> tuple[list[str], Any]:
        net = MemoryNetwork(loop, delay=lambda _msg: 0.001)
        reset: Any = None
        seen: list[str] = []

        def handler_for(name: str) -> Any:
            async def handler(stream: MasterStream) -> None:
                while (msg := await stream.read()) is not EOF:
                    seen.append(f"{name}:{msg.max_offset}")
            return handler

        net.serve(MASTER, handler_for("old"), token=TOKEN)
        net.serve(other, handler_for("new"), token=TOKEN)
        net.link(link, MASTER)
        assert net.resolve(link) == MASTER and net.resolve(other) == other
        async with net.connector(SLAVE).open(link, TOKEN) as call:
            await call.write(ha_pb2.Report(max_offset=1, slave="s"))
            await asyncio.sleep(0.1)
            net.partition(MASTER, SLAVE)  # the real ends, not the link
            await call.write(ha_pb2.Report(max_offset=2, slave="s"))
            await asyncio.sleep(0.1)
            assert seen == ["old:1"]
            net.heal(MASTER, SLAVE)
            await asyncio.sleep(0.1)
            net.link(link, other)
            try:
                await call.read()
            except grpc.aio.AioRpcError as exc:
                reset = (exc.code(), exc.details())
        async with net.connector(SLAVE).open(link, TOKEN) as call:
            await call.write(ha_pb2.Report(max_offset=3, slave="s"))
            await asyncio.sleep(0.1)
        return seen, reset

    seen, reset = _run(main)
    assert seen == ["old:1", "old:2", "new:3"]
    assert reset == (grpc.StatusCode.UNAVAILABLE, "connection reset")


def test_store_timers_and_timestamps_run_on_the_loops_clock(tmp_path: Any) -> None:
    """The store alone: its interval flusher's thorough flush comes after
    flush_thorough_interval_ms of virtual time, and records carry the
    virtual wall clock."""
    config = StoreConfig(segment_size_bytes=1 << 20, max_message_size_bytes=64 << 10,
                         flush_mode=FlushMode.ASYNC_FLUSH, flush_least_pages=1000,
                         flush_interval_ms=500, flush_thorough_interval_ms=10_000)

    async def main(loop: VirtualTimeLoop) -> tuple[PutResult, list[tuple[float, int]], int]:
        store = MessageStore.open(str(tmp_path), config, clock=loop.clock(),
                                  executor=InlineFlushExecutor())
        await store.start()
        await asyncio.sleep(0.25)
        result = await store.put(Message("sim", b"y" * 100, {"UNIQ_KEY": "s1"}))
        seen = []
        for _ in range(12):
            await asyncio.sleep(1)
            seen.append((loop.time(), store.log.flushed))
        wrote = store.log.wrote
        await store.close()
        return result, seen, wrote

    result, seen, wrote = _run(main)
    assert result.status is PutStatus.PUT_OK
    assert result.store_timestamp_ms == 1_700_000_000_250
    assert [t for t, flushed in seen if flushed == 0] == [1.25 + i for i in range(9)]
    assert all(flushed == wrote for t, flushed in seen if t > 10)
