"""Every path that judges an acknowledged message gives judge()'s answer,
on every combination of its inputs: the table the Spark query looks up
(chaos.check.promises.JUDGE_TABLE), the per-run Python checker of `dlab chaos run`
and `dlab chaos bugs` (chaos.check.summary, chaos.commands.bugs), and the Spark report
(chaos.report.pipeline), over run directories that hold every combination."""

from __future__ import annotations

import itertools
import os
from typing import Any

import pandas as pd
import pytest
from support.pipeline_fixtures import make_run, op, rec, slave_ahead, spark  # noqa: F401

from chaos.check import promises, summary
from chaos.check.run_dirs import load_run
from chaos.commands import bugs
from chaos.report.pipeline import build_report
from chaos.schema import read_jsonl

# Where a message is found: a subset of master m, slave s1 (which the master
# rejects: it was found ahead at a restart) and slave s2 (served). Holder
# set j's message is acknowledged 2**j times, so a run's figure, a sum over
# acknowledgements, says exactly which holder sets counted in it.
NODES = ("m", "s1", "s2")
HOLDERS = [frozenset(n for n, keep in zip(NODES, bits, strict=True) if keep)
           for bits in itertools.product((False, True), repeat=len(NODES))]
VOIDS = list(itertools.product((False, True), repeat=2))  # master disk, some slave's copy


# A failover run's messages are all acknowledged by s2, a master before m
# was promoted (chaos/check/promises.py: judged by their acker).
ACKER = "s2"


def _inputs(holders: frozenset[str], disk_void: bool, slave_void: bool,
            failover: bool = False) -> dict[str, bool]:
    on_slave = bool(holders & {"s1", "s2"})
    acker = ACKER if failover else "m"
    return {"on_master": "m" in holders, "on_slave": on_slave,
            "only_on_rejected": "s2" not in holders, "by_failover": failover,
            "on_acker": acker in holders, "on_replica": bool(holders - {acker}),
            "master_disk_void": disk_void, "some_slave_void": slave_void}


def test_judge_table_is_judge_on_every_input() -> None:
    seen = set()
    for (role, flush), bits in itertools.product(
            promises.MODES, itertools.product((False, True), repeat=len(promises.JUDGE_INPUTS))):
        inputs = dict(zip(promises.JUDGE_INPUTS, bits, strict=True))
        key = promises.judge_key(role, flush, **inputs)
        seen.add(key)
        figures = promises.ack_figures(promises.judge(role, flush, **inputs))
        assert {f: promises.JUDGE_TABLE[f][key] for f in promises.ACK_FIGURES} == {
            f: int(v) for f, v in figures.items()}, (role, flush, inputs)
    assert seen == set(range(promises.JUDGE_KEYS))
    # The Spark query folds the two void inputs into the key's lowest bits.
    # Before them, the failover inputs (all false without a failover).
    assert promises.judge_key(*promises.MODES[3], on_master=True, on_slave=False,
                              only_on_rejected=True, by_failover=False, on_acker=True,
                              on_replica=False, master_disk_void=True,
                              some_slave_void=False) == (
        ((((3 * 2 + 1) * 2 + 0) * 2 + 1) * 2 + 0) * 2 * 2 + 2) * 4 + 2


def _expected(role: str, flush: str, disk_void: bool, slave_void: bool,
              failover: bool = False) -> dict[str, int]:
    out = dict.fromkeys(("acked", *promises.ACK_FIGURES), 0)
    for j, holders in enumerate(HOLDERS):
        v = promises.judge(role, flush, **_inputs(holders, disk_void, slave_void, failover))
        out["acked"] += 2 ** j
        for f, counts in promises.ack_figures(v).items():
            out[f] += counts * 2 ** j
    return out


