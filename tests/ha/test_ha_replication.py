"""Replication between real node processes over real gRPC on loopback:
byte-identical copies, a slave restarted mid-stream resuming from its own
offset, a slave failing in the middle of a window of ranges resent from its
own offset, a master restarted mid-stream re-joined."""

from __future__ import annotations

import contextlib
import os
import random
import threading
import time

from support.ha_helpers import (
    NO_FLUSH,
    SEGMENT,
    client,
    commitlog_bytes,
    log_text,
    running_cluster,
    send_n,
    slave_link,
    status,
    wait_caught_up,
    wait_connected,
    wait_until,
)

from cluster.backends.interface import BackendError
from cluster.client.node_client import make_message
from cluster.node.role import Role
from ha.config import ShipLimit
from ha.slave import UNFLUSHED_READ_LIMIT_BYTES


def _assert_identical(backend: object, master_dir: str, slave_dir: str) -> None:
    m, s = commitlog_bytes(master_dir), commitlog_bytes(slave_dir)
    assert list(m) == list(s), "different segment files"
    for name in m:
        assert m[name] == s[name], f"segment {name} differs"


def test_messages_replicate_byte_identically_across_segment_rolls(tmp_path: str) -> None:
    rng = random.Random(3)
    with running_cluster(str(tmp_path), role=Role.ASYNC_MASTER, flush="SYNC_FLUSH") as (b, tok):
        with client(b, tok) as c:
            msgs = [make_message("t", rng.randbytes(rng.randint(1, 9000)), msg_id=f"m{i}")
                    for i in range(400)]
            for i in range(0, 400, 40):
                outs = c.send_batch(msgs[i:i + 40])
                assert {o.status for o in outs} == {"PUT_OK"}
        wrote = wait_caught_up(b, tok)
        assert wrote > 4 * 256 * 1024  # several segments rolled
        # Clean stops flush both logs to disk; then the files must be equal.
        b.stop("slave1")
        b.stop("master")
        _assert_identical(b, b.node("master").data_dir, b.node("slave1").data_dir)


def test_slave_killed_mid_stream_resumes_from_its_own_offset(tmp_path: str) -> None:
    with running_cluster(str(tmp_path), role=Role.ASYNC_MASTER) as (b, tok):
        stop = threading.Event()
        sent: list[str] = []

        def load() -> None:
            with client(b, tok, timeout_s=30) as c:
                for i in range(3000):
                    if stop.is_set():
                        return
                    out = c.send(make_message("t", os.urandom(2000), msg_id=f"L{i}"))
                    sent.append(out.status)

        t = threading.Thread(target=load)
        t.start()
        try:
            wait_until(lambda: status(b, tok, "slave1")["wrote"] > 300_000, 30,
                       "the slave to receive data")
            b.kill("slave1")  # power model: it loses what it had not flushed
            b.start("slave1")
            recovered = status(b, tok, "slave1")["recovery"]["max_valid_offset"]
            wait_until(lambda: slave_link(b, tok).get("sessions", 0) >= 2, 20,
                       "a second stream")
        finally:
            stop.set()
            t.join(60)
        assert set(sent) == {"PUT_OK"}  # ASYNC_MASTER never waits for the slave
        master_log = log_text(b.node("master").log_path)
        assert f"reports max offset {recovered} " in master_log
        wait_caught_up(b, tok)
        b.stop("slave1")
        b.stop("master")
        _assert_identical(b, b.node("master").data_dir, b.node("slave1").data_dir)


def test_a_slave_failing_mid_window_is_resent_from_its_own_offset(tmp_path: str) -> None:
    """A window of ranges in flight is not delivered until reported: the
    slave dies after applying the 3rd of 16 ranges the master shipped without
    waiting (64 KiB batches, 1 MiB window, a 3 MiB backlog); the master then
    ships from the offset the slave recovers to, and the two logs end up
    byte-identical: nothing duplicated, nothing skipped."""
    window = ("--ha-batch-bytes", "64KiB", "--ha-window-bytes", "1MiB")
    with running_cluster(str(tmp_path), role=Role.ASYNC_MASTER, flush="SYNC_FLUSH",
                         extra=window) as (b, tok):
        b.stop("slave1")
        with client(b, tok) as c:
            for i in range(0, 700, 50):
                batch = [make_message("t", os.urandom(5000), msg_id=f"w{i + k}")
                         for k in range(50)]
                assert {o.status for o in c.send_batch(batch)} == {"PUT_OK"}
        backlog = status(b, tok, "master")["wrote"]
        assert backlog > 3 * 1024 * 1024
        b.set_failpoints("slave1", "slave_after_append_before_report=crash@3")
        slave_log = b.node("slave1").log_path
        with contextlib.suppress(BackendError):  # it may die before its health check
            b.start("slave1")
        wait_until(lambda: "failpoint slave_after_append_before_report fired"
                   in log_text(slave_log), 30, "the slave to die at its 3rd range")
        b.set_failpoints("slave1", "")

        def started() -> bool:
            try:
                b.start("slave1")
            except BackendError as exc:
                assert "already running" in str(exc)  # not yet reaped: try again
                return False
            return True

        wait_until(started, 30, "the slave to start again")
        assert wait_caught_up(b, tok) == backlog
        recovered = status(b, tok, "slave1")["recovery"]["max_valid_offset"]
        assert recovered < backlog
        assert f"reports max offset {recovered} " in log_text(b.node("master").log_path)
        b.stop("slave1")
        b.stop("master")
        _assert_identical(b, b.node("master").data_dir, b.node("slave1").data_dir)


