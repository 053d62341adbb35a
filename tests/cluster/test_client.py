"""The client against real nodes: results carry status, offset, size and
message id; reads return what was stored; failed or timed-out calls are
INDETERMINATE, never lost; `dlab send` reports counts and percentiles."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
from support.ha_helpers import client, running_cluster, status

from cluster.backends.local import LocalBackend
from cluster.backends.procs import free_ports
from cluster.client.node_client import AsyncNodeClient, NodeCallError, NodeClient, make_message
from cluster.node.role import Role
from store.status import INDETERMINATE

# The module-scoped cluster below is started once: under pytest-xdist
# (scripts/test) this module's tests share one worker.
pytestmark = pytest.mark.xdist_group("test_client")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalBackend, str]]:
    with running_cluster(str(tmp_path_factory.mktemp("client")), role=Role.SYNC_MASTER,
                         flush="SYNC_FLUSH", connected=True) as (b, tok):
        yield b, tok


def test_send_results_carry_status_offset_size_and_id_and_read_returns_them(
        cluster: tuple[LocalBackend, str]) -> None:
    b, tok = cluster
    with client(b, tok) as c:
        msg = make_message("orders", b"hello world", msg_id="ID-1")
        out = c.send(msg)
        assert out.status == "PUT_OK" and out.msg_id == "ID-1"
        assert out.offset is not None and out.size is not None and out.size > len(b"hello")
        assert out.complete_ms >= out.invoke_ms > 0
        batch = c.send_batch([make_message("orders", bytes([i]) * 100, msg_id=f"B{i}")
                              for i in range(5)])
        assert [o.status for o in batch] == ["PUT_OK"] * 5
        offsets = [o.offset for o in batch]
        assert offsets == sorted(offsets) and offsets[0] >= out.offset + out.size
        (rec,) = c.read(out.offset, max_bytes=1).records
        assert (rec.msg_id, rec.topic, rec.body, rec.offset) == ("ID-1", "orders",
                                                                 b"hello world", out.offset)
        recs = c.read_all(batch[0].offset)
        assert [r.msg_id for r in recs[:5]] == [f"B{i}" for i in range(5)]
        # The same record from the slave (SYNC_MASTER: PUT_OK means a slave has it).
    with client(b, tok, "slave1") as s:
        (srec,) = s.read(out.offset, max_bytes=1).records
        assert srec.msg_id == "ID-1" and srec.body == b"hello world"


def test_illegal_messages_are_refused_and_named(cluster: tuple[LocalBackend, str]) -> None:
    b, tok = cluster
    with client(b, tok) as c:
        too_big = c.send(make_message("t", b"x" * (64 * 1024 + 1)))
        no_topic = c.send(make_message("", b"x"))
    assert too_big.status == "MESSAGE_ILLEGAL" and "exceeds max_message_size" in too_big.detail
    assert no_topic.status == "MESSAGE_ILLEGAL" and "topic" in no_topic.detail
    assert too_big.offset is None and no_topic.offset is None


def test_a_node_that_is_not_there_gives_indeterminate_not_an_exception() -> None:
    (port,) = free_ports(1)
    # Refused at once; the deadline is only a bound (a loaded machine).
    with NodeClient(f"127.0.0.1:{port}", token="t", timeout_s=10) as c:
        out = c.send(make_message("t", b"x", msg_id="gone"))
        assert out.status == INDETERMINATE and out.indeterminate
        assert out.msg_id == "gone" and out.offset is None
        assert "UNAVAILABLE" in out.detail
        with pytest.raises(NodeCallError, match="is the node running"):
            c.status()


def test_a_paused_master_times_out_as_indeterminate(cluster: tuple[LocalBackend, str]) -> None:
    b, tok = cluster
    b.pause("master")
    try:
        async def go() -> list[str]:
            async with AsyncNodeClient(b.node("master").address, token=tok,
                                       timeout_s=0.5) as c:
                outs = await asyncio.gather(c.send(make_message("t", b"x")),
                                            *[c.send_batch([make_message("t", b"y")])])
                return [outs[0].status, outs[1][0].status]
        assert asyncio.run(go()) == [INDETERMINATE, INDETERMINATE]
    finally:
        b.resume("master")
    with client(b, tok) as c:
        assert c.send(make_message("t", b"z")).status == "PUT_OK"


def test_status_dict_has_positions_policies_and_links(cluster: tuple[LocalBackend, str]) -> None:
    b, tok = cluster
    m = status(b, tok, "master")
    assert m["role"] == "SYNC_MASTER" and m["flush_mode"] == "SYNC_FLUSH"
    assert m["slave_ahead_policy"] == "reject" and m["ha_ship_limit"] == "wrote"
    assert isinstance(m["wrote"], int) and m["flushed"] <= m["wrote"]
    assert m["slaves"][0]["slave"] == "slave1" and m["slaves"][0]["state"] == "connected"
    assert m["config"]["ha"]["slave_timeout_ms"] == 1000
    assert m["recovery"]["summary"]
    s = status(b, tok, "slave1")
    assert s["role"] == "SLAVE" and s["master"]["state"] == "streaming"
    assert "slaves" in s and s["slaves"] == []


def test_dlab_send_prints_counts_and_percentiles(cluster: tuple[LocalBackend, str]) -> None:
    b, _ = cluster
    send = [sys.executable, "-m", "cluster.cli", "send", "--dir", b.directory or "",
            "--count", "60", "--size", "512", "--concurrency", "4", "--rate", "300"]
    r = subprocess.run(send, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert lines[0].startswith("sent 60 of 60 messages of 512 bytes")
    assert any(line.startswith("PUT_OK") and " 60 " in f" {line} " for line in lines)
    assert "p99 ms" in lines[1]
    r = subprocess.run([*send, "--json"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)  # the whole of stdout: nothing but the JSON
    assert summary["counts"] == {"PUT_OK": 60}
    assert summary["elapsed_s"] >= 59 / 300  # paced by --rate
    assert set(summary["latency_ms"]["all"]) == {"p50", "p90", "p99", "max"}


@pytest.mark.parametrize("args, message", [
    (["--count", "0"], "must be at least 1"),
    (["--size", "lots"], "is not a size"),
    (["--rate", "-3"], "must be 0 or more"),
    (["--to", "nowhere"], "expected HOST:PORT"),
])
def test_dlab_send_bad_arguments_are_named(cluster: tuple[LocalBackend, str],
                                           args: list[str], message: str) -> None:
    b, _ = cluster
    base = ["--to", "127.0.0.1:1"] if "--to" not in args else []
    r = subprocess.run([sys.executable, "-m", "cluster.cli", "send", *base, *args],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr


def test_dlab_send_to_without_a_token_file_says_so(tmp_path: str) -> None:
    r = subprocess.run([sys.executable, "-m", "cluster.cli", "send", "--target", "127.0.0.1:1"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--target needs --token-file" in r.stderr
    # --to, the old name, still works and says it is deprecated.
    r = subprocess.run([sys.executable, "-m", "cluster.cli", "send", "--to", "127.0.0.1:1"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--target needs --token-file" in r.stderr
    assert "--to is deprecated: use --target" in r.stderr
    r = subprocess.run([sys.executable, "-m", "cluster.cli", "send", "--dir",
                        os.path.join(tmp_path, "none")], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and "no cluster in" in r.stderr and "Traceback" not in r.stderr
