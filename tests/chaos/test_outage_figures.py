"""Availability per unit of time (chaos/check/outage.py): a recovery is the
first PUT_OK invoked after the faulted node answered again, and the time
without a writable master is the same for runs of different lengths with
the same outage. The rules on their own, then one report (Spark) over
planted run directories."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.pipeline_fixtures import fault, make_run, op, rec, spark  # noqa: F401

from chaos.check import outage
from chaos.check.summary import outcome_line, run_outcome
from chaos.report.pipeline import build_report
from chaos.schema import read_jsonl


def test_a_killed_node_answers_again_when_its_next_start_ends() -> None:
    faults = [fault(0, "kill", "m", 1000), fault(1, "torn_tail", "m", 1100, 1150),
              fault(2, "kill", "s", 1200), fault(3, "start", "m", 1800, 2600),
              fault(4, "pause", "s", 3000), fault(5, "pause", "m", 4000, 4500)]
    t0 = faults[0]["start_ms"] - 1000
    answered = [outage.answered_ms(faults, i) for i in range(len(faults))]
    assert [None if a is None else a - t0 for a in answered] == [
        2600,  # the start after the kill ended then
        1150,  # a damage step ends when done
        None,  # the slave was never started again
        2600, None, 4500]  # a pause without its resume: never


def test_only_faults_during_which_puts_failed_stop_writes_and_overlaps_count_once() -> None:
    kill = outage.FaultRow(fault_ms=1000, put_ok_ms=2705, first_failed_ms=1100,
                           load_end_ms=5000, puts_after=40, failed_after=16)
    torn = outage.FaultRow(fault_ms=1100, put_ok_ms=2705, first_failed_ms=1100,
                           load_end_ms=5000, puts_after=39, failed_after=16)
    # A slave killed under ASYNC_MASTER: every put went on being acknowledged.
    slave = outage.FaultRow(fault_ms=3000, put_ok_ms=4200, first_failed_ms=None,
                            load_end_ms=5000, puts_after=20, failed_after=0)
    a = outage.availability([kill, torn, slave])
    assert a.unwritable_s == pytest.approx(1.705)
    assert a.fault_to_put_ok_s == pytest.approx(1.705)
    assert not a.unwritable_until_end
    assert a.failed_after_fault_share == pytest.approx(16 / 40)
    assert a.failed_after_fault_per_s == pytest.approx(16 / 4.0)
    never = outage.availability([outage.FaultRow(1000, None, 1001, 3000, 20, 20)])
    assert never.unwritable_until_end and never.unwritable_s == pytest.approx(2.0)
    assert outage.availability([]).unwritable_s is None


def test_an_outage_starts_where_puts_after_the_fault_stopped_being_acknowledged() -> None:
    # An asynchronous master cut from its slave at 1000 (healed at 3000)
    # goes on acknowledging; killed at 2500, it fails puts from 2600 on.
    # The partition's outage starts at the last put it acknowledged after
    # the cut (2500), not at the cut, and (writes resumed during it) ends
    # with the kill's: both faults cost the same 0.4 s.
    partition = outage.FaultRow(fault_ms=1000, put_ok_ms=2905, first_failed_ms=2600,
                                load_end_ms=5000, puts_after=41, failed_after=3,
                                ok_until_ms=2500)
    kill = outage.FaultRow(fault_ms=2500, put_ok_ms=2905, first_failed_ms=2600,
                           load_end_ms=5000, puts_after=26, failed_after=3, ok_until_ms=2500)
    assert partition.outage == (2500, 2905)
    a = outage.availability([partition, kill])
    assert a.unwritable_s == pytest.approx(0.405)
    assert a.fault_to_put_ok_s == pytest.approx(1.905)  # fault to recovery, as before
    # Without puts acknowledged after it, an outage starts at its fault.
    assert outage.FaultRow(1000, 2705, 1100, 5000, 40, 16).outage == (1000, 2705)


def _puts_every_100ms(load_end: int, down: range, status: str,
                      latency: Callable[[int], int] = lambda at: 5
                      ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A put every 100 ms from 0 to `load_end`: those invoked in `down`
    fail with `status`, the others are acknowledged and stored in turn.
    The history and the records."""
    history: list[dict[str, Any]] = []
    records: list[dict[str, Any]] = []
    for i, at in enumerate(range(0, load_end + 1, 100)):
        failed = at in down
        history.append(op(i + 1, f"m{i}", None if failed else len(records) * 100, at=at,
                          latency=latency(at), status=status if failed else "PUT_OK"))
        if not failed:
            records.append(rec(len(records) * 100, f"m{i}"))
    return history, records


def _outage_run(root: str, run_id: str, load_end: int, backend: str) -> str:
    """ASYNC_MASTER + SYNC_FLUSH: a put every 100 ms up to `load_end`; the
    master killed at 1000, started again at 1800 and answering at 2600. The
    put invoked in the kill's millisecond was acknowledged at 1001 (it
    reached the node before the signal); the puts from 1100 to 2600 failed;
    the next one, invoked at 2700, is the recovery (answered at 2705)."""
    history, records = _puts_every_100ms(load_end, range(1100, 2601), "INDETERMINATE",
                                         latency=lambda at: 1 if at == 1000 else 5)
    return make_run(root, run_id, role="ASYNC_MASTER", flush="SYNC_FLUSH",
                    scenario="master-crash", history=history,
                    records={"m": records, "s": records},
                    faults=[fault(0, "kill", "m", 1000), fault(1, "start", "m", 1800, 2600)],
                    final={"m": {"killed": True}}, duration_ms=load_end + 500,
                    backend=backend)