def test_master_restarted_mid_stream_is_rejoined(tmp_path: str) -> None:
    with running_cluster(str(tmp_path), role=Role.SYNC_MASTER) as (b, tok):
        assert {o.status for o in send_n(b, tok, 50, prefix="a")} == {"PUT_OK"}
        b.restart("master")  # clean stop + start, same address
        wait_connected(b, tok)
        link = status(b, tok, "slave1")["master"]
        assert link["connects"] >= 2
        # SYNC_MASTER puts are acknowledged by the re-joined slave again.
        assert {o.status for o in send_n(b, tok, 50, prefix="b")} == {"PUT_OK"}
        wait_caught_up(b, tok)
        b.stop("slave1")
        b.stop("master")
        _assert_identical(b, b.node("master").data_dir, b.node("slave1").data_dir)


def test_ship_limit_flushed_ships_only_what_the_master_has_fsynced(tmp_path: str) -> None:
    with running_cluster(str(tmp_path), role=Role.ASYNC_MASTER, ship_limit=ShipLimit.FLUSHED,
                         master_extra=NO_FLUSH, connected=True) as (b, tok):
        assert status(b, tok, "master")["ha_ship_limit"] == "flushed"
        assert {o.status for o in send_n(b, tok, 20)} == {"PUT_OK"}
        m = status(b, tok, "master")
        assert m["wrote"] > 0 and m["flushed"] == 0
        time.sleep(1.0)  # heartbeats flow, bytes do not
        assert status(b, tok, "slave1")["wrote"] == 0
        assert slave_link(b, tok)["state"] == "connected"
        b.restart("master")  # a clean stop flushes; now it may ship
        wrote = wait_caught_up(b, tok)
        assert wrote == m["wrote"]
        # While more arrives, a slave never holds what the master has not fsynced.
        with client(b, tok) as c:
            for i in range(30):
                c.send(make_message("t", os.urandom(3000), msg_id=f"f{i}"))
                slave_wrote = status(b, tok, "slave1")["wrote"]
                assert slave_wrote <= status(b, tok, "master")["flushed"]


def test_master_drops_a_paused_slave_even_with_its_sends_blocked(tmp_path: str) -> None:
    """A slave paused in the middle of catch-up stops reading: the master's
    writes back up on HTTP/2 flow control. Housekeeping still closes the
    stream, and the resumed slave reconnects and catches up."""
    with running_cluster(str(tmp_path), role=Role.ASYNC_MASTER, connected=True) as (b, tok):
        b.pause("slave1")
        try:
            body = os.urandom(60_000)
            with client(b, tok) as c:
                for i in range(20):  # 20 x 20 x 60 KB = 24 MB: beyond every window
                    outs = c.send_batch([make_message("t", body, msg_id=f"p{i}-{k}")
                                         for k in range(20)])
                    assert {o.status for o in outs} == {"PUT_OK"}
            wait_until(lambda: slave_link(b, tok).get("state") == "disconnected", 10,
                       "housekeeping to drop the paused slave")
            assert "no report from the slave" in slave_link(b, tok)["detail"]
        finally:
            b.resume("slave1")
        wait_caught_up(b, tok, timeout_s=60)


def test_a_slave_holds_little_unflushed_even_when_it_never_flushes_by_itself(
        tmp_path: str) -> None:
    """Under the power model a slave holds the ranges it applied but has not
    flushed in memory. Past UNFLUSHED_READ_LIMIT_BYTES it stops reading ranges
    until a flush has written them: a slave with no flush schedule of its
    own, catching up a 44 MiB backlog, ends with at most that much (plus one
    range) unflushed; without the limit it would hold all of it."""
    with running_cluster(str(tmp_path), role=Role.ASYNC_MASTER,
                         slave_extra=NO_FLUSH) as (b, tok):
        b.stop("slave1")
        body = os.urandom(60_000)
        with client(b, tok) as c:
            for i in range(48):  # 48 x 16 x 60 KB = 44 MiB
                outs = c.send_batch([make_message("t", body, msg_id=f"u{i}-{k}")
                                     for k in range(16)])
                assert {o.status for o in outs} == {"PUT_OK"}
        b.start("slave1")
        wrote = wait_caught_up(b, tok, timeout_s=60)
        assert wrote > UNFLUSHED_READ_LIMIT_BYTES + 8 * 1024 * 1024
        slave = status(b, tok, "slave1")
        assert slave["flushed"] > 0, "the slave flushed nothing: it read without a limit"
        assert wrote - slave["flushed"] <= UNFLUSHED_READ_LIMIT_BYTES + SEGMENT
