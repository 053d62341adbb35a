"""The master's side of HA: the gRPC servicer for the replication stream, the
per-slave state shown in node status, and SYNC_MASTER's replica waits.

Everything here runs on the node's event loop thread (the store must only be
touched from it). Each slave stream runs two tasks: a reader that feeds
reports into the stream's MasterSession, and a shipper that reads whole
records from the CommitLog and writes Range messages. The shipper sleeps on
an asyncio event that appends (`notify_appended`) and reports set, so new
data is shipped without polling; it wakes by timer only for heartbeats and
housekeeping.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from ha import frames, sync_master
from ha.autoswitch.acks import AckQuorum, quorum_acked
from ha.config import SLAVE_NAME_MAX_LENGTH, HAConfig, ShipLimit
from ha.session import (
    Accept,
    Close,
    Ignore,
    MasterSession,
    RemoteProtocolError,
    SendTruncate,
    stream_refusal,
)
from ha.transport.streams import EOF, MasterStream
from ha.waiters import ReplicaWaitQueue
from ha.wake import Wake
from proto import ha_pb2, ha_pb2_grpc
from store.emulate import RMQ_3015, RMQ_3349
from store.failpoints import Failpoints
from store.log.record import CorruptRecordError
from store.names import name_problem
from store.seams.clock import Clock
from store.status import PutStatus, SlaveAck
from store.store import MessageStore

log = logging.getLogger("dlab.ha.master")
SERVICE = ha_pb2.DESCRIPTOR.services_by_name["HA"].full_name
# How long a closing stream waits for a write in flight (see _run_stream).
WRITE_DRAIN_S = 2.0


class SlaveLink(enum.StrEnum):
    """A slave's link as the master sees it (node status `slaves[].state`)."""

    CONNECTED = "connected"  # its reports are accepted
    TRUNCATING = "truncating"  # told to cut its log back to the master's end
    REJECTED = "rejected"  # ahead of the master, refused (slave_ahead_policy=reject)
    # Its log holds other records where this master's continue (two masters
    # wrote the same offsets): nothing can be shipped to it. Kept across its
    # reconnects until a range ships again.
    DIVERGED = "diverged"
    DISCONNECTED = "disconnected"  # no stream


#: The states a slave's link ends in after a change of master: its reports
#: accepted, or refused for good (a failover waits for one of these).
SETTLED_LINKS = frozenset({SlaveLink.CONNECTED, SlaveLink.REJECTED, SlaveLink.DIVERGED})


NEVER_REPORTED = "never reported"


def note_follower_links(found: dict[str, str], links: Iterable[Any]) -> bool:
    """Set each follower's entry of `found` (NEVER_REPORTED to start) to
    its link as a master's status lists it, "STATE DETAIL" (`links`: its
    SlaveLinkStates, or node status `slaves[]`); True once every one has
    settled (SETTLED_LINKS). What a promotion waits for, on every backend."""
    for link in links:
        if link.slave in found:
            found[link.slave] = f"{link.state} {link.detail}".strip()
    return all(v.split(" ")[0] in SETTLED_LINKS for v in found.values())


@dataclass
class SlaveLinkState:
    """What node status shows for one slave (by name)."""

    slave: str
    peer: str = ""
    state: SlaveLink = SlaveLink.CONNECTED
    acked: int = -1
    shipped: int = -1
    connected_since_ms: int = 0
    last_report_ms: int = 0
    detail: str = ""
    sessions: int = 0


@dataclass(eq=False)
class _Stream:
    session: MasterSession
    link: SlaveLinkState
    peer: str
    wake: Wake = field(default_factory=Wake)  # the ship loop's: something to ship or say
    close: tuple[grpc.StatusCode, str] | None = None
    truncate_sent: int | None = None
    context: MasterStream | None = None  # the call: is it over?
    incarnation: str = ""  # the slave process's id (its first report)
    # The master's end and the time when a range was last shipped on this
    # stream (RocketMQ 5's lastMasterMaxOffset / lastTransferTimeMs).
    last_transfer: tuple[int, float] | None = None

    def close_with(self, code: grpc.StatusCode, reason: str) -> None:
        if self.close is None:
            self.close = (code, reason)
        self.wake.set()


