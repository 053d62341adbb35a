"""The acks a SYNC_MASTER answer relied on are the ones that covered the
put when its replica wait was satisfied (HAMaster.wait_replicated's
`seen`), taken at that moment: a stream that closes a loop step later (a
clean stop of the master) does not take them out of the answer's evidence.

Found on a local clean-restart run under load (2026-11-27): two PUT_OKs
answered while the master stopped carried "no slave's ack" as their
evidence, because the acks were read by a done callback, after the stop
had closed the streams. The real node code runs here on the simulated
cluster (chaos/sim/cluster.py)."""

from __future__ import annotations

import asyncio
import random
from typing import Any

from chaos.sim.cluster import SimCluster
from cluster.backends.interface import NodeSpec
from cluster.node.role import Role
from store.log.record import UNIQ_KEY, Message
from store.sim import loop as sim_loop
from store.sim.loop import VirtualTimeLoop
from store.sim.memory_disk import DiskFaults
from store.status import PutStatus, SlaveAck


async def _connected(loop: VirtualTimeLoop) -> SimCluster:
    master = NodeSpec(name="master", role=Role.SYNC_MASTER, flush="ASYNC_FLUSH",
                      segment_size_bytes=8 << 20)
    slave = NodeSpec(name="slave1", role=Role.SLAVE, flush="ASYNC_FLUSH",
                     segment_size_bytes=8 << 20)
    c = SimCluster(loop, random.Random(7), master, (slave,), DiskFaults(),
                   on_crash=lambda _n: None)
    await c.start("master")
    await c.start("slave1")
    while not c.slaves_connected():
        await asyncio.sleep(0.01)
    return c


async def _put(c: SimCluster, loop: VirtualTimeLoop, i: int) -> Any:
    node = c.nodes["master"].node
    assert node is not None
    done: asyncio.Future[Any] = loop.create_future()
    node.submit([Message("t", b"x" * 300, {UNIQ_KEY: f"m{i}"})],
                lambda rs: done.done() or done.set_result(rs[0]))
    return await done


def test_acks_already_covering_a_put_are_its_evidence_though_the_stream_closes() -> None:
    async def main(loop: VirtualTimeLoop) -> tuple[list[list[SlaveAck]], PutStatus]:
        c = await _connected(loop)
        r = await _put(c, loop, 0)
        assert r.status is PutStatus.PUT_OK
        ha = c.nodes["master"].node.ha_master  # type: ignore[union-attr]
        assert ha is not None
        seen: list[list[SlaveAck]] = []
        fut = ha.wait_replicated(r.end, seen.append)
        await ha.close()  # the clean stop closes the streams before any callback runs
        assert ha.acks() == []  # what a callback one step later would have read
        status = await fut
        await c.stop("slave1")
        return seen, status

    seen, status = sim_loop.run(main)
    assert status is PutStatus.PUT_OK
    (acks,) = seen
    assert [a.slave for a in acks] == ["slave1"]


def test_acks_that_arrive_later_are_taken_when_they_cover_the_put() -> None:
    async def main(loop: VirtualTimeLoop) -> tuple[list[list[SlaveAck]], int, PutStatus]:
        c = await _connected(loop)
        first = await _put(c, loop, 0)
        ha = c.nodes["master"].node.ha_master  # type: ignore[union-attr]
        assert ha is not None
        seen: list[list[SlaveAck]] = []
        # Beyond what any slave holds yet: satisfied once the next put ships.
        end = first.end + 1
        fut = ha.wait_replicated(end, seen.append)
        fut.add_done_callback(lambda _f: ha._streams.clear())  # gone a step later
        await _put(c, loop, 1)
        status = await fut
        await c.stop("slave1")
        await c.stop("master")
        return seen, end, status

    seen, end, status = sim_loop.run(main)
    assert status is PutStatus.PUT_OK
    (acks,) = seen
    assert acks and max(a.acked for a in acks) >= end
