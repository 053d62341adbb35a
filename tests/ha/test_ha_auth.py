"""The cluster token guards broker and HA RPCs (health and reflection stay
open), and malformed or out-of-range HA reports close only their own stream:
the master keeps serving and replicating."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from support.ha_helpers import (
    client,
    log_text,
    running_cluster,
    send_n,
    slave_link,
    status,
    wait_caught_up,
    wait_until,
)

from cluster.backends.local import LocalBackend
from cluster.client.node_client import NodeCallError, NodeClient, make_message
from cluster.node.auth import write_token_file
from ha.credentials import token_metadata
from proto import broker_pb2, broker_pb2_grpc, ha_pb2, ha_pb2_grpc

# The module-scoped cluster below is started once: under pytest-xdist
# (scripts/test) this module's tests share one worker.
pytestmark = pytest.mark.xdist_group("test_ha_auth")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalBackend, str]]:
    with running_cluster(str(tmp_path_factory.mktemp("auth")), connected=True) as (b, tok):
        yield b, tok


def test_wrong_or_missing_token_is_refused_with_a_clear_error_and_logged(
        cluster: tuple[LocalBackend, str]) -> None:
    b, tok = cluster
    addr = b.node("master").address
    wrote = status(b, tok, "master")["wrote"]
    with NodeClient(addr, token="not-the-token") as c:
        out = c.send(make_message("t", b"x"))
        assert out.indeterminate  # the client cannot know more than that the call failed
        assert "UNAUTHENTICATED" in out.detail and "wrong cluster token" in out.detail
        with pytest.raises(NodeCallError, match="UNAUTHENTICATED.*cluster's token file"):
            c.status()
    with grpc.insecure_channel(addr) as ch:  # no metadata at all
        with pytest.raises(grpc.RpcError) as exc:
            broker_pb2_grpc.BrokerStub(ch).Status(broker_pb2.StatusRequest(), timeout=5)
        assert exc.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "missing cluster token" in exc.value.details()
    assert status(b, tok, "master")["wrote"] == wrote  # nothing was stored
    text = log_text(b.node("master").log_path)
    assert "refused /dlab.broker.Broker/Send from ipv4:127.0.0.1:" in text
    assert "wrong token" in text and "missing token" in text


def test_replication_stream_with_a_wrong_token_is_refused(
        cluster: tuple[LocalBackend, str]) -> None:
    b, _ = cluster

    async def go() -> grpc.StatusCode:
        async with grpc.aio.insecure_channel(b.node("master").address) as ch:
            call = ha_pb2_grpc.HAStub(ch).Replicate(metadata=token_metadata("bad"))
            # No write first: the refusal comes before any message is read,
            # and a write racing it fails on the client side (INTERNAL),
            # hiding the server's status.
            with contextlib.suppress(grpc.aio.AioRpcError):
                await call.read()
            return await call.code()

    assert asyncio.run(go()) == grpc.StatusCode.UNAUTHENTICATED
    # The node logs the refusal; its log line may land just after the reply.
    wait_until(lambda: "refused /dlab.ha.HA/Replicate" in log_text(b.node("master").log_path),
               10, "the refusal in the master's log")


def test_health_and_reflection_need_no_token(cluster: tuple[LocalBackend, str]) -> None:
    b, _ = cluster
    with grpc.insecure_channel(b.node("master").address) as ch:
        resp = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert resp.status == health_pb2.HealthCheckResponse.SERVING
        stub = reflection_pb2_grpc.ServerReflectionStub(ch)
        (answer,) = list(stub.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5))
        names = {s.name for s in answer.list_services_response.service}
        assert {"dlab.broker.Broker", "dlab.ha.HA", "grpc.health.v1.Health"} <= names


async def _stream(address: str, token: str, reports: list[object], raw: bool = False
                  ) -> tuple[grpc.StatusCode, str]:
    """Open a replication stream, send `reports` (Report messages, or raw bytes
    with raw=True), read until the master ends the stream."""
    async with grpc.aio.insecure_channel(address) as ch:
        if raw:
            call = ch.stream_stream("/dlab.ha.HA/Replicate")(metadata=token_metadata(token))
        else:
            call = ha_pb2_grpc.HAStub(ch).Replicate(metadata=token_metadata(token))
        for r in reports:
            await call.write(r)
        try:
            async with asyncio.timeout(10):
                while await call.read() is not grpc.aio.EOF:
                    pass
        except grpc.aio.AioRpcError as exc:
            return exc.code(), exc.details() or ""
        except TimeoutError:
            call.cancel()
            return grpc.StatusCode.DEADLINE_EXCEEDED, "the master kept the stream open"
        return await call.code(), await call.details() or ""


def test_malformed_and_out_of_range_reports_do_not_crash_the_master(
        cluster: tuple[LocalBackend, str]) -> None:
    b, tok = cluster
    addr = b.node("master").address
    assert {o.status for o in send_n(b, tok, 5)} == {"PUT_OK"}
    wrote = status(b, tok, "master")["wrote"]

    code, details = asyncio.run(_stream(addr, tok, [ha_pb2.Report(max_offset=-7, slave="x1")]))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "negative max offset" in details

    code, details = asyncio.run(_stream(addr, tok, [
        ha_pb2.Report(max_offset=0, slave="x2"), ha_pb2.Report(max_offset=2**62, slave="x2")]))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "beyond what was shipped" in details

    code, details = asyncio.run(_stream(addr, tok, [
        ha_pb2.Report(max_offset=wrote, slave="x3"), ha_pb2.Report(max_offset=1, slave="x3")]))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "backwards" in details

    # A first report far beyond the master: the slave-ahead case (reject).
    code, details = asyncio.run(_stream(addr, tok, [ha_pb2.Report(max_offset=2**62,
                                                                  slave="x4")]))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "ahead of this master" in details

    # Bytes that are not a Report at all.
    code, _ = asyncio.run(_stream(addr, tok, [b"\xff\xff\xff\xff garbage"], raw=True))
    assert code != grpc.StatusCode.OK

    # The master is alive, still replicating to its real slave.
    assert {o.status for o in send_n(b, tok, 5, prefix="after")} == {"PUT_OK"}
    wait_caught_up(b, tok)
    assert slave_link(b, tok)["state"] == "connected"
    assert "Traceback" not in log_text(b.node("master").log_path)


def test_malformed_broker_requests_get_invalid_argument_not_a_traceback(
        cluster: tuple[LocalBackend, str]) -> None:
    b, tok = cluster
    with grpc.insecure_channel(b.node("master").address) as ch:
        for method in ("/dlab.broker.Broker/Send", "/dlab.broker.Broker/SendBatch",
                       "/dlab.broker.Broker/Read"):
            with pytest.raises(grpc.RpcError) as exc:
                ch.unary_unary(method)(b"\xff\xff\xff\xff garbage",
                                       metadata=token_metadata(tok), timeout=5)
            assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert f"malformed request to {method}" in exc.value.details()
    # Well-formed but out of range: a clear OUT_OF_RANGE, the node carries on.
    with client(b, tok) as c:
        with pytest.raises(NodeCallError, match="OUT_OF_RANGE.*outside this node's log"):
            c.read(10**15)
        assert c.status().wrote >= 0
    assert "Traceback" not in log_text(b.node("master").log_path)


def test_dlab_send_with_a_wrong_token_exits_2_with_one_line(
        cluster: tuple[LocalBackend, str], tmp_path: str) -> None:
    b, _ = cluster
    wrong = os.path.join(tmp_path, "wrong-token")
    write_token_file(wrong, "nope")
    r = subprocess.run([sys.executable, "-m", "cluster.cli", "send", "--to",
                        b.node("master").address, "--token-file", wrong, "--count", "2"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "refused the token" in r.stderr and "Traceback" not in r.stderr
    with client(b, cluster[1]) as c:
        assert c.status().wrote > 0


def test_a_slave_name_is_bounded_and_a_connected_slave_cannot_be_displaced(
        cluster: tuple[LocalBackend, str]) -> None:
    """The name a report gives is checked (it shows in status and logs), and
    a second stream naming a connected slave is refused instead of closing
    the real slave's stream."""
    b, tok = cluster
    addr = b.node("master").address
    assert {o.status for o in send_n(b, tok, 1, prefix="first")} == {"PUT_OK"}
    wait_caught_up(b, tok)
    before = slave_link(b, tok)
    assert before["state"] == "connected"
    for name, code, says in (
            ("x" * 100_000, grpc.StatusCode.INVALID_ARGUMENT, "100000 characters long"),
            ("../evil", grpc.StatusCode.INVALID_ARGUMENT, "slave name '../evil' is not allowed"),
            ("", grpc.StatusCode.INVALID_ARGUMENT, "slave name is empty"),
            ("slave1", grpc.StatusCode.ALREADY_EXISTS, "slave slave1 is connected from")):
        got, details = asyncio.run(_stream(addr, tok, [ha_pb2.Report(max_offset=0, slave=name)]))
        assert got == code and says in details, (name[:20], got, details)
    after = slave_link(b, tok)
    assert after["state"] == "connected" and after["sessions"] == before["sessions"]
    assert after["connected_since_ms"] == before["connected_since_ms"]
    names = [s["slave"] for s in status(b, tok, "master")["slaves"]]
    assert "slave1" in names and max(len(n) for n in names) <= 64
    assert {o.status for o in send_n(b, tok, 3, prefix="named")} == {"PUT_OK"}
    wait_caught_up(b, tok)
    assert "Traceback" not in log_text(b.node("master").log_path)
