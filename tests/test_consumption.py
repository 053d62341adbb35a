"""The consume-side checker: exact figures on planted faults (pure and
through the Spark report), the schema of consumed.jsonl, and real chaos
runs with a real consumer process killed between its offset commits."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from pipeline_fixtures import T0, make_run, op, rec, spark  # noqa: F401
from test_chaos_run import _processes_mentioning, _run

from chaos.consumption import figures
from chaos.pipeline import build_report
from chaos.schema import SchemaError, read_jsonl, validate_run_dir, write_jsonl


def _d(msg: str, incarnation: int = 1, qo: int = 0) -> dict[str, Any]:
    return {"incarnation": incarnation, "msg_id": msg, "topic": "chaos", "queue_id": 0,
            "queue_offset": qo, "commitlog_offset": qo * 100, "node": "127.0.0.1:1",
            "node_role": "SYNC_MASTER", "time_ms": T0 + qo}


# Planted: b and c delivered twice (a consumer restarted before committing),
# e stored on the master but never delivered, d delivered but on no node.
DELIVERIES = [_d("a", 1, 0), _d("b", 1, 1), _d("c", 1, 2), _d("b", 2, 1), _d("c", 2, 2),
              _d("d", 2, 3)]


def test_the_checker_counts_each_planted_fault_exactly() -> None:
    got = figures(DELIVERIES, {"a", "b", "c", "e"}, {"a", "b", "c", "e", "f"})
    assert got == {"delivered": 6, "duplicates_delivered": 2, "stored_never_delivered": 1,
                   "delivered_then_lost": 1, "consumer_incarnations": 2}
    clean = figures(DELIVERIES[:3], {"a", "b", "c"}, {"a", "b", "c"})
    assert clean == {"delivered": 3, "duplicates_delivered": 0, "stored_never_delivered": 0,
                     "delivered_then_lost": 0, "consumer_incarnations": 1}


def _consuming_run(root: str) -> str:
    history = [op(i, m, i * 100) for i, m in enumerate("abcde")]
    records = {"m": [rec(i * 100, m) for i, m in enumerate("abce")],
               "s": [rec(i * 100, m) for i, m in enumerate("abcef")]}
    d = make_run(root, "consuming", role="SYNC_MASTER", flush="SYNC_FLUSH", history=history,
                 records=records, scenario="consumer-crash")
    write_jsonl(os.path.join(d, "consumed.jsonl"), DELIVERIES)
    return d


def test_the_report_carries_consume_figures_and_leaves_them_empty_without_a_consumer(
    spark: Any, tmp_path: str  # noqa: F811
) -> None:
    root = os.path.join(str(tmp_path), "runs")
    _consuming_run(root)
    make_run(root, "plain", role="SYNC_MASTER", flush="SYNC_FLUSH",
             history=[op(0, "x", 0)], records={"m": [rec(0, "x")], "s": [rec(0, "x")]})
    out = os.path.join(str(tmp_path), "report")
    summary = build_report([root], out)
    v = summary.verdicts.set_index("run_id")
    assert v.loc["consuming", "duplicates_delivered"] == 2
    assert v.loc["consuming", "stored_never_delivered"] == 1
    assert v.loc["consuming", "delivered_then_lost"] == 1
    assert v.loc["consuming", "consumer_incarnations"] == 2
    assert pd.isna(v.loc["plain", "delivered"])
    c = summary.comparison.set_index("scenario")
    assert c.loc["consumer-crash", "duplicates_delivered"] == 2
    md = Path(out, "report.md").read_text(encoding="utf-8")
    assert "2 duplicate deliveries" in md and "1 stored message never delivered" in md
    assert "1 message delivered and then lost" in md
    csv = Path(out, "comparison.csv").read_text(encoding="utf-8")
    assert "duplicates_delivered" in csv.splitlines()[0]


def test_a_malformed_consumed_row_is_named(tmp_path: str) -> None:
    d = _consuming_run(str(tmp_path))
    validate_run_dir(d)
    rows = read_jsonl(os.path.join(d, "consumed.jsonl"))
    rows[3]["queue_offset"] = "three"
    write_jsonl(os.path.join(d, "consumed.jsonl"), rows)
    with pytest.raises(SchemaError, match=r"consumed.jsonl:4.*queue_offset"):
        validate_run_dir(d)


def test_a_consumer_killed_between_commits_is_handed_messages_again(tmp_path: str) -> None:
    """A real run: producers, a consumer process SIGKILLed inside its 5 s
    commit interval and started again, the cluster drained at the end."""
    run_dir = _run(str(tmp_path), "consumer-crash", "SYNC_MASTER", "SYNC_FLUSH", 5)
    assert validate_run_dir(run_dir) == ["master", "slave1"]
    consumed = read_jsonl(os.path.join(run_dir, "consumed.jsonl"))
    faults = read_jsonl(os.path.join(run_dir, "faults.jsonl"))
    assert [(f["kind"], f["node"]) for f in faults][:2] == [("kill", "consumer"),
                                                            ("start", "consumer")]
    assert {r["incarnation"] for r in consumed} == {1, 2}
    master = {r["msg_id"] for r in read_jsonl(os.path.join(run_dir, "nodes", "master",
                                                           "records.jsonl"))}
    got = figures(consumed, master, master)
    # The second incarnation starts from offset 0 (nothing was committed in
    # the first 5 s): everything the first one got is delivered again.
    first = {r["msg_id"] for r in consumed if r["incarnation"] == 1}
    assert first and got["duplicates_delivered"] >= len(first)
    assert got["stored_never_delivered"] == 0  # drained: nothing stored was skipped
    assert got["delivered_then_lost"] == 0  # SYNC_FLUSH reads only flushed messages
    assert _processes_mentioning(run_dir) == []
