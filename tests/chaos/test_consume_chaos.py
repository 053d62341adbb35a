"""The consume side of chaos runs: the checker's exact figures on planted
faults (pure, and through the Spark report on hand-made run directories),
the result contract of the consumer files, and a real run with a real
consumer process SIGKILLed between its offset commits."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from support.chaos_runs import processes_mentioning, run_scenario
from support.pipeline_fixtures import T0, make_run, op, rec, spark  # noqa: F401

from chaos.check.consumption import figures
from chaos.check.run_dirs import load_run
from chaos.check.summary import one_line
from chaos.harness.consumer_proc import _Drain, collect
from chaos.report.pipeline import build_report
from chaos.schema import (
    SchemaError,
    read_jsonl,
    validate_consumer_files,
    validate_run_dir,
    write_json,
    write_jsonl,
)

pytestmark = pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas")


# ------------------------------------------------------------- fixtures
def _d(msg: str, incarnation: int = 1, qo: int = 0, node: str = "m") -> dict[str, Any]:
    return {"incarnation": incarnation, "msg_id": msg, "topic": "chaos", "queue_id": 0,
            "queue_offset": qo, "commitlog_offset": qo * 100, "node": node,
            "node_role": "SYNC_MASTER" if node == "m" else "SLAVE", "time_ms": T0 + qo}


def _commit(offset: int, incarnation: int = 1) -> dict[str, Any]:
    return {"incarnation": incarnation, "topic": "chaos", "queue_id": 0, "offset": offset,
            "time_ms": T0 + 5000}


def _consumer(incarnations: int, *, drained: bool = True) -> dict[str, Any]:
    return {"group": "chaos", "topic": "chaos", "commit_interval_ms": 5000,
            "incarnations": incarnations, "exit_codes": [-9] * (incarnations - 1) + [0],
            "drain_started_ms": T0 + 9000, "drained": drained,
            "ended_ms": T0 + 9600 if drained else None,
            "end_offsets": {"0": 4} if drained else None,
            "max_offsets": {"m": {"0": 4}} if drained else None}


def _add_consumer(run_dir: str, deliveries: list[dict[str, Any]],
                  commits: list[dict[str, Any]], summary: dict[str, Any]) -> str:
    write_jsonl(os.path.join(run_dir, "consumed.jsonl"), deliveries)
    write_jsonl(os.path.join(run_dir, "committed.jsonl"), commits)
    write_json(os.path.join(run_dir, "consumer.json"), summary)
    return run_dir


# Planted, with every number known: the consumer's first incarnation got
# a, b, c and committed offset 1 (after a); killed, the second started from
# 1 and got b and c again (2 duplicates) and d, which the master served
# before a crash took it from every node (1 delivered then lost); e is on
# the recovered master but was never delivered (1 stored never delivered);
# f lies past the master's flushed position under SYNC_FLUSH, so no
# consumer could read it (not counted).
PLANTED = [_d("a", 1, 0), _d("b", 1, 1), _d("c", 1, 2), _d("b", 2, 1), _d("c", 2, 2),
           _d("d", 2, 3)]
PLANTED_COMMITS = [_commit(1, 1), _commit(4, 2)]


def _planted_run(root: str, run_id: str = "planted", *, drained: bool = True,
                 role: str = "SYNC_MASTER", flush: str = "SYNC_FLUSH") -> str:
    # d was acknowledged at 300 and lost in a master crash; e took its place.
    history = [op(0, "a", 0), op(1, "b", 100), op(2, "c", 200), op(3, "d", 300),
               op(4, "e", 300, at=2000), op(5, "f", 400, at=2100)]
    master = [rec(0, "a"), rec(100, "b"), rec(200, "c"), rec(300, "e"), rec(400, "f")]
    d = make_run(root, run_id, role=role, flush=flush, history=history, scenario="consumer-crash",
                 records={"m": master, "s": master[:4]},
                 final={"m": {"flushed": 400}})  # f (400..500) is not flushed
    return _add_consumer(d, PLANTED, PLANTED_COMMITS, _consumer(2, drained=drained))


def _clean_run(root: str) -> str:
    """Every stored message delivered once: all consume figures zero."""
    history = [op(i, m, i * 100) for i, m in enumerate("xyz")]
    records = [rec(i * 100, m) for i, m in enumerate("xyz")]
    d = make_run(root, "clean", role="ASYNC_MASTER", flush="ASYNC_FLUSH", history=history,
                 scenario="master-crash-consuming", records={"m": records, "s": records})
    return _add_consumer(d, [_d(m, 1, i) for i, m in enumerate("xyz")], [_commit(3)],
                         _consumer(1))


# ---------------------------------------------------------- pure checker
BASE = {"deliveries": [_d("a", 1, 0), _d("b", 1, 1)], "master": {"a", "b"},
        "every": {"a", "b"}, "drained": True}


def _figures(case: dict[str, Any]) -> dict[str, int | None]:
    return figures(case["deliveries"], consumable_master_ids=case["master"],
                   every_node_ids=case["every"], drained=case["drained"], incarnations=1,
                   offsets_committed=0)


@pytest.mark.parametrize(("fault", "plant", "moved"), [
    ("a redelivery", lambda c: {**c, "deliveries": [*c["deliveries"], _d("a", 2, 0)]},
     {"duplicates_delivered": 1, "delivered": 3}),
    ("a stored message skipped", lambda c: {**c, "master": c["master"] | {"e"},
                                            "every": c["every"] | {"e"}},
     {"stored_never_delivered": 1}),
    ("a delivered message lost everywhere", lambda c: {**c, "deliveries": [
        *c["deliveries"], _d("d", 1, 2)]}, {"delivered_then_lost": 1, "delivered": 3}),
    ("a consumer that never drained", lambda c: {**c, "drained": False},
     {"stored_never_delivered": None}),
])
def test_the_checker_catches_each_planted_fault_and_only_it(fault: str, plant: Any,
                                                            moved: dict[str, Any]) -> None:
    clean = _figures(BASE)
    assert clean == {"delivered": 2, "duplicates_delivered": 0, "stored_never_delivered": 0,
                     "delivered_then_lost": 0, "consumer_incarnations": 1,
                     "offsets_committed": 0}
    assert _figures(plant(BASE)) == {**clean, **moved}, fault


def test_a_message_only_on_a_slave_is_not_delivered_then_lost() -> None:
    got = figures([_d("g", 1, 0, node="s")], consumable_master_ids=set(),
                  every_node_ids={"g"}, drained=True, incarnations=1, offsets_committed=0)
    assert got["delivered_then_lost"] == 0 and got["stored_never_delivered"] == 0


# ------------------------------------------------- the consumer process's files
def test_collect_tags_incarnations_and_trusts_only_the_last_ones_end(tmp_path: Path) -> None:
    def lines(*rows: dict[str, Any]) -> str:
        return "".join(json.dumps(r) + "\n" for r in rows)

    delivery = {k: v for k, v in _d("a").items() if k != "incarnation"}
    end = {"kind": "end", "time_ms": T0 + 9, "offsets": {"0": 1}, "max_offsets": {"m": {"0": 1}}}
    (tmp_path / "1.jsonl").write_text(lines({"kind": "delivery", **delivery},
                                            {"kind": "commit", "topic": "chaos", "queue_id": 0,
                                             "offset": 1, "time_ms": T0}, end))
    (tmp_path / "2.jsonl").write_text(lines({"kind": "delivery", **delivery}))
    kw: dict[str, Any] = {"group": "g", "topic": "chaos", "commit_interval_ms": 5000,
                          "drain_started_ms": T0, "exit_codes": [0, -9]}
    consumed, committed, summary = collect(str(tmp_path), 2, drained=True, **kw)
    assert [r["incarnation"] for r in consumed] == [1, 2]
    assert [(r["incarnation"], r["offset"]) for r in committed] == [(1, 1)]
    # The second incarnation wrote no end row: it did not drain, whatever
    # the harness believed.
    assert summary["drained"] is False and summary["ended_ms"] is None
    (tmp_path / "2.jsonl").write_text(lines({"kind": "delivery", **delivery}, end))
    assert collect(str(tmp_path), 2, drained=True, **kw)[2]["drained"] is True
    (tmp_path / "2.jsonl").write_text('{"kind": "deli')
    with pytest.raises(ValueError, match="not a JSON line"):
        collect(str(tmp_path), 2, drained=True, **kw)


def test_the_drain_stops_after_a_quiet_stretch_counted_from_the_last_delivery() -> None:
    d = _Drain(quiet_ms=600)
    assert not d.should_stop(10_000, False)  # no drain asked: never
    assert not d.should_stop(10_100, True)  # asked at 10.1 s
    d.last_delivery_ms = 10_500
    assert not d.should_stop(10_800, True)  # 700 ms since asked, 300 since a delivery
    assert d.should_stop(11_100, False)  # 600 ms quiet (the file is seen once is enough)
    assert _Drain(quiet_ms=600).should_stop(0, False, at_once=True)


# ------------------------------------------------- through the Spark report
@pytest.fixture(scope="module")
def consume_report(spark: Any, tmp_path_factory: Any) -> tuple[Any, str]:  # noqa: F811
    tmp = tmp_path_factory.mktemp("consume")
    root = str(tmp / "runs")
    _planted_run(root)
    _planted_run(root, "planted-undrained", drained=False)
    _clean_run(root)
    # A run without a consumer, as every result before the consume side.
    make_run(root, "plain", role="SYNC_MASTER", flush="SYNC_FLUSH", scenario="master-crash",
             history=[op(0, "p", 0)], records={"m": [rec(0, "p")], "s": [rec(0, "p")]})
    out = str(tmp / "report")
    return build_report([root], out), out


def test_verdicts_carry_the_exact_planted_figures(consume_report: Any) -> None:
    summary, out = consume_report
    for v in (summary.verdicts, pd.read_csv(os.path.join(out, "verdicts.csv")),
              pd.read_parquet(os.path.join(out, "verdicts.parquet"))):
        v = v.set_index("run_id")
        assert v.loc["planted", ["delivered", "duplicates_delivered", "stored_never_delivered",
                                 "delivered_then_lost", "consumer_incarnations",
                                 "offsets_committed"]].tolist() == [6, 2, 1, 1, 2, 2]
        assert v.loc["clean", ["duplicates_delivered", "stored_never_delivered",
                               "delivered_then_lost"]].tolist() == [0, 0, 0]
        # Not drained: what was stored but never delivered is unknown, not 0.
        assert v.loc["planted-undrained", "duplicates_delivered"] == 2
        assert pd.isna(v.loc["planted-undrained", "stored_never_delivered"])
        assert v.loc["plain", ["delivered", "duplicates_delivered", "stored_never_delivered",
                               "delivered_then_lost"]].isna().all()
        # The durability side of the planted run is unchanged by its consumer:
        # d was acknowledged and is on no node.
        assert v.loc["planted", "acked_lost_everywhere"] == 1


def test_comparison_sums_consume_figures_per_mode_and_scenario(consume_report: Any) -> None:
    summary, out = consume_report
    for c in (summary.comparison, pd.read_csv(os.path.join(out, "comparison.csv")),
              pd.read_parquet(os.path.join(out, "comparison.parquet"))):
        c = c.set_index(["role", "flush", "scenario"])
        planted = c.loc[("SYNC_MASTER", "SYNC_FLUSH", "consumer-crash")]
        assert planted["runs"] == 2
        assert planted["duplicates_delivered"] == 4
        assert planted["stored_never_delivered"] == 1  # the drained run's only
        assert planted["delivered_then_lost"] == 2
        assert c.loc[("ASYNC_MASTER", "ASYNC_FLUSH", "master-crash-consuming"),
                     "duplicates_delivered"] == 0
        assert pd.isna(c.loc[("SYNC_MASTER", "SYNC_FLUSH", "master-crash"),
                             "duplicates_delivered"])


def test_the_report_says_the_consume_figures_per_mode(consume_report: Any) -> None:
    _, out = consume_report
    md = Path(out, "report.md").read_text(encoding="utf-8")
    assert ("Consuming while producing (2 runs, consumer-crash): 4 duplicate deliveries, "
            "**1 stored message never delivered** (of 1 run whose consumer drained), "
            "**2 messages delivered and then lost** (consumed before they were durable).") in md
    assert ("Consuming while producing (1 run, master-crash-consuming): 0 duplicate "
            "deliveries, every stored message delivered, nothing delivered that was later "
            "lost.") in md
    # The durability table's consume columns.
    assert "| dup. delivered | never delivered | delivered then lost |" in md
    html = Path(out, "report.html").read_text(encoding="utf-8")
    assert "stored message never delivered" in html


# ---------------------------------------------------------------- schema
def test_runs_without_consumer_files_validate_and_have_none(tmp_path: Path) -> None:
    d = make_run(str(tmp_path), "plain", role="SYNC_MASTER", flush="SYNC_FLUSH",
                 history=[op(0, "p", 0)], records={"m": [rec(0, "p")]})
    assert validate_consumer_files(d) is False
    assert validate_run_dir(d) == ["m"]


def test_a_malformed_consumer_file_is_named_and_leaves_the_run_out(tmp_path: Path) -> None:
    d = _planted_run(str(tmp_path))
    assert validate_consumer_files(d) is True
    load_run(d, 0)
    rows = read_jsonl(os.path.join(d, "consumed.jsonl"))
    rows[3]["queue_offset"] = "three"
    write_jsonl(os.path.join(d, "consumed.jsonl"), rows)
    for check in (validate_run_dir, lambda d: load_run(d, 0)):
        with pytest.raises(SchemaError, match=r"consumed.jsonl:4.*queue_offset"):
            check(d)
    write_jsonl(os.path.join(d, "consumed.jsonl"), PLANTED)
    os.remove(os.path.join(d, "committed.jsonl"))
    with pytest.raises(SchemaError, match=r"not committed.jsonl"):
        load_run(d, 0)


def test_consumer_faults_name_the_consumer_not_a_node(tmp_path: Path) -> None:
    d = _planted_run(str(tmp_path))
    faults = [{"fault_id": 0, "kind": "kill", "node": "consumer", "peer": None,
               "start_ms": T0 + 1, "end_ms": None, "damages_disk": False, "detail": None}]
    write_jsonl(os.path.join(d, "faults.jsonl"), faults)
    run = load_run(d, 0)
    assert run.nodes[0].copy_void_until_ms == load_run(_clean_run(str(tmp_path)), 0
                                                       ).nodes[0].copy_void_until_ms
    faults[0]["node"] = "nobody"
    write_jsonl(os.path.join(d, "faults.jsonl"), faults)
    with pytest.raises(SchemaError, match="'nobody' is not a node"):
        load_run(d, 0)


# ------------------------------------------------------------- a real run
def test_a_consumer_killed_between_commits_is_handed_messages_again(tmp_path: Path) -> None:
    """A real run: producers, a consumer process SIGKILLed inside its 5 s
    commit interval and started again, the cluster drained at the end."""
    run_dir = run_scenario(str(tmp_path), "consumer-crash", "SYNC_MASTER", "SYNC_FLUSH", 5)
    assert validate_run_dir(run_dir) == ["master", "slave1"]
    run = load_run(run_dir, 0)
    consumed = read_jsonl(os.path.join(run_dir, "consumed.jsonl"))
    committed = read_jsonl(os.path.join(run_dir, "committed.jsonl"))
    with open(os.path.join(run_dir, "consumer.json")) as f:
        summary = json.load(f)
    assert [(f["kind"], f["node"]) for f in run.faults][:2] == [("kill", "consumer"),
                                                                ("start", "consumer")]
    assert {r["incarnation"] for r in consumed} == {1, 2}
    assert summary["incarnations"] == 2 and summary["drained"] is True
    assert summary["exit_codes"] == [-9, 0]
    # Killed before its first commit (2-3.5 s into a 5 s interval): the
    # second incarnation starts from the queues' first offsets, so every
    # message the first one got is delivered exactly once more.
    first = [r for r in consumed if r["incarnation"] == 1]
    assert first and not [c for c in committed if c["incarnation"] == 1]
    master = read_jsonl(os.path.join(run_dir, "nodes", "master", "records.jsonl"))
    assert len({r["msg_id"] for r in master}) == len(master)  # no stored duplicates
    # Each delivery is the record at that commitlog offset on the node that served it.
    at = {r["offset"]: r["msg_id"] for r in master}
    assert all(at[r["commitlog_offset"]] == r["msg_id"] for r in consumed
               if r["node"] == "master")
    from chaos.check.consumption import run_figures
    got = run_figures(run)
    assert got == {"delivered": len(consumed), "duplicates_delivered": len(first),
                   "stored_never_delivered": 0,  # drained: nothing stored was skipped
                   "delivered_then_lost": 0,  # SYNC_FLUSH serves only flushed messages
                   "consumer_incarnations": 2, "offsets_committed": len(committed)}
    # The clean end committed where the consumer stopped: the queues' ends.
    last = {c["queue_id"]: c["offset"] for c in committed if c["incarnation"] == 2}
    assert {str(q): o for q, o in last.items()} == summary["end_offsets"]
    assert summary["end_offsets"] == summary["max_offsets"]["master"]
    assert sum(summary["end_offsets"].values()) == len(master)
    assert (f"consumer: {len(consumed)} delivered, {len(first)} duplicates, 0 stored never "
            "delivered, 0 delivered then lost") in one_line(run_dir)
    assert processes_mentioning(run_dir) == []


def test_a_master_crashed_before_persisting_offsets_makes_a_new_consumer_start_over(
    tmp_path: Path,
) -> None:
    """A real run: the consumer commits every second to the master, which is
    SIGKILLed before its first 5 s persist of the offset table; the consumer
    stops cleanly while the master is down; a new one asks the restarted
    master where to resume and is told nothing: it starts from the first
    offset, and is handed again everything the master kept."""
    run_dir = run_scenario(str(tmp_path), "master-crash-consuming", "SYNC_MASTER", "SYNC_FLUSH", 3)
    run = load_run(run_dir, 0)
    assert [(f["kind"], f["node"]) for f in run.faults][:4] == [
        ("kill", "master"), ("stop", "consumer"), ("start", "master"), ("start", "consumer")]
    assert run.faults[1]["detail"] == "consumer stopped cleanly (committed)"
    with open(os.path.join(run_dir, "consumer.json")) as f:
        assert json.load(f)["exit_codes"] == [0, 0]
    killed_ms = run.faults[0]["start_ms"]
    consumed = read_jsonl(os.path.join(run_dir, "consumed.jsonl"))
    committed = read_jsonl(os.path.join(run_dir, "committed.jsonl"))
    before_crash = [c["offset"] for c in committed
                    if c["incarnation"] == 1 and c["time_ms"] < killed_ms]
    assert before_crash and max(before_crash) > 0  # the master had taken commits
    second = [r for r in consumed if r["incarnation"] == 2]
    assert second and min(r["queue_offset"] for r in second) == 0  # and lost them
    master = {r["msg_id"] for r in read_jsonl(os.path.join(run_dir, "nodes", "master",
                                                           "records.jsonl"))}
    first = {r["msg_id"] for r in consumed if r["incarnation"] == 1}
    again = first & master
    assert again and again <= {r["msg_id"] for r in second}
    from chaos.check.consumption import run_figures
    got = run_figures(run)
    assert got is not None
    assert got["duplicates_delivered"] >= len(again)
    assert got["stored_never_delivered"] == 0
    # SYNC_FLUSH: the master and, while it was down, the slave served only
    # flushed records, and the reject policy truncates neither log.
    assert got["delivered_then_lost"] == 0
    assert processes_mentioning(run_dir) == []
