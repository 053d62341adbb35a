"""A slave that is told to stop stops reconnecting, whatever its HA client is
doing at that moment (a defect once found: a slave that got SIGTERM while its
master was down kept reconnecting with backoff until it was killed).

In process, on a real store and a real gRPC client: the master's address is
a port nobody listens on, so every stream fails at connect and is torn down
and retried, over and over."""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

import pytest

from cluster.backends.procs import free_ports
from ha.config import TESTING
from ha.slave import HASlave
from store.config import StoreConfig
from store.failpoints import Failpoints
from store.seams.clock import SystemClock
from store.store import MessageStore

# Reconnect at once and often: most of the slave's time goes to connecting
# and tearing streams down, the states a stop must also end.
EAGER = TESTING.with_(reconnect_min_ms=1, reconnect_max_ms=20)


class _StopsDuringTeardown(HASlave):
    """Calls stop() the way the node does (from another task) at the moment a
    failed stream's report writer is cancelled: while that stream is being
    torn down, the window where the old code lost the cancellation. Only the
    moment of the call is chosen here; stop() and the loop are the real ones."""

    stop_task: asyncio.Task[None] | None = None

    async def _report_loop(self, *args: Any) -> None:
        try:
            await super()._report_loop(*args)
        finally:
            if self.stop_task is None:
                self.stop_task = asyncio.get_running_loop().create_task(self.stop())


async def _open_store(directory: str) -> MessageStore:
    store = MessageStore.open(directory, StoreConfig(), clock=SystemClock(),
                              failpoints=Failpoints(""))
    await store.start()
    return store


def _slave(cls: type[HASlave], store: MessageStore, port: int) -> HASlave:
    return cls(store, name="s1", master_address=f"127.0.0.1:{port}", token="t" * 16,
               config=EAGER, clock=SystemClock(), failpoints=Failpoints(""))


async def _force_end(slave: HASlave) -> None:
    """Test cleanup for the old code, whose loop ignored stop(): cancel until
    a cancellation lands where it is not lost."""
    task = slave._task
    assert task is not None
    for _ in range(100):
        if task.done():
            return
        task.cancel()
        await asyncio.wait([task], timeout=0.05)


def test_a_stop_during_a_stream_teardown_ends_the_reconnect_loop(tmp_path: str) -> None:
    (port,) = free_ports(1)

    async def go() -> tuple[bool, int, int]:
        store = await _open_store(os.path.join(tmp_path, "store"))
        slave = _slave(_StopsDuringTeardown, store, port)
        assert isinstance(slave, _StopsDuringTeardown)
        try:
            slave.start()
            while slave.stop_task is None:
                await asyncio.sleep(0.001)
            done, _ = await asyncio.wait([slave.stop_task], timeout=10)
            connects = slave.link.connects
            await asyncio.sleep(0.5)  # dozens of reconnects' worth at EAGER
            return bool(done), connects, slave.link.connects
        finally:
            await _force_end(slave)
            await store.close()

    stopped, connects_at_stop, connects_later = asyncio.run(go())
    assert stopped, "stop() did not return: the reconnect loop ignored it"
    assert connects_later == connects_at_stop == 1


def test_a_stop_at_any_moment_of_the_first_second_ends_the_loop_at_once(
        tmp_path: str) -> None:
    (port,) = free_ports(1)

    async def one(i: int, after_s: float) -> tuple[float, int, int]:
        store = await _open_store(os.path.join(tmp_path, f"store{i}"))
        slave = _slave(HASlave, store, port)
        try:
            slave.start()
            await asyncio.sleep(after_s)
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            done, _ = await asyncio.wait([loop.create_task(slave.stop())], timeout=10)
            took = loop.time() - t0 if done else float("inf")
            connects = slave.link.connects
            await asyncio.sleep(0.05)
            return took, connects, slave.link.connects
        finally:
            await _force_end(slave)
            await store.close()

    async def go() -> list[tuple[float, int, int]]:
        # Every millisecond for the first 40 ms (start, first connect, its
        # failure, the first backoffs: on the old code a quarter of these
        # points lost the stop), then a few later ones.
        points = [i / 1000 for i in range(40)] + [0.1, 0.25, 0.5]
        return [await one(i, p) for i, p in enumerate(points)]

    for took, connects, later in asyncio.run(go()):
        assert took < 2, f"stop() took {took:.2f} s"
        assert later == connects, "the slave connected again after stop()"


class _LoopBug(HASlave):
    """A replication loop that dies of an error (a bug), as an unexpected
    exception from the gRPC client would make it."""

    async def _stream_once(self) -> None:
        raise RuntimeError("a bug in the stream")


def test_a_replication_loop_that_died_is_reported_and_still_stops_cleanly(
        tmp_path: str, caplog: pytest.LogCaptureFixture) -> None:
    (port,) = free_ports(1)

    async def go() -> HASlave:
        store = await _open_store(os.path.join(tmp_path, "store"))
        slave = _slave(_LoopBug, store, port)
        try:
            slave.start()
            assert slave._task is not None
            await asyncio.wait([slave._task], timeout=10)
            # The node's stop must get past the dead loop to close the store.
            await asyncio.wait_for(slave.stop(), 10)
            return slave
        finally:
            await store.close()

    with caplog.at_level(logging.ERROR, logger="dlab.ha.slave"):
        slave = asyncio.run(go())
    assert "replication loop failed" in slave.link.last_error
    assert "a bug in the stream" in slave.link.last_error
    assert any("replication from" in r.getMessage() and r.exc_info for r in caplog.records)
