"""SYNC_MASTER put semantics with real processes: SLAVE_NOT_AVAILABLE at once
(no slave; slave too far behind), FLUSH_SLAVE_TIMEOUT with a paused slave,
PUT_OK again after resume; ASYNC_MASTER never waits; a slave refuses puts."""

from __future__ import annotations

import asyncio
import os

from support.ha_helpers import client, running_cluster, send_n, slave_link, wait_until

from cluster.client.node_client import AsyncNodeClient, SendOutcome, make_message
from cluster.node.role import Role


def test_no_slave_means_slave_not_available_at_once_and_the_message_is_stored(
        tmp_path: str) -> None:
    # A slave timeout far above a put's time even on a loaded machine: "at
    # once" is "long before the timeout".
    with running_cluster(str(tmp_path), role=Role.SYNC_MASTER, flush="SYNC_FLUSH",
                         slaves=0, extra=("--slave-timeout-ms", "10000")) as (b, tok):
        outs = send_n(b, tok, 5, timeout_s=30)
        assert [o.status for o in outs] == ["SLAVE_NOT_AVAILABLE"] * 5
        assert max(o.latency_s for o in outs) < 5  # not after slave_timeout (10 s)
        assert "no slave is connected" in outs[0].detail
        with client(b, tok) as c:
            (rec,) = c.read(outs[2].offset, max_bytes=1).records
        assert rec.msg_id == outs[2].msg_id  # stored on the master, as the status says


async def _burst(address: str, token: str, n: int, size: int) -> list[SendOutcome]:
    async with AsyncNodeClient(address, token=token, timeout_s=30) as c:
        return list(await asyncio.gather(*(
            c.send(make_message("t", os.urandom(size), msg_id=f"g{i}")) for i in range(n))))


def test_paused_slave_gives_flush_slave_timeout_then_gap_then_put_ok_after_resume(
        tmp_path: str) -> None:
    # gap 64 KiB; slave timeout 4 s; housekeeping 20 s (the paused slave still
    # counts as connected while the puts wait, however slow a loaded machine).
    with running_cluster(str(tmp_path), role=Role.SYNC_MASTER,
                         extra=("--ha-max-gap-bytes", "64KiB", "--ha-housekeeping-ms",
                                "20000", "--slave-timeout-ms", "4000"),
                         connected=True) as (b, tok):
        assert {o.status for o in send_n(b, tok, 3)} == {"PUT_OK"}
        b.pause("slave1")
        try:
            outs = asyncio.run(_burst(b.node("master").address, tok, 30, 4000))
            by_status: dict[str, list[SendOutcome]] = {}
            for o in outs:
                by_status.setdefault(o.status, []).append(o)
            assert set(by_status) == {"FLUSH_SLAVE_TIMEOUT", "SLAVE_NOT_AVAILABLE"}, by_status
            # Within the gap: waited the slave timeout (4 s), then gave up.
            assert all(3.9 < o.latency_s < 20 for o in by_status["FLUSH_SLAVE_TIMEOUT"])
            # Beyond the gap: refused at once (before the slave timeout)
            # although the slave is "connected".
            gap = by_status["SLAVE_NOT_AVAILABLE"]
            assert all(o.latency_s < 3.9 for o in gap)
            assert "behind" in gap[0].detail
            ends = sorted((o.offset or 0) + (o.size or 0) for o in outs)
            acked = slave_link(b, tok)["acked"]
            assert all(end - acked >= 64 * 1024 for end in
                       [(o.offset or 0) + (o.size or 0) for o in gap])
            assert ends[0] - acked < 64 * 1024
            assert slave_link(b, tok)["state"] == "connected"
        finally:
            b.resume("slave1")
        # After resume the slave acks again: a put comes back PUT_OK.
        def put_ok() -> bool:
            return send_n(b, tok, 1, prefix="after")[0].status == "PUT_OK"
        wait_until(put_ok, 20, "PUT_OK after resume")


def test_async_master_never_waits_for_a_slave(tmp_path: str) -> None:
    # Were it to wait for the paused slave, each put would take the slave
    # timeout (10 s here); a loaded machine takes nothing like that per put.
    with running_cluster(str(tmp_path), role=Role.ASYNC_MASTER, connected=True,
                         extra=("--slave-timeout-ms", "10000")) as (b, tok):
        b.pause("slave1")
        try:
            outs = send_n(b, tok, 20, timeout_s=30)
            assert {o.status for o in outs} == {"PUT_OK"}
            assert max(o.latency_s for o in outs) < 5
        finally:
            b.resume("slave1")
        # A slave refuses puts: it is not the node to write to.
        with client(b, tok, "slave1") as c:
            out = c.send(make_message("t", b"x"))
        assert out.status == "SERVICE_NOT_AVAILABLE"
        assert "SLAVE" in out.detail and out.offset is None


def test_sync_master_sync_flush_waits_for_disk_and_slave_in_parallel(tmp_path: str) -> None:
    with running_cluster(str(tmp_path), role=Role.SYNC_MASTER, flush="SYNC_FLUSH",
                         connected=True) as (b, tok):
        outs = send_n(b, tok, 30)
        assert {o.status for o in outs} == {"PUT_OK"}
        from support.ha_helpers import status

        st = status(b, tok, "master")
        last_end = max((o.offset or 0) + (o.size or 0) for o in outs)
        # PUT_OK under SYNC_MASTER+SYNC_FLUSH: on the master's disk and in a slave.
        assert st["flushed"] >= last_end
        assert slave_link(b, tok)["acked"] >= last_end
