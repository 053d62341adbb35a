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
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import pytest
from support.ha_helpers import client, running_cluster, send_n, status, wait_connected, wait_until

from cluster.backends.interface import NodeSpec
from cluster.backends.local import LocalBackend
from cluster.backends.procs import free_ports
from cluster.cli.main import build_parser
from cluster.cli.node_command import node_config_from_args
from cluster.client.consumer import (
    BlockingConsumer,
    Consumer,
    ConsumerError,
    Delivery,
    load_offset_file,
    save_offset_file,
)
from cluster.client.node_client import make_message
from cluster.node import consume_service
from cluster.node.auth import write_token_file
from cluster.node.role import Role
from ha.credentials import token_metadata
from proto import broker_pb2, broker_pb2_grpc
from store.status import GetMessagesResult, GetMessageStatus, QueuedMessage


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
        shown = subprocess.run([sys.executable, "-m", "cluster.cli", "cluster", "status",
                                "--dir", str(tmp_path)], capture_output=True, text=True,
                               timeout=30, check=True).stdout
        assert f"consume: confirmed={st['confirmed_offset']}  queues [t/0 0..30]  " \
               "offsets [t@g 0:30]" in shown


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


def _query_offset(b: LocalBackend, tok: str, group: str = "g") -> int | None:
    with grpc.insecure_channel(b.node("master").address) as ch:
        resp = broker_pb2_grpc.BrokerStub(ch).QueryOffset(
            broker_pb2.QueryOffsetRequest(group=group, topic="t", queue_id=0),
            metadata=token_metadata(tok), timeout=5)
    return resp.offset if resp.found else None


def test_a_consumer_killed_after_its_own_interval_commit_redelivers_only_what_followed(
        tmp_path: Path) -> None:
    with running_cluster(str(tmp_path), role=Role.ASYNC_MASTER, flush="SYNC_FLUSH",
                         slaves=0) as (b, tok):
        child = _consumer_child(b, tmp_path, commit_ms=3_000)
        try:
            assert child.stdout is not None
            send_n(b, tok, 10, size=100)
            assert [child.stdout.readline().split("\t")[3] for _ in range(10)] == [
                f"m{i}" for i in range(10)]
            wait_until(lambda: _query_offset(b, tok) == 10, 30, "the child's interval commit")
            # The next commit is about 3 s away: consume 5 more and die first.
            send_n(b, tok, 5, size=100, prefix="n")
            assert [child.stdout.readline().split("\t")[3] for _ in range(5)] == [
                f"n{i}" for i in range(5)]
            child.send_signal(signal.SIGKILL)
            child.wait(timeout=10)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
        assert _query_offset(b, tok) == 10
        again = _consume(b, tok)
        assert [d.msg_id for d in again] == [f"n{i}" for i in range(5)]  # 5 duplicates


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
        wait_until(lambda: path.exists(), 30, "the slave to persist it")
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
    r = run("--dir", str(tmp_path), "--group", "g", "--topic", "t", "--max", "1",
            "--offset-file", "x.json")
    assert r.returncode != 0 and "is for --mode broadcast" in r.stderr
    r = run("--target", "127.0.0.1:1", "--group", "g", "--topic", "t", "--max", "1")
    assert r.returncode != 0 and "--token-file" in r.stderr
    r = run("--target", "nowhere", "--group", "g", "--topic", "t", "--max", "1")
    assert r.returncode != 0 and "HOST:PORT" in r.stderr
    token_file = str(tmp_path / "token")
    write_token_file(token_file, "secret")
    (port,) = free_ports(1)  # nobody listens there
    r = run("--target", f"127.0.0.1:{port}", "--token-file", token_file, "--group", "g",
            "--topic", "t", "--idle-exit", "0.5")
    assert r.returncode != 0 and "no node answered" in r.stderr
    r = run("--help")
    assert r.returncode == 0
    for teaches in ("At-least-once", "broadcast", "confirmed offset", "examples:"):
        assert teaches in r.stdout


