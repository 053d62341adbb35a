"""The replication session's pure logic (ha/session.py, ha/waiters.py):
offsets and times in, decisions out — no sockets, files or clocks."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ha.config import HAConfig, SlaveAheadPolicy
from ha.session import (
    Accept,
    Apply,
    Close,
    Drop,
    Heartbeat,
    Ignore,
    MasterSession,
    SendTruncate,
    Ship,
    SlaveSession,
    TruncateTo,
    stream_refusal,
)
from ha.waiters import ReplicaWaitQueue
from store.config import ConfigError

CFG = HAConfig(batch_bytes=4096, window_bytes=3 * 4096, heartbeat_interval_ms=1000,
               housekeeping_interval_ms=5000)


def established(acked: int = 0, cfg: HAConfig = CFG, wrote: int = 10**6) -> MasterSession:
    s = MasterSession("s1", cfg, now_s=0.0)
    assert s.on_report(acked, master_wrote=wrote, master_min=0, now_s=0.0) == Accept(acked)
    return s


# ------------------------------------------------------------- master side
def test_first_report_sets_the_shipping_offset_and_batches_follow() -> None:
    s = established(1000)
    assert s.next_ship(limit=1000) is None  # nothing new
    assert s.next_ship(limit=2000) == Ship(1000, 1000)  # up to the limit
    assert s.next_ship(limit=100_000) == Ship(1000, 4096)  # at most one batch


def test_window_bounds_unacked_bytes_then_acks_reopen_it() -> None:
    """The window starts at one batch and grows by what the slave acknowledges,
    up to window_bytes (12 KiB here)."""
    s = established(0)
    s.on_shipped(0, 4096, now_s=0.1)
    assert s.next_ship(limit=10**6) is None  # one batch until the slave acks
    assert s.on_report(4096, master_wrote=10**6, master_min=0, now_s=0.2) == Accept(4096)
    for i in (1, 2):  # the window grew by the 4 KiB acknowledged
        ship = s.next_ship(limit=10**6)
        assert ship == Ship(i * 4096, 4096)
        s.on_shipped(ship.offset, ship.offset + 4096, now_s=0.3)
    assert s.next_ship(limit=10**6) is None
    assert s.on_report(3 * 4096, master_wrote=10**6, master_min=0, now_s=0.4) == Accept(12288)
    for i in (3, 4, 5):  # grown to window_bytes, and no further
        ship = s.next_ship(limit=10**6)
        assert ship == Ship(i * 4096, 4096)
        s.on_shipped(ship.offset, ship.offset + 4096, now_s=0.5)
    assert s.next_ship(limit=10**6) is None  # 12 KiB in flight = window_bytes
    assert s.on_report(4 * 4096, master_wrote=10**6, master_min=0, now_s=0.6) == Accept(16384)
    assert s.next_ship(limit=10**6) == Ship(6 * 4096, 4096)


def test_small_ranges_wait_for_the_ack_and_then_go_out_together() -> None:
    s = established(0)
    assert s.next_ship(limit=100) == Ship(0, 100)  # nothing in flight: at once
    s.on_shipped(0, 100, now_s=0.0)
    assert s.next_ship(limit=300) is None  # 200 new bytes wait for the ack...
    # ...and so does a full batch while the window is one batch (slow start)
    assert s.next_ship(limit=100 + 4096) is None
    s.on_report(100, master_wrote=10**6, master_min=0, now_s=0.0)  # window: 4096 + 100
    assert s.next_ship(limit=200) == Ship(100, 100)
    s.on_shipped(100, 200, now_s=0.0)
    assert s.next_ship(limit=300) is None  # small: waits for the ack
    s.on_report(200, master_wrote=10**6, master_min=0, now_s=0.0)  # window: 4096 + 200
    assert s.next_ship(limit=300) == Ship(200, 100)
    s.on_shipped(200, 300, now_s=0.0)
    assert s.next_ship(limit=300 + 4096) == Ship(300, 4096)  # a full batch that fits: does not
    s.on_shipped(300, 300 + 4096, now_s=0.0)
    s.on_report(300 + 4096, master_wrote=10**6, master_min=0, now_s=0.0)
    assert s.next_ship(limit=300 + 4096 + 700) == Ship(300 + 4096, 700)  # all of it, once


def test_reports_going_backwards_or_past_what_was_shipped_close_the_stream() -> None:
    s = established(0)
    s.on_shipped(0, 500, now_s=0.0)
    assert s.on_report(500, master_wrote=500, master_min=0, now_s=0.0) == Accept(500)
    back = s.on_report(100, master_wrote=500, master_min=0, now_s=0.0)
    assert isinstance(back, Close) and back.kind == "protocol" and "backwards" in back.reason
    s = established(0)
    s.on_shipped(0, 500, now_s=0.0)
    past = s.on_report(900, master_wrote=5000, master_min=0, now_s=0.0)
    assert isinstance(past, Close) and "beyond what was shipped" in past.reason


def test_negative_and_below_first_offset_reports_are_protocol_errors() -> None:
    s = MasterSession("s1", CFG, now_s=0.0)
    d = s.on_report(-1, master_wrote=0, master_min=0, now_s=0.0)
    assert isinstance(d, Close) and d.kind == "protocol"
    s = MasterSession("s1", CFG, now_s=0.0)
    d = s.on_report(10, master_wrote=5000, master_min=4096, now_s=0.0)
    assert isinstance(d, Close) and "below this master's first offset" in d.reason
    assert not s.established


def test_slave_ahead_reject_closes_and_never_counts_as_acked() -> None:
    s = MasterSession("s1", CFG.with_(slave_ahead_policy=SlaveAheadPolicy.REJECT), now_s=0.0)
    d = s.on_report(9000, master_wrote=5000, master_min=0, now_s=0.0)
    assert isinstance(d, Close) and d.kind == "ahead" and "4000 bytes ahead" in d.reason
    assert not s.established and s.acked is None


def test_slave_ahead_trust_accepts_the_report_as_acked() -> None:
    s = MasterSession("s1", CFG.with_(slave_ahead_policy=SlaveAheadPolicy.TRUST), now_s=0.0)
    assert s.on_report(9000, master_wrote=5000, master_min=0, now_s=0.0) == Accept(9000)
    assert s.established and s.ahead_trusted and s.acked == 9000
    assert s.next_ship(limit=5000) is None  # nothing to ship until the master passes it
    assert s.next_ship(limit=9500) == Ship(9000, 500)


def test_slave_ahead_truncate_waits_for_the_cut_before_shipping() -> None:
    s = MasterSession("s1", CFG.with_(slave_ahead_policy=SlaveAheadPolicy.TRUNCATE), now_s=0.0)
    d = s.on_report(9000, master_wrote=5000, master_min=0, now_s=0.0)
    assert isinstance(d, SendTruncate) and d.offset == 5000
    assert not s.established and s.next_ship(limit=6000) is None
    # A heartbeat sent before the slave saw the Truncate changes nothing.
    assert isinstance(s.on_report(9000, master_wrote=5000, master_min=0, now_s=0.1), Ignore)
    assert s.on_report(5000, master_wrote=5000, master_min=0, now_s=0.2) == Accept(5000)
    assert s.established and s.next_ship(limit=6000) == Ship(5000, 1000)


def test_truncate_cuts_where_the_masters_own_writes_began() -> None:
    truncate = CFG.with_(slave_ahead_policy=SlaveAheadPolicy.TRUNCATE)
    # Ahead of the master's end, which took puts (5000 -> 6000) before the
    # slave's first report: the fork is where the master began, not its end.
    s = MasterSession("s1", truncate, now_s=0.0, began_at=5000)
    d = s.on_report(9000, master_wrote=6000, master_min=0, now_s=0.0)
    assert isinstance(d, SendTruncate) and d.offset == 5000
    assert s.on_report(5000, master_wrote=6000, master_min=0, now_s=0.1) == Accept(5000)
    assert s.next_ship(limit=6000) == Ship(5000, 1000)
    # "Ahead" is still judged by the master's end alone (classic HA): a
    # slave behind it is taken at its word.
    assert MasterSession("s1", truncate, now_s=0.0, began_at=5000).on_report(
        5500, master_wrote=7000, master_min=0, now_s=0.0) == Accept(5500)


def test_truncate_confirmed_at_the_wrong_offset_is_a_protocol_error() -> None:
    s = MasterSession("s1", CFG.with_(slave_ahead_policy=SlaveAheadPolicy.TRUNCATE), now_s=0.0)
    s.on_report(9000, master_wrote=5000, master_min=0, now_s=0.0)
    d = s.on_report(4000, master_wrote=5000, master_min=0, now_s=0.1)
    assert isinstance(d, Close) and d.kind == "protocol"


def test_heartbeat_and_housekeeping_follow_the_clock_passed_in() -> None:
    s = established(0)
    assert not s.heartbeat_due(0.5)
    assert s.heartbeat_due(1.0)
    s.on_sent(now_s=1.0)
    assert not s.heartbeat_due(1.5)
    assert s.wake_in(1.5) == pytest.approx(0.5)
    assert not s.expired(4.9)
    assert s.expired(5.0)  # no report for the housekeeping interval
    s.on_report(0, master_wrote=0, master_min=0, now_s=4.9)
    assert not s.expired(5.0)
    # The master's reader waits exactly until expired() holds.
    assert s.expires_in(5.0) == pytest.approx(4.9)
    assert s.expired(5.0 + s.expires_in(5.0)) and s.expires_in(20.0) == 0.0


# -------------------------------------------------------------- slave side
def test_slave_applies_only_ranges_at_its_own_offset() -> None:
    s = SlaveSession(100, CFG, now_s=0.0)
    assert s.on_range(100, 50, now_s=0.0) == Apply()
    s.applied(150)
    assert s.on_range(150, 0, now_s=0.1) == Heartbeat()
    d = s.on_range(100, 50, now_s=0.2)
    assert isinstance(d, Drop) and "range at 100" in d.reason and "150" in d.reason


def test_slave_truncate_only_backwards() -> None:
    s = SlaveSession(1000, CFG, now_s=0.0)
    assert s.on_truncate(400, now_s=0.0) == TruncateTo(400)
    s.truncated(400)
    assert s.max_offset == 400
    assert isinstance(s.on_truncate(500, now_s=0.0), Drop)
    assert isinstance(s.on_truncate(-1, now_s=0.0), Drop)


def test_slave_housekeeping_counts_from_the_last_message() -> None:
    s = SlaveSession(0, CFG, now_s=0.0)
    assert not s.expired(4.0)
    s.on_range(0, 0, now_s=4.0)
    assert not s.expired(8.9)
    assert s.expired(9.0)


# --------------------------------------------------------------- waiters
def test_replica_waits_resolve_in_end_order_as_acks_advance() -> None:
    q: ReplicaWaitQueue[str] = ReplicaWaitQueue()
    for end, name in [(300, "c"), (100, "a"), (200, "b"), (200, "b2")]:
        q.push(end, name)
    assert q.advance(99) == []
    assert q.advance(200) == ["a", "b", "b2"]
    assert len(q) == 1
    assert q.drain() == ["c"] and len(q) == 0


def test_config_validation_names_the_setting() -> None:
    with pytest.raises(ConfigError, match="housekeeping"):
        HAConfig(heartbeat_interval_ms=5000, housekeeping_interval_ms=5000).validate()
    with pytest.raises(ConfigError, match="window"):
        HAConfig(batch_bytes=1 << 20, window_bytes=1 << 19).validate()


# ------------------------------------------------------ property: invariants
events = st.lists(st.one_of(
    st.tuples(st.just("report"), st.integers(-5, 200_000)),
    st.tuples(st.just("ship"), st.integers(0, 200_000)),
    st.tuples(st.just("grow"), st.integers(0, 50_000)),
), max_size=60)


@settings(max_examples=300, deadline=None)
@given(first=st.integers(0, 100_000), evs=events,
       policy=st.sampled_from(list(SlaveAheadPolicy)))
def test_any_report_sequence_keeps_acked_le_shipped_and_never_raises(
        first: int, evs: list[tuple[str, int]], policy: SlaveAheadPolicy) -> None:
    cfg = CFG.with_(slave_ahead_policy=policy)
    s = MasterSession("s", cfg, now_s=0.0)
    wrote = 50_000
    closed = False
    d = s.on_report(first, master_wrote=wrote, master_min=0, now_s=0.0)
    closed = isinstance(d, Close)
    for kind, value in evs:
        if closed:
            break
        if kind == "grow":
            wrote += value
        elif kind == "ship":
            ship = s.next_ship(limit=wrote)
            if ship is not None:
                assert ship.max_bytes > 0 and ship.offset + ship.max_bytes <= wrote
                s.on_shipped(ship.offset, ship.offset + min(ship.max_bytes, value + 1),
                             now_s=0.0)
        else:
            d = s.on_report(value, master_wrote=wrote, master_min=0, now_s=0.0)
            assert isinstance(d, Accept | Ignore | Close | SendTruncate)
            closed = isinstance(d, Close)
        if s.established:
            assert s.acked is not None and s.shipped is not None
            assert s.acked <= s.shipped
            assert s.shipped - s.acked <= s.window <= cfg.window_bytes


# ------------------------------------------------- what a stream may hold
def test_a_peer_that_never_acks_holds_one_batch_and_expires_while_reporting() -> None:
    """A peer that keeps reporting its first offset but reads nothing gets one
    batch (not the whole window), and its stream expires one housekeeping
    interval after that batch went out, however often it reports."""
    s = established(0)
    s.on_shipped(0, 4096, now_s=1.0)
    assert s.next_ship(limit=10**6) is None
    for t in (2.0, 3.0, 4.0, 5.0):
        assert s.on_report(0, master_wrote=10**6, master_min=0, now_s=t) == Accept(0)
        assert s.next_ship(limit=10**6) is None
        assert s.expiry(t) is None
    assert s.expires_in(5.5) == pytest.approx(0.5)
    why = s.expiry(6.0)
    assert why is not None and "acknowledged none of the 4096 bytes" in why
    assert "not reading" in why


def test_acks_restart_the_stall_clock_and_a_caught_up_stream_never_stalls() -> None:
    s = established(0)
    s.on_shipped(0, 4096, now_s=0.0)
    s.on_report(1000, master_wrote=10**6, master_min=0, now_s=4.0)  # partial ack
    assert s.expiry(8.0) is None and s.expiry(9.0) is not None
    s.on_report(4096, master_wrote=10**6, master_min=0, now_s=8.5)  # all of it
    s.on_report(4096, master_wrote=10**6, master_min=0, now_s=13.0)
    assert s.unacked_since is None and s.expiry(17.0) is None


def test_the_window_grows_with_acks_only_up_to_window_bytes() -> None:
    s = established(0)
    acked = 0
    for _ in range(10):
        while (ship := s.next_ship(limit=10**6)) is not None:
            s.on_shipped(ship.offset, ship.offset + ship.max_bytes, now_s=0.0)
        assert s.shipped is not None and s.shipped - acked <= CFG.window_bytes
        acked = s.shipped
        s.on_report(acked, master_wrote=10**6, master_min=0, now_s=0.0)
    assert s.window == CFG.window_bytes


def test_streams_beyond_the_configured_slaves_and_margin_are_refused() -> None:
    cfg = CFG.with_(slaves=frozenset({"slave1", "slave2"}), extra_streams=1)
    assert stream_refusal("slave1", cfg, {"slave2", "x"}) is None  # configured: always
    assert stream_refusal("x", cfg, {"slave1", "slave2"}) is None  # the one extra
    why = stream_refusal("y", cfg, {"slave1", "x"})
    assert why is not None and "slave y is not one this master is configured with" in why
    assert "configured slaves: slave1, slave2" in why and "(x)" in why
    assert "--ha-slave" in why and "--ha-extra-streams" in why
    bare = CFG.with_(extra_streams=2)
    assert stream_refusal("a", bare, {"b"}) is None
    assert "no --ha-slave configured" in str(stream_refusal("c", bare, {"a", "b"}))


def test_ha_slave_names_and_the_margin_are_validated() -> None:
    with pytest.raises(ConfigError, match="--ha-slave name '../x' is not allowed"):
        HAConfig(slaves=frozenset({"../x"})).validate()
    with pytest.raises(ConfigError, match="--ha-extra-streams"):
        HAConfig(extra_streams=-1).validate()