class HAMaster(ha_pb2_grpc.HAServicer):
    def __init__(self, store: MessageStore, config: HAConfig, *, clock: Clock,
                 failpoints: Failpoints) -> None:
        self.store = store
        self.log = store.log
        # Built before the node serves puts: its end now is its recovered
        # end, where this process's own writes begin.
        self.began_at = store.log.wrote
        self.config = config
        self.clock = clock
        self.failpoints = failpoints
        self.links: dict[str, SlaveLinkState] = {}
        self._streams: dict[str, _Stream] = {}
        self._waiters: ReplicaWaitQueue[asyncio.Future[PutStatus]] = ReplicaWaitQueue()
        # A waiting put's `seen` (wait_replicated), told the acks that cover it.
        self._seen: dict[asyncio.Future[PutStatus], Callable[[list[SlaveAck]], object]] = {}
        self._closing = False
        # --emulate rmq-3349 or rmq-3015: RocketMQ's
        # HAService.push2SlaveMaxOffset, the highest report ever accepted:
        # never lowered, not reset when a stream ends, and what SYNC_MASTER
        # waits compare against while any stream is connected.
        self._push2slave_max: int | None = None
        # Controller mode (ha/autoswitch/acks.py): how many of whose acks a
        # put waits for; None: classic (the best ack of any slave).
        self.quorum: AckQuorum | None = None
        # Told (slave, acked) after every accepted report (controller mode:
        # a slave that caught up joins the SyncStateSet at once).
        self.on_ack: Callable[[str, int], object] | None = None
        # When each slave last caught up (monotonic s): its ack reached what
        # the master had written when it shipped the range before
        # (AutoSwitchHAConnection's lastCatchUpTimeMs). Kept while away.
        self.caught_up_at: dict[str, float] = {}

    # ------------------------------------------------------ put-side API
    def notify_appended(self) -> None:
        """Called after every append: wake the shippers."""
        for s in self._streams.values():
            s.wake.set()

    def best_acked(self) -> int | None:
        """The highest acked offset over established streams (None: no slave).
        In controller mode, the offset the put's quorum of slaves has all
        acknowledged (ha/autoswitch/acks.py)."""
        if self.quorum is not None:
            return quorum_acked({a.slave: a.acked for a in self.acks()}, self.quorum)
        best: int | None = None
        for s in self._streams.values():
            if s.session.established and s.close is None:
                acked = s.session.acked
                assert acked is not None
                if best is None or acked > best:
                    best = acked
        if best is not None and self._push2slave_max is not None:
            # Only under --emulate rmq-3349/rmq-3015 (see __init__); the fixed code
            # counts the established streams' own acks only.
            best = max(best, self._push2slave_max)
        return best

    def acks(self) -> list[SlaveAck]:
        """Each established stream's acked and shipped positions, by slave
        name: the evidence a SYNC_MASTER answer records (ha/evidence.py).
        Only the streams' own reports: under --emulate rmq-3349/rmq-3015
        best_acked may count more than any of these shows."""
        out = []
        for name, s in self._streams.items():
            if s.session.established and s.close is None:
                acked, shipped = s.session.acked, s.session.shipped
                assert acked is not None and shipped is not None
                out.append(SlaveAck(name, acked, shipped))
        return out

    def slave_ok(self, end: int) -> bool:
        """RocketMQ's HAService.isSlaveOK: a slave is connected and the best
        one is less than ha_max_gap_not_in_sync behind `end`."""
        return sync_master.slave_ok(end, self.best_acked(), self.config.max_gap_not_in_sync_bytes)

    def wait_replicated(self, end: int, seen: Callable[[list[SlaveAck]], object] | None = None
                        ) -> asyncio.Future[PutStatus]:
        """A future resolved with PUT_OK when some slave's acked offset covers
        `end`, or FLUSH_SLAVE_TIMEOUT after slave_timeout_ms. `seen` is told
        the slaves' acks at that moment, before anything else runs (a done
        callback runs a loop step later, when a stream may have closed:
        the acks an answer relied on are these, not those)."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[PutStatus] = loop.create_future()
        best = self.best_acked()
        if best is not None and best >= end:
            if seen is not None:
                seen(self.acks())
            fut.set_result(PutStatus.PUT_OK)
            return fut
        if seen is not None:
            self._seen[fut] = seen
            fut.add_done_callback(self._forget_seen)
        self._waiters.push(end, fut)
        timer = loop.call_later(self.config.slave_timeout_ms / 1000, _resolve, fut,
                                PutStatus.FLUSH_SLAVE_TIMEOUT)
        fut.add_done_callback(lambda _f: timer.cancel())
        return fut

    def set_quorum(self, quorum: AckQuorum | None) -> None:
        """Controller mode: what puts wait for from now on (the SyncStateSet
        changed); waiters it already covers are released."""
        self.quorum = quorum
        self._acked_advanced()

    def _acked_advanced(self) -> None:
        best = self.best_acked()
        if best is None:
            return
        acks: list[SlaveAck] | None = None
        for fut in self._waiters.advance(best):
            seen = self._seen.pop(fut, None)
            if seen is not None and not fut.done():
                acks = self.acks() if acks is None else acks
                seen(acks)
            _resolve(fut, PutStatus.PUT_OK)

    def _forget_seen(self, fut: asyncio.Future[PutStatus]) -> None:
        self._seen.pop(fut, None)

    # ---------------------------------------------------------- status
    def status(self) -> list[SlaveLinkState]:
        for name, s in self._streams.items():
            link = self.links[name]
            link.acked = -1 if s.session.acked is None else s.session.acked
            link.shipped = -1 if s.session.shipped is None else s.session.shipped
        return sorted(self.links.values(), key=lambda x: x.slave)

    async def close(self) -> None:
        """Shutdown: close every stream; puts still waiting for a replica are
        answered FLUSH_SLAVE_TIMEOUT at once (stored here, not known to be
        replicated)."""
        self._closing = True
        for s in list(self._streams.values()):
            s.close_with(grpc.StatusCode.UNAVAILABLE, "master is shutting down")
        for fut in self._waiters.drain():
            _resolve(fut, PutStatus.FLUSH_SLAVE_TIMEOUT)

    # -------------------------------------------------------- servicer
    async def Replicate(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> None:
        await self.serve(context)

    async def serve(self, context: MasterStream) -> None:
        """Serve one replication stream (over gRPC, or any ha/transport/
        MasterStream) until it ends."""
        first = await self._first_report(context)
        if first is None:
            return
        refusal = self._claim_refusal(first.slave, first.incarnation)
        if refusal is not None:
            log.warning("refusing a replication stream from %s: %s", context.peer(), refusal[1])
            await context.abort(*refusal)
        stream = self._open_stream(first, context.peer())
        stream.context = context
        await self._run_stream(context, stream)
        if stream.close is not None and stream.close[0] != grpc.StatusCode.OK:
            try:
                await context.abort(*stream.close)
            except grpc.aio.AbortError:
                raise
            except Exception as exc:  # the call is already gone: nothing to tell
                log.info("slave %s: could not send the close status (%s)",
                         stream.session.slave, exc)

    async def _first_report(self, context: MasterStream) -> ha_pb2.Report | None:
        """The report that opens a stream (aborts the call if there is none)."""
        if self._closing:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "master is shutting down")
        housekeeping_s = self.config.housekeeping_interval_ms / 1000
        try:
            async with asyncio.timeout(housekeeping_s):
                return await _read_report(context)
        except RemoteProtocolError as exc:
            log.warning("closing a replication stream from %s: %s", context.peer(), exc)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except TimeoutError:
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED,
                                f"no report within {housekeeping_s:g} s of opening the stream")
        raise AssertionError("unreachable: abort raises")

    def _claim_refusal(self, name: str, incarnation: str) -> tuple[grpc.StatusCode, str] | None:
        """Why a new stream may not be slave `name`, or None.

        The name is shown in status and logs: 1..64 characters of the topic
        rule (store/names.py). A stream is the slave its first report names
        for its whole life (later reports' names are not read). A stream
        from the same slave process (same incarnation) supersedes the old
        one: the slave only opens a new stream once it has given up on the
        old, whose end the master may not have seen yet. A stream from
        another process naming a slave whose stream is live is refused: it
        must not disconnect the real one. The old stream counts as over, and
        is replaced, once its call has ended or it has expired by the
        master's own rule (ha/session.py MasterSession.expiry). A name
        without a stream opens one only within the master's stream limit
        (ha/session.py stream_refusal)."""
        problem = name_problem("slave name", name, SLAVE_NAME_MAX_LENGTH)
        if problem:
            return grpc.StatusCode.INVALID_ARGUMENT, problem
        if len(incarnation) > SLAVE_NAME_MAX_LENGTH:
            return (grpc.StatusCode.INVALID_ARGUMENT,
                    f"slave incarnation is {len(incarnation)} characters; at most "
                    f"{SLAVE_NAME_MAX_LENGTH}")
        live = self._streams.get(name)
        if live is None:
            limit = stream_refusal(name, self.config, set(self._streams))
            return None if limit is None else (grpc.StatusCode.RESOURCE_EXHAUSTED, limit)
        if live.close is not None:
            return None
        if incarnation and live.incarnation == incarnation:
            return None
        if live.context is not None and (live.context.done() or live.context.cancelled()):
            return None
        now = self.clock.monotonic()
        if live.session.expired(now):
            return None
        silent_s = now - live.session.last_report
        return (grpc.StatusCode.ALREADY_EXISTS,
                f"slave {name} is connected from {live.peer} (last report {silent_s:.1f} s "
                "ago): a second stream with its name is refused; retry once that stream "
                "has ended")

    def _open_stream(self, first: ha_pb2.Report, peer: str) -> _Stream:
        name = first.slave
        session = MasterSession(name, self.config, now_s=self.clock.monotonic(),
                                began_at=self.began_at)
        link = self.links.get(name) or SlaveLinkState(slave=name)
        self.links[name] = link
        link.peer, link.sessions = peer, link.sessions + 1
        stream = _Stream(session, link, peer, incarnation=first.incarnation)
        old = self._streams.get(name)
        if old is not None:
            old.close_with(grpc.StatusCode.ABORTED, "superseded by a new stream from this slave")
        self._streams[name] = stream
        log.info("slave %s connected from %s, reports max offset %d (master wrote %d)",
                 name, peer, first.max_offset, self.log.wrote)
        self._on_report(stream, first.max_offset)
        return stream

    async def _run_stream(self, context: MasterStream, stream: _Stream) -> None:
        """Reader and shipper until either ends the stream."""
        tasks = [asyncio.create_task(self._read_loop(context, stream)),
                 asyncio.create_task(self._ship_loop(context, stream))]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            if stream.close is None:
                for t in tasks:
                    failure = t.exception() if t.done() else None
                    if failure is not None:
                        stream.close = (grpc.StatusCode.UNAVAILABLE, f"stream failed: {failure}")
        finally:
            reader, shipper = tasks
            reader.cancel()
            if not shipper.done():
                # Let a write in flight finish (the loop stops after it once
                # `close` is set): a write cancelled mid-way leaves grpc's send
                # operation pending, and the abort that follows then fails
                # (GRPC_CALL_ERROR_TOO_MANY_OPERATIONS), leaving the slave
                # without a status until its deadline.
                stream.wake.set()
                with contextlib.suppress(TimeoutError, asyncio.CancelledError, Exception):
                    await asyncio.wait_for(asyncio.shield(shipper), WRITE_DRAIN_S)
            for t in tasks:
                t.cancel()
            for t in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await t
            self._end_stream(stream)

    def _end_stream(self, stream: _Stream) -> None:
        name = stream.session.slave
        link = stream.link
        link.acked = -1 if stream.session.acked is None else stream.session.acked
        link.shipped = -1 if stream.session.shipped is None else stream.session.shipped
        if self._streams.get(name) is stream:
            del self._streams[name]
            _, reason = stream.close or (grpc.StatusCode.CANCELLED, "stream ended")
            if link.state not in (SlaveLink.REJECTED, SlaveLink.DIVERGED):
                link.state = SlaveLink.DISCONNECTED
            link.detail = reason
            log.info("slave %s stream closed: %s", name, reason)
            if name not in self.config.slaves:
                # Not a configured slave: once its stream is gone it has no
                # place in node status, or every name a peer ever tried
                # would stay in the table (ha/config.py extra_streams).
                del self.links[name]

    def _on_report(self, stream: _Stream, max_offset: int) -> None:
        now = self.clock.monotonic()
        decision = stream.session.on_report(max_offset, master_wrote=self.log.wrote,
                                            master_min=self.log.min_offset, now_s=now)
        link = stream.link
        link.last_report_ms = self.clock.wall_ms()
        if isinstance(decision, Accept):
            if link.state != SlaveLink.CONNECTED or not link.connected_since_ms:
                link.connected_since_ms = self.clock.wall_ms()
            if link.state != SlaveLink.DIVERGED:  # until a range ships again
                link.state, link.detail = SlaveLink.CONNECTED, ""
            if stream.session.ahead_trusted and decision.acked > self.log.wrote:
                why = ("--emulate rmq-3349" if RMQ_3349 in self.config.emulate
                       else "slave_ahead_policy=trust")
                link.detail = (f"slave ahead of the master by {decision.acked - self.log.wrote} "
                               f"bytes, trusted ({why})")
                log.warning("slave %s: %s", stream.session.slave, link.detail)
            elif decision.acked > self.log.wrote:  # only under --emulate rmq-3015
                link.detail = (f"reports {decision.acked}, {decision.acked - self.log.wrote} "
                               "bytes beyond this master's end: believed (--emulate rmq-3015)")
                log.warning("slave %s: %s", stream.session.slave, link.detail)
            if self.config.emulate & {RMQ_3349, RMQ_3015}:
                self._push2slave_max = max(self._push2slave_max or 0, decision.acked)
            caught_up = (stream.last_transfer if stream.last_transfer is not None
                         else (self.log.wrote, now))
            if decision.acked >= caught_up[0]:
                self.caught_up_at[stream.session.slave] = max(
                    caught_up[1], self.caught_up_at.get(stream.session.slave, caught_up[1]))
            if self.on_ack is not None:
                self.on_ack(stream.session.slave, decision.acked)
            self._acked_advanced()
        elif isinstance(decision, Close):
            if decision.kind == "ahead":
                link.state = SlaveLink.REJECTED
                log.warning("rejecting slave %s: %s", stream.session.slave, decision.reason)
                stream.close_with(grpc.StatusCode.FAILED_PRECONDITION, decision.reason)
            else:
                log.warning("closing stream of slave %s: %s", stream.session.slave,
                            decision.reason)
                stream.close_with(grpc.StatusCode.INVALID_ARGUMENT, decision.reason)
            link.detail = decision.reason
        elif isinstance(decision, SendTruncate):
            link.state, link.detail = SlaveLink.TRUNCATING, decision.reason
            log.warning("slave %s is ahead: telling it to truncate to %d (%s)",
                        stream.session.slave, decision.offset, decision.reason)
        else:
            assert isinstance(decision, Ignore)
        stream.wake.set()

    async def _read_loop(self, context: MasterStream, stream: _Stream) -> None:
        session = stream.session
        while stream.close is None:
            try:
                # Until the session expires by its own rule (no report, or
                # nothing acknowledged, for the housekeeping interval).
                # (At least 1 ms: a timer may fire a hair before its time,
                # and on a virtual clock a zero timeout would not advance it.)
                async with asyncio.timeout(max(session.expires_in(self.clock.monotonic()),
                                               0.001)):
                    report = await _read_report(context)
            except RemoteProtocolError as exc:
                log.warning("closing stream of slave %s: %s", stream.session.slave, exc)
                stream.close_with(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
                return
            except TimeoutError:
                expiry = session.expiry(self.clock.monotonic())
                if expiry is None:
                    continue
                log.warning("closing stream of slave %s: %s", session.slave, expiry)
                stream.close_with(grpc.StatusCode.UNAVAILABLE, expiry)
                return
            if report is None:
                stream.close_with(grpc.StatusCode.OK, "slave closed the stream")
                return
            self._on_report(stream, report.max_offset)

    async def _ship_loop(self, context: MasterStream, stream: _Stream) -> None:
        session = stream.session
        ship_flushed = self.config.ship_limit == ShipLimit.FLUSHED
        flush_poll_s = self.store.config.flush_interval_ms / 1000
        while stream.close is None:
            stream.wake.clear()
            now = self.clock.monotonic()
            if session.truncate_to is not None and stream.truncate_sent != session.truncate_to:
                # Sent once; the slave's report of the cut re-establishes the session.
                stream.truncate_sent = session.truncate_to
                await context.write(frames.encode_truncate(session.truncate_to,
                                                           stream.link.detail))
                session.on_sent(now_s=now)
            limit = self.log.flushed if ship_flushed else self.log.wrote
            ship = session.next_ship(limit)
            if ship is not None:
                try:
                    data, nxt = self.log.read_range(ship.offset, ship.max_bytes)
                except (CorruptRecordError, ValueError) as exc:
                    why = (f"cannot ship from {ship.offset}: {exc} (the slave's log has "
                           "diverged from this master's)")
                    stream.link.state = SlaveLink.DIVERGED
                    stream.close_with(grpc.StatusCode.FAILED_PRECONDITION, why)
                    return
                session.on_shipped(ship.offset, nxt, now_s=now)
                stream.last_transfer = (self.log.wrote, now)
                if stream.link.state == SlaveLink.DIVERGED:
                    stream.link.state, stream.link.detail = SlaveLink.CONNECTED, ""
                await context.write(frames.encode_range(ship.offset, data, self.log.wrote))
                self.failpoints.hit("after_ship_before_ack")
                continue
            if session.established and session.heartbeat_due(now):
                assert session.shipped is not None
                await context.write(frames.encode_range(session.shipped, b"", self.log.wrote))
                session.on_sent(now_s=now)
            timeout = session.wake_in(self.clock.monotonic())
            if ship_flushed and self.log.flushed < self.log.wrote:
                # No hook tells us when the flusher advances `flushed`: while
                # bytes wait for a flush, look again every flush interval.
                timeout = min(timeout, flush_poll_s)
            await stream.wake.wait(max(timeout, 0.001))


async def _read_report(context: MasterStream) -> ha_pb2.Report | None:
    """The next report, None at the end of the stream; RemoteProtocolError
    for bytes that are not a Report."""
    try:
        msg = await context.read()
    except DecodeError as exc:
        raise RemoteProtocolError(f"malformed report (not a dlab.ha.Report): {exc}") from None
    if msg is EOF:
        return None
    assert isinstance(msg, ha_pb2.Report)
    return msg


def _resolve(fut: asyncio.Future[PutStatus], status: PutStatus) -> None:
    if not fut.done():
        fut.set_result(status)


def add_to_server(master: Any, server: grpc.aio.Server) -> None:
    """Register the HA service. Not through the generated
    add_HAServicer_to_server: the master writes MasterMessages already
    encoded (ha/frames.py), so the handler has no response serializer.
    `master`: an HAMaster, or anything with its Replicate (a controller-mode
    node's, which hands the stream to whichever HAMaster it has now)."""
    handlers = {"Replicate": grpc.stream_stream_rpc_method_handler(
        master.Replicate, request_deserializer=ha_pb2.Report.FromString,
        response_serializer=None)}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    server.add_registered_method_handlers(SERVICE, handlers)

