"""The broker's SendStream against real node processes: concurrent sends of
one client share one stream and each gets its own result; a slow put does
not hold up a later one; the stream needs the token; a malformed request
gets a clear error without losing the stream's other puts; a node killed or
stopped mid-stream leaves no send lost silently or hanging; puts a client
abandons still complete in the store."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Iterator

import grpc
import pytest
from support.ha_helpers import client, log_text, running_cluster, status, wait_connected, wait_until

from cluster.backends.local import LocalBackend
from cluster.client.node_client import AsyncNodeClient, SendOutcome, make_message
from cluster.node.role import Role
from cluster.node.send_stream import MAX_IN_FLIGHT
from cluster.node.wire import message_to_pb
from ha.credentials import token_metadata
from proto import broker_pb2, broker_pb2_grpc
from store.status import INDETERMINATE

METHOD = "/dlab.broker.Broker/SendStream"


# The master keeps a paused (silent) slave connected for 20 s, not 2: the
# tests that pause it want puts waiting for it, however long a loaded machine
# takes to get there.
PAUSED_SLAVE_STAYS = ("--ha-housekeeping-ms", "20000")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalBackend, str]]:
    # Slave timeout 3 s: a put waiting for a paused slave stays in flight
    # long enough, on a loaded machine too, for the tests that need it so.
    # Housekeeping 20 s: a paused slave stays connected meanwhile (dropped,
    # the puts would be refused SLAVE_NOT_AVAILABLE at once instead).
    with running_cluster(str(tmp_path_factory.mktemp("sendstream")), role=Role.SYNC_MASTER,
                         flush="SYNC_FLUSH", extra=PAUSED_SLAVE_STAYS + ("--slave-timeout-ms",
                                                                         "3000"),
                         connected=True) as (b, tok):
        yield b, tok


def _request(opaque: int, body: bytes, msg_id: str) -> broker_pb2.SendStreamRequest:
    return broker_pb2.SendStreamRequest(
        opaque=opaque, message=message_to_pb(make_message("t", body, msg_id=msg_id)))


def test_concurrent_sends_share_one_stream_and_each_gets_its_own_result(
        cluster: tuple[LocalBackend, str]) -> None:
    b, tok = cluster
    n = MAX_IN_FLIGHT * 2 + 100  # more than one stream may have in flight

    async def go() -> tuple[list[SendOutcome], int]:
        async with AsyncNodeClient(b.node("master").address, token=tok) as c:
            outs = await asyncio.gather(*(
                c.send(make_message("t", f"body-{i}".encode() * (1 + i % 7), msg_id=f"S{i}"))
                for i in range(n)), c.send(make_message("t", b"x" * (64 * 1024 + 1),
                                                        msg_id="too-big")))
            stream = c._stream
            assert stream is not None
            return list(outs), stream._next_opaque, stream.writes

    outs, opened, writes = asyncio.run(go())
    *ok, too_big = outs
    assert opened == n + 1  # every send went over the one stream
    assert writes < n // 4, f"{writes} stream messages for {n + 1} sends made at once"
    assert [o.status for o in ok] == ["PUT_OK"] * n
    assert [o.msg_id for o in ok] == [f"S{i}" for i in range(n)]
    assert too_big.status == "MESSAGE_ILLEGAL" and "exceeds max_message_size" in too_big.detail
    offsets = [o.offset for o in ok]
    assert len(set(offsets)) == n
    with client(b, tok) as c:
        for i in (0, 1, n // 2, n - 1):
            (rec,) = c.read(ok[i].offset or 0, max_bytes=1).records
            assert (rec.msg_id, rec.body) == (f"S{i}", f"body-{i}".encode() * (1 + i % 7))
            assert ok[i].size == rec.size
    # SYNC_MASTER: PUT_OK means the slave has it too.
    with client(b, tok, "slave1") as s:
        (rec,) = s.read(ok[n - 1].offset or 0, max_bytes=1).records
        assert rec.msg_id == f"S{n - 1}"


def test_a_slow_put_does_not_hold_up_a_later_one(cluster: tuple[LocalBackend, str]) -> None:
    b, tok = cluster
    b.pause("slave1")  # a put now waits the slave timeout (3 s)
    try:
        async def go() -> tuple[SendOutcome, SendOutcome, bool]:
            async with AsyncNodeClient(b.node("master").address, token=tok) as c:
                slow = asyncio.ensure_future(c.send(make_message("t", b"slow")))
                await asyncio.sleep(0.2)
                fast = await c.send(make_message("", b"no topic"))  # illegal: refused at once
                slow_pending = not slow.done()
                return await slow, fast, slow_pending
        slow, fast, slow_pending = asyncio.run(go())
    finally:
        b.resume("slave1")
    assert fast.status == "MESSAGE_ILLEGAL" and fast.latency_s < 2
    assert slow_pending  # the later put was answered while the slow one still waited
    assert slow.status == "FLUSH_SLAVE_TIMEOUT" and slow.latency_s > 2.9


def test_the_stream_needs_the_cluster_token(cluster: tuple[LocalBackend, str]) -> None:
    b, tok = cluster
    addr = b.node("master").address
    wrote = status(b, tok, "master")["wrote"]

    async def raw(metadata: tuple[tuple[str, str], ...]) -> tuple[grpc.StatusCode, str]:
        async with grpc.aio.insecure_channel(addr) as ch:
            call = broker_pb2_grpc.BrokerStub(ch).SendStream(metadata=metadata)
            # Read first: a write racing the refusal can fail client-side
            # and hide the server's status (see test_ha_auth).
            with contextlib.suppress(grpc.aio.AioRpcError):
                await call.read()
            return await call.code(), await call.details() or ""

    for metadata, why in ((token_metadata("not-the-token"), "wrong"), ((), "missing")):
        code, details = asyncio.run(raw(metadata))
        assert code == grpc.StatusCode.UNAUTHENTICATED
        assert f"{why} cluster token for {METHOD}" in details

    async def via_client() -> list[SendOutcome]:
        async with AsyncNodeClient(addr, token="not-the-token") as c:
            return list(await asyncio.gather(*(c.send(make_message("t", b"x"))
                                               for _ in range(3))))

    outs = asyncio.run(via_client())
    assert [o.status for o in outs] == [INDETERMINATE] * 3
    assert all("UNAUTHENTICATED" in o.detail for o in outs), [o.detail for o in outs]
    assert status(b, tok, "master")["wrote"] == wrote  # nothing was stored
    wait_until(lambda: f"refused {METHOD}" in log_text(b.node("master").log_path), 10,
               "the refusal in the master's log")


async def _raw_stream(address: str, token: str, frames: list[bytes], results: int
                      ) -> tuple[list[broker_pb2.SendStreamResult], grpc.StatusCode, str]:
    """Write raw frames on a SendStream, read `results` results (then, if the
    node ends the call, its status). A stream message carrying several
    results (`more`) counts as each of them."""
    async with grpc.aio.insecure_channel(address) as ch:
        call = ch.stream_stream(METHOD, response_deserializer=(
            broker_pb2.SendStreamResult.FromString))(metadata=token_metadata(token))
        for f in frames:
            await call.write(f)
        got: list[broker_pb2.SendStreamResult] = []
        try:
            async with asyncio.timeout(15):
                while len(got) < results:
                    r = await call.read()
                    if r is grpc.aio.EOF:
                        break
                    got += [r, *r.more]
                if len(got) == results:
                    await call.done_writing()
                while await call.read() is not grpc.aio.EOF:
                    pass
        except grpc.aio.AioRpcError as exc:
            return got, exc.code(), exc.details() or ""
        return got, await call.code(), await call.details() or ""


def test_a_request_without_a_message_gets_its_own_error_and_the_stream_goes_on(
        cluster: tuple[LocalBackend, str]) -> None:
    b, tok = cluster
    frames = [_request(1, b"one", "R1").SerializeToString(),
              broker_pb2.SendStreamRequest(opaque=2).SerializeToString(),
              _request(3, b"three", "R3").SerializeToString()]
    got, code, _ = asyncio.run(_raw_stream(b.node("master").address, tok, frames, 3))
    assert code == grpc.StatusCode.OK
    by_id = {r.opaque: r.result for r in got}
    assert set(by_id) == {1, 2, 3}
    assert by_id[2].status == broker_pb2.MESSAGE_ILLEGAL and "has no message" in by_id[2].detail
    assert by_id[1].status == by_id[3].status == broker_pb2.PUT_OK
    with client(b, tok) as c:
        assert [r.msg_id for r in c.read(by_id[1].offset, max_bytes=1).records] == ["R1"]
        assert [r.msg_id for r in c.read(by_id[3].offset, max_bytes=1).records] == ["R3"]


def test_an_undecodable_or_ambiguous_request_ends_the_stream_after_the_others_results(
        cluster: tuple[LocalBackend, str]) -> None:
    b, tok = cluster
    addr = b.node("master").address
    b.pause("slave1")  # the puts before the bad request are still in flight when it is read
    try:
        got, code, details = asyncio.run(_raw_stream(addr, tok, [
            _request(1, b"a", "U1").SerializeToString(),
            _request(2, b"b", "U2").SerializeToString(),
            b"\xff\xff\xff\xff"], 3))
        dup, dup_code, dup_details = asyncio.run(_raw_stream(addr, tok, [
            _request(7, b"c", "D7").SerializeToString(),
            _request(7, b"d", "D7bis").SerializeToString()], 2))
    finally:
        b.resume("slave1")
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "could not be decoded" in details
    assert sorted(r.opaque for r in got) == [1, 2]  # both answered before the end
    assert {r.result.status for r in got} == {broker_pb2.FLUSH_SLAVE_TIMEOUT}
    assert dup_code == grpc.StatusCode.INVALID_ARGUMENT and "already in flight" in dup_details
    assert [r.opaque for r in dup] == [7]
    with client(b, tok) as c:  # stored, as the results said; the node carries on
        for r in [*got, *dup]:
            assert len(c.read(r.result.offset, max_bytes=1).records) == 1
        wait_until(lambda: c.send(make_message("t", b"after")).status == "PUT_OK", 20,
                   "PUT_OK once the slave is back")
    assert "Traceback" not in log_text(b.node("master").log_path)


def test_requests_sent_in_one_message_are_each_taken_as_if_alone(
        cluster: tuple[LocalBackend, str]) -> None:
    """A stream message may carry further requests in `more`: each is put
    in order and answered under its own id (a missing message gets its own
    MESSAGE_ILLEGAL); nesting `more`, or reusing an id, ends the stream with
    INVALID_ARGUMENT after the results of the requests before it."""
    b, tok = cluster
    addr = b.node("master").address
    first = _request(1, b"m1", "M1")
    first.more.extend([_request(2, b"m2", "M2"), broker_pb2.SendStreamRequest(opaque=3),
                       _request(4, b"m4", "M4")])
    got, code, _ = asyncio.run(_raw_stream(addr, tok, [first.SerializeToString()], 4))
    assert code == grpc.StatusCode.OK
    by_id = {r.opaque: r.result for r in got}
    assert set(by_id) == {1, 2, 3, 4}
    assert by_id[3].status == broker_pb2.MESSAGE_ILLEGAL and "has no message" in by_id[3].detail
    assert [by_id[i].status for i in (1, 2, 4)] == [broker_pb2.PUT_OK] * 3
    assert by_id[1].offset < by_id[2].offset < by_id[4].offset  # in order
    with client(b, tok) as c:
        for i in (1, 2, 4):
            assert [r.msg_id for r in c.read(by_id[i].offset, max_bytes=1).records] == [f"M{i}"]

    nested = _request(5, b"n5", "N5")
    inner = _request(6, b"n6", "N6")
    inner.more.append(_request(7, b"n7", "N7"))
    nested.more.append(inner)
    got, code, details = asyncio.run(_raw_stream(addr, tok, [nested.SerializeToString()], 1))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "nests `more`" in details
    assert [(r.opaque, r.result.status) for r in got] == [(5, broker_pb2.PUT_OK)]

    dup = _request(8, b"d8", "D8")
    dup.more.extend([_request(9, b"d9", "D9"), _request(8, b"d8bis", "D8bis")])
    got, code, details = asyncio.run(_raw_stream(addr, tok, [dup.SerializeToString()], 2))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "already in flight" in details
    assert sorted(r.opaque for r in got) == [8, 9]
    assert "Traceback" not in log_text(b.node("master").log_path)


def _pending_sends(address: str, token: str, n: int, act: object) -> list[SendOutcome]:
    """Start n sends over one client's stream, run `act` while they wait (the
    slave is paused), return the outcomes."""
    async def go() -> list[SendOutcome]:
        async with AsyncNodeClient(address, token=token, timeout_s=60) as c:
            sends = [asyncio.ensure_future(c.send(make_message("t", os.urandom(500),
                                                               msg_id=f"P{i}")))
                     for i in range(n)]
            await asyncio.sleep(0.3)
            assert not any(s.done() for s in sends), "the puts should still be waiting"
            await asyncio.get_running_loop().run_in_executor(None, act)  # type: ignore[arg-type]
            return list(await asyncio.gather(*sends))
    return asyncio.run(go())


def test_killing_the_node_mid_stream_makes_pending_sends_indeterminate_at_once(
        tmp_path: str) -> None:
    with running_cluster(str(tmp_path), role=Role.SYNC_MASTER, flush="SYNC_FLUSH",
                         extra=PAUSED_SLAVE_STAYS + ("--slave-timeout-ms", "30000"),
                         connected=True) as (b, tok):
        addr = b.node("master").address
        b.pause("slave1")
        t0 = time.monotonic()
        outs = _pending_sends(addr, tok, 20, lambda: b.kill("master"))
        took = time.monotonic() - t0
        b.resume("slave1")
        assert [o.status for o in outs] == [INDETERMINATE] * 20
        assert all("UNAVAILABLE" in o.detail for o in outs), {o.detail for o in outs}
        # Not at the 30 s slave timeout, nor the 60 s send timeout (the
        # margin below them is for a loaded machine).
        assert took < 15
        # The same client object opens a new stream once the node is back.
        b.start("master")
        wait_connected(b, tok)

        async def again() -> list[str]:
            async with AsyncNodeClient(addr, token=tok) as c:
                first = await c.send(make_message("t", b"x"))
                return [first.status, (await c.send(make_message("t", b"y"))).status]
        assert asyncio.run(again()) == ["PUT_OK", "PUT_OK"]


def test_stopping_the_node_answers_the_puts_it_took_then_ends_the_stream(
        tmp_path: str) -> None:
    with running_cluster(str(tmp_path), role=Role.SYNC_MASTER, flush="SYNC_FLUSH",
                         extra=PAUSED_SLAVE_STAYS + ("--slave-timeout-ms", "30000"),
                         connected=True) as (b, tok):
        b.pause("slave1")
        t0 = time.monotonic()
        outs = _pending_sends(b.node("master").address, tok, 20, lambda: b.stop("master"))
        took = time.monotonic() - t0
        b.resume("slave1")
        # Stored on the master, never acked by the paused slave: the node
        # says so for each (not indeterminate), and its stop did not wait
        # for the 30 s slave timeout.
        assert [o.status for o in outs] == ["FLUSH_SLAVE_TIMEOUT"] * 20, {o.detail for o in outs}
        assert took < 15
        b.start("master")
        with client(b, tok) as c:
            for o in outs:
                (rec,) = c.read(o.offset or 0, max_bytes=1).records
                assert rec.msg_id == o.msg_id


def test_puts_a_client_abandons_still_complete_in_the_store(tmp_path: str) -> None:
    # The puts must still wait for the slave when the client gives up 0.3 s
    # later: a slave timeout no loaded machine comes near.
    with running_cluster(str(tmp_path), role=Role.SYNC_MASTER, flush="SYNC_FLUSH",
                         extra=PAUSED_SLAVE_STAYS + ("--slave-timeout-ms", "30000"),
                         connected=True) as (b, tok):
        b.pause("slave1")
        try:
            async def go() -> list[SendOutcome]:
                c = AsyncNodeClient(b.node("master").address, token=tok)
                sends = [asyncio.ensure_future(c.send(make_message("t", b"left",
                                                                   msg_id=f"A{i}")))
                         for i in range(10)]
                await asyncio.sleep(0.3)
                await c.close()  # cancels the stream while the puts wait for the slave
                return list(await asyncio.gather(*sends))
            outs = asyncio.run(go())
        finally:
            b.resume("slave1")
        assert [o.status for o in outs] == [INDETERMINATE] * 10
        assert all("CANCELLED" in o.detail for o in outs)
        with client(b, tok) as c:
            stored = {r.msg_id for r in c.read_all()}
        assert {f"A{i}" for i in range(10)} <= stored
