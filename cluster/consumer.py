"""A pull consumer with RocketMQ's two offset stores.

- `cluster` mode (RemoteBrokerOffsetStore): the group's offsets live on the
  broker. The consumer asks for them at start, keeps its progress in memory
  and commits it every `commit_interval_ms` (RocketMQ's
  persistConsumerOffsetInterval, 5 s) and at a clean close.
- `broadcast` mode (LocalFileOffsetStore): each consumer keeps its own
  offsets in a local JSON file, written atomically (temp file, fsync,
  rename, fsync the directory) at the same interval and at close.

At-least-once: a message is handed to the handler, then its queue's
offset advances; offsets reach the broker or the file only at the interval.
So a consumer killed between commits receives again everything after its
last commit — and a broker that crashes before persisting its table (5 s)
forgets commits too. Those are the duplicates the lab counts.

Reads: pulls go to the first target (the master); when it fails, to the
next (a slave, as RocketMQ lets consumers read from a slave when the master
is down). Commits go to the target that answered last.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import grpc

from cluster.auth import token_metadata
from cluster.client import CHANNEL_OPTIONS
from proto import broker_pb2, broker_pb2_grpc
from store.segments import fsync_dir

MODES = ("cluster", "broadcast")


class ConsumerError(RuntimeError):
    """The consumer cannot go on; the message says why and what to do."""


@dataclass(frozen=True)
class Delivery:
    """One message handed to the handler."""

    topic: str
    queue_id: int
    queue_offset: int
    commitlog_offset: int
    msg_id: str
    body: bytes
    node: str  # the target that served it
    node_role: str
    time_ms: int


def load_offset_file(path: str) -> dict[int, int]:
    """A broadcast consumer's offsets; {} when the file does not exist."""
    try:
        with open(path) as f:
            doc = json.load(f)
        return {int(q): int(o) for q, o in doc["offsets"].items()}
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ConsumerError(f"offset file {path} is unreadable ({exc}); remove it to start "
                            "from the queues' first offsets") from None


def save_offset_file(path: str, topic: str, group: str, offsets: dict[int, int]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"topic": topic, "group": group,
                   "offsets": {str(q): o for q, o in sorted(offsets.items())}}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(os.path.abspath(path)))