def _pull(b: LocalBackend, tok: str, node: str, offset: int) -> broker_pb2.PullResponse:
    with grpc.insecure_channel(b.node(node).address) as ch:
        resp: broker_pb2.PullResponse = broker_pb2_grpc.BrokerStub(ch).Pull(
            broker_pb2.PullRequest(topic="t", queue_id=0, offset=offset),
            metadata=token_metadata(tok), timeout=5)
        return resp


def test_every_queue_in_order_through_the_blocking_consumer_and_the_iterator(
        tmp_path: Path) -> None:
    with running_cluster(str(tmp_path), role=Role.ASYNC_MASTER, flush="ASYNC_FLUSH",
                         slaves=0) as (b, tok):
        with client(b, tok) as c:
            for i in range(24):  # queues 0, 1, 2 interleaved
                sent = c.send(make_message("t", b"x", msg_id=f"m{i}", queue_id=i % 3))
                assert sent.status == "PUT_OK"
        with BlockingConsumer(b.node("master").address, tok, "g", "t",
                              commit_interval_ms=100) as bc:
            got = list(bc.deliveries(idle_exit_s=0.5))
        assert len(got) == 24
        for q in range(3):
            mine = [d for d in got if d.queue_id == q]
            assert [d.msg_id for d in mine] == [f"m{i}" for i in range(q, 24, 3)]
            assert [d.queue_offset for d in mine] == list(range(8))
        assert status(b, tok, "master")["consume"]["offsets"]["t@g"] == {"0": 8, "1": 8, "2": 8}

        # Leaving an iterator with break: the message broken on is not
        # consumed (its handler did not finish), so the group gets it again.
        async def first_then_break() -> list[str]:
            async with Consumer([b.node("master").address], tok, "g2", "t",
                                queue_ids=[1]) as c:
                async for d in c.deliveries():
                    seen = [d.msg_id]
                    break
            return seen
        assert asyncio.run(first_then_break()) == ["m1"]
        assert asyncio.run(first_then_break()) == ["m1"]


def test_a_consumer_never_reads_past_the_flushed_offset_under_sync_flush(tmp_path: Path) -> None:
    # The second flush stalls 2.5 s between its write and its fsync: m1 is
    # appended (wrote) but not flushed, and must not be consumable.
    stall = ("--failpoints", "before_flush_sync=delay:2500@2")
    with running_cluster(str(tmp_path), role=Role.ASYNC_MASTER, flush="SYNC_FLUSH", slaves=0,
                         master_extra=stall) as (b, tok):
        send_n(b, tok, 1, size=100)
        assert status(b, tok, "master")["failpoint_hits"] == {"before_flush_sync": 1}
        sender = threading.Thread(target=send_n, args=(b, tok, 1),
                                  kwargs={"size": 100, "prefix": "late"})
        sender.start()
        try:
            st = wait_until(lambda: (s := status(b, tok, "master"))["wrote"] > s["flushed"]
                            and s, 10, "an appended, unflushed message")
            assert st["confirmed_offset"] == st["flushed"] < st["wrote"]
            assert st["consume"]["queues"] == {"t/0": [0, 1]}
            resp = _pull(b, tok, "master", 1)
            assert broker_pb2.PullStatus.Name(resp.status) == "OFFSET_OVERFLOW_ONE"
            assert (resp.max_offset, list(resp.messages)) == (1, [])
            assert [d.msg_id for d in _consume(b, tok, idle_s=0.3)] == ["m0"]
        finally:
            sender.join(timeout=20)
        assert [d.msg_id for d in _consume(b, tok, idle_s=0.3)] == ["late0"]


