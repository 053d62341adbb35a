"""`dlab report` judges from the stores a run kept (chaos/check/kept_stores.py).

Each run here keeps real stores (segment files in the project's record
format) under cluster/nodes/NAME/data, with the read-back the harness would
have written at the end of the run (chaos.harness.readback over those stores). Then
a fault is planted in a kept store — a flipped record, a zeroed tail, a
rewritten header field — and `dlab report` must report the verdict the
store now implies, not the one the run's read-back gives. One `dlab report`
over all of them (one Spark job); a test per verdict kind."""

from __future__ import annotations

import json
import os
from typing import Any

import pandas as pd
import pytest
from support.pipeline_fixtures import make_run, op, rec, spark  # noqa: F401

from chaos import cli
from chaos.check.kept_stores import first_difference, reread, store_dir
from chaos.check.run_dirs import find_run_dirs, load_runs
from chaos.harness.readback import read_back
from chaos.schema import write_json, write_jsonl
from store.log.record import UNIQ_KEY, V4_FIXED_SIZE, Message, encode

pytestmark = pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas")

SEGMENT = 64 * 1024
TS = 1_700_000_000_000
# STORETIMESTAMP's place in an IPv4 record: the 48-byte head, then BORNHOST.
STORE_TS_AT = 48 + 8
assert STORE_TS_AT + 8 <= V4_FIXED_SIZE


def _messages(n: int) -> list[Message]:
    return [Message("TopicTest", f"body of m{i}".encode() * 3, {UNIQ_KEY: f"m{i}"})
            for i in range(1, n + 1)]


def _write_store(data_dir: str, msgs: list[Message]) -> list[int]:
    """One segment holding `msgs` from offset 0, the rest zeros, as a node
    writes it; returns each record's offset."""
    commitlog = os.path.join(data_dir, "commitlog")
    os.makedirs(commitlog, exist_ok=True)
    buf, offsets = bytearray(), []
    for q, m in enumerate(msgs):
        offsets.append(len(buf))
        buf += encode(m, offset=len(buf), queue_offset=q, store_timestamp_ms=TS + q)
    with open(os.path.join(commitlog, "0" * 20), "wb") as f:
        f.write(bytes(buf) + bytes(SEGMENT - len(buf)))
    return offsets


def _kept_run(root: str, run_id: str, *, role: str, flush: str, n: int = 4,
              slave_msgs: int | None = None) -> tuple[str, list[int]]:
    """A run with every message acknowledged, its stores kept, and its
    read-back written from them as chaos/harness/runner.py does."""
    run_dir = os.path.join(root, run_id)
    msgs = _messages(n)
    offsets = []
    readback = {}
    for name, count in (("m", n), ("s", n if slave_msgs is None else slave_msgs)):
        data = store_dir(run_dir, name)
        got = _write_store(data, msgs[:count])
        offsets = got if name == "m" else offsets
        readback[name] = read_back(data).records
    history = [op(i + 1, f"m{i + 1}", off, at=i * 10) for i, off in enumerate(offsets)]
    make_run(root, run_id, role=role, flush=flush, history=history, records=readback)
    return run_dir, offsets


def _consumer_files(run_dir: str, offsets: list[int]) -> None:
    """One consumer that got every message once and drained."""
    write_jsonl(os.path.join(run_dir, "consumed.jsonl"), [
        {"incarnation": 1, "msg_id": f"m{i + 1}", "topic": "TopicTest", "queue_id": 0,
         "queue_offset": i, "commitlog_offset": off, "node": "m", "node_role": "ASYNC_MASTER",
         "time_ms": TS + 100 + i} for i, off in enumerate(offsets)])
    write_jsonl(os.path.join(run_dir, "committed.jsonl"), [
        {"incarnation": 1, "topic": "TopicTest", "queue_id": 0, "offset": len(offsets),
         "time_ms": TS + 200}])
    write_json(os.path.join(run_dir, "consumer.json"), {
        "group": "g", "topic": "TopicTest", "commit_interval_ms": 5000, "incarnations": 1,
        "exit_codes": [0], "drain_started_ms": TS + 150, "drained": True,
        "ended_ms": TS + 300, "end_offsets": {"0": len(offsets)},
        "max_offsets": {"m": {"0": len(offsets)}}})


def _patch(run_dir: str, node: str, at: int, data: bytes) -> None:
    path = os.path.join(store_dir(run_dir, node), "commitlog", "0" * 20)
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(data)


def _zero_from(run_dir: str, node: str, at: int) -> None:
    _patch(run_dir, node, at, bytes(SEGMENT - at))


