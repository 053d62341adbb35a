"""A master killed under the power model with ASYNC_FLUSH comes back with
less than its slave holds: the slave is ahead. Each slave_ahead_policy then
does what ha/session.py decides for a first report beyond the master
(reject: close the link, both logs kept; trust: believe the slave; truncate:
the slave cuts back to the master), with real processes and a real SIGKILL.

Setup for each policy: SYNC_MASTER + ASYNC_FLUSH, a master that never
flushes on its own (slaves flush every 50 ms). Batch A is sent and made
durable on the master by a clean restart; batch B is acknowledged PUT_OK (the
slave holds it, on disk) but lives only in the master's memory; SIGKILL the
master, start it again: it recovers to the end of A, the slave holds A+B."""

from __future__ import annotations

from support.ha_helpers import (
    NO_FLUSH,
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

from cluster.backends.local import LocalBackend
from cluster.node.role import Role
from ha.config import SlaveAheadPolicy


def _make_slave_ahead(b: LocalBackend, tok: str, *, slave_down: bool = False
                      ) -> tuple[int, int]:
    """Returns (master offset after recovery, slave offset). With
    `slave_down` the slave is stopped (cleanly) before the master's kill and
    left down."""
    wait_connected(b, tok)
    assert {o.status for o in send_n(b, tok, 20, prefix="A")} == {"PUT_OK"}
    b.restart("master")  # clean: A is flushed
    wait_connected(b, tok)
    a_end = status(b, tok, "master")["flushed"]
    outs = send_n(b, tok, 20, prefix="B")
    assert {o.status for o in outs} == {"PUT_OK"}  # the slave acked B
    slave_wrote = wait_caught_up(b, tok)
    wait_until(lambda: status(b, tok, "slave1")["flushed"] == slave_wrote, 10,
               "B on the slave's disk")
    assert status(b, tok, "master")["flushed"] == a_end  # B only in the master's memory
    if slave_down:
        b.stop("slave1")
    b.kill("master")
    b.start("master")
    master_wrote = status(b, tok, "master")["wrote"]
    assert master_wrote == a_end < slave_wrote
    return master_wrote, slave_wrote


def test_reject_keeps_both_logs_and_refuses_the_slave(tmp_path: str) -> None:
    with running_cluster(str(tmp_path), policy=SlaveAheadPolicy.REJECT,
                         master_extra=NO_FLUSH) as (b, tok):
        master_wrote, slave_wrote = _make_slave_ahead(b, tok)
        wait_until(lambda: slave_link(b, tok).get("state") == "rejected", 20, "a rejection")
        link = slave_link(b, tok)
        assert f"{slave_wrote - master_wrote} bytes ahead" in link["detail"]
        assert "reject" in log_text(b.node("master").log_path)
        slave_view = status(b, tok, "slave1")["master"]
        assert "FAILED_PRECONDITION" in slave_view["last_error"]
        # Both logs stay as they are, and the master has no slave to count on.
        assert status(b, tok, "slave1")["wrote"] == slave_wrote
        out = send_n(b, tok, 1, prefix="C")[0]
        assert out.status == "SLAVE_NOT_AVAILABLE"
        assert status(b, tok, "slave1")["wrote"] == slave_wrote


def test_trust_lets_a_sync_master_ack_what_no_slave_holds(tmp_path: str) -> None:
    with running_cluster(str(tmp_path), policy=SlaveAheadPolicy.TRUST,
                         master_extra=NO_FLUSH) as (b, tok):
        master_wrote, slave_wrote = _make_slave_ahead(b, tok)
        wait_until(lambda: slave_link(b, tok).get("acked") == slave_wrote, 20,
                   "the master to trust the slave's report")
        assert slave_link(b, tok)["state"] == "connected"
        assert "trusted" in slave_link(b, tok)["detail"]
        # apache/rocketmq#3015: a new message below the trusted offset is
        # acknowledged PUT_OK at once...
        (out,) = send_n(b, tok, 1, prefix="C")
        assert out.status == "PUT_OK"
        assert out.offset == master_wrote and out.offset + out.size <= slave_wrote
        # ...but the slave holds other bytes there (a record of batch B), not it.
        with client(b, tok, "slave1") as c:
            chunk = c.read(out.offset, max_bytes=1)
        assert chunk.records and chunk.records[0].msg_id != out.msg_id
        assert chunk.records[0].msg_id.startswith("B")
        assert status(b, tok, "slave1")["wrote"] == slave_wrote


def test_truncate_cuts_the_slave_to_the_master_and_resumes(tmp_path: str) -> None:
    with running_cluster(str(tmp_path), policy=SlaveAheadPolicy.TRUNCATE,
                         master_extra=NO_FLUSH) as (b, tok):
        master_wrote, slave_wrote = _make_slave_ahead(b, tok)
        wait_until(lambda: status(b, tok, "slave1")["master"]["truncations"] == 1, 20,
                   "the slave to truncate")
        wait_connected(b, tok)
        assert status(b, tok, "slave1")["wrote"] == master_wrote
        assert {o.status for o in send_n(b, tok, 10, prefix="C")} == {"PUT_OK"}
        wait_caught_up(b, tok)
        b.stop("slave1")
        b.stop("master")
        m = commitlog_bytes(b.node("master").data_dir)
        s = commitlog_bytes(b.node("slave1").data_dir)
        assert m == s  # B is gone from the slave; C follows A on both


def test_truncate_cuts_where_the_restarted_master_began_when_it_took_puts_first(
        tmp_path: str) -> None:
    """The restarted master takes puts (C) before the slave's first report:
    the slave is still ahead of the master's end, but the fork is where the
    master's own writes began (its recovered end), not its end at the
    report. Cut there, the slave drops B and takes C from the master; cut at
    the master's end, it would keep B's first records where the master holds
    C (or refuse a cut inside a record)."""
    with running_cluster(str(tmp_path), policy=SlaveAheadPolicy.TRUNCATE,
                         master_extra=NO_FLUSH) as (b, tok):
        master_wrote, slave_wrote = _make_slave_ahead(b, tok, slave_down=True)
        # With no slave a SYNC_MASTER still appends the put (RocketMQ too).
        assert {o.status for o in send_n(b, tok, 3, prefix="C")} == {"SLAVE_NOT_AVAILABLE"}
        assert master_wrote < status(b, tok, "master")["wrote"] < slave_wrote
        b.start("slave1")
        wait_until(lambda: status(b, tok, "slave1")["master"]["truncations"] == 1, 20,
                   "the slave to truncate")
        wait_connected(b, tok)
        assert {o.status for o in send_n(b, tok, 5, prefix="D")} == {"PUT_OK"}
        wait_caught_up(b, tok)
        b.stop("slave1")
        b.stop("master")
        assert commitlog_bytes(b.node("master").data_dir) == \
            commitlog_bytes(b.node("slave1").data_dir)  # A, C, D on both; B gone


def test_truncate_survives_a_slave_kill_right_after_the_cut(tmp_path: str) -> None:
    """The cut is durable before the slave reports it: B is on the slave's
    disk (it flushes every 50 ms), the slave truncates, is SIGKILLed and
    restarted; the truncated tail does not come back."""
    with running_cluster(str(tmp_path), policy=SlaveAheadPolicy.TRUNCATE,
                         master_extra=NO_FLUSH, role=Role.SYNC_MASTER) as (b, tok):
        master_wrote, _ = _make_slave_ahead(b, tok)
        wait_until(lambda: status(b, tok, "slave1")["master"]["truncations"] == 1, 20,
                   "the slave to truncate")
        b.kill("slave1")
        b.start("slave1")
        assert status(b, tok, "slave1")["wrote"] == master_wrote
        wait_connected(b, tok)
        assert slave_link(b, tok)["acked"] == master_wrote
