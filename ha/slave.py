"""The slave's side of HA: one replication stream to the master at a time,
re-opened with exponential backoff (tenacity) whenever it ends.

Per stream: report the max offset on connect; for each Range, check it starts
at the max offset (else drop the stream: RocketMQ's HAClient does the same),
append it verified (CommitLog.append_raw, all or nothing), then report —
before any fsync. Reports are written by one writer task that coalesces
"report wanted" signals and also sends the heartbeat report every
heartbeat interval. Nothing from the master (not even its heartbeat) for the
housekeeping interval drops the stream.

Flushing follows the slave's own flush mode: ASYNC_FLUSH leaves it to the
store's interval flusher; SYNC_FLUSH keeps one group-commit flush request in
flight while bytes are unflushed (without making reports wait for it).
Under the power crash model the slave stops reading ranges while more than
UNFLUSHED_READ_LIMIT_BYTES is unflushed, until a flush has caught up.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc
from tenacity import AsyncRetrying, retry_if_exception_type, wait_exponential

from ha import frames
from ha.config import HAConfig
from ha.session import Apply, Drop, Heartbeat, SlaveSession, TruncateTo
from ha.transport.grpc_transport import HA_CHANNEL_OPTIONS, GrpcConnector
from ha.transport.streams import EOF, HAConnector, SlaveCall
from ha.wake import Wake
from proto import ha_pb2
from store.config import MIB, CrashModel, FlushMode
from store.failpoints import Failpoints
from store.log.commitlog import OffsetMismatchError, RangeRejectedError, StoreFailedError
from store.log.record import peek
from store.seams.clock import Clock
from store.store import MessageStore

log = logging.getLogger("dlab.ha.slave")

__all__ = ["HA_CHANNEL_OPTIONS", "HASlave", "MasterLink", "MasterLinkState", "StreamEnded"]


# Under the power crash model the ranges applied but not yet flushed are held
# in memory (the received messages themselves). Past this many bytes the
# slave stops reading the stream until a flush has written some (HTTP/2 flow
# control then holds the master back), so the memory stays small and is
# reused: a catching-up slave that kept reading held up to 400 MiB of fresh
# memory, each page faulted in once (a sixth of its CPU time).
# (The store's max_unflushed_bytes applies too when it is smaller.)
UNFLUSHED_READ_LIMIT_BYTES = 32 * MIB


class StreamEnded(Exception):
    """One replication stream is over; the slave reconnects."""


class MasterLink(enum.StrEnum):
    """A slave's link to its master (node status `master_link.state`)."""

    CONNECTING = "connecting"  # opening a stream
    STREAMING = "streaming"  # ranges arrive
    BACKOFF = "backoff"  # waiting to reconnect (exponential backoff)
    STOPPED = "stopped"  # the node is stopping, or the loop failed


@dataclass
class MasterLinkState:
    """What node status shows for a slave's link to its master."""

    address: str
    state: MasterLink = MasterLink.CONNECTING
    reported: int = -1
    connects: int = 0
    last_error: str = ""
    last_contact_ms: int = 0
    truncations: int = 0