def _make_runs(root: str) -> dict[str, tuple[str, str, bool, bool, bool]]:
    """A run per mode x void category, holding every holder set; and per
    mode a failover run without voids whose acks all came from ACKER."""
    runs = {}
    cases = [(mode, voids, False) for mode, voids in itertools.product(promises.MODES, VOIDS)]
    cases += [(mode, (False, False), True) for mode in promises.MODES]
    for (role, flush), (disk_void, slave_void), failover in cases:
        run_id = f"{role}-{flush}-{int(disk_void)}{int(slave_void)}".lower() + (
            "-failover" if failover else "")
        history: list[dict[str, Any]] = []
        records: dict[str, list[dict[str, Any]]] = {n: [] for n in NODES}
        for j, holders in enumerate(HOLDERS):
            msg, offset = f"x{j}", j * 100
            history += [op(len(history) + 1, msg, offset, at=10 * j) for _ in range(2 ** j)]
            for n in holders:
                records[n].append(rec(offset, msg))
        if failover:
            history = [{**h, "node": ACKER} for h in history]
        # The master ends last, so only the observation makes s1 ignored.
        records["m"].append(rec(100_000, "filler"))
        # Damage and a crash no fault row dates void every message (chaos.check.run_dirs).
        make_run(root, run_id, role=role, flush=flush, history=history, records=records,
                 observations=[slave_ahead(5_000, 0, 900, slave="s1")],
                 final={"m": {"disk_damaged": disk_void}, "s2": {"killed": slave_void}})
        runs[run_id] = (role, flush, disk_void, slave_void, failover)
    return runs


@pytest.mark.timeout(900)  # a JVM and a report of 16 runs, on a loaded machine
@pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas")
def test_every_checker_judges_every_combination_alike(spark: Any,  # noqa: F811
                                                      tmp_path: Any) -> None:
    root = str(tmp_path / "runs")
    runs = _make_runs(root)
    expected = {run_id: _expected(*mode) for run_id, mode in runs.items()}
    # Not vacuous: every figure counts somewhere, violations not everywhere.
    assert all(any(e[f] for e in expected.values()) for f in promises.ACK_FIGURES)
    assert not all(e["promise_violations"] for e in expected.values())

    python, divergent = {}, {}
    for run_id in runs:
        run_dir = os.path.join(root, run_id)
        python[run_id] = summary.judge_run_acks(load_run(run_dir, 0),
                                                read_jsonl(os.path.join(run_dir, "history.jsonl")))
        by_bugs = bugs.judge_run(run_dir)
        divergent[run_id] = by_bugs["divergent_records"]
        assert {k: by_bugs[k] for k in ("acked", "disk_violations", "replica_violations",
                                        "promise_violations")} == {
            k: expected[run_id][k] for k in ("acked", "disk_violations", "replica_violations",
                                             "promise_violations")}, run_id
        outcome = summary.run_outcome(run_dir)
        assert (outcome.acked_stranded, outcome.promise_violations) == (
            expected[run_id]["acked_stranded"], expected[run_id]["promise_violations"])
    assert python == expected

    report = build_report([root], str(tmp_path / "out"))
    spark_figures = {r["run_id"]: {k: r[k] for k in expected[r["run_id"]]}
                     for r in report.verdicts.to_dict("records")}
    assert spark_figures == expected
    # The bug checks' divergence is the report's (master records s1 lacks).
    assert {r["run_id"]: r["divergent_records"] for r in report.verdicts.to_dict("records")
            } == divergent and all(divergent.values())

    # Per message, the lost table's flags are judge()'s.
    lost = {(r.run_id, r.msg_id, bool(r.stranded), bool(r.violation))
            for r in pd.read_csv(os.path.join(str(tmp_path / "out"), "lost.csv")).itertuples()}
    want = set()
    for run_id, (role, flush, disk_void, slave_void, failover) in runs.items():
        for j, holders in enumerate(HOLDERS):
            v = promises.judge(role, flush, **_inputs(holders, disk_void, slave_void, failover))
            if not v.on_master:
                want.add((run_id, f"x{j}", v.stranded, v.violation))
    assert lost == want

