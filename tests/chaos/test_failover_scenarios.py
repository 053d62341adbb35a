"""Failover scenarios on the sim backend (chaos/harness/scenarios.py: lose,
promote, rejoin) and the checker's failover rule (chaos/check/promises.py,
chaos/check/failover.py): SYNC_MASTER keeps every acknowledged message
through a lost master, ASYNC_MASTER loses some; a message planted only on
the old master is reported lost by failover, a SYNC_MASTER ack missing from
the promoted slave a violation; a run replays byte for byte."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from chaos.check import failover
from chaos.check.summary import run_outcome
from chaos.commands.bugs import judge_run
from chaos.commands.replay import tree_hashes
from chaos.harness import scenarios
from chaos.harness.run_base import RunBase
from chaos.harness.runner import RunConfig
from chaos.schema import load_json_file, read_jsonl, write_jsonl
from chaos.sim.run import SimRun

DURATION_S = 12.0


def _run(tmp: Path, scenario: str, role: str, flush: str, seed: int, slaves: int = 1) -> str:
    cfg = RunConfig(scenario=scenarios.get(scenario), role=role, flush=flush, seed=seed,
                    out_dir=str(tmp), backend="sim", sim_duration_s=DURATION_S, slaves=slaves)
    return SimRun(cfg).execute()


def _kinds(run_dir: str) -> list[str]:
    return [f["kind"] for f in read_jsonl(os.path.join(run_dir, "faults.jsonl"))]


def test_failover_scenarios_are_in_the_full_matrix_only() -> None:
    for name in scenarios.FAILOVER_MATRIX:
        assert name in scenarios.DEFAULT_MATRIX and name not in scenarios.QUICK_MATRIX
        assert scenarios.get(name).retries > 0  # producers follow the route by retrying


@pytest.mark.parametrize("flush", ["ASYNC_FLUSH", "SYNC_FLUSH"])
def test_sync_master_loses_no_acknowledged_message_when_its_master_is_lost(
        tmp_path: Path, flush: str) -> None:
    for seed in (1, 2, 3):
        run_dir = _run(tmp_path, "master-lost", "SYNC_MASTER", flush, seed)
        params = load_json_file(os.path.join(run_dir, "params.json"))
        # The promoted slave is the master the run is judged against.
        assert params["nodes"][0] == {"name": "slave1", "role": "SYNC_MASTER"}
        assert {"lose", "promote"} <= set(_kinds(run_dir))
        o = run_outcome(run_dir)
        assert o.acked > 0, seed
        assert (o.acked_lost_master, o.acked_lost_failover, o.promise_violations) == (0, 0, 0)


def test_with_two_slaves_the_third_replica_follows_the_promoted_one(tmp_path: Path) -> None:
    """--slaves 2, master-lost under SYNC_MASTER: slave1 is promoted, slave2
    follows it (its link re-pointed, not restarted, as on local; its log
    against the promoted one's recorded), every acknowledged message survives, and the new master's
    PUT_OKs each waited for slave2 alone, which ends holding all of them."""
    run_dir = _run(tmp_path, "master-lost", "SYNC_MASTER", "ASYNC_FLUSH", 1, slaves=2)
    params = load_json_file(os.path.join(run_dir, "params.json"))
    assert params["nodes"] == [{"name": "slave1", "role": "SYNC_MASTER"},
                               {"name": "master", "role": "SLAVE"},
                               {"name": "slave2", "role": "SLAVE"}]
    (promote,) = [f for f in read_jsonl(os.path.join(run_dir, "faults.jsonl"))
                  if f["kind"] == "promote"]
    assert (promote["node"], promote["detail"]) == ("slave1", "followers: slave2 connected")
    (seen,) = [o for o in read_jsonl(os.path.join(run_dir, "observations.jsonl"))
               if o["kind"] == "slave_ahead"]
    assert (seen["master"], seen["slave"], seen["time_ms"]) == (
        "slave1", "slave2", promote["end_ms"])
    assert seen["slave_offset"] <= seen["master_offset"]  # slave2 not ahead: it follows
    o = run_outcome(run_dir)
    assert (o.acked_lost_master, o.acked_lost_failover, o.acked_stranded,
            o.promise_violations, o.evidence_breaches) == (0, 0, 0, 0, 0)
    assert o.replication == "replication settled"
    history = read_jsonl(os.path.join(run_dir, "history.jsonl"))
    after = [h for h in history if h["status"] == "PUT_OK" and h["node"] == "slave1"]
    assert len(after) > 100  # the load went on to the new master
    assert {h["evidence"]["by"] for h in after} == {"slave2"}
    held = {r["msg_id"] for r in read_jsonl(os.path.join(run_dir, "nodes", "slave2",
                                                          "records.jsonl"))}
    assert {h["msg_id"] for h in after} <= held
    ends = [load_json_file(os.path.join(run_dir, "nodes", n, "final.json"))["wrote"]
            for n in ("slave1", "slave2")]
    assert ends[0] == ends[1] > seen["master_offset"]


def test_the_operator_promotes_the_slave_with_the_longest_log(tmp_path: Path) -> None:
    """best_slave, the failover scenarios' first promotion: with two slaves
    the one holding more (the first on a tie; a down one never), so the
    other can follow it; with one slave, that slave."""
    for name in scenarios.FAILOVER_MATRIX:
        assert [s.target for s in scenarios.get(name).steps
                if s.action is scenarios.Action.PROMOTE][0] == "best_slave"
    cfg = RunConfig(scenario=scenarios.get("master-lost"), role="SYNC_MASTER",
                    flush="ASYNC_FLUSH", seed=1, out_dir=str(tmp_path), backend="sim", slaves=2)
    run = RunBase(cfg, lambda _line: None)
    assert run._targets("best_slave", {"slave1": 10, "slave2": 20}.get) == ["slave2"]
    assert run._targets("best_slave", {"slave1": 20, "slave2": 20}.get) == ["slave1"]
    assert run._targets("best_slave", {"slave2": 5}.get) == ["slave2"]  # slave1 down
    one = RunBase(RunConfig(scenario=scenarios.get("master-lost"), role="SYNC_MASTER",
                            flush="ASYNC_FLUSH", seed=1, out_dir=str(tmp_path / "one"),
                            backend="sim"), lambda _line: None)
    assert one._targets("best_slave", {"slave1": 0}.get) == ["slave1"]


def test_async_master_loses_some_acknowledged_messages_in_some_seeds(tmp_path: Path) -> None:
    lost = {}
    for seed in range(1, 7):
        o = run_outcome(_run(tmp_path, "master-lost", "ASYNC_MASTER", "ASYNC_FLUSH", seed))
        assert o.promise_violations == 0  # nothing was promised
        assert o.acked_lost_failover == o.acked_lost_master
        if o.acked_lost_failover:
            # Lost in the last moments before the loss: a lag of milliseconds.
            assert o.failover_lag_ms is not None and 0 <= o.failover_lag_ms < 1000
        lost[seed] = o.acked_lost_failover
    assert any(lost.values()) and not all(lost.values()), lost


def _first_ok(run_dir: str, node: str) -> dict[str, object]:
    return next(h for h in read_jsonl(os.path.join(run_dir, "history.jsonl"))
                if h["status"] == "PUT_OK" and h["node"] == node)


def test_a_message_only_the_old_master_holds_is_lost_by_failover(tmp_path: Path) -> None:
    run_dir = _run(tmp_path, "master-lost", "ASYNC_MASTER", "SYNC_FLUSH", 4)
    before = run_outcome(run_dir)
    assert before.acked_lost_failover == 0
    # Plant one acknowledged message on the lost master's store only.
    records = os.path.join(run_dir, "nodes", "master", "records.jsonl")
    rows = read_jsonl(records)
    last = rows[-1]
    rows.append({**last, "offset": last["offset"] + last["size"], "msg_id": "planted"})
    write_jsonl(records, rows)
    history = os.path.join(run_dir, "history.jsonl")
    ok = _first_ok(run_dir, "master")
    write_jsonl(history, [*read_jsonl(history), {
        **ok, "op_id": 10**9, "msg_id": "planted", "offset": last["offset"] + last["size"]}])
    after = run_outcome(run_dir)
    assert after.acked_lost_failover == 1 and after.acked_lost_master == 1
    # On the old master's disk, as SYNC_FLUSH promised; ASYNC_MASTER promised
    # no slave had it: an allowed loss, not a violation.
    assert after.promise_violations == 0
    assert judge_run(run_dir)["promise_violations"] == 0


def test_a_sync_master_ack_missing_from_the_promoted_slave_is_a_violation(
        tmp_path: Path) -> None:
    run_dir = _run(tmp_path, "master-lost", "SYNC_MASTER", "ASYNC_FLUSH", 1)
    assert run_outcome(run_dir).promise_violations == 0
    ok = _first_ok(run_dir, "master")
    records = os.path.join(run_dir, "nodes", "slave1", "records.jsonl")
    write_jsonl(records, [r for r in read_jsonl(records) if r["msg_id"] != ok["msg_id"]])
    o = run_outcome(run_dir)
    assert (o.acked_lost_failover, o.promise_violations) == (1, 1)
    assert judge_run(run_dir)["replica_violations"] == 1


def test_an_isolated_master_keeps_acknowledging_and_its_log_diverges(tmp_path: Path) -> None:
    run_dir = _run(tmp_path, "isolated-master", "ASYNC_MASTER", "ASYNC_FLUSH", 2)
    kinds = _kinds(run_dir)
    assert kinds.index("partition") < kinds.index("promote") < kinds.index("heal")
    o = run_outcome(run_dir)
    # What it took while cut off never reached the promoted slave.
    assert o.acked_lost_failover > 0 and o.promise_violations == 0
    assert o.failover_lag_ms is not None and o.failover_lag_ms >= 3000  # the cut, at least
    judged = judge_run(run_dir)
    assert judged["divergent_records"] and judged["divergent_records"] > 0


def test_the_old_master_rejoins_as_a_slave_after_a_crash_failover(tmp_path: Path) -> None:
    run_dir = _run(tmp_path, "master-crash-failover", "SYNC_MASTER", "SYNC_FLUSH", 3)
    faults = read_jsonl(os.path.join(run_dir, "faults.jsonl"))
    rejoin = [f for f in faults if f["kind"] == "rejoin"]
    assert rejoin and rejoin[0]["node"] == "master" and rejoin[0]["peer"] == "slave1"
    obs = [o for o in read_jsonl(os.path.join(run_dir, "observations.jsonl"))
           if o["kind"] == "slave_ahead" and o["slave"] == "master"]
    assert obs and obs[0]["master"] == "slave1"  # its first report against the new master
    assert run_outcome(run_dir).promise_violations == 0


def test_failing_over_twice_promotes_the_old_master_back(tmp_path: Path) -> None:
    run_dir = _run(tmp_path, "failover-twice", "ASYNC_MASTER", "ASYNC_FLUSH", 1)
    promotes = [f["node"] for f in read_jsonl(os.path.join(run_dir, "faults.jsonl"))
                if f["kind"] == "promote"]
    assert promotes == ["slave1", "master"]
    params = load_json_file(os.path.join(run_dir, "params.json"))
    assert params["nodes"][0]["name"] == "master" and params["first_master"] == "master"


def test_a_failover_run_replays_byte_for_byte(tmp_path: Path) -> None:
    a = tree_hashes(_run(tmp_path / "a", "master-lost", "ASYNC_MASTER", "ASYNC_FLUSH", 3))
    b = tree_hashes(_run(tmp_path / "b", "master-lost", "ASYNC_MASTER", "ASYNC_FLUSH", 3))
    assert a == b and "nodes/master/records.jsonl" in a


# ------------------------------------------------ chaos/check/failover.py
def _fault(kind: str, node: str | None, at: int, peer: str | None = None,
           detail: str | None = None) -> dict[str, object]:
    return {"kind": kind, "node": node, "peer": peer, "start_ms": at, "end_ms": None,
            "detail": detail}


def test_the_route_follows_losses_and_promotions() -> None:
    faults = [_fault("lose", "m", 100), _fault("promote", "s", 300, peer="m"),
              _fault("promote", "m", 500, detail="refused: not running")]
    changes = failover.route_changes(faults, "m")
    assert [failover.master_at(changes, t) for t in (0, 100, 299, 300, 600)] == [
        "m", None, None, "s", "s"]
    assert failover.lost_at_end(faults) == {"m"}
    assert failover.lost_at_end([*faults, _fault("rejoin", "m", 700)]) == set()
    history = [{"status": "PUT_OK", "node": "m", "complete_ms": 50},
               {"status": "PUT_OK", "node": "m", "complete_ms": 350},  # split brain
               {"status": "PUT_OK", "node": "s", "complete_ms": 400}]
    assert failover.split_brain_acks(history, changes, "PUT_OK") == 1
    # Lost at the master's loss (100): invoked at 40, 60 ms behind; a
    # partition is no loss (the isolated master runs on) until the promotion.
    assert failover.failover_lag_ms(faults, changes, [("m", 40), ("m", 90)]) == 60
    cut = [_fault("partition", "m", 100, peer="s"), _fault("promote", "s", 4100, peer="m")]
    assert failover.failover_lag_ms(cut, failover.route_changes(cut, "m"),
                                    [("m", 100), ("m", 5000)]) == 4000


def test_a_failover_runs_line_names_its_losses(tmp_path: Path) -> None:
    run_dir = _run(tmp_path, "isolated-master", "ASYNC_MASTER", "ASYNC_FLUSH", 2)
    o = run_outcome(run_dir)
    line = json.dumps(o.to_json())
    assert "acked_lost_failover" in line and "split_brain_acks" in line


def test_a_promotion_and_a_rejoin_take_the_machines_start_time(tmp_path: Path) -> None:
    """Given a machine's timings (compare-backends), the sim's promotion
    and rejoin restart a node as the local backend does, taking its
    measured start time (a 1.5 s start here): the promote step lasts at
    least that long in simulated time, the rejoin too; without timings both
    are instant."""
    from chaos.harness.timings import MachineTimings

    def steps(timings: MachineTimings | None, out: Path) -> dict[str, float]:
        cfg = RunConfig(scenario=scenarios.get("master-crash-failover"), role="ASYNC_MASTER",
                        flush="ASYNC_FLUSH", seed=1, out_dir=str(out), backend="sim",
                        sim_duration_s=DURATION_S, sim_timings=timings)
        rows = read_jsonl(os.path.join(SimRun(cfg).execute(), "faults.jsonl"))
        return {f["kind"]: (f["end_ms"] - f["start_ms"]) / 1000 for f in rows
                if f["kind"] in ("promote", "rejoin") and f.get("end_ms") is not None}

    timed = steps(MachineTimings(fsync_us=(100.0, 200.0), put_us=100.0, start_us=1.5e6),
                  tmp_path / "timed")
    instant = steps(None, tmp_path / "instant")
    assert set(timed) == set(instant) == {"promote", "rejoin"}, (timed, instant)
    assert timed["promote"] >= 1.5 and timed["rejoin"] >= 1.5, timed
    assert instant["promote"] < 0.5 and instant["rejoin"] < 0.5, instant
