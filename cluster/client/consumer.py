"""A pull consumer with RocketMQ's two offset stores.

- `cluster` mode (RemoteBrokerOffsetStore): the group's offsets live on the
  broker. At start the consumer asks the broker for each queue's offset
  (QueryOffset), keeps its progress in memory, and commits every queue's
  offset every `commit_interval_ms` (RocketMQ's persistConsumerOffsetInterval,
  5 s; like persistAll, unchanged offsets are sent too, so a broker that
  lost its table gets it back) and at a clean close.
- `broadcast` mode (LocalFileOffsetStore): each consumer keeps its own
  offsets in a local JSON file, written atomically (temp file, fsync,
  rename, fsync the directory) at the same interval and at close. The
  broker's table never hears of it.

With no stored offset a queue is read from its min offset
(CONSUME_FROM_FIRST_OFFSET).

At-least-once, in this order: a message is handed to the handler (or
yielded); when the handler returns (the loop asks for the next one) the
queue's in-memory offset moves past it; offsets reach the broker or the file
only at the interval and at close — never more often. So a consumer killed
between commits receives again everything after its last commit, and a
broker that crashes before persisting its table (every 5 s) forgets commits
too. Those are the duplicates the lab counts.

Targets: the master first, then its slaves (with `master`, the address
the cluster's route names now goes first). Every call (pull, query,
commit) goes to the first target that answers; a target whose call failed
is skipped for `failover_backoff_ms` (doubling while it keeps failing, up
to `failover_backoff_max_ms`, 5 s), then tried again — so pulls fall over
to a slave while the master is down (RocketMQ's slave read) and come back
to the master when it is up.
While no target answers, consuming keeps retrying (as RocketMQ's consumer)
and a failed interval commit waits for the next interval; `idle_exit_s`
then ends the run with a ConsumerError saying no node answered. A commit
that reaches a slave lives in the slave's table only until its next sync
from the master overwrites the group (cluster/node/consume_service.py).

When a pull finds nothing, the broker's next offset is adopted: a master
corrects an offset out of its queue's range (OFFSET_TOO_SMALL,
OFFSET_OVERFLOW_BADLY, an empty or unknown queue), as RocketMQ's
nextOffsetCorrection; a slave never moves it (offsetCheckInSlave = false).

Two flavours: `Consumer` (asyncio: `run(handler)` or `async for d in
deliveries()`) and `BlockingConsumer` (the same on its own event loop).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import os
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc

from cluster.client.node_client import CHANNEL_OPTIONS, MIN_CONNECT_TIMEOUT_MS
from ha.credentials import token_metadata
from proto import broker_pb2, broker_pb2_grpc
from store.log.segments import fsync_dir
from store.names import group_problem, queue_id_problem, topic_problem

MODES = ("cluster", "broadcast")
MAX_PULL_BATCH = 1024  # the node refuses more (cluster/node/consume_service.py)
# After a round that reached no node (RocketMQ waits 3 s after a pull
# exception; shorter here, so a master back is read from soon).
UNAVAILABLE_RETRY_S = 0.5
# Reconnect soon after a node comes back (grpc's default backoff grows to
# 120 s); each attempt gets node_client's connect timeout (what gRPC calls
# the min reconnect backoff).
RECONNECT_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", MIN_CONNECT_TIMEOUT_MS),
    ("grpc.max_reconnect_backoff_ms", 1000),
]
OFFSET_FILE_VERSION = 1
# RPC failures that are the caller's fault: no other target would answer
# differently, so they are raised instead of failing over.
_CALLER_ERRORS = (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNAUTHENTICATED)

log = logging.getLogger("dlab.consumer")
_R = TypeVar("_R")


class ConsumerError(RuntimeError):
    """The consumer cannot go on; the message says why and what to do."""


class TargetsUnavailable(ConsumerError):
    """No target answered a call. Consuming retries (as RocketMQ's consumer
    does); a commit is retried at the next interval."""


@dataclass(frozen=True)
class Delivery:
    """One message handed to the handler."""

    topic: str
    queue_id: int
    queue_offset: int
    commitlog_offset: int
    msg_id: str  # the producer's UNIQ_KEY
    body: bytes
    node: str  # the target (address) that served it
    node_role: str  # SYNC_MASTER | ASYNC_MASTER | SLAVE
    time_ms: int  # wall clock when it was handed over
    properties: dict[str, str] = field(default_factory=dict)
    store_timestamp_ms: int = 0


Handler = Callable[[Delivery], Awaitable[None] | None]


# ---------------------------------------------------------- offset file
def load_offset_file(path: str, *, topic: str, group: str) -> dict[int, int]:
    """A broadcast consumer's offsets (queue id -> next offset); {} when the
    file does not exist. A file of another topic or group is refused: two
    consumers sharing one file would skip each other's messages."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
        offsets = {int(q): int(o) for q, o in doc["offsets"].items()}
        owner = (doc["topic"], doc["group"])
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ConsumerError(f"offset file {path} is unreadable ({exc}); remove it to start "
                            "from the queues' first offsets") from None
    if owner != (topic, group):
        raise ConsumerError(f"offset file {path} holds topic {owner[0]!r} group {owner[1]!r}, "
                            f"not topic {topic!r} group {group!r}: give each consumer its own "
                            "--offset-file")
    if any(q < 0 or o < 0 for q, o in offsets.items()):
        raise ConsumerError(f"offset file {path} has a negative queue id or offset; remove it "
                            "to start from the queues' first offsets")
    return offsets