def test_a_slave_keeps_its_own_commits_only_for_groups_its_master_lacks(tmp_path: Path) -> None:
    fast_sync = ("--consumer-offset-sync-ms", "200")
    with running_cluster(str(tmp_path), role=Role.SYNC_MASTER, flush="SYNC_FLUSH",
                         slave_extra=fast_sync) as (b, tok):
        send_n(b, tok, 6, size=100)
        _consume(b, tok, n=2)  # master: t@g -> 2
        wait_until(lambda: status(b, tok, "slave1")["consume"]["offsets"] == {"t@g": {"0": 2}},
                   10, "the slave's first copy")
        with grpc.insecure_channel(b.node("slave1").address) as ch:
            stub = broker_pb2_grpc.BrokerStub(ch)
            for group, off in (("g", 5), ("solo", 3)):  # a consumer commits to the slave
                stub.CommitOffset(broker_pb2.CommitOffsetRequest(
                    group=group, topic="t", queue_id=0, offset=off),
                    metadata=token_metadata(tok), timeout=5)
        # The next sync puts the master's t@g back; t@solo stays.
        wait_until(lambda: status(b, tok, "slave1")["consume"]["offsets"] == {
            "t@g": {"0": 2}, "t@solo": {"0": 3}}, 10, "the sync to overwrite t@g")
        sync = status(b, tok, "slave1")["consume"]["offset_sync"]
        assert sync["syncs"] >= 2 and sync["changes"] >= 2 and sync["last_error"] == ""
        # Past a queue's end a master moves the offset back; a slave keeps it.
        wait_until(lambda: status(b, tok, "slave1")["consume"]["queues"] == {"t/0": [0, 6]},
                   10, "the slave's queue")
        for node, moved_to in (("master", 6), ("slave1", 50)):
            resp = _pull(b, tok, node, 50)
            assert broker_pb2.PullStatus.Name(resp.status) == "OFFSET_OVERFLOW_BADLY"
            assert resp.next_offset == moved_to, node


def test_consumer_arguments_and_offset_files_are_checked(tmp_path: Path) -> None:
    ok = dict(targets="127.0.0.1:1", token="t", group="g", topic="t")
    for bad, fix in (({"mode": "pull"}, "cluster or broadcast"),
                     ({"mode": "broadcast"}, "offset_file"),
                     ({"group": "a@b"}, "consumer group 'a@b' is not allowed"),
                     ({"topic": ""}, "topic is empty"),
                     ({"targets": []}, "no target"),
                     ({"pull_batch": 5000}, "1..1024"),
                     ({"commit_interval_ms": 0}, "at least 1"),
                     ({"queue_ids": [-1]}, "queue ids >= 0")):
        with pytest.raises(ConsumerError, match=fix):
            Consumer(**{**ok, **bad})  # type: ignore[arg-type]
    f = str(tmp_path / "o.json")
    assert load_offset_file(f, topic="t", group="g") == {}
    save_offset_file(f, topic="t", group="g", offsets={0: 4, 2: 7})
    assert load_offset_file(f, topic="t", group="g") == {0: 4, 2: 7}
    assert not Path(f + ".tmp").exists()
    with pytest.raises(ConsumerError, match="give each consumer its own"):
        load_offset_file(f, topic="t", group="other")


def test_failed_targets_are_skipped_for_the_backoff_then_the_master_is_tried_again() -> None:
    now = [100.0]
    c = Consumer(["master:1", "slave:2"], "tok", "g", "t", failover_backoff_ms=1000,
                 clock=lambda: now[0])
    assert c._order() == [0, 1]
    c._down_until[0] = now[0] + 1.0  # what a failed call on the master does
    assert c._order() == [1, 0]
    now[0] += 1.0
    assert c._order() == [0, 1]


