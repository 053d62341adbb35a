"""The replication session, sans IO: offsets and times in, decisions out.

One MasterSession per slave stream on the master, one SlaveSession per stream
on the slave. No sockets, files or clocks in here: ha/master.py and
ha/slave.py feed in what arrived (with the time) and carry out the decision.

Positions (master side), for an established session:
    acked <= shipped            acked: the slave's last accepted report
                                shipped: where the next Range starts
    shipped - acked <= window               or one record, if larger
    batch <= window <= config.window_bytes  window: this stream's, see next_ship

What a master holds for a stream is bounded by its window (a peer that
never reads holds at most one batch: the window starts there and grows only
with acknowledged bytes), and a stream whose shipped bytes go unacknowledged
for the housekeeping interval expires (`expiry`), as one whose slave stops
reporting does (docs/design.md, "What a master holds for its slaves").
`acked` may exceed the master's `wrote` only under slave_ahead_policy=trust
or --emulate rmq-3349 (RocketMQ believes a first report beyond the master,
in every classic-HA version: apache/rocketmq#3349; the #3016 check for
apache/rocketmq#3015 covers later reports only), and may exceed `shipped`
only under --emulate rmq-3015 (a later report beyond what was shipped is
believed, as before #3016 and again in 5.x).

Ordering rules:
- The slave appends a range (verified, all or nothing) BEFORE it reports the
  new max offset, and it reports before any fsync (RocketMQ's HAClient does
  the same): an ack means "in the slave's log", not "on the slave's disk".
- The master counts a slave's report toward SYNC_MASTER acks only AFTER the
  report passed `on_report` (a report ahead of the master under `reject` or
  `truncate` never counts).
- Under `truncate` the slave cuts its log durably BEFORE it reports the cut
  offset; the master ships nothing until that report arrives.
"""

from __future__ import annotations

from dataclasses import dataclass

from ha.config import HAConfig, SlaveAheadPolicy
from store.emulate import PLANTED_SLAVE_WRONG_OFFSET, RMQ_3015, RMQ_3349


class RemoteProtocolError(Exception):
    """The peer broke the protocol (a report that goes backwards, a range at
    the wrong offset): the stream is closed, the process carries on."""


# ------------------------------------------------------------ master side
@dataclass(frozen=True)
class Accept:
    """The report is the slave's acked offset from now_s on."""

    acked: int


@dataclass(frozen=True)
class Ignore:
    """Nothing changes (a heartbeat still showing the pre-truncation offset)."""

    reason: str


@dataclass(frozen=True)
class Close:
    """End the stream. kind: `ahead` (slave ahead, policy reject) or
    `protocol` (malformed or impossible report)."""

    kind: str
    reason: str


@dataclass(frozen=True)
class SendTruncate:
    """Tell the slave to cut its log at `offset`: where the master's own writes
    began (its end when it opened), or its max offset when that is lower."""

    offset: int
    reason: str


@dataclass(frozen=True)
class Ship:
    """Read whole records from `offset`, about `max_bytes`, and send them."""

    offset: int
    max_bytes: int


MasterDecision = Accept | Ignore | Close | SendTruncate


def stream_refusal(name: str, config: HAConfig, open_names: set[str]) -> str | None:
    """Why a new stream from slave `name` may not open while streams from
    `open_names` are open (a stream `name` supersedes is not among them),
    or None. A configured slave (config.slaves) always may: one stream per
    name. Other names share config.extra_streams streams, so a master holds
    at most len(config.slaves) + extra_streams streams whoever connects."""
    if name in config.slaves:
        return None
    unknown = sorted(n for n in open_names if n not in config.slaves)
    if len(unknown) < config.extra_streams:
        return None
    shown = ", ".join(unknown[:5]) + (", ..." if len(unknown) > 5 else "")
    configured = (f"configured slaves: {', '.join(sorted(config.slaves))}" if config.slaves
                  else "no --ha-slave configured")
    return (f"slave {name} is not one this master is configured with ({configured}), and "
            f"the {config.extra_streams} stream(s) allowed for other names are open "
            f"({shown}): name it with --ha-slave on the master, or raise "
            "--ha-extra-streams")