@pytest.fixture(scope="module")
def planted(spark: Any, tmp_path_factory: pytest.TempPathFactory  # noqa: F811
            ) -> tuple[pd.DataFrame, str, int]:
    root = str(tmp_path_factory.mktemp("kept"))
    # Untouched: the store still matches the read-back.
    _kept_run(root, "clean", role="SYNC_MASTER", flush="SYNC_FLUSH")
    # A byte of m3's body flipped on the master: m3 fails its CRC, and the
    # master's data ends there (m3 and m4 gone from it).
    run, off = _kept_run(root, "flip-master", role="ASYNC_MASTER", flush="SYNC_FLUSH")
    _patch(run, "m", off[2] + V4_FIXED_SIZE + 2, b"X")
    # m4 zeroed on both nodes: gone everywhere (no promise in this mode).
    run, off = _kept_run(root, "zero-both", role="ASYNC_MASTER", flush="ASYNC_FLUSH")
    _zero_from(run, "m", off[3])
    _zero_from(run, "s", off[3])
    # The slave's tail zeroed: m4 on no slave, a replica violation.
    run, off = _kept_run(root, "zero-slave-tail", role="SYNC_MASTER", flush="SYNC_FLUSH")
    _zero_from(run, "s", off[3])
    # The master's tail zeroed: the slave now ends past it; under `reject`
    # the master refuses that slave, so m3 and m4 are stranded on it.
    run, off = _kept_run(root, "zero-master-tail", role="SYNC_MASTER", flush="ASYNC_FLUSH")
    _zero_from(run, "m", off[2])
    # m2's store timestamp rewritten on the slave: same id, size and body
    # CRC, other header bytes.
    run, off = _kept_run(root, "header-only", role="ASYNC_MASTER", flush="ASYNC_FLUSH")
    _patch(run, "s", off[1] + STORE_TS_AT, (TS + 999).to_bytes(8, "big"))
    # A consuming run with kept stores: its consume figures come from the
    # re-read stores too (they used to be read after those were removed).
    run, off = _kept_run(root, "consumed", role="ASYNC_MASTER", flush="SYNC_FLUSH")
    _consumer_files(run, off)
    # No kept store: one 200-byte master record against two 100-byte slave
    # records at the same offsets is one divergent message, not two offsets;
    # and a retried message acknowledged twice is one distinct message.
    make_run(root, "readback-only", role="ASYNC_MASTER", flush="ASYNC_FLUSH",
             history=[op(1, "a", 0), op(2, "a", 0, at=10, attempt=2), op(3, "b", 200, at=20)],
             records={"m": [rec(0, "a", size=200), rec(200, "b")],
                      "s": [rec(0, "x"), rec(100, "y"), rec(200, "b")]})
    out = os.path.join(root, "..", "out")
    status = cli.main(["report", root, "--out", out])
    verdicts = pd.read_parquet(os.path.join(out, "verdicts.parquet")).set_index("run_id")
    return verdicts, out, status


def test_a_consuming_run_with_kept_stores_gets_its_consume_figures(planted: Any) -> None:
    assert _pick(_row(planted, "consumed"), "judged_from delivered duplicates_delivered "
                 "stored_never_delivered delivered_then_lost") == {
        "judged_from": "kept stores", "delivered": 4, "duplicates_delivered": 0,
        "stored_never_delivered": 0, "delivered_then_lost": 0}


def _row(planted: Any, run_id: str) -> dict[str, Any]:
    verdicts, _, _ = planted
    return dict(verdicts.loc[run_id])


def _pick(row: dict[str, Any], keys: str) -> dict[str, Any]:
    return {k: (json.loads(row[k]) if k.endswith("_by_node") else row[k]) for k in keys.split()}


def test_a_store_unchanged_since_the_run_gives_the_read_back_verdict(planted: Any) -> None:
    verdicts, _, status = planted
    # Every run is reported; `dlab report` exits 1 because the planted ones
    # break promises (the violation and the zeroed tails).
    assert status == 1 and len(verdicts) == 8
    assert int((verdicts["verdict"] == "violation").sum()) == 2
    assert _pick(_row(planted, "clean"), "judged_from acked acked_lost_master "
                 "promise_violations divergent_records disk_damage_by_node "
                 "store_changed_by_node") == {
        "judged_from": "kept stores", "acked": 4, "acked_lost_master": 0,
        "promise_violations": 0, "divergent_records": 0, "disk_damage_by_node": {},
        "store_changed_by_node": {}}
    assert _row(planted, "readback-only")["judged_from"] == "read-back"


def test_a_record_flipped_on_the_kept_master_store_is_lost_acked_and_disk_damage(
        planted: Any) -> None:
    row = _row(planted, "flip-master")
    assert row["acked_lost_master"] == 2  # the read-back says 0
    m3 = int(json.loads(row["disk_damage_by_node"])["m"])
    assert _pick(row, "acked_lost_master acked_lost_everywhere disk_violations "
                      "promise_violations verdict store_changed_by_node") == {
        "acked_lost_master": 2, "acked_lost_everywhere": 0, "disk_violations": 2,
        "promise_violations": 2, "verdict": "violation", "store_changed_by_node": {"m": m3}}
    with open(os.path.join(planted[1], "report.md"), encoding="utf-8") as f:
        md = f.read()
    assert "## Stores damaged or changed on disk" in md
    assert f"flip-master: m damaged on disk at offset {m3:,}" in md


