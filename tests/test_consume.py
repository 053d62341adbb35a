"""The consume side through real nodes: Pull, offsets on the broker and in a
local file, a consumer process SIGKILLed between commits, a broker crash
before its offset table is persisted, a slave copying its master's table,
and the token and argument checks on every new RPC."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from ha_helpers import running_cluster, send_n, status, wait_until

from cluster.auth import token_metadata
from cluster.backend import Role
from cluster.consumer import Consumer, ConsumerError, Delivery
from cluster.local import LocalBackend
from proto import broker_pb2, broker_pb2_grpc


def _consume(b: LocalBackend, tok: str, *, group: str = "g", n: int | None = None,
             mode: str = "cluster", offset_file: str | None = None, idle_s: float = 1.0,
             targets: list[str] | None = None) -> list[Delivery]:
    got: list[Delivery] = []

    async def go() -> None:
        async with Consumer(targets or [b.node("master").address], token=tok, group=group,
                            topic="t", mode=mode, offset_file=offset_file,
                            commit_interval_ms=100) as c:
            await c.run(got.append, max_messages=n, idle_exit_s=idle_s)
    asyncio.run(go())
    return got


def test_pull_in_queue_order_and_resume_from_the_committed_offset(tmp_path: Path) -> None:
    with running_cluster(str(tmp_path), role=Role.SYNC_MASTER, flush="SYNC_FLUSH") as (b, tok):
        send_n(b, tok, 30, size=100)
        first = _consume(b, tok, n=12)
        assert [d.msg_id for d in first] == [f"m{i}" for i in range(12)]
        assert [d.queue_offset for d in first] == list(range(12))
        rest = _consume(b, tok)
        assert [d.msg_id for d in rest] == [f"m{i}" for i in range(12, 30)]
        assert {d.node_role for d in rest} == {"SYNC_MASTER"}
        st = status(b, tok, "master")
        assert st["consume"]["offsets"] == {"t@g": {"0": 30}}
        assert st["consume"]["queues"] == {"t/0": [0, 30]}


def _consumer_child(b: LocalBackend, directory: Path, *, commit_ms: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "cluster.cli", "consume", "--dir", str(directory), "--group", "g",
         "--topic", "t", "--idle-exit", "60", "--commit-interval-ms", str(commit_ms)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_consumer_killed_between_commits_gets_those_messages_again(tmp_path: Path) -> None:
    with running_cluster(str(tmp_path), role=Role.SYNC_MASTER, flush="SYNC_FLUSH") as (b, tok):
        send_n(b, tok, 25, size=100)
        assert len(_consume(b, tok, n=10)) == 10  # committed at its clean close: offset 10
        child = _consumer_child(b, tmp_path, commit_ms=600_000)
        try:
            assert child.stdout is not None
            lines = [child.stdout.readline() for _ in range(15)]  # the other 15, uncommitted
            assert [ln.split("\t")[3] for ln in lines] == [f"m{i}" for i in range(10, 25)]
            child.send_signal(signal.SIGKILL)
            child.wait(timeout=10)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
        again = _consume(b, tok)
        assert [d.msg_id for d in again] == [f"m{i}" for i in range(10, 25)]  # 15 duplicates


def test_a_broker_crash_forgets_offsets_committed_after_its_last_persist(tmp_path: Path) -> None:
    slow_persist = ("--consumer-offset-persist-ms", "600000")
    with running_cluster(str(tmp_path), role=Role.ASYNC_MASTER, flush="SYNC_FLUSH",
                         master_extra=slow_persist) as (b, tok):
        send_n(b, tok, 20, size=100)
        assert len(_consume(b, tok, n=8)) == 8  # committed to the broker, not persisted
        b.kill("master")
        b.start("master")
        assert [d.msg_id for d in _consume(b, tok, n=8)] == [f"m{i}" for i in range(8)]
        b.restart("master")  # clean stop: the table is persisted
        assert [d.msg_id for d in _consume(b, tok, n=1)] == ["m8"]
        data_dir = b.node("master").data_dir
        table = json.loads(Path(data_dir, "config", "consumerOffset.json").read_text())
        assert table == {"offsetTable": {"t@g": {"0": 8}}}  # as of the clean stop


def test_broadcast_offsets_live_in_the_consumers_file(tmp_path: Path) -> None:
    with running_cluster(str(tmp_path), role=Role.ASYNC_MASTER, flush="ASYNC_FLUSH") as (b, tok):
        send_n(b, tok, 10, size=100)
        f = str(tmp_path / "offsets.json")
        assert len(_consume(b, tok, n=4, mode="broadcast", offset_file=f)) == 4
        assert json.loads(Path(f).read_text())["offsets"] == {"0": 4}
        rest = _consume(b, tok, mode="broadcast", offset_file=f)
        assert [d.msg_id for d in rest] == [f"m{i}" for i in range(4, 10)]
        # The broker's table knows nothing of a broadcast consumer.
        assert status(b, tok, "master")["consume"]["offsets"] == {}
        Path(f).write_text("{broken")
        with pytest.raises(ConsumerError, match="offsets.json"):
            _consume(b, tok, mode="broadcast", offset_file=f)


def test_a_slave_copies_its_masters_offset_table(tmp_path: Path) -> None:
    fast_sync = ("--consumer-offset-sync-ms", "200")
    with running_cluster(str(tmp_path), role=Role.SYNC_MASTER, flush="SYNC_FLUSH",
                         slave_extra=fast_sync) as (b, tok):
        send_n(b, tok, 6, size=100)
        _consume(b, tok, n=5)
        wait_until(lambda: status(b, tok, "slave1")["consume"]["offsets"] == {"t@g": {"0": 5}},
                   10, "the slave's copy of the table")
        path = Path(b.node("slave1").data_dir, "config", "consumerOffset.json")
        wait_until(lambda: path.exists(), 10, "the slave to persist it")
        # The slave serves reads too (a consumer falls over to it).
        b.kill("master")
        got = _consume(b, tok, targets=[b.node("master").address, b.node("slave1").address])
        assert [d.msg_id for d in got] == ["m5"] and got[0].node_role == "SLAVE"


def test_every_consume_rpc_wants_the_token_and_sane_arguments(tmp_path: Path) -> None:
    with running_cluster(str(tmp_path), role=Role.ASYNC_MASTER, flush="ASYNC_FLUSH") as (b, tok):
        send_n(b, tok, 1, size=10)
        calls = {
            "Pull": broker_pb2.PullRequest(topic="t", queue_id=0, offset=0),
            "QueueInfo": broker_pb2.QueueInfoRequest(),
            "CommitOffset": broker_pb2.CommitOffsetRequest(group="g", topic="t", offset=1),
            "QueryOffset": broker_pb2.QueryOffsetRequest(group="g", topic="t"),
            "GetConsumerOffsets": broker_pb2.ConsumerOffsetsRequest(),
        }
        bad = {
            "Pull": [broker_pb2.PullRequest(topic="", offset=0),
                     broker_pb2.PullRequest(topic="t", offset=-1),
                     broker_pb2.PullRequest(topic="t", max_count=5000),
                     broker_pb2.PullRequest(topic="t", queue_id=-2)],
            "CommitOffset": [broker_pb2.CommitOffsetRequest(group="", topic="t"),
                             broker_pb2.CommitOffsetRequest(group="a@b", topic="t"),
                             broker_pb2.CommitOffsetRequest(group="g", topic="t", offset=-3)],
            "QueryOffset": [broker_pb2.QueryOffsetRequest(group="", topic="t")],
        }
        with grpc.insecure_channel(b.node("master").address) as ch:
            stub = broker_pb2_grpc.BrokerStub(ch)
            for method, req in calls.items():
                for metadata in ((), token_metadata("wrong-token")):
                    with pytest.raises(grpc.RpcError) as err:
                        getattr(stub, method)(req, metadata=metadata, timeout=5)
                    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED, method
                getattr(stub, method)(req, metadata=token_metadata(tok), timeout=5)
            for method, reqs in bad.items():
                for req in reqs:
                    with pytest.raises(grpc.RpcError) as err:
                        getattr(stub, method)(req, metadata=token_metadata(tok), timeout=5)
                    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (method, req)
                    assert err.value.details(), "the refusal says what is wrong"


def test_consume_cli_refuses_bad_arguments_with_the_fix(tmp_path: Path) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "cluster.cli", "consume", *args],
                              capture_output=True, text=True, timeout=30, check=False)
    r = run("--dir", str(tmp_path), "--group", "g", "--topic", "t")
    assert r.returncode != 0 and "--max N or --idle-exit" in r.stderr
    r = run("--dir", str(tmp_path), "--group", "g", "--topic", "t", "--max", "1",
            "--mode", "broadcast")
    assert r.returncode != 0 and "--offset-file" in r.stderr
    r = run("--dir", str(tmp_path / "none"), "--group", "g", "--topic", "t", "--max", "1")
    assert r.returncode != 0 and "cluster up" in r.stderr