class MasterSession:
    def __init__(self, slave: str, config: HAConfig, *, now_s: float,
                 began_at: int | None = None) -> None:
        self.slave = slave
        self.config = config
        # Where this master process's own writes began (its store's end when
        # it opened; None: unknown). A slave ahead of the master's end has
        # never followed this process (it would not be ahead), so its bytes
        # past that point came from an earlier master process and are not
        # this master's: `truncate` cuts there.
        self.began_at = began_at
        self.acked: int | None = None  # None until the first accepted report
        self.shipped: int | None = None
        self.truncate_to: int | None = None  # sent, not yet confirmed
        self.ahead_trusted = False
        self.last_report = now_s
        self.last_sent = now_s
        # Slow start (TCP's, RFC 5681): one batch until the slave has
        # acknowledged bytes, then grown by what it acknowledges.
        self.window = config.batch_bytes
        # Since when shipped bytes wait for an ack without one arriving
        # (None: nothing in flight).
        self.unacked_since: float | None = None

    @property
    def established(self) -> bool:
        return self.acked is not None and self.truncate_to is None

    def on_report(self, max_offset: int, *, master_wrote: int, master_min: int,
                  now_s: float) -> MasterDecision:
        """Decide what a report means. `master_wrote` is the master's max
        offset now_s; a first report beyond it is the slave-ahead case."""
        self.last_report = now_s
        if max_offset < 0:
            return Close("protocol", f"negative max offset {max_offset} in a report")
        if self.truncate_to is not None:
            if max_offset == self.truncate_to:
                self.truncate_to = None
                self.acked = self.shipped = max_offset
                self.window, self.unacked_since = self.config.batch_bytes, None
                return Accept(max_offset)
            if self.acked is not None and max_offset == self.acked:
                return Ignore("report from before the truncation took effect")
            return Close("protocol", f"asked to truncate to {self.truncate_to}, slave "
                                     f"reported {max_offset}")
        if self.acked is None:
            return self._first_report(max_offset, master_wrote, master_min)
        assert self.shipped is not None
        if max_offset < self.acked:
            return Close("protocol", f"report went backwards: {max_offset} after {self.acked}")
        if max_offset > self.shipped:
            if RMQ_3015 in self.config.emulate:
                # --emulate rmq-3015: RocketMQ's HAConnection.ReadSocketService
                # takes every report as slaveAckOffset and hands it to
                # HAService.notifyTransferSome (push2SlaveMaxOffset) unchecked,
                # so a peer reporting past the master's end makes SYNC_MASTER
                # puts PUT_OK that no slave holds. Real fix: apache/rocketmq#3016
                # closes the connection on a non-first report beyond the
                # master's max offset (4.9.3-4.9.8); absent from 5.x
                # DefaultHAConnection since the RIP-34 refactor (#3979).
                # What is shipped does not follow (nextTransferFromWhere is
                # its own pointer): `shipped` stays.
                self.acked = max_offset
                return Accept(max_offset)
            return Close("protocol", f"report {max_offset} beyond what was shipped "
                                     f"({self.shipped})")
        self._acknowledged(max_offset, now_s)
        return Accept(max_offset)

    def _acknowledged(self, offset: int, now_s: float) -> None:
        """An accepted report at or below what was shipped: the window
        grows by the bytes it acknowledges; the stall clock restarts."""
        assert self.acked is not None and self.shipped is not None
        assert self.acked <= offset <= self.shipped
        if offset > self.acked:
            self.window = min(self.config.window_bytes, self.window + offset - self.acked)
            self.unacked_since = now_s if offset < self.shipped else None
        self.acked = offset

    def _first_report(self, offset: int, master_wrote: int, master_min: int) -> MasterDecision:
        if offset > master_wrote:
            ahead = offset - master_wrote
            policy = self.config.slave_ahead_policy
            if RMQ_3349 in self.config.emulate:
                # --emulate rmq-3349: RocketMQ's ReadSocketService takes the
                # first report as slaveRequestOffset/slaveAckOffset unchecked
                # and raises push2SlaveMaxOffset to it, so every SYNC_MASTER
                # put ending at or below it is acknowledged. No fix in
                # classic HA (the issue was closed as stale; #3016 checks
                # only later reports); our reject/truncate policies are the
                # lab's answer, and this switch overrides them.
                policy = SlaveAheadPolicy.TRUST
            if policy == SlaveAheadPolicy.REJECT:
                return Close("ahead", f"slave {self.slave} reports max offset {offset}, "
                                      f"{ahead} bytes ahead of this master ({master_wrote}); "
                                      "slave_ahead_policy=reject keeps both logs as they are")
            if policy == SlaveAheadPolicy.TRUNCATE:
                # The fork point: what this master wrote since it opened is
                # not what the slave holds there. Cutting at master_wrote
                # instead would keep the slave's stale bytes below it (and
                # land inside one of its records) once the master has taken
                # puts before the slave's first report.
                cut = master_wrote if self.began_at is None else min(master_wrote,
                                                                      self.began_at)
                self.acked = offset
                self.truncate_to = cut
                return SendTruncate(cut, f"slave {ahead} bytes ahead of the master; "
                                         f"cut at {cut}")
            self.ahead_trusted = True  # TRUST: believe it, as RocketMQ <= 4.9.2 does
        elif offset < master_min:
            return Close("protocol", f"slave at {offset} is below this master's first "
                                     f"offset {master_min}; give the slave an empty data dir")
        self.acked = self.shipped = offset
        return Accept(offset)

    def next_ship(self, limit: int) -> Ship | None:
        """What to ship next with the master's shipping limit (`wrote` or
        `flushed`) at `limit`; None while nothing is due or the window is full.

        Full batches are pipelined while they fit the stream's window
        (catch-up; a first record larger than a batch goes out alone),
        which starts at one batch and grows with acknowledged bytes up to
        config.window_bytes: a peer that reads nothing holds one batch of
        this master's memory, not a whole window. Less than a
        batch is shipped at once only when nothing is in flight; otherwise it
        waits for the slave's ack and then goes out in one range with
        everything appended meanwhile (Nagle's rule: under load, one range
        and one report carry many puts; an idle producer never waits)."""
        if not self.established:
            return None
        assert self.acked is not None and self.shipped is not None
        available = limit - self.shipped
        if available <= 0:
            return None
        in_flight = self.shipped - self.acked
        if in_flight > 0 and in_flight + self.config.batch_bytes > self.window:
            return None
        if in_flight > 0 and available < self.config.batch_bytes:
            return None
        return Ship(self.shipped, min(self.config.batch_bytes, available))

    def on_shipped(self, offset: int, next_offset: int, *, now_s: float) -> None:
        assert self.shipped == offset and next_offset > offset, (self.shipped, offset,
                                                                  next_offset)
        if self.unacked_since is None:
            self.unacked_since = now_s
        self.shipped = next_offset
        self.last_sent = now_s
        assert self.acked is not None
        assert self.acked <= self.shipped or RMQ_3015 in self.config.emulate

    def on_sent(self, *, now_s: float) -> None:
        """A heartbeat or a Truncate went out."""
        self.last_sent = now_s

    def heartbeat_due(self, now_s: float) -> bool:
        return now_s - self.last_sent >= self.config.heartbeat_interval_ms / 1000

    def expired(self, now_s: float) -> bool:
        """The slave is gone, or not reading (see `expiry`)."""
        return self.expiry(now_s) is not None

    def expiry(self, now_s: float) -> str | None:
        """Why the stream is over by the housekeeping rule, or None: no
        report for the housekeeping interval (the slave is gone), or shipped
        bytes not acknowledged for as long (it reports but does not read:
        what was shipped to it would stay in this master's buffers)."""
        housekeeping_s = self.config.housekeeping_interval_ms / 1000
        if now_s - self.last_report >= housekeeping_s:
            return f"no report from the slave for {housekeeping_s:g} s (housekeeping interval)"
        if self.unacked_since is not None and now_s - self.unacked_since >= housekeeping_s:
            assert self.acked is not None and self.shipped is not None
            return (f"the slave acknowledged none of the {self.shipped - self.acked} bytes "
                    f"shipped to it from {self.acked} for {housekeeping_s:g} s (housekeeping "
                    "interval): it is not reading the stream")
        return None

    def expires_in(self, now_s: float) -> float:
        """Seconds until expired(now_s) holds, if no report comes first."""
        housekeeping_s = self.config.housekeeping_interval_ms / 1000
        at = self.last_report
        if self.unacked_since is not None:
            at = min(at, self.unacked_since)
        return max(0.0, at + housekeeping_s - now_s)

    def wake_in(self, now_s: float) -> float:
        """Seconds until a heartbeat or the housekeeping check is due."""
        hb = self.last_sent + self.config.heartbeat_interval_ms / 1000 - now_s
        return max(0.0, min(hb, self.expires_in(now_s)))


