"""Every PUT_OK carries the evidence it was answered on, and the checker
verifies it on every run (chaos/check/evidence.py): a planted defect that
answers SYNC_FLUSH puts before their flush (`--emulate
planted-ack-before-flush`) loses nothing in a run where the master never
crashes, and is still reported as a broken promise, with its moment — on
real processes and on the sim. Without the plant the same runs show no
breach, under SYNC_MASTER too (where each PUT_OK names the slave whose ack
covered it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from support.pipeline_fixtures import spark  # noqa: F401

from chaos.check.summary import run_outcome
from chaos.commands.run import make_run
from chaos.harness import scenarios
from chaos.harness.runner import RunConfig
from chaos.harness.workload import WorkloadConfig
from chaos.schema import read_jsonl
from store.emulate import PLANTED_ACK_BEFORE_FLUSH

# The slave is SIGKILLed and restarted: the master, whose disk SYNC_FLUSH
# promises, never crashes, so nothing acknowledged can be lost there.
SCENARIO = "slave-crash"


def _run(tmp: Path, backend: str, role: str, emulate: tuple[str, ...]) -> str:
    cfg = RunConfig(scenario=scenarios.get(SCENARIO), role=role, flush="SYNC_FLUSH",
                    seed=5, out_dir=str(tmp / backend / role / (",".join(emulate) or "none")),
                    backend=backend, emulate=emulate,
                    workload=WorkloadConfig(producers=4, rate_per_s=None if backend == "local"
                                            else 25.0)).validate()
    return make_run(cfg).execute()


def _put_oks(run_dir: str) -> list[dict[str, object]]:
    return [h for h in read_jsonl(str(Path(run_dir) / "history.jsonl"))
            if h["status"] == "PUT_OK"]


@pytest.mark.parametrize("backend", ["local", "sim"])
def test_an_ack_before_the_flush_is_a_breach_though_nothing_is_lost(
        tmp_path: Path, backend: str) -> None:
    planted = _run(tmp_path, backend, "ASYNC_MASTER", (PLANTED_ACK_BEFORE_FLUSH,))
    o = run_outcome(planted)
    assert o.acked > 50, o
    assert o.acked_lost_master == 0 and o.promise_violations == 0, o
    assert o.evidence_breaches > 0 and o.evidence_rules["flush"] > 0, o
    assert o.broke_a_promise
    # Named with its moment: seconds since the run started, the op, the node.
    assert o.evidence_first and " s  flush " in o.evidence_first[0], o.evidence_first
    uncovered = [h for h in _put_oks(planted) if h["evidence"]["flushed"]  # type: ignore[index]
                 < h["offset"] + h["size"]]  # type: ignore[operator]
    assert len(uncovered) == o.evidence_rules["flush"]

    fixed = _run(tmp_path, backend, "ASYNC_MASTER", ())
    o = run_outcome(fixed)
    assert o.acked > 50 and o.acked_lost_master == 0, o
    assert o.evidence_breaches == 0, o.evidence_first
    assert all(h["evidence"] for h in _put_oks(fixed))


@pytest.mark.parametrize("backend", ["local", "sim"])
def test_sync_master_put_oks_name_the_slave_that_covered_them(
        tmp_path: Path, backend: str) -> None:
    run_dir = _run(tmp_path, backend, "SYNC_MASTER", ())
    o = run_outcome(run_dir)
    assert o.acked > 50, o
    assert o.evidence_breaches == 0, o.evidence_first
    slaves = {n["name"] for n in json.loads(
        (Path(run_dir) / "params.json").read_text())["nodes"][1:]}
    for h in _put_oks(run_dir):
        ev = h["evidence"]
        assert ev["by"] in slaves, h  # type: ignore[index]
        ack = next(a for a in ev["acks"] if a["slave"] == ev["by"])  # type: ignore[index]
        assert ack["acked"] >= h["offset"] + h["size"], h  # type: ignore[operator]


def test_the_report_counts_the_breach_as_a_violation(
        spark: Any, tmp_path: Path) -> None:  # noqa: F811
    """The report (chaos/report/pipeline.py) applies the same rule: the
    planted run is a violation with its breaches named, the fixed one is
    not."""
    from chaos.report.pipeline import build_report

    planted = _run(tmp_path, "sim", "ASYNC_MASTER", (PLANTED_ACK_BEFORE_FLUSH,))
    fixed = _run(tmp_path, "sim", "ASYNC_MASTER", ())
    report = build_report([planted, fixed], str(tmp_path / "report"))
    v = report.verdicts.set_index("run_dir")
    assert v.loc[planted, "promise_violations"] == 0
    assert v.loc[planted, "evidence_breaches"] > 0
    assert v.loc[planted, "verdict"] == "violation"
    assert "flush" in v.loc[planted, "first_evidence_breaches"]
    assert v.loc[fixed, "evidence_breaches"] == 0 and v.loc[fixed, "verdict"] == "ok"


@pytest.mark.parametrize("backend", ["local", "sim"])
def test_controller_put_oks_record_the_quorum_they_waited_for(
        tmp_path: Path, backend: str) -> None:
    """Controller mode with all-ack: each PUT_OK records its quorum (the
    SyncStateSet's other members) and the checker finds every one covered
    by their acks."""
    from ha.config import HAMode

    cfg = RunConfig(scenario=scenarios.get(SCENARIO), role="SYNC_MASTER", flush="SYNC_FLUSH",
                    seed=5, out_dir=str(tmp_path / backend), backend=backend,
                    ha_mode=HAMode.CONTROLLER, all_ack_in_sync_state_set=True,
                    workload=WorkloadConfig(producers=4, rate_per_s=25.0)).validate()
    run_dir = make_run(cfg).execute()
    o = run_outcome(run_dir)
    assert o.acked > 50, o
    assert o.evidence_breaches == 0, o.evidence_first
    quorums = [h["evidence"]["quorum"] for h in _put_oks(run_dir)]  # type: ignore[index]
    assert all(q["needed"] in (0, 1) for q in quorums), quorums[:5]
    waited = [q for q in quorums if q["needed"] == 1]
    assert waited and all(q["members"] == ["slave1"] for q in waited), quorums[:5]
