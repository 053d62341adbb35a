"""The checker and report on fixture run directories with known contents:
exact figures per run, the comparison, the promise table against the Spark
judgement, malformed input, and `dlab report`. One local Spark session for
the module (tests/support/pipeline_fixtures.py)."""

from __future__ import annotations

import itertools
import json
import os
import re
from typing import Any

import pandas as pd
import pytest
from support.pipeline_fixtures import (  # noqa: F401
    LOSS_HISTORY,
    T0,
    THREE,
    fault,
    fixture_runs,
    make_run,
    op,
    rec,
    slave_ahead,
    spark,
)

from chaos import cli
from chaos.bench import pipeline as bench
from chaos.check import promises
from chaos.check.run_dirs import (
    ALWAYS_MS,
    NEVER_MS,
    find_run_dirs,
    load_run,
    load_runs,
    void_until,
)
from chaos.check.summary import run_outcome
from chaos.report.pipeline import NoRunsError, _run_query, build_report, checker_query
from chaos.schema import validate_run_dir

# pyspark warns that it was not tested with pandas 3 when it first meets pandas.
pytestmark = pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas")

MODES = list(promises.PROMISES)

@pytest.fixture(scope="module")
def fixture_root(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = str(tmp_path_factory.mktemp("runs"))
    fixture_runs(root)
    return root


@pytest.fixture(scope="module")
def fixture_report(spark: Any, fixture_root: str) -> Any:  # noqa: F811
    return build_report([fixture_root], os.path.join(fixture_root, "..", "report"))


def _verdict(summary: Any, run_id: str) -> dict[str, Any]:
    rows = summary.verdicts[summary.verdicts["run_id"] == run_id]
    assert len(rows) == 1, run_id
    return rows.iloc[0].to_dict()


def _figures(v: dict[str, Any], keys: str) -> dict[str, Any]:
    return {k: v[k] for k in keys.split()}


LOSS_KEYS = ("acked acked_lost_master acked_lost_everywhere disk_promises disk_violations "
             "replica_promises replica_violations promise_violations allowed_loss")


def test_sync_flush_master_missing_a_put_ok_is_one_violation(fixture_report: Any) -> None:
    v = _verdict(fixture_report, "loss-async-sync")
    assert _figures(v, LOSS_KEYS) == {
        "acked": 4, "acked_lost_master": 1, "acked_lost_everywhere": 1, "disk_promises": 4,
        "disk_violations": 1, "replica_promises": 0, "replica_violations": 0,
        "promise_violations": 1, "allowed_loss": 0}
    assert v["verdict"] == "violation"
    assert json.loads(v["acked_lost_by_node"]) == {"m": 1, "s": 1}


def test_the_same_loss_under_async_master_async_flush_is_allowed(fixture_report: Any) -> None:
    v = _verdict(fixture_report, "loss-async-async")
    assert _figures(v, LOSS_KEYS) == {
        "acked": 4, "acked_lost_master": 1, "acked_lost_everywhere": 1, "disk_promises": 0,
        "disk_violations": 0, "replica_promises": 0, "replica_violations": 0,
        "promise_violations": 0, "allowed_loss": 1}
    assert v["verdict"] == "ok" and v["promises"] == "none"


def test_both_promises_broken_count_one_violation(fixture_report: Any) -> None:
    v = _verdict(fixture_report, "loss-sync-sync")
    assert _figures(v, LOSS_KEYS) == {
        "acked": 4, "acked_lost_master": 1, "acked_lost_everywhere": 1, "disk_promises": 4,
        "disk_violations": 1, "replica_promises": 4, "replica_violations": 1,
        "promise_violations": 1, "allowed_loss": 0}


def test_sync_master_async_flush_loss_held_by_a_rejected_slave_is_stranded(
        fixture_report: Any) -> None:
    v = _verdict(fixture_report, "loss-sync-async-slave-kept")
    # The slave holds m4 past the master's end: under `reject` the master
    # refuses it, so m4 is stranded there, neither kept nor an allowed loss.
    assert _figures(v, LOSS_KEYS + " acked_stranded acked_distinct") == {
        "acked": 4, "acked_lost_master": 1, "acked_lost_everywhere": 0, "disk_promises": 0,
        "disk_violations": 0, "replica_promises": 4, "replica_violations": 0,
        "promise_violations": 0, "allowed_loss": 0, "acked_stranded": 1, "acked_distinct": 4}
    assert json.loads(v["acked_lost_by_node"]) == {"m": 1, "s": 0}
    assert v["verdict"] == "stranded"
    assert _figures(v, "slave_ahead_at_restart_bytes slave_ahead_at_end_bytes "
                       "slave_ahead_at_end_messages") == {
        "slave_ahead_at_restart_bytes": 0, "slave_ahead_at_end_bytes": 100,
        "slave_ahead_at_end_messages": 1}


def test_same_offset_different_bytes_is_divergence(fixture_report: Any) -> None:
    v = _verdict(fixture_report, "diverge")
    # Common range [0, 300): offset 100 (same id, other CRC) and offset 200
    # (reused by the restarted master) differ; 0 matches.
    # m3 and m4 are held only by the slave the master rejected: stranded.
    assert _figures(v, "divergent_records first_divergent_offset slave_ahead "
                       "slave_ahead_at_restart_bytes slave_ahead_at_restart_messages "
                       "slave_ahead_at_end_bytes slave_ahead_at_end_messages acked_lost_master "
                       "acked_lost_everywhere promise_violations allowed_loss "
                       "acked_stranded") == {
        "divergent_records": 2, "first_divergent_offset": 100, "slave_ahead": True,
        "slave_ahead_at_restart_bytes": 200, "slave_ahead_at_restart_messages": 2,
        "slave_ahead_at_end_bytes": 100, "slave_ahead_at_end_messages": 1,
        "acked_lost_master": 2, "acked_lost_everywhere": 0, "promise_violations": 0,
        "allowed_loss": 0, "acked_stranded": 2}
    assert _verdict(fixture_report, "loss-async-sync")["divergent_records"] == 0


def test_split_brain_acks_and_where_the_old_and_new_master_part(fixture_report: Any
                                                                ) -> None:
    """The planted isolated-master run (pipeline_fixtures.failover_run): two
    PUT_OKs from m after s was promoted, three records diverging from offset
    100; the report says so per mode, and the run's own outcome agrees."""
    v = _verdict(fixture_report, "split-brain")
    assert _figures(v, "split_brain_acks divergent_records first_divergent_offset "
                       "acked_lost_master acked_lost_failover allowed_loss acked_stranded "
                       "promise_violations") == {
        "split_brain_acks": 2, "divergent_records": 3, "first_divergent_offset": 100,
        "acked_lost_master": 3, "acked_lost_failover": 3, "allowed_loss": 3,
        "acked_stranded": 0, "promise_violations": 0}
    assert run_outcome(v["run_dir"]).split_brain_acks == 2
    # No failover, no split brain, in every other run.
    others = fixture_report.verdicts[fixture_report.verdicts["run_id"] != "split-brain"]
    assert (others["split_brain_acks"] == 0).all()
    c = fixture_report.comparison.set_index("scenario").loc["isolated-master"]
    assert (c["split_brain_runs"], c["split_brain_acks"]) == (1, 2)
    with open(os.path.join(fixture_report.out_dir, "report.md"), encoding="utf-8") as f:
        md = f.read()
    section = md[md.index("## After a failover"):md.index("## Reading this report")]
    assert ("| ASYNC_MASTER + ASYNC_FLUSH | isolated-master | [split brain 1/1 runs "
            "(21–100 %) · 2 acks in all; diverged 1/1 runs (21–100 %) · 3 records in all; "
            "first divergent at 100 (seed 1)](runs/split-brain.html) |") in section, section
    with open(os.path.join(fixture_report.out_dir, "runs", "split-brain.html"),
              encoding="utf-8") as f:
        page = f.read()
    assert ("split brain</td><td>2 PUT_OKs answered by a node the route no longer named "
            "as master") in page
    assert "3 records the master and another node hold differently, the first at offset 100" \
        in page


def test_one_id_at_two_offsets_is_a_duplicate(fixture_report: Any) -> None:
    v = _verdict(fixture_report, "dup")
    assert _figures(v, "duplicates duplicate_records indeterminate indeterminate_found "
                       "indeterminate_not_found acked acked_lost_master") == {
        "duplicates": 1, "duplicate_records": 2, "indeterminate": 2, "indeterminate_found": 1,
        "indeterminate_not_found": 1, "acked": 2, "acked_lost_master": 0}
    assert v["acked_distinct"] == 2
    assert json.loads(v["failed_by_status"]) == {"INDETERMINATE": 2}


def test_trust_policy_sync_master_put_ok_on_no_slave_is_a_violation(fixture_report: Any
                                                                    ) -> None:
    v = _verdict(fixture_report, "trust")
    # m2: on the master, on no slave -> violation. m_old: lost on the master,
    # held only by the slave whose offset the master believed and whose
    # record it never reads -> stranded. The slave was 100 bytes ahead.
    assert _figures(v, "promise_violations replica_violations replica_void "
                       "acked_lost_master acked_lost_everywhere allowed_loss acked_stranded "
                       "divergent_records slave_ahead_at_restart_bytes "
                       "slave_ahead_at_restart_messages") == {
        "promise_violations": 1, "replica_violations": 1, "replica_void": 0,
        "acked_lost_master": 1, "acked_lost_everywhere": 0, "allowed_loss": 0,
        "acked_stranded": 1, "divergent_records": 1, "slave_ahead_at_restart_bytes": 100,
        "slave_ahead_at_restart_messages": 1}
    assert v["slave_ahead_policy"] == "trust"


def test_damage_and_power_crash_void_promises_made_before_them(fixture_report: Any) -> None:
    v = _verdict(fixture_report, "void")
    assert _figures(v, "disk_void disk_violations replica_void replica_violations "
                       "promise_violations allowed_loss acked_lost_everywhere") == {
        "disk_void": 1, "disk_violations": 1, "replica_void": 1, "replica_violations": 1,
        "promise_violations": 1, "allowed_loss": 1, "acked_lost_everywhere": 2}


def test_latency_order_and_availability(fixture_report: Any) -> None:
    v = _verdict(fixture_report, "timing")
    assert v["put_ok_p50_us"] == pytest.approx(2500)
    assert v["put_ok_p99_us"] == pytest.approx(3970)
    assert _figures(v, "puts acked failed order_inversions indeterminate") == {
        "puts": 7, "acked": 4, "failed": 3, "order_inversions": 1, "indeterminate": 1}
    assert v["failed_put_share"] == pytest.approx(3 / 7)
    assert json.loads(v["failed_by_status"]) == {
        "INDETERMINATE": 1, "SERVICE_NOT_AVAILABLE": 1, "SLAVE_NOT_AVAILABLE": 1}
    t = fixture_report.timeline
    t = t[t["run_id"] == "timing"]
    assert [(r.second, r.status, r.ops) for r in t.itertuples()] == [
        (0, "PUT_OK", 3), (1, "PUT_OK", 1), (2, "SERVICE_NOT_AVAILABLE", 1),
        (2, "SLAVE_NOT_AVAILABLE", 1), (3, "INDETERMINATE", 1)]
    assert t[t["second"] == 0]["latency_p50_us"].item() == pytest.approx(2000)


def test_time_from_a_fault_to_the_next_put_ok(fixture_report: Any) -> None:
    # diverge: the master killed at 1000 ms, m5 invoked at 2000 answered at 2005.
    v = _verdict(fixture_report, "diverge")
    assert (v["fault_to_put_ok_s"], v["unwritable_until_end"]) == (pytest.approx(1.005), False)
    # void: faults at 1000 and 2000, the next PUT_OK invoked at 3000: the longest.
    assert _verdict(fixture_report, "void")["fault_to_put_ok_s"] == pytest.approx(2.005)
    v = _verdict(fixture_report, "timing-2")
    assert v["unwritable_until_end"] and pd.isna(v["fault_to_put_ok_s"])
    assert pd.isna(_verdict(fixture_report, "dup")["fault_to_put_ok_s"])  # no fault
    c = fixture_report.comparison.set_index("scenario")
    assert c.loc["timing", "unwritable_runs"] == 1
    assert json.loads(c.loc["timing", "failed_by_status"]) == {
        "FLUSH_DISK_TIMEOUT": 1, "INDETERMINATE": 1, "SERVICE_NOT_AVAILABLE": 1,
        "SLAVE_NOT_AVAILABLE": 1}


def test_lost_message_ids_are_named_with_offsets(fixture_report: Any) -> None:
    lost = pd.read_parquet(os.path.join(fixture_report.out_dir, "lost.parquet"))
    by = {r: [(m["msg_id"], m["acked_offset"], m["held_by"], m["lost_everywhere"],
               m["stranded"], m["violation"]) for m in g.to_dict("records")]
          for r, g in lost.groupby("run_id")}
    # Acknowledged at offset 300, gone from every node, a broken disk promise.
    assert by["loss-async-sync"] == [("m4", 300, "", True, False, True)]
    # Held only by a slave the master rejects: stranded.
    assert by["loss-sync-async-slave-kept"] == [("m4", 300, "s", False, True, False)]
    assert [m[:3] for m in by["diverge"]] == [("m3", 200, "s"), ("m4", 300, "s")]
    assert set(by) == set(fixture_report.verdicts.loc[
        fixture_report.verdicts["acked_lost_master"] > 0, "run_id"])


def test_comparison_one_row_per_mode_and_scenario(fixture_report: Any) -> None:
    c = fixture_report.comparison
    assert len(c) == 10
    row = c[(c["scenario"] == "timing")].iloc[0].to_dict()
    assert _figures(row, "role flush runs puts acked failed_put_share put_ok_p50_us "
                         "acked_lost_master promise_violations indeterminate") == {
        "role": "ASYNC_MASTER", "flush": "SYNC_FLUSH", "runs": 2, "puts": 9, "acked": 5,
        "failed_put_share": pytest.approx(4 / 9), "put_ok_p50_us": pytest.approx(3000),
        "acked_lost_master": 0, "promise_violations": 0, "indeterminate": 1}
    # Latency percentiles are over all PUT_OKs of the group: 1, 2, 3, 4, 10.
    assert row["put_ok_p99_us"] == pytest.approx((4 + 0.96 * 6) * 1000)
    crash = c[(c["scenario"] == "master-crash") & (c["role"] == "ASYNC_MASTER")].iloc[0]
    assert (crash["slave_ahead_runs"], crash["slave_ahead_at_restart_bytes_max"],
            crash["slave_ahead_at_end_bytes_max"], crash["divergence_runs"]) == (1, 200, 100, 1)
    issue_columns = [
        "role", "flush", "scenario", "runs", "acked", "acked_lost_master",
        "acked_lost_everywhere", "promise_violations", "slave_ahead_runs",
        "slave_ahead_at_restart_bytes_max", "slave_ahead_at_end_bytes_max", "acked_stranded",
        "acked_distinct", "divergence_runs", "duplicates", "indeterminate",
        "put_ok_p50_us", "put_ok_p99_us", "failed_put_share",
    ]
    assert set(issue_columns) <= set(c.columns)
    assert "backend" in c.columns


def test_tables_and_report_are_written(fixture_report: Any) -> None:
    out = fixture_report.out_dir
    for name in ("verdicts", "comparison", "timeline"):
        csv = pd.read_csv(os.path.join(out, f"{name}.csv"))
        parquet = pd.read_parquet(os.path.join(out, f"{name}.parquet"))
        assert len(csv) == len(parquet) == len(getattr(fixture_report, name))
    verdicts = pd.read_parquet(os.path.join(out, "verdicts.parquet"))
    assert set(verdicts["run_id"]) == {
        "loss-async-sync", "loss-async-async", "loss-sync-sync", "loss-sync-async-slave-kept",
        "diverge", "dup", "trust", "void", "timing", "timing-2", "split-brain"}
    assert {"seed", "backend", "crash_model", "slave_ahead_policy"} <= set(verdicts.columns)
    for plot in ("plots/outcomes", "plots/slave_ahead", "runs/diverge"):
        with open(os.path.join(out, f"{plot}.png"), "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    with open(os.path.join(out, "report.md"), encoding="utf-8") as f:
        md = f.read()
    # The answer first: a mode per row, a column per backend; then a row
    # per mode and scenario, a cell linking to its run(s).
    assert md.index("## The answer") < md.index("## By scenario") < md.index(
        "## Reading this report") < md.index("## What a PUT_OK promises") < md.index(
        "## Durability") < md.index("## Availability and latency") < md.index("## Glossary")
    assert "| mode | local |" in md  # one backend: no agreement column
    assert ("| SYNC_MASTER + SYNC_FLUSH; on the master's disk, and received by a slave | "
            "lost: 2/2 runs (34–100 %) · msgs/run median 1.5, max 2; broke promise: 2/2 runs "
            "(34–100 %); stranded: 0/2 runs (0–66 %) · max 0 msgs;") in md, md
    assert ("| SYNC_MASTER + SYNC_FLUSH | disk | [lost 1/1 (21–100 %), max 2; broke promise "
            "1/1 · stranded 0/1](runs/void.html) |") in md
    assert ("| ASYNC_MASTER + SYNC_FLUSH | timing | [lost 0/2 (0–66 %); broke promise 0/2 · "
            "stranded 0/2; unwritable ≤ 5.03 s (1 to the end)]"
            "(#runs-async-master-sync-flush-timing) |") in md
    assert '<a id="runs-async-master-sync-flush-timing"></a>[timing](runs/timing.html)' in md
    # Two tables of readable columns (the runs varied the slave-ahead policy).
    assert "| mode | scenario | slave_ahead_policy | runs | acked | lost on master |" in md
    assert "| mode | scenario | slave_ahead_policy | runs | puts | failed |" in md
    assert "### SYNC_MASTER + SYNC_FLUSH" in md
    assert "![Outcome of every put, per mode and backend](plots/outcomes.png)" in md
    assert "11 runs reported (local 11); 4 runs broke a promise." in md
    assert ("**2 acknowledged messages broke the mode's promise** in 2 runs (disk, loss)."
            in md)
    with open(os.path.join(out, "report.html"), encoding="utf-8") as f:
        page = f.read()
    assert '<img src="plots/outcomes.png"' in page and "<table>" in page
    assert ('<td class="violation"><a href="runs/void.html">lost 1/1 (21–100 %), max 2<br>'
            'broke promise 1/1 · stranded 0/1</a></td>') in page
    for run_id in fixture_report.verdicts["run_id"]:
        assert os.path.isfile(os.path.join(out, "runs", f"{run_id}.html"))
        assert f'href="runs/{run_id}.html"' in page


# ------------------------------------------------- promises: Spark == judge()
def test_spark_judgement_matches_promises_judge_in_every_case(spark: Any,  # noqa: F811
                                                              tmp_path: Any) -> None:
    """Per mode, two runs (damage before the crash, and after it); in each,
    every combination of (held by master, held by slave) at each of three
    invoke times around the two faults. Expected counts from judge()."""
    expected: dict[str, dict[str, int]] = {}
    for (role, flush), (damage_at, crash_at) in itertools.product(
            MODES, [(1000, 2000), (2000, 1000)]):
        run_id = f"{role}-{flush}-{damage_at}".lower()
        history, master, slave = [], [], []
        counts = dict.fromkeys(("promise_violations", "disk_void", "replica_void",
                                "disk_violations", "replica_violations", "allowed_loss",
                                "acked_stranded"), 0)
        for n, (at, on_m, on_s) in enumerate(itertools.product(
                (500, 1500, 2500), (True, False), (True, False))):
            msg, offset = f"x{n}", n * 100
            history.append(op(n + 1, msg, offset, at=at))
            if on_m:
                master.append(rec(offset, msg))
            if on_s:
                slave.append(rec(offset, msg))
            # The slave ends past the master (x10 is its last record, x9 the
            # master's), so under `reject` it is one the master refuses.
            j = promises.judge(role, flush, on_master=on_m, on_slave=on_s,
                               master_disk_void=at <= damage_at, some_slave_void=at <= crash_at,
                               only_on_rejected=True)
            counts["promise_violations"] += j.violation
            counts["allowed_loss"] += j.allowed_loss
            counts["acked_stranded"] += j.stranded
            counts["disk_void"] += j.disk == promises.Outcome.VOID
            counts["replica_void"] += j.replica == promises.Outcome.VOID
            counts["disk_violations"] += j.disk == promises.Outcome.VIOLATED
            counts["replica_violations"] += j.replica == promises.Outcome.VIOLATED
        make_run(str(tmp_path), run_id, role=role, flush=flush, history=history,
                 records={"m": master, "s": slave},
                 faults=[fault(1, "torn_tail", "m", damage_at, damages_disk=True),
                         fault(2, "kill", "s", crash_at, crash_at + 100)],
                 final={"m": {"disk_damaged": True}, "s": {"killed": True}})
        expected[run_id] = counts
    summary = build_report([str(tmp_path)], str(tmp_path / "out"))
    got = {r["run_id"]: {k: r[k] for k in expected[r["run_id"]]}
           for r in summary.verdicts.to_dict("records")}
    assert got == expected
    # Not vacuous: every outcome occurs somewhere.
    assert all(sum(c[k] for c in expected.values()) > 0 for k in next(iter(expected.values())))


def test_void_until_rules() -> None:
    final = {"disk_damaged": False, "killed": False}
    kill = fault(1, "kill", "s", 700)
    flip = fault(2, "bit_flip", "s", 300, damages_disk=True)
    args: dict[str, Any] = {"name": "s", "failpoint_spec": None}
    assert void_until(crash_model="power", final=final, faults=[], **args) == (
        NEVER_MS, NEVER_MS)
    assert void_until(crash_model="power", final={**final, "killed": True}, faults=[kill],
                      **args) == (NEVER_MS, T0 + 700)
    # Under the process model a kill loses nothing the OS holds.
    assert void_until(crash_model="process", final={**final, "killed": True}, faults=[kill],
                      **args) == (NEVER_MS, NEVER_MS)
    assert void_until(crash_model="power", final={**final, "disk_damaged": True},
                      faults=[flip], **args) == (T0 + 300, T0 + 300)
    # Damage or a crash no fault row dates voids every message.
    assert void_until(crash_model="power", final={**final, "disk_damaged": True}, faults=[],
                      **args) == (ALWAYS_MS, ALWAYS_MS)
    assert void_until(crash_model="power", final={**final, "killed": True}, faults=[kill],
                      name="s", failpoint_spec="slave_after_append_before_report=crash@3"
                      ) == (NEVER_MS, ALWAYS_MS)
    # Faults on other nodes do not count.
    assert void_until(crash_model="power", final=final, faults=[fault(3, "kill", "m", 5)],
                      **args) == (NEVER_MS, NEVER_MS)


# ------------------------------------------------------------ malformed input
def _good(root: str, run_id: str) -> str:
    return make_run(root, run_id, role="SYNC_MASTER", flush="SYNC_FLUSH",
                    history=LOSS_HISTORY, records={"m": THREE, "s": THREE})


def _rewrite_line(path: str, line: int, text: str) -> None:
    with open(path, encoding="utf-8") as f:
        lines = f.readlines()
    lines[line - 1] = text + "\n"
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(lines)


def test_malformed_files_are_named_and_the_rest_reported(spark: Any,  # noqa: F811
                                                         tmp_path: Any) -> None:
    root = str(tmp_path / "runs")
    _good(root, "good")
    bad_type = _good(root, "bad-type")
    row = dict(LOSS_HISTORY[2], offset="two hundred")
    _rewrite_line(os.path.join(bad_type, "history.jsonl"), 3, json.dumps(row))
    not_json = _good(root, "not-json")
    _rewrite_line(os.path.join(not_json, "nodes", "s", "records.jsonl"), 2, '{"offset": 1')
    missing_field = _good(root, "missing-field")
    row = {k: v for k, v in LOSS_HISTORY[0].items() if k != "msg_id"}
    _rewrite_line(os.path.join(missing_field, "history.jsonl"), 1, json.dumps(row))
    bad_status = _good(root, "bad-status")
    _rewrite_line(os.path.join(bad_status, "history.jsonl"), 4,
                  json.dumps(dict(LOSS_HISTORY[3], status="MAYBE")))
    no_final = _good(root, "no-final")
    os.unlink(os.path.join(no_final, "nodes", "m", "final.json"))

    summary = build_report([root], str(tmp_path / "out"))
    assert list(summary.verdicts["run_id"]) == ["good"]
    assert summary.verdicts["promise_violations"].tolist() == [1]  # m4 gone: disk+replica
    problems = sorted(str(p) for p in summary.problems)
    assert problems == sorted([
        f"{bad_type}/history.jsonl:3: field 'offset' should be int, got 'two hundred'",
        f"{not_json}/nodes/s/records.jsonl:2: not JSON (Expecting ',' delimiter)",
        f"{missing_field}/history.jsonl:1: missing field 'msg_id'",
        f"{bad_status}/history.jsonl:4: status 'MAYBE' is not a PutStatus name or "
        "INDETERMINATE",
        f"{no_final}/nodes/m/final.json: missing",
    ])
    with open(tmp_path / "out" / "report.md", encoding="utf-8") as f:
        md = f.read()
    assert "## Runs left out" in md and "status 'MAYBE'" in md


def test_slave_ahead_gaps_are_counted_per_observation(spark: Any,  # noqa: F811
                                                      tmp_path: Any) -> None:
    """Several slave_ahead observations in one run, on two slaves, one not
    ahead: each gap counts the records of its own slave (the counts ride on
    the divergence branch, one column per observation of a run)."""
    root = str(tmp_path / "runs")
    recs = [rec(i * 100, f"m{i + 1}") for i in range(5)]
    make_run(root, "gaps", role="ASYNC_MASTER", flush="ASYNC_FLUSH", scenario="master-crash",
             history=LOSS_HISTORY[:2], records={"m": recs[:2], "s": recs[:3], "t": recs},
             observations=[slave_ahead(500, 300, 300), slave_ahead(1000, 200, 300),
                           slave_ahead(2000, 200, 500, slave="t"),
                           slave_ahead(3000, 100, 200, slave="t")])
    make_run(root, "no-gap", role="ASYNC_MASTER", flush="ASYNC_FLUSH",
             history=LOSS_HISTORY[:2], records={"m": recs[:2], "s": recs[:2]})
    runs, _ = load_runs(find_run_dirs([root]))
    ahead = _run_query(spark, runs)["slave_ahead"]
    gaps = next(r.index for r in runs if r.run_id == "gaps")
    # Observations 1..3 at restarts; 5 and 6: s and t past the master's end.
    assert sorted(ahead.values.tolist()) == [[gaps, 1, 1], [gaps, 2, 3], [gaps, 3, 1],
                                             [gaps, 5, 1], [gaps, 6, 3]]
    v = build_report([root], str(tmp_path / "out")).verdicts.set_index("run_id")
    assert v.loc["gaps", "slave_ahead_at_restart_messages"] == 3
    assert v.loc["gaps", "slave_ahead_at_restart_bytes"] == 300
    assert v.loc["gaps", "slave_ahead_at_end_messages"] == 3
    assert v.loc["gaps", "slave_ahead_at_end_bytes"] == 300
    assert v.loc["no-gap", "slave_ahead_at_restart_messages"] == 0
    assert v.loc["no-gap", "slave_ahead_at_end_bytes"] == 0


def test_results_of_schema_version_1_still_read(tmp_path: Any) -> None:
    run_dir = make_run(str(tmp_path), "v1", role="ASYNC_MASTER", flush="ASYNC_FLUSH",
                       history=LOSS_HISTORY, records={"m": THREE})
    params_path = os.path.join(run_dir, "params.json")
    with open(params_path, encoding="utf-8") as f:
        params = json.load(f)
    for version, readable in ((1, True), (2, True), (3, False)):
        with open(params_path, "w", encoding="utf-8") as f:
            json.dump({**params, "schema_version": version}, f)
        if readable:
            assert validate_run_dir(run_dir) == ["m"]
            assert load_run(run_dir, 0).run_id == "v1"
        else:
            with pytest.raises(ValueError, match="schema_version 3, this dlab reads 1 and 2"):
                load_run(run_dir, 0)


def test_load_run_names_a_bad_small_file(tmp_path: Any) -> None:
    run_dir = _good(str(tmp_path), "r")
    with open(os.path.join(run_dir, "faults.jsonl"), "w") as f:
        f.write(json.dumps(fault(1, "kill", "nobody", 5)) + "\n")
    with pytest.raises(Exception, match=r"faults.jsonl:1: node 'nobody' is not a node"):
        load_run(run_dir, 0)


def test_no_reportable_run_raises(spark: Any, tmp_path: Any) -> None:  # noqa: F811
    run_dir = _good(str(tmp_path), "only")
    os.unlink(os.path.join(run_dir, "params.json"))
    with pytest.raises(FileNotFoundError, match="no run directory"):
        build_report([str(tmp_path)], str(tmp_path / "out"))
    _rewrite_line(os.path.join(_good(str(tmp_path), "only2"), "history.jsonl"), 1, "5")
    with pytest.raises(NoRunsError, match=r"only2/history.jsonl:1: expected a JSON object"):
        build_report([str(tmp_path)], str(tmp_path / "out"))


# ------------------------------------------------------------------ the CLI
def test_dlab_report_cli(spark: Any, tmp_path: Any,  # noqa: F811
                         capsys: pytest.CaptureFixture[str]) -> None:
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    _good(a, "one")
    make_run(b, "two", role="ASYNC_MASTER", flush="ASYNC_FLUSH", history=LOSS_HISTORY,
             records={"m": THREE, "s": THREE})
    out = str(tmp_path / "out")
    # Run "one" (SYNC_MASTER + SYNC_FLUSH) breaks its promise: exit status 1.
    assert cli.main(["report", a, b, "--out", out]) == 1
    comparison = pd.read_csv(os.path.join(out, "comparison.csv"))
    assert comparison[["role", "flush", "runs", "promise_violations"]].values.tolist() == [
        ["ASYNC_MASTER", "ASYNC_FLUSH", 1, 0], ["SYNC_MASTER", "SYNC_FLUSH", 1, 1]]
    captured = capsys.readouterr()
    assert "2 runs reported, 1 with promise violations" in captured.out
    assert os.path.join(out, "report.html") in captured.out

    # A malformed run: named on stderr, the other reported, exit status 1.
    _rewrite_line(os.path.join(b, "two", "history.jsonl"), 2, "nonsense")
    assert cli.main(["report", a, b, "--out", out]) == 1
    captured = capsys.readouterr()
    assert f"{b}/two/history.jsonl:2: not JSON" in captured.err
    assert "1 run reported" in captured.out

    # A run whose observations.jsonl is not UTF-8 (a traceback before): named
    # on stderr and left out, the other reported.
    c = str(tmp_path / "c")
    with open(os.path.join(_good(c, "three"), "observations.jsonl"), "wb") as f:
        f.write(b'{"kind": "\xe9t\xe9"}\n')
    assert cli.main(["report", a, c, "--out", out]) == 1
    captured = capsys.readouterr()
    assert (f"left out: {c}/three/observations.jsonl:1: not UTF-8 text (byte 0xe9 at "
            "column 11)") in captured.err
    assert "1 run reported" in captured.out

    assert cli.main(["report", str(tmp_path / "nowhere"), "--out", out]) == 2
    assert "nowhere: not a directory" in capsys.readouterr().err


# ------------------------------------------------------- the query's shape
def test_the_query_parses_and_shuffles_each_input_once(spark: Any,  # noqa: F811
                                                       fixture_root: str) -> None:
    """Every branch must read the same two exchanges (history, records):
    were the optimizer to narrow them per branch again, each branch would
    parse the JSON anew — correct, but several times slower."""
    runs, _ = load_runs(find_run_dirs([fixture_root]))
    query, columns, _ = checker_query(spark, runs)
    query.collect()
    plan = query._jdf.queryExecution().executedPlan()
    if plan.nodeName() == "AdaptiveSparkPlan":  # off for small inputs (chaos.report.pipeline)
        plan = plan.executedPlan()
    final = plan.toString()
    nodes = [re.sub(r"^[\s:|+\-*()0-9]*", "", line) for line in final.splitlines()]
    exchanges = [n for n in nodes if n.startswith("Exchange hashpartitioning")]
    reused = [n for n in nodes if n.startswith("ReusedExchange") and "hashpartitioning" in n]
    assert len(exchanges) == 2, final
    assert len(reused) >= len(columns) - 1  # every other branch reads one of them


# ---------------------------------------------------------------- the bench
def test_bench_runs_follow_the_schema_and_check_as_designed(spark: Any,  # noqa: F811
                                                           tmp_path: Any) -> None:
    dirs = bench.generate(str(tmp_path / "runs"), 8, 400, processes=2)
    for d in dirs:
        validate_run_dir(d)
    v = build_report([str(tmp_path / "runs")], str(tmp_path / "out")).verdicts
    assert len(v) == 8 and v["puts"].tolist() == [400] * 8
    assert v["promise_violations"].sum() == 0
    crashed = v[(v["scenario"] == "master-crash") & (v["flush"] == "ASYNC_FLUSH")]
    assert crashed["slave_ahead_at_restart_messages"].tolist() == [bench.LOST_TAIL] * 2
    assert (crashed["divergent_records"] > 0).all()
    # The lost tail is held by the slave the master rejected: stranded.
    assert (crashed["acked_stranded"] > 0).all()
    assert v[v["scenario"] == "clean-restart"]["acked_lost_master"].sum() == 0


def test_dlab_bench_pipeline_prints_its_ratio_last(spark: Any,  # noqa: F811
                                                   tmp_path: Any,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bench", "pipeline", "--runs", "4", "--ops", "100",
                     "--workdir", str(tmp_path)]) == 0
    figures = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert figures["bench"] == "pipeline" and figures["runs"] == 4
    assert figures["history_rows"] == 400 and figures["ratio"] > 0
    assert os.listdir(tmp_path) == []  # the synthetic results are removed


def test_dlab_bench_pipeline_reuse_keeps_and_reads_its_results_again(
        spark: Any, tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    args = ["bench", "pipeline", "--runs", "2", "--ops", "20", "--workdir", str(tmp_path),
            "--reuse"]
    for reused in (False, True):
        assert cli.main(args) == 0
        figures = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert figures["reused"] is reused and figures["history_rows"] == 40
        # Only the results are kept, and the reused ones are those generated.
        assert os.listdir(tmp_path) == ["dlab-bench-pipeline-2x20"]
        assert len(os.listdir(tmp_path / "dlab-bench-pipeline-2x20" / "runs")) == 2


def test_the_python_workers_run_the_drivers_interpreter(spark: Any) -> None:  # noqa: F811
    """The report's pandas UDFs run in Spark's Python workers: they must be
    this interpreter (with the project's packages), not the first `python3`
    on PATH, which a user who runs `.venv/bin/dlab report` without the venv
    active has without pandas."""
    import sys

    assert spark.sparkContext.pythonExec == sys.executable
    ran = spark.sparkContext.parallelize([0], 1).map(lambda _: __import__("sys").prefix).collect()
    assert ran == [sys.prefix]
