"""Consumer group names: RocketMQ's rule (the topic's characters, at most
255 of them) on every way in — the CommitOffset and QueryOffset RPCs, the
client, `dlab consume --group` — and a slave's offset sync that no entry,
however big or odd, stops for the other groups (store/names.py,
cluster/node/consume_service.py)."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest
from support.cli_helpers import dlab
from support.ha_helpers import running_cluster, status, wait_until

from cluster.client.consumer import Consumer, ConsumerError
from cluster.node import consume_service
from cluster.node.role import Role
from ha.credentials import token_metadata
from proto import broker_pb2, broker_pb2_grpc
from store.names import GROUP_MAX_LENGTH, group_problem

RULE = "^[%|a-zA-Z0-9_-]+$"
HUGE = 1024 * 1024
BAD_GROUPS = ["", "a@b", "a\x00b", "a\nb", "g" * (GROUP_MAX_LENGTH + 1), "a b", "é",
              "\x00\n" * (HUGE // 2)]


def test_group_rule_is_rocketmqs() -> None:
    for good in ("g", "CID_a-b_c%|1", "g" * GROUP_MAX_LENGTH):
        assert group_problem(good) is None, good
    for bad in BAD_GROUPS:
        problem = group_problem(bad)
        assert problem is not None and RULE in problem and "1..255" in problem, bad
        assert len(problem) < 400 and "\x00" not in problem and "\n" not in problem


def test_sync_table_skips_bad_entries_and_stays_under_its_cap() -> None:
    table = {f"t@{'x' * 200}{i:04d}": {q: q for q in range(50)} for i in range(300)}
    table["t@a\x00b"] = {0: 1}
    table["t@" + "g" * HUGE] = {0: 1}
    text, left_out = consume_service.sync_table(table, max_bytes=64 * 1024)
    assert len(text) <= 64 * 1024
    synced, skipped = consume_service.parse_table(text)
    assert skipped == [] and 0 < len(synced) < 300
    assert all(k in table and table[k] == v for k, v in synced.items())
    assert len(left_out) == 3 and any("over 65536 bytes" in s for s in left_out)
    # A slave takes the good entries of a table with bad ones (an older master's).
    raw = json.dumps({"t@ok": {"0": 3}, "t@a\nb": {"0": 1}, "t@q": [1], "nokey": {}})
    synced, skipped = consume_service.parse_table(raw)
    assert synced == {"t@ok": {0: 3}} and len(skipped) == 3
    assert "\n" not in "".join(skipped)


def test_the_rpcs_refuse_bad_groups(tmp_path: Path) -> None:
    fast_sync = ("--consumer-offset-sync-ms", "200")
    with running_cluster(str(tmp_path), role=Role.ASYNC_MASTER, flush="ASYNC_FLUSH",
                         slave_extra=fast_sync) as (b, tok):
        with grpc.insecure_channel(b.node("master").address, options=[
                ("grpc.max_send_message_length", 8 * HUGE)]) as ch:
            stub = broker_pb2_grpc.BrokerStub(ch)
            for group in BAD_GROUPS:
                for call in (lambda g: stub.CommitOffset(broker_pb2.CommitOffsetRequest(
                                 group=g, topic="t", queue_id=0, offset=1),
                                 metadata=token_metadata(tok), timeout=10),
                             lambda g: stub.QueryOffset(broker_pb2.QueryOffsetRequest(
                                 group=g, topic="t", queue_id=0),
                                 metadata=token_metadata(tok), timeout=10)):
                    with pytest.raises(grpc.RpcError) as err:
                        call(group)
                    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, repr(group[:9])
                    assert RULE in (err.value.details() or "")
        assert status(b, tok, "master")["consume"]["offsets"] == {}


def test_a_table_of_huge_bad_groups_never_stops_the_other_groups_sync(tmp_path: Path) -> None:
    fast_sync = ("--consumer-offset-sync-ms", "200")
    with running_cluster(str(tmp_path), role=Role.ASYNC_MASTER, flush="ASYNC_FLUSH",
                         slave_extra=fast_sync) as (b, tok):
        # A table persisted by an older node: six 1 MiB groups with NUL and
        # newlines beside a good one. The slave still gets the good one.
        b.stop("master")
        bad = {f"t@{i}\x00\n" + "x" * HUGE: {"0": i} for i in range(6)}
        config = Path(b.node("master").data_dir, "config")
        config.mkdir(parents=True, exist_ok=True)
        (config / "consumerOffset.json").write_text(json.dumps(
            {"offsetTable": {**bad, "t@good": {"0": 7}}}))
        b.start("master")
        wait_until(lambda: status(b, tok, "slave1")["consume"]["offsets"] == {
            "t@good": {"0": 7}}, 30, "the good group's sync despite six huge bad ones")
        sync = status(b, tok, "slave1")["consume"]["offset_sync"]
        assert sync["syncs"] >= 1 and sync["last_error"] == ""
        # `cluster status` shows such a group escaped and cut, never raw.
        shown = dlab("cluster", "status", "--dir", str(tmp_path))
        assert shown.returncode == 0 and "Traceback" not in shown.stderr, shown.stderr
        assert "\x00" not in shown.stdout and len(shown.stdout) < 20_000
        assert "t@good 0:7" in shown.stdout and "+6 malformed offset entries" in shown.stdout
        master_log = Path(b.node("master").log_path).read_text(errors="replace")
        assert "WARNING" in master_log and "consumer offset sync leaves out 6 entries" in \
            master_log


def test_the_client_and_cli_refuse_bad_groups(tmp_path: Path) -> None:
    for bad in BAD_GROUPS:
        with pytest.raises(ConsumerError, match=r"\^\[%\|a-zA-Z0-9_-\]\+\$"):
            Consumer("127.0.0.1:1", token="t", group=bad, topic="t")
    for bad in ("a\nb", "a@b", "g" * (GROUP_MAX_LENGTH + 1)):
        r = dlab("consume", "--target", "127.0.0.1:1", "--token-file", str(tmp_path / "tok"),
                 "--group", bad, "--topic", "t", "--max", "1", timeout=60)
        assert r.returncode == 2, r.stderr
        assert "consumer group" in r.stderr and RULE in r.stderr and "Traceback" not in r.stderr
