"""The sim backend's consumer: the real pull consumer
(cluster/client/consumer.py's Consumer) in the simulation's process, its
broker calls over the in-memory network (ha/transport/'s
MemoryNetwork.stub, to the nodes' real BrokerServicer) and its clocks the
loop's. It is chaos/harness/consumer_proc.py's child without the process:

- an incarnation records each delivery before its offset moves, and each
  commit the broker took whole, as the child's lines; at the end of a
  clean drain, an `end` row with its offsets and each node's max offsets;
- kill (SIGKILL's twin): the incarnation's task is cancelled and it is
  dead: no call of it reaches a node from then on (its exit commit
  included) and it records nothing more;
- stop: it commits and ends, as the child does at its stop file;
- drain: it consumes until nothing came for DRAIN_QUIET_MS, commits, ends.

The rows go to RUN/consumer/N.jsonl, as the child's, and
consumer_proc.collect turns them into the run's consumed.jsonl,
committed.jsonl and consumer.json: a sim run's consume side is read by the
same checker (chaos/check/consumption.py) as a local run's.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import os
from collections.abc import Callable
from typing import Any

import grpc

from chaos.harness.consumer_proc import DRAIN_QUIET_MS, GROUP, _Drain, collect
from cluster.client.consumer import Consumer, ConsumerError, Delivery
from ha.credentials import token_metadata
from ha.transport.memory import MemoryNetwork
from proto import broker_pb2
from store.sim.loop import VirtualTimeLoop

# The consumer's own address on the simulated network.
CONSUMER_ADDRESS = "10.0.1.1:7100"


class _Incarnation:
    def __init__(self, owner: SimConsumer) -> None:
        self.owner = owner
        self.lines: list[str] = []
        self.dead = False
        self.stop_requested = False
        self.drain_requested = False
        self.exit_code: int | None = None

    def emit(self, row: dict[str, Any]) -> None:
        if not self.dead:
            self.lines.append(json.dumps(row, sort_keys=True))

    def stub(self, address: str) -> Any:
        real = self.owner.network.stub(CONSUMER_ADDRESS, address)
        inc = self

        class _Stub:
            def __getattr__(self, method: str) -> Callable[..., Any]:
                async def call(request: Any, **kw: Any) -> Any:
                    if inc.dead:  # a killed process sends nothing
                        raise grpc.aio.AioRpcError(
                            grpc.StatusCode.CANCELLED, grpc.aio.Metadata(), grpc.aio.Metadata(),
                            details="the consumer process is gone")
                    return await getattr(real, method)(request, **kw)
                return call

        return _Stub()

    async def run(self) -> None:
        o = self.owner
        loop = o.loop
        by_address = {a: n for n, a in o.targets.items()}
        inc = self

        class Recording(Consumer):
            async def commit(self) -> None:
                offsets = dict(self.offsets)
                before = self.commits
                await super().commit()
                if self.commits != before:
                    t = loop.wall_ms()
                    for q, off in sorted(offsets.items()):
                        inc.emit({"kind": "commit", "topic": self.topic, "queue_id": q,
                                  "offset": off, "time_ms": t})

        drain = _Drain(o.quiet_ms)

        def handle(d: Delivery) -> None:
            self.emit({"kind": "delivery", "msg_id": d.msg_id, "topic": d.topic,
                       "queue_id": d.queue_id, "queue_offset": d.queue_offset,
                       "commitlog_offset": d.commitlog_offset,
                       "node": by_address.get(d.node, d.node), "node_role": d.node_role,
                       "time_ms": d.time_ms})
            drain.last_delivery_ms = loop.wall_ms()

        stop = asyncio.Event()

        async def watch() -> None:
            while not drain.should_stop(loop.wall_ms(), self.drain_requested,
                                        at_once=self.stop_requested):
                await asyncio.sleep(0.05)
            stop.set()

        c = Recording(list(o.targets.values()), token=o.token, group=GROUP, topic=o.topic,
                      commit_interval_ms=o.commit_interval_ms, clock=loop.time,
                      wall_ms=loop.wall_ms, stubs=self.stub)
        try:
            async with c:
                watcher = asyncio.create_task(watch())
                try:
                    await c.run(handle, stop=stop)  # commits once more on the way out
                finally:
                    watcher.cancel()
                max_offsets: dict[str, dict[str, int]] = {}
                for name, address in o.targets.items():
                    with contextlib.suppress(grpc.aio.AioRpcError):
                        resp = await self.stub(address).QueueInfo(
                            broker_pb2.QueueInfoRequest(topic=o.topic), timeout=5.0,
                            metadata=token_metadata(o.token))
                        max_offsets[name] = {str(q.queue_id): q.max_offset
                                             for q in resp.queues}
                self.emit({"kind": "end", "time_ms": loop.wall_ms(),
                           "offsets": {str(q): off for q, off in sorted(c.offsets.items())},
                           "max_offsets": max_offsets})
            self.exit_code = 0
        except (asyncio.CancelledError, ConsumerError):
            # Killed (its exit commit failed: it was dead), or it could not go on.
            self.exit_code = -9 if self.dead else 1


class SimConsumer:
    """Starts, kills, stops and drains the consumer of one sim run (the
    harness side, as chaos/harness/consumer_proc.py's ConsumerProcess)."""

    def __init__(self, loop: VirtualTimeLoop, network: MemoryNetwork, run_dir: str, *,
                 targets: dict[str, str], token: str, topic: str, commit_interval_ms: int,
                 quiet_ms: int = DRAIN_QUIET_MS) -> None:
        self.loop = loop
        self.network = network
        self.dir = os.path.join(run_dir, "consumer")
        self.targets = dict(targets)  # node name -> address, master first
        self.token = token
        self.topic = topic
        self.commit_interval_ms = commit_interval_ms
        self.quiet_ms = quiet_ms
        self.drain_started_ms: int | None = None
        self.drained = False
        self._incarnations: list[_Incarnation] = []
        self._task: asyncio.Task[None] | None = None

    @property
    def incarnations(self) -> int:
        return len(self._incarnations)

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self, context: contextvars.Context) -> None:
        assert not self.running
        inc = _Incarnation(self)
        self._incarnations.append(inc)
        self._task = self.loop.create_task(inc.run(), context=context)

    def kill(self) -> None:
        if self.running:
            assert self._task is not None
            self._incarnations[-1].dead = True
            self._task.cancel()

    async def apply(self, action: str) -> str:
        """A scenario's kill or stop of the consumer; returns the fault's
        detail (the local backend's words)."""
        if action == "kill":
            self.kill()
            return "consumer process (SIGKILL)"
        was_running = self.running
        clean = await self.stop()
        return ("consumer stopped cleanly (committed)" if clean
                else "consumer did not stop cleanly in 10 s: SIGKILLed" if was_running
                else "consumer had already exited")

    async def _wait(self, timeout_s: float) -> bool:
        assert self._task is not None
        done, _ = await asyncio.wait({self._task}, timeout=timeout_s)
        return bool(done)

    async def stop(self, *, timeout_s: float = 10.0) -> bool:
        """Stop cleanly (it commits on the way out); kill it if it has not
        stopped within `timeout_s`. False too when it was not running."""
        if not self.running:
            return False
        self._incarnations[-1].stop_requested = True
        if not await self._wait(timeout_s):
            self.kill()
            await self._wait(1.0)
            return False
        return self._incarnations[-1].exit_code == 0

    async def drain(self, *, timeout_s: float = 20.0) -> None:
        self.drain_started_ms = self.loop.wall_ms()
        self._incarnations[-1].drain_requested = True
        if await self._wait(timeout_s):
            self.drained = self._incarnations[-1].exit_code == 0
        else:
            self.kill()
            await self._wait(1.0)

    def collect(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
        """The incarnations' rows, written as the child writes them, then
        read back by consumer_proc.collect."""
        os.makedirs(self.dir, exist_ok=True)
        for n, inc in enumerate(self._incarnations, start=1):
            with open(os.path.join(self.dir, f"{n}.jsonl"), "w", encoding="utf-8") as f:
                f.write("".join(line + "\n" for line in inc.lines))
        return collect(self.dir, self.incarnations, group=GROUP, topic=self.topic,
                       commit_interval_ms=self.commit_interval_ms,
                       drain_started_ms=self.drain_started_ms, drained=self.drained,
                       exit_codes=[inc.exit_code for inc in self._incarnations])