class Consumer:
    def __init__(self, targets: Sequence[str], *, token: str, group: str, topic: str,
                 mode: str = "cluster", commit_interval_ms: int = 5_000,
                 offset_file: str | None = None, queue_ids: Sequence[int] | None = None,
                 pull_batch: int = 32, idle_poll_ms: int = 50, timeout_s: float = 5.0) -> None:
        if not targets:
            raise ConsumerError("no target: give the master's address (and slaves' to read "
                                "from when it is down)")
        if mode not in MODES:
            raise ConsumerError(f"mode {mode!r}: use cluster or broadcast")
        if mode == "broadcast" and not offset_file:
            raise ConsumerError("broadcast mode keeps offsets in a local file: pass offset_file")
        if not group or "@" in group:
            raise ConsumerError("group must be a non-empty name without '@'")
        if not topic:
            raise ConsumerError("topic is empty")
        if commit_interval_ms < 1 or pull_batch < 1 or idle_poll_ms < 1:
            raise ConsumerError("commit_interval_ms, pull_batch and idle_poll_ms must be >= 1")
        self.targets = list(targets)
        self.group, self.topic, self.mode = group, topic, mode
        self.commit_interval_s = commit_interval_ms / 1000
        self.offset_file = offset_file
        self.fixed_queues = list(queue_ids) if queue_ids is not None else None
        self.pull_batch = pull_batch
        self.idle_poll_s = idle_poll_ms / 1000
        self.timeout_s = timeout_s
        self._metadata = token_metadata(token)
        self._channels = [grpc.aio.insecure_channel(t, options=CHANNEL_OPTIONS)
                          for t in self.targets]
        self._stubs = [broker_pb2_grpc.BrokerStub(c) for c in self._channels]
        self._current = 0  # the target that answered last
        self._file_offsets: dict[int, int] = {}
        self.offsets: dict[int, int] = {}  # queue id -> next offset to consume
        self._committed: dict[int, int] = {}
        self._last_commit = time.monotonic()
        self.delivered = 0
        self.commits = 0

    # ------------------------------------------------------------- calls
    async def _call(self, method: str, request: object) -> tuple[object, int]:
        """Call on the current target, falling over to the others in turn."""
        last: grpc.aio.AioRpcError | None = None
        order = [self._current] + [i for i in range(len(self._stubs)) if i != self._current]
        for i in order:
            try:
                resp = await getattr(self._stubs[i], method)(
                    request, timeout=self.timeout_s, metadata=self._metadata)
            except grpc.aio.AioRpcError as exc:
                if exc.code() in (grpc.StatusCode.INVALID_ARGUMENT,
                                  grpc.StatusCode.UNAUTHENTICATED):
                    raise ConsumerError(f"{method} refused by {self.targets[i]}: "
                                        f"{exc.code().name} {exc.details()}") from None
                last = exc
                continue
            self._current = i
            return resp, i
        assert last is not None
        raise ConsumerError(f"{method}: no target answered ({last.code().name}: "
                            f"{last.details()})")

    async def queues(self) -> list[int]:
        if self.fixed_queues is not None:
            return self.fixed_queues
        resp, _ = await self._call("QueueInfo", broker_pb2.QueueInfoRequest(topic=self.topic))
        assert isinstance(resp, broker_pb2.QueueInfoResponse)
        return sorted(q.queue_id for q in resp.queues)

    async def _start_offset(self, qid: int) -> int:
        if self.mode == "broadcast":
            return self._file_offsets.get(qid, 0)
        resp, _ = await self._call("QueryOffset", broker_pb2.QueryOffsetRequest(
            group=self.group, topic=self.topic, queue_id=qid))
        assert isinstance(resp, broker_pb2.QueryOffsetResponse)
        return resp.offset if resp.found else 0  # CONSUME_FROM_FIRST_OFFSET

    # --------------------------------------------------------------- run
    async def run(self, handler: Callable[[Delivery], Awaitable[None] | None], *,
                  max_messages: int | None = None, idle_exit_s: float | None = None,
                  stop: asyncio.Event | None = None) -> int:
        """Pull every queue and hand each message to `handler`, in queue
        order, until `max_messages`, `idle_exit_s` without a message, or
        `stop`. Commits at the interval and once more at the end. Returns
        the number of deliveries."""
        self._file_offsets = (load_offset_file(self.offset_file)
                              if self.mode == "broadcast" and self.offset_file else {})
        idle_since = time.monotonic()
        try:
            while stop is None or not stop.is_set():
                got_any = False
                for qid in await self.queues():
                    if qid not in self.offsets:
                        self.offsets[qid] = self._committed[qid] = await self._start_offset(qid)
                    n = await self._pull_one(qid, handler, max_messages)
                    got_any = got_any or n > 0
                    if max_messages is not None and self.delivered >= max_messages:
                        return self.delivered
                await self._maybe_commit()
                if got_any:
                    idle_since = time.monotonic()
                    continue
                if idle_exit_s is not None and time.monotonic() - idle_since >= idle_exit_s:
                    return self.delivered
                await asyncio.sleep(self.idle_poll_s)
            return self.delivered
        finally:
            with contextlib.suppress(ConsumerError):
                await self.commit()

    async def _pull_one(self, qid: int, handler: Callable[[Delivery], Awaitable[None] | None],
                        max_messages: int | None) -> int:
        resp, served_by = await self._call("Pull", broker_pb2.PullRequest(
            topic=self.topic, queue_id=qid, offset=self.offsets[qid],
            max_count=self.pull_batch))
        assert isinstance(resp, broker_pb2.PullResponse)
        status = broker_pb2.PullStatus.Name(resp.status)
        if status in ("OFFSET_TOO_SMALL", "OFFSET_OVERFLOW_BADLY"):
            # RocketMQ corrects the offset to where the broker says.
            self.offsets[qid] = resp.next_offset
            return 0
        n = 0
        for m in resp.messages:
            d = Delivery(self.topic, qid, m.queue_offset, m.commitlog_offset, m.msg_id, m.body,
                         self.targets[served_by], resp.node_role, time.time_ns() // 1_000_000)
            maybe = handler(d)
            if maybe is not None:
                await maybe
            self.offsets[qid] = m.queue_offset + 1  # after the handler: at-least-once
            self.delivered += 1
            n += 1
            if max_messages is not None and self.delivered >= max_messages:
                break
        return n

    async def _maybe_commit(self) -> None:
        if time.monotonic() - self._last_commit >= self.commit_interval_s:
            await self.commit()

    async def commit(self) -> None:
        """Send the offsets that moved since the last commit (cluster mode)
        or write the offset file (broadcast mode)."""
        self._last_commit = time.monotonic()
        changed = {q: o for q, o in self.offsets.items() if self._committed.get(q) != o}
        if not changed:
            return
        if self.mode == "broadcast":
            assert self.offset_file is not None
            merged = {**self._file_offsets, **self.offsets}
            await asyncio.get_running_loop().run_in_executor(
                None, save_offset_file, self.offset_file, self.topic, self.group, merged)
            self._file_offsets = merged
        else:
            for qid, off in changed.items():
                await self._call("CommitOffset", broker_pb2.CommitOffsetRequest(
                    group=self.group, topic=self.topic, queue_id=qid, offset=off))
        self._committed.update(changed)
        self.commits += 1

    async def close(self) -> None:
        for c in self._channels:
            await c.close()

    async def __aenter__(self) -> Consumer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