class HASlave:
    def __init__(self, store: MessageStore, *, name: str, master_address: str, token: str,
                 config: HAConfig, clock: Clock, failpoints: Failpoints,
                 connector: HAConnector | None = None, incarnation: str | None = None,
                 on_applied: Callable[[int], object] | None = None) -> None:
        self.store = store
        # Told the log's new end after each applied range, before the report
        # (controller mode records the master's epochs there).
        self.on_applied = on_applied
        # Names this slave process to the master (ha.proto Report.incarnation):
        # its own reconnects supersede a stream the master still holds.
        self.incarnation = incarnation or secrets.token_hex(8)
        self.connector: HAConnector = connector or GrpcConnector()
        self.log = store.log
        self.name = name
        self.master_address = master_address
        self.token = token
        self.config = config
        self.clock = clock
        self.failpoints = failpoints
        self.link = MasterLinkState(address=master_address)
        self._stopping = False
        self._task: asyncio.Task[None] | None = None
        self._flush_task: asyncio.Task[object] | None = None
        store_limit = store.config.max_unflushed_bytes
        self._read_limit = min(UNFLUSHED_READ_LIMIT_BYTES,
                               store_limit or UNFLUSHED_READ_LIMIT_BYTES)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="ha-slave")
        self._task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            # A bug: say so, or the slave would silently stop replicating.
            log.error("replication from %s stopped", self.master_address,
                      exc_info=task.exception())
            self.link.state = MasterLink.STOPPED
            self.link.last_error = f"replication loop failed: {task.exception()!r}"

    async def stop(self) -> None:
        """End the reconnect loop, whatever it is doing (connecting, streaming,
        backing off, tearing a stream down), and wait until it has ended."""
        self._stopping = True
        self.link.state = MasterLink.STOPPED
        if self._task is not None:
            await _end_task(self._task)
        if self._flush_task is not None:
            self._flush_task.add_done_callback(_retrieve)
            await asyncio.wait([self._flush_task])

    # --------------------------------------------------------- reconnect
    async def _run(self) -> None:
        cfg = self.config
        while not self._stopping:
            # stop() cancels this task; `_stopping` also ends the retries, so
            # the loop ends even if a cancellation is lost somewhere below
            # (tenacity's attempt swallows every exception; a library may
            # swallow CancelledError): a stopping slave never connects again.
            retrying = AsyncRetrying(
                wait=wait_exponential(multiplier=cfg.reconnect_min_ms / 1000,
                                      min=cfg.reconnect_min_ms / 1000,
                                      max=cfg.reconnect_max_ms / 1000),
                retry=retry_if_exception_type(StreamEnded),
                stop=lambda _state: self._stopping,
                before_sleep=self._before_sleep,
                reraise=True,
            )
            with contextlib.suppress(StreamEnded):
                async for attempt in retrying:
                    with attempt:
                        await self._stream_once()

    def _before_sleep(self, retry_state: object) -> None:
        self.link.state = MasterLink.BACKOFF

    async def _stream_once(self) -> None:
        """Run one stream. Returns normally when a stream that had carried
        data ends (the next connect is immediate); raises StreamEnded when it
        failed before that (the next connect backs off)."""
        if self._stopping:
            return
        self.link.state = MasterLink.CONNECTING
        self.link.connects += 1
        try:
            async with self.connector.open(self.master_address, self.token) as call:
                await self._serve(call)
        except StreamEnded as exc:
            self._note_end(str(exc))
            raise
        except (StoreFailedError, OSError) as exc:
            self._note_end(f"local store failed: {exc}")
            raise StreamEnded(str(exc)) from None

    def _note_end(self, reason: str) -> None:
        self.link.last_error = reason
        log.warning("replication stream to %s ended: %s", self.master_address, reason)

    # ------------------------------------------------------------ stream
    async def _serve(self, call: SlaveCall) -> None:
        loop = asyncio.get_running_loop()
        now = self.clock.monotonic()
        session = SlaveSession(self.log.wrote, self.config, now_s=now)
        want_report = Wake()
        writer = asyncio.create_task(self._report_loop(call, session, want_report))
        housekeeping_s = self.config.housekeeping_interval_ms / 1000
        got_data = False
        try:
            try:
                # Bounded like every read: behind a silent network (a
                # partition) even connecting never completes.
                async with asyncio.timeout(housekeeping_s):
                    await self._report(call, session)
            except TimeoutError:
                raise StreamEnded(f"could not reach the master within {housekeeping_s:g} s "
                                  "(housekeeping interval)") from None
            while True:
                try:
                    async with asyncio.timeout(housekeeping_s):
                        msg = await call.read()
                except TimeoutError:
                    raise StreamEnded(f"nothing from the master for {housekeeping_s:g} s "
                                      "(housekeeping interval)") from None
                if writer.done():
                    writer.result()  # surface the writer's error
                if msg is EOF:
                    status = await call.code()
                    details = await call.details()
                    raise StreamEnded(f"master ended the stream: {status.name} {details}")
                assert isinstance(msg, bytes)
                try:
                    frame = frames.decode(msg)
                except frames.FrameError as exc:
                    raise StreamEnded(str(exc)) from None
                self.link.last_contact_ms = self.clock.wall_ms()
                if self.link.state != MasterLink.STREAMING:
                    self.link.state = MasterLink.STREAMING
                now = self.clock.monotonic()
                if isinstance(frame, frames.RangeFrame):
                    got_data = True
                    self._on_range(session, frame, now)
                else:
                    await self._on_truncate(session, frame, now)
                want_report.set()
                if isinstance(frame, frames.RangeFrame) and frame.data:
                    # Dispatch the range into the consume queues soon, while
                    # its bytes are in memory (RocketMQ's reput runs every
                    # millisecond), but after the report is on its way: the
                    # store drops a slave's flushed pages once reput has
                    # read them.
                    loop.call_soon(self._reput)
                if self._held_unflushed() > self._read_limit:
                    await self._wait_for_flush()
        except (StreamEnded, grpc.aio.AioRpcError) as exc:
            reason = str(exc) if isinstance(exc, StreamEnded) else \
                f"{exc.code().name}: {exc.details()}"
            if not got_data:
                raise StreamEnded(reason) from None
            self._note_end(reason)
        finally:
            try:
                await _end_task(writer)
            finally:
                call.cancel()

    def _on_range(self, session: SlaveSession, rng: frames.RangeFrame, now: float) -> None:
        decision = session.on_range(rng.offset, len(rng.data), now_s=now)
        if isinstance(decision, Drop):
            raise StreamEnded(decision.reason)
        if isinstance(decision, Heartbeat):
            return
        assert isinstance(decision, Apply)
        try:
            # No copy: the log keeps a view of the received message until it
            # is flushed (one 1 MiB copy less per range).
            # Under --emulate planted-slave-wrong-offset the session applies a
            # range at another offset; it lands at this log's end.
            at = None if rng.offset == session.max_offset else self.log.wrote
            new_max = self.log.append_raw(rng.offset, rng.data, at=at)
        except OffsetMismatchError as exc:
            raise StreamEnded(f"range rejected: {exc}") from None
        except RangeRejectedError as exc:
            raise StreamEnded(f"range from the master failed verification, nothing "
                              f"appended: {exc}") from None
        session.applied(new_max)
        if self.on_applied is not None:
            self.on_applied(new_max)
        self.failpoints.hit("slave_after_append_before_report")
        self._kick_flush()

    async def _on_truncate(self, session: SlaveSession, tr: frames.TruncateFrame, now: float
                           ) -> None:
        decision = session.on_truncate(tr.offset, now_s=now)
        if isinstance(decision, Drop):
            raise StreamEnded(decision.reason)
        assert isinstance(decision, TruncateTo)
        problem = self._not_a_boundary(decision.offset)
        if problem:
            raise StreamEnded(f"refusing to truncate to {decision.offset}: {problem}")
        log.warning("master %s asked to truncate from %d to %d (%s)", self.master_address,
                    self.log.wrote, decision.offset, tr.reason)
        if self._flush_task is not None:
            with contextlib.suppress(Exception):
                await self._flush_task
        self.store.truncate_to(decision.offset)
        session.truncated(decision.offset)
        self.link.truncations += 1
        self.failpoints.hit("slave_after_truncate_before_report")

    def _not_a_boundary(self, offset: int) -> str:
        """Empty when `offset` is a record boundary of this log; otherwise why
        not (a cut anywhere else would leave half a record behind). Walks the
        records of the segment holding `offset` from its start."""
        if offset == self.log.wrote:
            return ""
        pos = max(self.log.min_offset, offset - offset % self.log.seg_size)
        while pos < offset:
            data, nxt = self.log.read_range(pos, 1 << 20)
            if nxt <= pos:
                return "cannot walk this log's records"
            if offset < nxt:
                p = pos
                while p < offset:
                    size, _ = peek(data, p - pos)
                    if size <= 0:
                        return f"no record at {p} of this log"
                    p += size
                if p != offset:
                    return "it falls inside a record of this log (the logs have diverged)"
                return ""
            pos = nxt
        return ""

    def _reput(self) -> None:
        try:
            self.store.reput()
        except Exception:  # the store's own service retries it within a second
            log.exception("consume queue dispatch after a range failed")

    def _held_unflushed(self) -> int:
        """Bytes applied, not yet flushed, and held in memory (none under the
        process crash model: append_raw wrote them to the file)."""
        if self.store.config.crash_model != CrashModel.POWER:
            return 0
        return self.log.dirty_bytes

    async def _wait_for_flush(self) -> None:
        """Until a flush brings the held bytes under the read limit: the
        group commit already in flight (SYNC_FLUSH), else a flush of our own
        (ASYNC_FLUSH: the interval flusher may be asleep)."""
        while self._held_unflushed() > self._read_limit:
            if self.log.failed:
                raise StoreFailedError(self.log.failed)
            task = self._flush_task
            if task is not None and not task.done():
                await asyncio.shield(task)
            else:
                await self.store.flush()

    def _kick_flush(self) -> None:
        if self.store.config.flush_mode != FlushMode.SYNC_FLUSH:
            return
        if self._flush_task is not None and not self._flush_task.done():
            return
        if self.log.flushed >= self.log.wrote:
            return
        task = asyncio.get_running_loop().create_task(self.store.wait_flushed(self.log.wrote))
        task.add_done_callback(lambda _t: self._kick_flush() if not self._stopping else None)
        self._flush_task = task

    async def _report(self, call: SlaveCall, session: SlaveSession) -> None:
        advanced = session.max_offset != self.link.reported
        await call.write(ha_pb2.Report(max_offset=session.max_offset, slave=self.name,
                                        incarnation=self.incarnation))
        session.reported(now_s=self.clock.monotonic())
        self.link.reported = session.max_offset
        if advanced:  # a heartbeat repeating the last offset tells the master nothing new
            self.failpoints.hit("slave_after_report")

    async def _report_loop(self, call: SlaveCall, session: SlaveSession,
                           want: Wake) -> None:
        heartbeat_s = self.config.heartbeat_interval_ms / 1000
        while True:
            await want.wait(heartbeat_s)
            want.clear()
            await self._report(call, session)


async def _end_task(task: asyncio.Task[Any]) -> None:
    """Cancel `task` and wait until it has ended, leaving its outcome aside.

    Not `task.cancel(); with suppress(CancelledError): await task`: that also
    swallows a cancellation of the *caller* landing while it waits (a
    stop() during a stream's teardown was lost so, and a stopping slave
    kept reconnecting until it was killed). asyncio.wait raises
    CancelledError only when the caller itself is cancelled."""
    task.add_done_callback(_retrieve)
    task.cancel()
    await asyncio.wait([task])


def _retrieve(task: asyncio.Task[Any]) -> None:
    # Its error was surfaced where it mattered (or the task was ended on
    # purpose): not "Task exception was never retrieved" at exit.
    if not task.cancelled():
        task.exception()