# ------------------------------------------------------------- slave side
@dataclass(frozen=True)
class Apply:
    """Append the range (it starts at this slave's max offset)."""


@dataclass(frozen=True)
class Heartbeat:
    """An empty range at the right offset: the master is alive."""


@dataclass(frozen=True)
class Drop:
    """Drop the stream and reconnect (with backoff)."""

    reason: str


@dataclass(frozen=True)
class TruncateTo:
    offset: int


SlaveDecision = Apply | Heartbeat | Drop | TruncateTo


class SlaveSession:
    def __init__(self, max_offset: int, config: HAConfig, *, now_s: float) -> None:
        assert max_offset >= 0
        self.max_offset = max_offset
        self.config = config
        self.last_contact = now_s
        self.last_report = now_s
        # PLANTED FAULT (--emulate planted-slave-wrong-offset), not
        # RocketMQ's: a range that does not start at this slave's max offset
        # is applied anyway, at the slave's end (RocketMQ's HAClient and the
        # fixed code drop the stream).
        self.wrong_offset = PLANTED_SLAVE_WRONG_OFFSET in config.emulate

    def on_range(self, offset: int, length: int, *, now_s: float) -> SlaveDecision:
        self.last_contact = now_s
        if offset != self.max_offset and not self.wrong_offset:
            return Drop(f"master shipped a range at {offset} but this slave's max offset is "
                        f"{self.max_offset}")
        return Apply() if length else Heartbeat()

    def applied(self, new_max_offset: int) -> None:
        assert new_max_offset > self.max_offset, (new_max_offset, self.max_offset)
        self.max_offset = new_max_offset

    def on_truncate(self, offset: int, *, now_s: float) -> SlaveDecision:
        self.last_contact = now_s
        if offset < 0 or offset > self.max_offset:
            return Drop(f"master asked to truncate to {offset}, outside [0, {self.max_offset}]")
        return TruncateTo(offset)

    def truncated(self, offset: int) -> None:
        assert 0 <= offset <= self.max_offset
        self.max_offset = offset

    def reported(self, *, now_s: float) -> None:
        self.last_report = now_s

    def expired(self, now_s: float) -> bool:
        """Nothing from the master (not even a heartbeat) for the housekeeping
        interval: drop the stream and reconnect."""
        return now_s - self.last_contact >= self.config.housekeeping_interval_ms / 1000
