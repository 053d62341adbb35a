"""Topic names and queue ids become directories (consumequeue/<topic>/<id>/):
every way in refuses what RocketMQ's TopicValidator refuses
(^[%|a-zA-Z0-9_-]+$, at most 127 characters) and queue ids outside
0..MAX_QUEUE_ID, and nothing a store holds or finds on disk makes it write
outside its directory — a put (both codecs, the RPCs, `dlab send`), a pull
or offset commit, a record replayed from the CommitLog (a slave's copy, a
store written before the check), a directory found on disk."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.store_helpers import message

from cluster.client.consumer import Consumer, ConsumerError
from cluster.client.node_client import make_message
from cluster.node import consume_service
from cluster.node.role import Role
from proto import broker_pb2
from store.config import TESTING
from store.consume.consumequeue import UNIT
from store.log import native as native_codec
from store.log.record import UNIQ_KEY, Message, encode
from store.names import MAX_QUEUE_ID, TOPIC_MAX_LENGTH, queue_id_problem, topic_problem
from store.status import PutStatus
from store.store import MessageStore

RULE = "^[%|a-zA-Z0-9_-]+$"
BAD_TOPICS = ["../x", "/tmp/abs", "a\x00b", "", "t" * (TOPIC_MAX_LENGTH + 1), "a.b", "a b",
              "ok\n", "é"]


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def test_the_rule_is_rocketmqs() -> None:
    for good in ("TopicTest", "a", "%RETRY%g1", "x|y", "a_b-c", "t" * TOPIC_MAX_LENGTH):
        assert topic_problem(good) is None, good
    for bad in BAD_TOPICS:
        problem = topic_problem(bad)
        assert problem and "topic" in problem, bad
    assert queue_id_problem(0) is None and queue_id_problem(MAX_QUEUE_ID) is None
    assert queue_id_problem(-1) and queue_id_problem(MAX_QUEUE_ID + 1)


@pytest.mark.parametrize("codec", ["native", "python"])
def test_a_put_refuses_bad_topics_and_queue_ids_and_writes_nothing_outside(
        tmp_path: Path, codec: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if codec == "python":
        monkeypatch.setattr(native_codec, "encode_run_into", None)
    elif native_codec.encode_run_into is None:
        pytest.skip("the native codec is not built")
    store_dir = tmp_path / "data" / "store"
    bad = [Message(t, b"x", {UNIQ_KEY: f"b{i}"}) for i, t in enumerate(BAD_TOPICS)]
    bad += [Message("t", b"x", {UNIQ_KEY: f"q{q}"}, queue_id=q)
            for q in (-1, MAX_QUEUE_ID + 1, 2**31 - 1, 2**40)]
    good = [message(0), Message("t", b"y", {UNIQ_KEY: "edge"}, queue_id=MAX_QUEUE_ID)]

    async def run() -> list[PutStatus]:
        s = MessageStore.open(str(store_dir), TESTING)
        await s.start()
        try:
            # Mixed in one batch: the good ones around the bad still go in.
            results = await s.put_batch([good[0], *bad, good[1]])
            for r, m in zip(results[1:-1], bad, strict=True):
                assert r.status is PutStatus.MESSAGE_ILLEGAL, m
                assert RULE in r.detail or "0..1023" in r.detail, r.detail
            assert s.log.wrote == results[0].size + results[-1].size
            s.reput()
            return [r.status for r in results]
        finally:
            await s.close()

    statuses = asyncio.run(run())
    assert statuses[0] is statuses[-1] is PutStatus.PUT_OK
    assert _tree(tmp_path / "data") <= {"store"} | {f"store/{p}" for p in _tree(store_dir)}
    assert sorted(os.listdir(store_dir / "consumequeue")) == ["TopicTest", "t"]
    assert os.listdir(store_dir / "consumequeue" / "t") == [str(MAX_QUEUE_ID)]
    assert not (store_dir / "abort").exists()  # closed cleanly


def test_records_with_bad_names_in_the_commitlog_get_no_queue_and_no_path(
        tmp_path: Path) -> None:
    """Bytes a master shipped (or a store written before topics were
    checked) hold `../x`, `/tmp/...`, a NUL and queue id -1: dispatch gives
    them no unit and no directory, counts them, and the store closes clean."""
    store_dir = tmp_path / "data" / "store"
    outside = tmp_path / "outside"
    bad = [Message("../x", b"a"), Message(str(outside / "abs"), b"b"),
           Message("n\x00ul", b"c"), Message("t", b"d", queue_id=-1)]
    s = MessageStore.open(str(store_dir), TESTING)
    try:
        at = 0
        for i, m in enumerate([message(0), *bad, message(1)]):
            raw = encode(m, offset=at, queue_offset=0 if i < 5 else 1,
                         store_timestamp_ms=1_700_000_000_000 + i)
            at = s.log.append_raw(at, raw)  # what a slave does with shipped bytes
        s.reput()
        st = s.state()
        assert st["consume_queue_records_skipped"] == 4
        assert "is not allowed" in st["consume_queue_dispatch_error"]
        assert len(s.get_messages("TopicTest", 0, 0).messages) == 2
    finally:
        s.close_sync()
    assert not (store_dir / "abort").exists()
    assert not outside.exists() and not (store_dir / "x").exists()
    assert sorted(os.listdir(store_dir / "consumequeue")) == ["TopicTest"]
    # Reopened with the queues rebuilt from the CommitLog: the same, and said.
    for f in (store_dir / "consumequeue").rglob("0" * 20):
        f.unlink()
    s = MessageStore.open(str(store_dir), TESTING)
    try:
        problems = s.recovery.problems
        assert any("4 record(s) left without a consume queue unit" in p for p in problems)
        assert len(s.get_messages("TopicTest", 0, 0).messages) == 2
    finally:
        s.close_sync()
    assert not (store_dir / "abort").exists()
    assert _tree(tmp_path) <= {"data", "data/store"} | {
        f"data/store/{p}" for p in _tree(store_dir)}


def test_consumequeue_directories_named_badly_are_ignored(tmp_path: Path) -> None:
    # (A linked one makes the open refuse: tests/store/test_store_symlinks.py.)
    store_dir = tmp_path / "store"
    MessageStore.open(str(store_dir), TESTING).close_sync()
    cq = store_dir / "consumequeue"
    # Units that point past the (empty) CommitLog: loading them would cut them.
    units = b"".join(UNIT.pack(i * 100, 100, 0) for i in range(10))
    cq.mkdir(exist_ok=True)
    (cq / "bad name" / "0").mkdir(parents=True)
    (cq / "bad name" / "0" / f"{0:020d}").write_bytes(units)
    (cq / "ok" / "-1").mkdir(parents=True)
    s = MessageStore.open(str(store_dir), TESTING)
    try:
        problems = "\n".join(s.recovery.problems)
        assert "ignored consumequeue/'bad name': topic 'bad name' is not allowed" in problems
        assert "ignored ok/-1" in problems
        assert s.queues.queues == {}
    finally:
        s.close_sync()
    assert (cq / "bad name" / "0" / f"{0:020d}").read_bytes() == units


def test_consume_requests_and_consumers_refuse_bad_topics_and_queue_ids(
        tmp_path: Path) -> None:
    s = MessageStore.open(str(tmp_path / "s"), TESTING)
    try:
        for topic, qid in (("../x", 0), ("a\x00b", 0), ("t", -1), ("t", MAX_QUEUE_ID + 1)):
            with pytest.raises(consume_service.BadConsumeRequest, match=r"not allowed|range"):
                consume_service.pull(
                    s, broker_pb2.PullRequest(topic=topic, queue_id=qid), "SYNC_MASTER")
            with pytest.raises(consume_service.BadConsumeRequest, match=r"not allowed|range"):
                consume_service.commit_offset(s, broker_pb2.CommitOffsetRequest(
                    group="g", topic=topic, queue_id=qid, offset=1))
            with pytest.raises(consume_service.BadConsumeRequest, match=r"not allowed|range"):
                consume_service.query_offset(s, broker_pb2.QueryOffsetRequest(
                    group="g", topic=topic, queue_id=qid))
        assert s.consumer_offsets.snapshot() == {}
    finally:
        s.close_sync()
    with pytest.raises(ConsumerError, match=r"\^\[%\|a-zA-Z0-9_-\]\+\$"):
        Consumer("127.0.0.1:1", token="t", group="g", topic="../x")
    with pytest.raises(ConsumerError, match="0..1023"):
        Consumer("127.0.0.1:1", token="t", group="g", topic="t", queue_ids=[0, 4096])


@pytest.mark.parametrize("command", ["send", "consume"])
def test_cli_refuses_a_bad_topic_with_exit_2_naming_the_rule(tmp_path: Path,
                                                             command: str) -> None:
    extra = ["--group", "g", "--max", "1"] if command == "consume" else []
    for topic in ("../x", str(tmp_path / "abs"), "a b"):
        r = subprocess.run([sys.executable, "-m", "cluster.cli", command, "--dir",
                            str(tmp_path), "--topic", topic, *extra],
                           capture_output=True, text=True, timeout=60, check=False)
        assert r.returncode == 2, (topic, r.stderr)
        assert RULE in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert os.listdir(tmp_path) == []


def test_the_broker_rpcs_refuse_bad_topics_and_queue_ids(tmp_path: Path) -> None:
    from support.ha_helpers import client, running_cluster, status

    with running_cluster(str(tmp_path / "c"), role=Role.ASYNC_MASTER, slaves=0) as (b, tok):
        with client(b, tok) as c:
            absolute = str(tmp_path / "abs")
            bad = [make_message(t, b"x") for t in ("../x", absolute, "n\x00ul")]
            bad.append(make_message("t", b"x", queue_id=-1))
            for m in bad:
                out = c.send(m)  # the send stream
                assert out.status == "MESSAGE_ILLEGAL", (m.topic, out)
                assert RULE in out.detail or "out of range" in out.detail
            outs = c.send_batch([*bad, make_message("t", b"ok")])  # SendBatch
            assert [o.status for o in outs] == ["MESSAGE_ILLEGAL"] * 4 + ["PUT_OK"]
            st = status(b, tok, "master")
        assert st["consume"]["queues"] == {"t/0": [0, 1]}
    assert not (tmp_path / "abs").exists()
    assert not (tmp_path / "c" / "nodes" / "master" / "data" / "x").exists()
    data = tmp_path / "c" / "nodes" / "master" / "data"
    assert sorted(os.listdir(data / "consumequeue")) == ["t"]