def _partition_then_kill_run(root: str, run_id: str) -> str:
    """ASYNC_MASTER + SYNC_FLUSH, a put every 100 ms up to 5000: the master
    cut from its slave from 1000 to 3000, acknowledging on; killed at 2500
    (the put invoked then acknowledged), started again at 2600, answering
    at 2800; the puts from 2600 to 2800 failed."""
    history, records = _puts_every_100ms(5000, range(2600, 2801), "INDETERMINATE")
    return make_run(root, run_id, role="ASYNC_MASTER", flush="SYNC_FLUSH",
                    scenario="lone-in-sync-master", history=history,
                    records={"m": records, "s": records},
                    faults=[{**fault(0, "partition", "m", 1000, 3000), "peer": "s"},
                            fault(1, "kill", "m", 2500), fault(2, "start", "m", 2600, 2800)],
                    final={"m": {"killed": True}}, duration_ms=5500, backend="local")


def _shrink_run(root: str, run_id: str) -> str:
    """SYNC_MASTER + SYNC_FLUSH, a put every 100 ms up to 5000: the master
    cut from its slave from 1000 to 4000; the puts from 1000 to 1900 fail
    (they wait for the slave), then the master goes on alone (its
    SyncStateSet shrunk) and acknowledges from 2000 on."""
    history, records = _puts_every_100ms(5000, range(1000, 1901), "FLUSH_SLAVE_TIMEOUT")
    return make_run(root, run_id, role="SYNC_MASTER", flush="SYNC_FLUSH",
                    scenario="lone-in-sync-master", history=history,
                    records={"m": records, "s": records[:10]},
                    faults=[{**fault(0, "partition", "m", 1000, 4000), "peer": "s"}],
                    duration_ms=5500, backend="local")


@pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas")
def test_recovery_counts_from_a_put_invoked_after_the_node_answered(
        spark: Any, tmp_path: Path) -> None:  # noqa: F811
    root = str(tmp_path / "runs")
    short = _outage_run(root, "short", load_end=5000, backend="local")
    _outage_run(root, "long", load_end=20000, backend="sim")
    cut = _partition_then_kill_run(root, "cut")
    shrink = _shrink_run(root, "shrink")
    # The planted runs are what the harness writes: the kill has no end of
    # its own, its start row says when the node answered.
    assert [f["end_ms"] for f in read_jsonl(os.path.join(short, "faults.jsonl"))][0] is None
    summary = build_report([root], str(tmp_path / "report"))
    v = summary.verdicts.set_index("run_id")
    for run_id in ("short", "long"):
        # Not 0.001 s: the put invoked with the kill answered before the node went down.
        assert v.loc[run_id, "fault_to_put_ok_s"] == pytest.approx(1.705)
        assert v.loc[run_id, "unwritable_s"] == pytest.approx(1.705)
        assert not v.loc[run_id, "unwritable_until_end"]
        assert v.loc[run_id, "failed_after_fault_share"] == pytest.approx(
            16 / len([at for at in range(1000, {"short": 5000, "long": 20000}[run_id] + 1, 100)]))
    # The failed share of all puts depends on the run's length; the time
    # without a writable master does not.
    assert v.loc["short", "failed_put_share"] > v.loc["long", "failed_put_share"]
    assert v.loc["short", "failed_after_fault_per_s"] == pytest.approx(16 / 4.005)
    # The run's own console line (chaos/check/summary.py) computes the same
    # rows in Python: the same answer.
    for run_id in ("short", "long", "cut", "shrink"):
        o = run_outcome(os.path.join(root, run_id))
        assert o.unwritable_s == pytest.approx(v.loc[run_id, "unwritable_s"])
    # The partition's outage starts at the kill, where puts stopped being
    # acknowledged, and ends with the first PUT_OK invoked after the
    # failures (2500 to 2905), not from the cut to the heal's recovery
    # (3105: 2.105 s).
    assert v.loc["cut", "unwritable_s"] == pytest.approx(0.405)
    assert run_outcome(cut).unwritable_s == pytest.approx(0.405)
    # Writes resumed during the partition (the first PUT_OK invoked after
    # its first failure, 2005), long before its heal (the first PUT_OK
    # invoked after it, 4105): 1.005 s, not 3.105.
    assert v.loc["shrink", "unwritable_s"] == pytest.approx(1.005)
    assert v.loc["shrink", "fault_to_put_ok_s"] == pytest.approx(1.005)
    assert run_outcome(shrink).unwritable_s == pytest.approx(1.005)
    assert "no writable master for 1.705 simulated s" in outcome_line(
        run_outcome(os.path.join(root, "long")))
    assert "no writable master for 1.705 s" in outcome_line(run_outcome(short))
    report = (tmp_path / "report" / "report.md").read_text(encoding="utf-8")
    assert "unwritable s" in report and "failed/s after fault" in report
    # The sim run's times are simulated time, and say so; the local run's are not.
    assert "1.71 (simulated)" in report and "| 1.71 |" in report
    page = (tmp_path / "report" / "runs" / "long.html").read_text(encoding="utf-8")
    assert "1.705 simulated s" in page
    assert "simulated" not in (tmp_path / "report" / "runs" / "short.html").read_text(
        encoding="utf-8")