def save_offset_file(path: str, *, topic: str, group: str, offsets: dict[int, int]) -> None:
    """Atomically: a crash leaves the old file or the new one, never a mix."""
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"version": OFFSET_FILE_VERSION, "topic": topic, "group": group,
                   "offsets": {str(q): o for q, o in sorted(offsets.items())}}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(os.path.abspath(path)))


# ------------------------------------------------------------- consumer
class Consumer:
    """A pull consumer of one topic for one group (see the module doc).

    Use as `async with Consumer(...) as c:` then `await c.run(handler)` or
    `async for d in c.deliveries(): ...`. Leaving the `async with` commits
    what moved since the last commit and closes the channels.
    """

    def __init__(self, targets: str | Sequence[str], token: str, group: str, topic: str, *,
                 mode: str = "cluster", commit_interval_ms: int = 5_000,
                 offset_file: str | None = None, queue_ids: Sequence[int] | None = None,
                 pull_batch: int = 32, idle_poll_ms: int = 50, queue_refresh_ms: int = 1_000,
                 failover_backoff_ms: int = 1_000, failover_backoff_max_ms: int = 5_000,
                 timeout_s: float = 5.0,
                 channel_options: Sequence[tuple[str, Any]] = (),
                 clock: Callable[[], float] = time.monotonic,
                 wall_ms: Callable[[], int] | None = None,
                 stubs: Callable[[str], Any] | None = None,
                 master: Callable[[], str | None] | None = None) -> None:
        self.targets = [targets] if isinstance(targets, str) else list(targets)
        if not self.targets or not all(self.targets):
            raise ConsumerError("no target: give the master's HOST:PORT (then its slaves', "
                                "read from while it is down)")
        if mode not in MODES:
            raise ConsumerError(f"mode {mode!r}: use cluster or broadcast")
        if mode == "broadcast" and not offset_file:
            raise ConsumerError("broadcast mode keeps offsets in a local file: pass offset_file")
        if problem := group_problem(group) or topic_problem(topic):
            raise ConsumerError(problem)
        if not token:
            raise ConsumerError("the cluster token is empty (it is in the cluster's DIR/token)")
        for name, value in (("commit_interval_ms", commit_interval_ms),
                            ("idle_poll_ms", idle_poll_ms),
                            ("queue_refresh_ms", queue_refresh_ms),
                            ("failover_backoff_ms", failover_backoff_ms),
                            ("failover_backoff_max_ms", failover_backoff_max_ms)):
            if value < 1:
                raise ConsumerError(f"{name} {value}: must be at least 1")
        if not 1 <= pull_batch <= MAX_PULL_BATCH:
            raise ConsumerError(f"pull_batch {pull_batch}: use 1..{MAX_PULL_BATCH}")
        if timeout_s <= 0:
            raise ConsumerError(f"timeout_s {timeout_s}: must be positive")
        if queue_ids is not None and (not queue_ids or min(queue_ids) < 0):
            raise ConsumerError("queue_ids: give queue ids >= 0, or None for every queue")
        if queue_ids and (problem := queue_id_problem(max(queue_ids))):
            raise ConsumerError(f"queue_ids: {problem}")
        self.group, self.topic, self.mode = group, topic, mode
        self.commit_interval_s = commit_interval_ms / 1000
        self.offset_file = offset_file
        self.fixed_queues = sorted(set(queue_ids)) if queue_ids is not None else None
        self.pull_batch = pull_batch
        self.idle_poll_s = idle_poll_ms / 1000
        self.queue_refresh_s = queue_refresh_ms / 1000
        self.failover_backoff_s = failover_backoff_ms / 1000
        self.failover_backoff_max_s = max(failover_backoff_max_ms, failover_backoff_ms) / 1000
        self.timeout_s = timeout_s
        self._channel_options = [*CHANNEL_OPTIONS, *RECONNECT_OPTIONS, *channel_options]
        self._clock = clock
        # Wall time of a delivery, and a broker stub per target: a
        # simulation passes its own (ha/transport/'s MemoryNetwork.stub);
        # by default the system clock and a grpc.aio channel per target.
        self._wall_ms = wall_ms or (lambda: time.time_ns() // 1_000_000)
        self._stub_factory = stubs
        # The master now, by the cluster's route (cluster/client/routing.py):
        # asked before every call, so after a failover the new master is
        # read from first, not the old one now serving as a slave.
        self._master = master
        self._metadata = token_metadata(token)
        self._channels: list[grpc.aio.Channel] = []
        self._stubs: list[Any] = []  # broker_pb2_grpc.BrokerStub or its twin
        self._down_until = [0.0] * len(self.targets)
        self._failures = [0] * len(self.targets)  # consecutive failed calls per target
        self.unavailable: str | None = None  # why the last round reached no node
        self._started = False
        self._file_offsets: dict[int, int] = {}
        self._queue_mins: dict[int, int] = {}
        self._queues: list[int] = []
        self._queues_at: float | None = None
        self._last_commit = clock()
        self._dirty = False  # offsets moved since the last commit
        self.offsets: dict[int, int] = {}  # queue id -> next offset to consume
        self.delivered = 0
        self.commits = 0  # commits that reached the broker / the file whole
        self.corrections = 0  # offsets the broker moved (out of its queue's range)

    # ------------------------------------------------------------- calls
    def _ensure_channels(self) -> None:
        # Made on first use, inside the running loop (grpc.aio binds a
        # channel to the loop it is made in).
        if self._stub_factory is not None:
            if not self._stubs:
                self._stubs = [self._stub_factory(t) for t in self.targets]
            return
        if not self._channels:
            self._channels = [grpc.aio.insecure_channel(t, options=self._channel_options)
                              for t in self.targets]
            self._stubs = [broker_pb2_grpc.BrokerStub(c) for c in self._channels]

    def _order(self) -> list[int]:
        """Targets in preference order (master first), those that failed
        within the backoff last."""
        now = self._clock()
        up = [i for i in range(len(self.targets)) if self._down_until[i] <= now]
        master = self._master() if self._master is not None else None
        if master in self.targets and self.targets.index(master) in up:
            first = self.targets.index(master)
            up = [first] + [i for i in up if i != first]
        return up + [i for i in range(len(self.targets)) if i not in up]

    async def _call(self, method: str, request: Any) -> tuple[Any, int]:
        """(response, index of the target that answered)."""
        self._ensure_channels()
        last: grpc.aio.AioRpcError | None = None
        for i in self._order():
            try:
                resp = await getattr(self._stubs[i], method)(
                    request, timeout=self.timeout_s, metadata=self._metadata)
            except grpc.aio.AioRpcError as exc:
                if exc.code() in _CALLER_ERRORS:
                    raise ConsumerError(f"{method} refused by {self.targets[i]}: "
                                        f"{exc.code().name}: {exc.details()}") from None
                if self._failures[i] == 0:
                    log.info("%s on %s failed (%s); trying the next target", method,
                             self.targets[i], exc.code().name)
                self._failures[i] += 1
                # Doubling, so a hung (paused) master does not stall every
                # call for timeout_s; capped, so a master back is used soon.
                backoff = min(self.failover_backoff_s * 2 ** (self._failures[i] - 1),
                              self.failover_backoff_max_s)
                self._down_until[i] = self._clock() + backoff
                last = exc
                continue
            self._down_until[i] = 0.0
            self._failures[i] = 0
            return resp, i
        assert last is not None
        raise TargetsUnavailable(f"{method}: no node answered ({', '.join(self.targets)}; "
                                 f"last {last.code().name}: {last.details()})")

    # ------------------------------------------------------------ queues
    async def queues(self) -> list[int]:
        """The queue ids this consumer pulls, refreshed every
        `queue_refresh_ms` (a topic's queues appear with their first put)."""
        now = self._clock()
        if self._queues_at is not None and now - self._queues_at < self.queue_refresh_s:
            return self._queues
        resp, _ = await self._call("QueueInfo", broker_pb2.QueueInfoRequest(topic=self.topic))
        self._queue_mins = {q.queue_id: q.min_offset for q in resp.queues}
        found = sorted(self._queue_mins)
        self._queues = self.fixed_queues if self.fixed_queues is not None else found
        self._queues_at = now
        return self._queues

    async def _start_offset(self, qid: int) -> int:
        stored: int | None
        if self.mode == "broadcast":
            stored = self._file_offsets.get(qid)
        else:
            resp, _ = await self._call("QueryOffset", broker_pb2.QueryOffsetRequest(
                group=self.group, topic=self.topic, queue_id=qid))
            stored = resp.offset if resp.found else None
        # CONSUME_FROM_FIRST_OFFSET when the group has no offset yet.
        return stored if stored is not None else self._queue_mins.get(qid, 0)

    async def _start(self) -> None:
        if self._started:
            return
        if self.mode == "broadcast":
            assert self.offset_file is not None
            self._file_offsets = load_offset_file(self.offset_file, topic=self.topic,
                                                  group=self.group)
        self._started = True

    # --------------------------------------------------------- consuming
    async def deliveries(self, *, max_messages: int | None = None,
                         idle_exit_s: float | None = None,
                         stop: asyncio.Event | None = None) -> AsyncGenerator[Delivery, None]:
        """Yield every queue's messages, in queue order per queue, until
        `max_messages` (counted over this consumer's life), `idle_exit_s`
        without a message, or `stop`. A message's offset moves when the loop
        asks for the next one: leaving the loop with `break` leaves the
        message you broke on unconsumed (it is delivered again). Commits at
        the interval while iterating; the last commit is close()'s."""
        await self._start()
        if max_messages is not None and self.delivered >= max_messages:
            return
        idle_since = self._clock()
        while stop is None or not stop.is_set():
            got_any = False
            try:
                for qid in await self.queues():
                    if qid not in self.offsets:
                        self.offsets[qid] = await self._start_offset(qid)
                    for d in await self._pull(qid):
                        yield d
                        self.offsets[qid] = d.queue_offset + 1  # after the handler
                        self.delivered += 1
                        self._dirty = got_any = True
                        if max_messages is not None and self.delivered >= max_messages:
                            return
                    await self._maybe_commit()
            except TargetsUnavailable as exc:
                if self.unavailable is None:
                    log.warning("no node answers; retrying: %s", exc)
                self.unavailable = str(exc)
            else:
                self.unavailable = None
            if got_any:
                idle_since = self._clock()
                continue
            if idle_exit_s is not None and self._clock() - idle_since >= idle_exit_s:
                if self.unavailable is not None:
                    raise ConsumerError(f"gave up after {idle_exit_s} s: {self.unavailable}")
                return
            await asyncio.sleep(UNAVAILABLE_RETRY_S if self.unavailable else self.idle_poll_s)

    async def run(self, handler: Handler, *, max_messages: int | None = None,
                  idle_exit_s: float | None = None, stop: asyncio.Event | None = None) -> int:
        """Hand each message to `handler` (a function or a coroutine
        function) as deliveries() yields them; commit once more at the end,
        also when the handler raised. Returns the deliveries so far."""
        try:
            async with contextlib.aclosing(self.deliveries(
                    max_messages=max_messages, idle_exit_s=idle_exit_s, stop=stop)) as it:
                async for d in it:
                    maybe = handler(d)
                    if inspect.isawaitable(maybe):
                        await maybe
            return self.delivered
        finally:
            if self._started:
                try:
                    await self.commit()
                except ConsumerError as exc:
                    log.warning("final commit failed: %s", exc)

    async def _pull(self, qid: int) -> list[Delivery]:
        offset = self.offsets[qid]
        resp, served_by = await self._call("Pull", broker_pb2.PullRequest(
            topic=self.topic, queue_id=qid, offset=offset, max_count=self.pull_batch))
        if resp.status != broker_pb2.PullStatus.FOUND:
            if resp.next_offset != offset:
                # The broker corrected an offset out of its queue's range.
                log.info("%s/%d: %s at %d, the broker moves it to %d", self.topic, qid,
                         broker_pb2.PullStatus.Name(resp.status), offset, resp.next_offset)
                self.offsets[qid] = resp.next_offset
                self.corrections += 1
                self._dirty = True
            return []
        now_ms = self._wall_ms()
        out = []
        for m in resp.messages:
            assert m.queue_offset >= offset, "the node served messages before the pull offset"
            out.append(Delivery(self.topic, qid, m.queue_offset, m.commitlog_offset, m.msg_id,
                                m.body, self.targets[served_by], resp.node_role, now_ms,
                                dict(m.properties), m.store_timestamp_ms))
        return out

    # ----------------------------------------------------------- commits
    async def _maybe_commit(self) -> None:
        if self._clock() - self._last_commit >= self.commit_interval_s:
            try:
                await self.commit()
            except TargetsUnavailable as exc:  # offsets stay dirty: the next interval retries
                log.warning("commit failed: %s", exc)

    async def commit(self) -> None:
        """Send every queue's offset to the broker (cluster mode) or write
        the offset file (broadcast mode). Raises ConsumerError when no
        target takes it; `commits` counts only whole commits."""
        self._last_commit = self._clock()
        if not self.offsets:
            return
        offsets = dict(self.offsets)
        if self.mode == "broadcast":
            assert self.offset_file is not None
            merged = {**self._file_offsets, **offsets}
            path = self.offset_file
            try:
                await asyncio.get_running_loop().run_in_executor(
                    None, lambda: save_offset_file(path, topic=self.topic, group=self.group,
                                                   offsets=merged))
            except OSError as exc:
                why = f"{exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else "")
                raise ConsumerError(
                    f"offsets not saved to {path} ({why}): the messages consumed since the "
                    "last save will be delivered again; give an offset file in an existing "
                    "directory this user can write") from None
            self._file_offsets = merged
        else:
            for qid, off in sorted(offsets.items()):
                await self._call("CommitOffset", broker_pb2.CommitOffsetRequest(
                    group=self.group, topic=self.topic, queue_id=qid, offset=off))
        self._dirty = self.offsets != offsets  # moved while the commit was under way
        self.commits += 1

    async def close(self) -> None:
        """Commit what moved since the last commit, close the channels."""
        try:
            if self._started and self._dirty:
                await self.commit()
        finally:
            for c in self._channels:
                await c.close()
            self._channels, self._stubs = [], []

    async def __aenter__(self) -> Consumer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class BlockingConsumer:
    """The Consumer for blocking code: the same arguments, `run(handler)`
    and `for d in deliveries()`, on an event loop of its own. Use as a
    context manager; leaving it commits what moved and closes."""

    def __init__(self, targets: str | Sequence[str], token: str, group: str, topic: str,
                 **options: Any) -> None:
        self._consumer = Consumer(targets, token, group, topic, **options)
        self._loop = asyncio.new_event_loop()
        self._open: set[AsyncGenerator[Delivery, None]] = set()  # iterators not finished

    @property
    def offsets(self) -> dict[int, int]:
        return self._consumer.offsets

    @property
    def delivered(self) -> int:
        return self._consumer.delivered

    @property
    def commits(self) -> int:
        return self._consumer.commits

    def _do(self, aw: Awaitable[_R]) -> _R:
        return self._loop.run_until_complete(aw)

    def run(self, handler: Callable[[Delivery], None], *, max_messages: int | None = None,
            idle_exit_s: float | None = None) -> int:
        return self._do(self._consumer.run(handler, max_messages=max_messages,
                                           idle_exit_s=idle_exit_s))

    def deliveries(self, *, max_messages: int | None = None,
                   idle_exit_s: float | None = None) -> Iterator[Delivery]:
        it = self._consumer.deliveries(max_messages=max_messages, idle_exit_s=idle_exit_s)
        self._open.add(it)
        try:
            while True:
                try:
                    d = self._do(it.__anext__())
                except StopAsyncIteration:
                    return
                yield d
        finally:
            self._close_iterator(it)

    def _close_iterator(self, it: AsyncGenerator[Delivery, None]) -> None:
        if it in self._open:
            self._open.discard(it)
            if not self._loop.is_closed():
                self._do(it.aclose())

    def commit(self) -> None:
        self._do(self._consumer.commit())

    def close(self) -> None:
        if self._loop.is_closed():
            return
        try:
            for it in list(self._open):  # an iterator left unfinished
                self._close_iterator(it)
            self._do(self._consumer.close())
        finally:
            self._loop.close()

    def __enter__(self) -> BlockingConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