def test_node_specs_pass_the_consume_timings_to_the_node(tmp_path: Path) -> None:
    token_file = str(tmp_path / "token")
    write_token_file(token_file, "secret")
    spec = NodeSpec(name="n", role=Role.SLAVE, consumer_offset_persist_interval_ms=700,
                    consumer_offset_sync_interval_ms=300)
    args = spec.node_args(data_dir=str(tmp_path / "d"), listen="127.0.0.1:0",
                          master="127.0.0.1:9", token_file=token_file)
    cfg = node_config_from_args(build_parser().parse_args(["node", *args]))
    assert cfg.consumer_offset_sync_interval_ms == 300
    assert cfg.store.consumer_offset_persist_interval_ms == 700
    assert "--consumer-offset" not in " ".join(NodeSpec(name="n", role=Role.SLAVE).node_args(
        data_dir="d", listen="127.0.0.1:0", master=None, token_file="tok"))


class _FakeStore:
    """get_messages only: a queue of `n` messages of `size` bytes from 0."""

    def __init__(self, n: int, size: int) -> None:
        self.n, self.size = n, size

    def get_messages(self, topic: str, queue_id: int, offset: int, max_count: int
                     ) -> GetMessagesResult:
        if offset > self.n:
            return GetMessagesResult(GetMessageStatus.OFFSET_OVERFLOW_BADLY, [], self.n, 0,
                                     self.n)
        msgs = [QueuedMessage(i, i * self.size, SimpleNamespace(
            size=self.size, msg_id=f"m{i}", body=b"", properties={}, store_timestamp_ms=0,
            born_timestamp_ms=0)) for i in range(offset, min(self.n, offset + max_count))]
        return GetMessagesResult(GetMessageStatus.FOUND, msgs, offset + len(msgs), 0, self.n)


def test_a_pull_stops_at_its_byte_cap_and_a_slave_never_corrects_an_offset() -> None:
    big = consume_service.MAX_PULL_BYTES // 3 + 1  # three do not fit, two do
    store: Any = _FakeStore(10, big)
    resp = consume_service.pull(store, broker_pb2.PullRequest(topic="t", offset=4,
                                                              max_count=8), "ASYNC_MASTER")
    assert [m.msg_id for m in resp.messages] == ["m4", "m5"] and resp.next_offset == 6
    huge: Any = _FakeStore(3, consume_service.MAX_PULL_BYTES * 2)
    resp = consume_service.pull(huge, broker_pb2.PullRequest(topic="t", offset=0), "SLAVE")
    assert [m.msg_id for m in resp.messages] == ["m0"] and resp.next_offset == 1
    for role, moved_to in (("SYNC_MASTER", 10), ("SLAVE", 40)):
        resp = consume_service.pull(store, broker_pb2.PullRequest(topic="t", offset=40), role)
        assert resp.next_offset == moved_to, role


def test_one_consumer_reads_from_the_slave_while_the_master_is_down_and_returns_to_it(
        tmp_path: Path) -> None:
    with running_cluster(str(tmp_path), role=Role.SYNC_MASTER, flush="SYNC_FLUSH") as (b, tok):
        send_n(b, tok, 10, size=100)  # SYNC_MASTER: the slave holds every acked one
        targets = [b.node("master").address, b.node("slave1").address]
        with BlockingConsumer(targets, tok, "g", "t", commit_interval_ms=100,
                              failover_backoff_ms=100, failover_backoff_max_ms=300) as bc:
            it = bc.deliveries(idle_exit_s=20)
            b.kill("master")
            first = [next(it) for _ in range(10)]
            assert [(d.msg_id, d.node_role) for d in first] == [
                (f"m{i}", "SLAVE") for i in range(10)]
            b.start("master")
            wait_connected(b, tok)
            # Past the consumer's backoff for the master (at most 0.3 s here) and its
            # channel's reconnect backoff (at most 1 s), with a margin for a loaded
            # machine: the next pulls go to the master again.
            time.sleep(3.0)
            send_n(b, tok, 5, size=100, prefix="n")
            later = [next(it) for _ in range(5)]
            assert [(d.msg_id, d.node_role) for d in later] == [
                (f"n{i}", "SYNC_MASTER") for i in range(5)]