def test_a_tail_zeroed_on_every_kept_store_is_lost_everywhere(planted: Any) -> None:
    row = _row(planted, "zero-both")
    assert row["acked_lost_everywhere"] == 1  # the read-back says 0
    assert _pick(row, "acked_lost_master acked_lost_everywhere allowed_loss "
                      "promise_violations disk_damage_by_node") == {
        "acked_lost_master": 1, "acked_lost_everywhere": 1, "allowed_loss": 1,
        "promise_violations": 0, "disk_damage_by_node": {}}
    assert set(json.loads(row["store_changed_by_node"])) == {"m", "s"}


def test_a_zeroed_slave_tail_is_a_replica_violation(planted: Any) -> None:
    row = _row(planted, "zero-slave-tail")
    assert _pick(row, "acked_lost_master replica_violations disk_violations "
                      "promise_violations verdict") == {
        "acked_lost_master": 0, "replica_violations": 1, "disk_violations": 0,
        "promise_violations": 1, "verdict": "violation"}


def test_acks_only_on_a_slave_past_the_kept_master_are_stranded_and_it_is_ahead(
        planted: Any) -> None:
    row = _row(planted, "zero-master-tail")
    assert row["acked_lost_master"] == 2  # the read-back says 0
    assert _pick(row, "acked_lost_master acked_stranded allowed_loss promise_violations "
                      "replica_violations verdict slave_ahead slave_ahead_at_restart_bytes "
                      "slave_ahead_at_end_messages") == {
        "acked_lost_master": 2, "acked_stranded": 2, "allowed_loss": 0,
        "promise_violations": 0, "replica_violations": 0, "verdict": "stranded",
        "slave_ahead": True, "slave_ahead_at_restart_bytes": 0,
        "slave_ahead_at_end_messages": 2}
    assert row["slave_ahead_at_end_bytes"] > 0


def test_records_differing_in_header_bytes_only_diverge(planted: Any) -> None:
    row = _row(planted, "header-only")
    assert row["divergent_records"] == 1  # the read-back says 0
    m2 = int(json.loads(row["store_changed_by_node"])["s"])
    assert m2 > 0
    assert _pick(row, "divergent_records first_divergent_offset acked_lost_master") == {
        "divergent_records": 1, "first_divergent_offset": m2, "acked_lost_master": 0}


def test_divergence_counts_messages_and_acked_distinct_counts_ids(planted: Any) -> None:
    row = _row(planted, "readback-only")
    assert row["divergent_records"] == 1  # offsets from both logs: 2
    assert _pick(row, "divergent_records first_divergent_offset acked acked_distinct") == {
        "divergent_records": 1, "first_divergent_offset": 0, "acked": 3, "acked_distinct": 2}


# ------------------------------------------------------- without Spark
def test_first_difference_names_the_lowest_differing_offset() -> None:
    a = [rec(0, "a"), rec(100, "b"), rec(200, "c")]
    assert first_difference(a, a) is None
    assert first_difference(a, a[:2]) == 200  # a record the store no longer holds
    assert first_difference(a[:2], a) == 200
    assert first_difference(a, [a[0], dict(a[1], store_timestamp_ms=1), a[2]]) == 100
    hashed = [dict(r, record_hash=i) for i, r in enumerate(a)]
    assert first_difference(hashed, [*hashed[:2], dict(hashed[2], record_hash=-1)]) == 200
    assert first_difference(a, [*hashed[:2], dict(hashed[2], record_hash=-1)]) is None


def test_reread_leaves_out_a_run_whose_read_back_breaks_the_schema(tmp_path: Any) -> None:
    root = str(tmp_path / "runs")
    good, _ = _kept_run(root, "good", role="SYNC_MASTER", flush="SYNC_FLUSH")
    bad, _ = _kept_run(root, "bad", role="SYNC_MASTER", flush="SYNC_FLUSH")
    with open(os.path.join(bad, "nodes", "s", "records.jsonl"), "a", encoding="utf-8") as f:
        f.write('{"offset": 1\n')
    runs, problems = load_runs(find_run_dirs([root]))
    work = tmp_path / "work"
    work.mkdir()
    kept, left_out = reread(runs, str(work))
    assert [r.run_id for r in kept] == ["good"] and kept[0].index == 0
    assert [p.run_dir for p in left_out] == [bad]
    assert "records.jsonl:5: not JSON" in str(left_out[0])
    assert all(n.store_dir and n.store_differs_at is None for n in kept[0].nodes)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file whatever its mode")
def test_reread_names_a_kept_store_it_cannot_read(tmp_path: Any) -> None:
    root = str(tmp_path / "runs")
    run_dir, _ = _kept_run(root, "locked", role="SYNC_MASTER", flush="SYNC_FLUSH")
    segment = os.path.join(store_dir(run_dir, "s"), "commitlog", "0" * 20)
    os.chmod(segment, 0)
    try:
        runs, _ = load_runs(find_run_dirs([root]))
        kept, left_out = reread(runs, str(tmp_path))
    finally:
        os.chmod(segment, 0o644)
    assert kept == []
    assert str(left_out[0]).startswith(f"{segment}: cannot read the kept store (Permission")
