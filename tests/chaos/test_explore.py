"""`dlab chaos explore`: every crash point of a small sim workload, every
target and disk state. A planted bug (an ack before its fsync) is found at
its first crash point and today's code breaks no promise there; SYNC_FLUSH's
window (a slave ahead of a crashed master) is found; the puts after the
restart find rmq-3349 (and nothing without them or without the switch),
a restart in place finds rmq-7689 and a failover the epoch file rewritten in
place (each only with its switch);
the counts add up; a case replays byte for byte; bad input is refused with
exit 2."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from support.pipeline_fixtures import spark  # noqa: F401

from chaos.check.run_dirs import load_run
from chaos.cli import main
from chaos.commands.bugs import judge_run
from chaos.commands.replay import differing_files, tree_hashes
from chaos.explore import disk_states
from chaos.explore.explorer import (
    DIVERGENCE,
    SLAVE_AHEAD,
    STORED_NEVER_DELIVERED,
    VIOLATION,
    Task,
    crash_run,
    explore,
    judge,
    reference,
)
from chaos.explore.replay import replay_case
from chaos.explore.run import Event
from chaos.explore.workload import ELECTED, ExploreOptions
from chaos.report.run_pages import crash_point_section
from chaos.schema import load_json_file, read_jsonl
from store.emulate import PLANTED_ACK_BEFORE_FSYNC, RMQ_3349, RMQ_7689, RMQ_EPOCH_IN_PLACE
from store.sim.memory_disk import Kept, MemoryDisk

PLANTED = (PLANTED_ACK_BEFORE_FSYNC,)


def _first(events: list[Event], label: str) -> int:
    return next(e.index for e in events if e.label() == label)


def _events(tmp_path: Path, **opts: object) -> list[Event]:
    ref = reference(ExploreOptions(**opts).validate(), str(tmp_path / "ref"))  # type: ignore[arg-type]
    return ref.probe.events


# ------------------------------------------------------------- disk states
def test_a_files_choices_are_its_prefixes_and_sector_tears_without_repeats() -> None:
    durable = bytes(2048)
    pending = [(100, b"a" * 1000), (0, b"\0" * 10), (1100, b"b" * 10)]
    got, every = disk_states.file_choices(2048, pending, 512,
                                          lambda a, b: durable[a:b])
    # write 0 torn at 512 and 1024 (file offsets), or whole; write 1 writes
    # the zeros already there (the same bytes: dropped); write 2 whole.
    assert got == [Kept(0), Kept(0, 412), Kept(0, 924), Kept(1), Kept(3)]
    assert every == 6  # nothing, 3 of write 0, 1 of write 1, 1 of write 2


def test_a_crash_keeps_the_chosen_prefix_and_tear_of_each_file() -> None:
    disk = MemoryDisk()
    disk.makedirs("/d")
    f = disk.open("/d/a", create=True)
    f.pwrite(b"x" * 10, 0)
    f.fsync()
    disk.fsync_dir("/d")
    f.pwrite(b"y" * 1000, 10)
    f.pwrite(b"z" * 5, 1010)
    assert list(disk.unsynced()) == ["/d/a"]
    torn = disk.crash(kept={"/d/a": Kept(0, 502)})
    assert torn.read_file("/d/a") == b"x" * 10 + b"y" * 502
    whole = disk.crash(kept={"/d/a": Kept(2)})
    assert whole.read_file("/d/a") == b"x" * 10 + b"y" * 1000 + b"z" * 5
    assert disk.crash(kept={}).read_file("/d/a") == b"x" * 10


# ------------------------------------------------------- what it finds
def test_the_planted_ack_before_fsync_is_found_at_its_first_crash_point(
        tmp_path: Path) -> None:
    events = _events(tmp_path, emulate=PLANTED)
    first_answer = _first(events, "master answer-sent")
    opts = ExploreOptions(emulate=PLANTED, events=(first_answer,), targets=("master",))
    counts, findings = explore(opts.validate(), str(tmp_path / "out"), workers=1,
                               log=lambda s: None)
    violations = [f for f in findings if VIOLATION in f["kinds"]]
    assert violations and counts.findings[VIOLATION] == len(violations)
    # The state that lost the unsynced record breaks the disk promise.
    assert any(f["acked_lost_master"] >= 1 for f in violations)
    for f in violations:
        assert os.path.isfile(tmp_path / "out" / f["case"] / "params.json")


def test_without_the_planted_fault_the_same_crash_point_breaks_no_promise(
        tmp_path: Path) -> None:
    events = _events(tmp_path)
    first_answer = _first(events, "master answer-sent")
    before = [e.index for e in events if e.index <= first_answer and e.node == "master"]
    opts = ExploreOptions(events=tuple(before[-3:]), targets=("master", "both"))
    counts, findings = explore(opts.validate(), str(tmp_path / "out"), workers=1,
                               log=lambda s: None)
    assert counts.runs > 10
    assert counts.findings[VIOLATION] == 0, [f for f in findings if f["kinds"]]


def test_sync_flush_leaves_a_slave_ahead_of_a_master_crashed_before_its_fsync(
        tmp_path: Path) -> None:
    events = _events(tmp_path)
    applied = _first(events, "slave1 ship-applied")
    fsynced = next(e.index for e in events if e.index > applied and e.node == "master"
                   and e.kind == "fsync")
    opts = ExploreOptions(events=(applied,), targets=("master",))
    counts, findings = explore(opts.validate(), str(tmp_path / "out"), workers=1,
                               log=lambda s: None)
    assert fsynced > applied
    assert counts.findings[SLAVE_AHEAD] == counts.runs > 0
    assert all(f["slave_ahead_bytes"] > 0 for f in findings)
    assert counts.findings[VIOLATION] == 0


# ------------------------------------------------- puts after the restart
# rmq-3349's mode: the master's lazy ASYNC_FLUSH loses what its slave holds.
RMQ_3349_MODE: dict[str, object] = {"role": "SYNC_MASTER", "flush": "ASYNC_FLUSH",
                                    "targets": ("master",)}


def test_puts_after_default_to_half_the_puts_and_old_cases_had_none() -> None:
    assert ExploreOptions(puts=6).puts_after == 3
    assert ExploreOptions(puts=7, puts_after=0).puts_after == 0
    doc = ExploreOptions(puts_after=0).to_json()
    assert "puts_after" not in doc  # as a case recorded before the option says it
    assert ExploreOptions.from_json(doc).puts_after == 0
    assert ExploreOptions.from_json(ExploreOptions().to_json()).puts_after == 3
    with pytest.raises(ValueError, match="--puts-after must be 0 or more"):
        ExploreOptions(puts_after=-1).validate()


def test_puts_after_the_restart_find_rmq_3349_and_only_with_its_switch(
        tmp_path: Path) -> None:
    events = _events(tmp_path, emulate=(RMQ_3349,), **RMQ_3349_MODE)
    # The second answer: the master's crash there loses two records its
    # slave holds, which the first puts after the restart fit under.
    point = [e.index for e in events if e.label() == "master answer-sent"][1]

    def run(name: str, **opts: object) -> tuple[int, list[dict[str, object]]]:
        options = ExploreOptions(events=(point,), **{**RMQ_3349_MODE, **opts})  # type: ignore[arg-type]
        counts, findings = explore(options.validate(), str(tmp_path / name), workers=1,
                                   log=lambda s: None)
        assert counts.runs >= 1 and counts.findings[SLAVE_AHEAD] == counts.runs
        return counts.findings[VIOLATION], findings

    found, findings = run("with", emulate=(RMQ_3349,))
    assert found >= 1
    for f in (f for f in findings if VIOLATION in f["kinds"]):
        case = str(tmp_path / "with" / str(f["case"]))
        assert (judge_run(case)["replica_violations"] or 0) >= 1  # the corpus's verdict
        acked_after = [r for r in read_jsonl(os.path.join(case, "history.jsonl"))
                       if "-after-" in r["msg_id"] and r["status"] == "PUT_OK"]
        assert acked_after  # acknowledged by the restarted master
    assert run("no-load-after", emulate=(RMQ_3349,), puts_after=0)[0] == 0
    assert run("no-switch")[0] == 0


def test_the_puts_after_a_slave_restarts_wait_for_it_to_be_back(tmp_path: Path) -> None:
    opts = ExploreOptions(targets=("slave",)).validate()
    ref = reference(opts, str(tmp_path / "ref"))
    event = _first(ref.probe.events, "master answer-sent")
    task = Task(event, "slave", 0, ref.target_nodes("slave"),
                ref.states[event]["slave"].states[0], ref.probe.events[event].label())
    rows = read_jsonl(os.path.join(crash_run(opts, task, str(tmp_path / "run")).execute(),
                                   "history.jsonl"))
    after = [r for r in rows if "-after-" in r["msg_id"]]
    assert [r["op_id"] for r in rows] == list(range(len(rows)))
    # SYNC_MASTER answers PUT_OK only once its slave has them: it was back.
    assert len(after) == 3 and {r["status"] for r in after} == {"PUT_OK"}


# ------------------------------------------- slave-ahead policy, ship limit
def test_the_slave_ahead_policy_decides_what_the_puts_after_leave(tmp_path: Path) -> None:
    """A slave ahead of its restarted master (SYNC_FLUSH's window): rejected,
    it keeps its tail and the master's puts after the restart write other
    records at those offsets (divergence); told to truncate, it cuts its
    tail and follows (no divergence)."""
    applied = _first(_events(tmp_path), "slave1 ship-applied")

    def run(policy: str) -> dict[str, int]:
        opts = ExploreOptions(events=(applied,), targets=("master",), slave_ahead_policy=policy)
        counts, _ = explore(opts.validate(), str(tmp_path / policy), workers=1,
                            log=lambda s: None)
        assert counts.runs > 0 and counts.findings[SLAVE_AHEAD] == counts.runs
        return counts.findings

    assert run("reject")[DIVERGENCE] > 0
    assert run("truncate")[DIVERGENCE] == 0


def test_shipping_only_flushed_bytes_leaves_no_slave_ahead(tmp_path: Path) -> None:
    def ahead(limit: str) -> int:
        events = _events(tmp_path / limit, ha_ship_limit=limit)
        applied = tuple(e.index for e in events if e.label() == "slave1 ship-applied")
        opts = ExploreOptions(events=applied, targets=("master",), ha_ship_limit=limit)
        counts, _ = explore(opts.validate(), str(tmp_path / limit / "out"), workers=2,
                            log=lambda s: None)
        assert counts.runs > 0
        return counts.findings[SLAVE_AHEAD]

    assert ahead("wrote") > 0
    assert ahead("flushed") == 0


# ---------------------------------------------------------------- failover
def test_a_failover_promotes_each_running_slave_in_turn() -> None:
    classic = ExploreOptions(failover=True, slaves=2)
    slaves = ("slave1", "slave2")
    assert classic.promotions(("master",), slaves) == slaves
    assert classic.promotions(("master", "slave1"), slaves) == ("slave2",)
    assert classic.promotions(("slave1",), slaves) == ("",)  # the master did not crash
    assert ExploreOptions(failover=True).promotions(("master", "slave1"), ("slave1",)) == ("",)
    assert ExploreOptions(failover=True, ha_mode="controller").promotions(
        ("master",), slaves) == (ELECTED,)
    assert ExploreOptions().promotions(("master",), slaves) == ("",)


def test_with_two_slaves_each_master_crash_state_runs_once_per_promoted_slave(
        tmp_path: Path) -> None:
    opts = ExploreOptions(failover=True, slaves=2, targets=("master", "slave"),
                          events=(0, 1), puts_after=0).validate()
    counts, _ = explore(opts, str(tmp_path / "out"), workers=2, log=lambda s: None)
    ref = reference(opts, str(tmp_path / "ref"))
    master = sum(len(ref.states[e]["master"].states) for e in (0, 1))
    slave = sum(len(ref.states[e]["slave"].states) for e in (0, 1))
    assert counts.states == master + slave
    assert counts.runs == 2 * master + slave


# rmq-3349/failover's shape: an old master that flushed a record it had not
# shipped rejoins the slave promoted in its place. A fast disk puts the
# master's flush before its ship.
FAILOVER_3349: dict[str, object] = {"role": "SYNC_MASTER", "flush": "SYNC_FLUSH",
                                    "fsync_ms": 0.1, "failover": True, "targets": ("master",)}


def test_a_failover_finds_rmq_3349_failover_and_its_case_replays(tmp_path: Path) -> None:
    events = _events(tmp_path, emulate=(RMQ_3349,), **FAILOVER_3349)
    shipped = _first(events, "master ship-sent")
    point = next(e.index for e in events if e.index > shipped and e.node == "master"
                 and e.kind == "fsync")

    def run(name: str, **opts: object) -> tuple[dict[str, int], list[dict[str, object]]]:
        options = ExploreOptions(events=(point,), **{**FAILOVER_3349, **opts})  # type: ignore[arg-type]
        counts, findings = explore(options.validate(), str(tmp_path / name), workers=1,
                                   log=lambda s: None)
        assert counts.runs >= 1
        return counts.findings, findings

    found, findings = run("with", emulate=(RMQ_3349,))
    assert found[VIOLATION] >= 1
    case = str(tmp_path / "with" / str(next(f for f in findings if VIOLATION in f["kinds"])
                                       ["case"]))
    faults = [(r["kind"], r["node"]) for r in read_jsonl(os.path.join(case, "faults.jsonl"))]
    assert faults[:3] == [("kill", "master"), ("promote", "slave1"), ("rejoin", "master")]
    assert (judge_run(case)["replica_violations"] or 0) >= 1
    with open(os.path.join(case, "params.json"), encoding="utf-8") as f:
        record = json.load(f)["explore"]
    assert record["promote"] == "slave1"
    again = replay_case(record, str(tmp_path / "again"))
    assert differing_files(case, again.run_dir) == []
    without, _ = run("without")
    # The old master is ahead of the promoted slave and rejected: no ack
    # believes it.
    assert without[VIOLATION] == 0 and without[SLAVE_AHEAD] >= 1


def test_in_controller_mode_the_controller_elects_and_the_old_master_follows(
        tmp_path: Path) -> None:
    opts = ExploreOptions(ha_mode="controller", role="SYNC_MASTER", flush="ASYNC_FLUSH",
                          failover=True, targets=("master",)).validate()
    ref = reference(opts, str(tmp_path / "ref"))
    # A late answer: the slave holds what the master had, they share an epoch.
    event = [e.index for e in ref.probe.events if e.label() == "master answer-sent"][-1]
    task = Task(event, "master", 0, ("master",), ref.states[event]["master"].states[0],
                ref.probe.events[event].label(), ELECTED)
    run = crash_run(opts, task, str(tmp_path / "run"))
    run_dir = run.execute()
    assert run.promoted == "slave1"
    faults = [(r["kind"], r["node"], r["detail"])
              for r in read_jsonl(os.path.join(run_dir, "faults.jsonl"))]
    assert ("promote", "slave1", "elected by the controller") in faults
    assert any(kind == "rejoin" and node == "master" for kind, node, _ in faults)
    after = [r for r in read_jsonl(os.path.join(run_dir, "history.jsonl"))
             if "-after-" in r["msg_id"]]
    assert after and {r["node"] for r in after} == {"slave1"}
    assert judge(run_dir)["kinds"] == []


# The corpus's controller-mode crash bugs, explored without their tuned
# scenarios (docs/simulation.md, "The known-bug corpus").
RMQ_7689_MODE: dict[str, object] = {"ha_mode": "controller", "role": "SYNC_MASTER",
                                    "flush": "SYNC_FLUSH", "consumer": True,
                                    "ha_ship_limit": "flushed", "targets": ("master",)}
EPOCH_MODE: dict[str, object] = {"ha_mode": "controller", "role": "ASYNC_MASTER",
                                 "flush": "SYNC_FLUSH", "failover": True,
                                 "targets": ("master",)}


def _explore_at(tmp_path: Path, name: str, point: int, mode: dict[str, object],
                **opts: object) -> tuple[dict[str, int], list[dict[str, Any]]]:
    options = ExploreOptions(events=(point,), **{**mode, **opts})  # type: ignore[arg-type]
    counts, findings = explore(options.validate(), str(tmp_path / name), workers=1,
                               log=lambda s: None)
    assert counts.runs >= 1
    return counts.findings, findings


def test_a_crash_restarting_the_master_in_place_finds_rmq_7689_and_only_with_its_switch(
        tmp_path: Path) -> None:
    """The master restarts before the controller's heartbeat timeout, so it
    serves again in a new life, as the corpus's scenario makes it by killing
    the controller with it; with the switch its next puts reuse the queue
    offsets of records past its confirm offset, which the draining consumer
    never gets."""
    events = _events(tmp_path, emulate=(RMQ_7689,), **RMQ_7689_MODE)
    point = _first(events, "master answer-sent")
    found, findings = _explore_at(tmp_path, "with", point, RMQ_7689_MODE, emulate=(RMQ_7689,))
    assert found[STORED_NEVER_DELIVERED] >= 1
    for f in (f for f in findings if STORED_NEVER_DELIVERED in f["kinds"]):
        case = str(tmp_path / "with" / str(f["case"]))
        assert (judge_run(case)["stored_never_delivered"] or 0) >= 1  # the corpus's verdict
    assert _explore_at(tmp_path, "without", point, RMQ_7689_MODE)[0][
        STORED_NEVER_DELIVERED] == 0


def test_a_failover_finds_the_epoch_file_rewritten_in_place_and_only_with_its_switch(
        tmp_path: Path) -> None:
    """A crash after the master stored a record its slave lacks: the
    power cut takes the epoch file's unsynced in-place rewrite, the old
    master rejoins the elected slave as a new replica and truncates
    nothing, so it keeps records where the new master holds others. The
    fixed epoch file (write, fsync, rename) survives, and the rejoin cuts
    the tail instead."""
    events = _events(tmp_path, emulate=(RMQ_EPOCH_IN_PLACE,), **EPOCH_MODE)
    point = _first(events, "master answer-sent")
    found, findings = _explore_at(tmp_path, "with", point, EPOCH_MODE,
                                  emulate=(RMQ_EPOCH_IN_PLACE,))
    assert found[DIVERGENCE] >= 1
    for f in (f for f in findings if DIVERGENCE in f["kinds"]):
        case = str(tmp_path / "with" / str(f["case"]))
        assert (judge_run(case)["divergent_records"] or 0) >= 1  # the corpus's verdict
    assert _explore_at(tmp_path, "without", point, EPOCH_MODE)[0][DIVERGENCE] == 0


# ------------------------------------------------------------------ counts
def test_the_counts_add_up_and_explore_json_says_them(tmp_path: Path) -> None:
    opts = ExploreOptions(events=(0, 1, 2, 3)).validate()
    counts, _ = explore(opts, str(tmp_path / "out"), workers=2, log=lambda s: None)
    ref = reference(opts, str(tmp_path / "ref"))
    expected = sum(len(ref.states[e][t].states) for e in range(4) for t in opts.targets)
    assert counts.crash_points == 4
    assert counts.states == counts.runs == expected
    assert counts.pruned == sum(ref.states[e][t].pruned for e in range(4) for t in opts.targets)
    doc = load_json_file(str(tmp_path / "out" / "explore.json"))
    assert doc["counts"]["disk_states"] == counts.states
    assert doc["counts"]["runs"] == counts.runs and doc["counts"]["crash_points"] == 4
    kinds = {e["kind"] for e in doc["events"]}
    assert {"write", "fsync", "ship-sent", "ship-applied", "report-sent",
            "answer-sent"} <= kinds
    # Only the findings' runs are kept.
    assert len(os.listdir(tmp_path / "out" / "cases")) == sum(
        1 for f in doc["findings"] if f["kinds"])


def test_spark_tasks_explore_what_the_process_pool_explores(
        tmp_path: Path, spark: Any) -> None:  # noqa: F811
    """Spark is the default runner (local[*], as the sim sweeps): the same
    crash points give the same counts and the same findings, run for run,
    as a pool of processes (each run is deterministic)."""
    first = _first(_events(tmp_path, emulate=PLANTED), "master answer-sent")
    opts = ExploreOptions(emulate=PLANTED, events=tuple(range(first - 3, first + 3))).validate()
    on_spark, found_spark = explore(opts, str(tmp_path / "spark"), workers=1,
                                    log=lambda s: None,
                                    spark_master=spark.sparkContext.master)
    here, found_here = explore(opts, str(tmp_path / "here"), workers=1, log=lambda s: None)
    assert (on_spark.crash_points, on_spark.states, on_spark.runs, on_spark.findings) == (
        here.crash_points, here.states, here.runs, here.findings)
    assert on_spark.findings[VIOLATION] > 0  # the planted ack before its fsync
    assert [(f["event"], f["target"], f["kinds"]) for f in found_spark] == [
        (f["event"], f["target"], f["kinds"]) for f in found_here]
    assert sorted(os.listdir(tmp_path / "spark" / "cases")) == sorted(
        os.listdir(tmp_path / "here" / "cases"))


# ------------------------------------------------------------------ replay
def dlab(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """`dlab ARGS` in this process (the CLI's own error handling included):
    exit status, stdout, stderr."""
    try:
        code = main(list(args))
    except SystemExit as exc:  # argparse's usage errors
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_a_case_replays_byte_for_byte(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                      ) -> None:
    events = _events(tmp_path, emulate=PLANTED)
    first_answer = _first(events, "master answer-sent")
    code, out, err = dlab(capsys, "chaos", "explore", "--emulate", PLANTED[0], "--events",
                          str(first_answer), "--targets", "master", "--max-disk-states", "2",
                          "--workers", "1", "--out", str(tmp_path / "out"))
    assert code == 1, out + err
    assert "violation:" in out and "dlab chaos replay" in out
    case = str(tmp_path / "out" / "cases" / sorted(os.listdir(tmp_path / "out" / "cases"))[0])
    with open(os.path.join(case, "params.json"), encoding="utf-8") as f:
        record = json.load(f)["explore"]
    assert record["trace"][-1]["kind"] == "answer-sent"  # the trace ends at the crash
    again = replay_case(record, str(tmp_path / "again"))
    assert differing_files(case, again.run_dir) == []
    assert len(tree_hashes(case)) > 10
    code, out, err = dlab(capsys, "chaos", "replay", case, "--out", str(tmp_path / "cli"))
    assert code == 1, out + err  # the case breaks a promise
    assert "identical to the original, byte for byte" in out
    # Its page in the report names the crash point and shows the trace up to it.
    run = load_run(case, 0)
    page = "\n".join(crash_point_section(run.params["explore"], run.params["started_ms"],
                                          "simulated s"))
    assert f"right after event {first_answer} (master answer-sent)" in page
    assert page.count("<td>answer-sent</td>") == 1 and "<td>ship-sent</td>" in page


@pytest.mark.parametrize("args, words", [
    (("--targets", "master,primary"), "targets are master, slave and both"),
    (("--emulate", "no-such-bug"), "unknown bug 'no-such-bug'"),
    (("--events", "x-3"), "crash point numbers"),
    (("--body-bytes", "100000"), "--body-bytes 100000"),
    (("--puts-after", "-1"), "--puts-after must be 0 or more"),
    (("--slave-ahead-policy", "believe"), "invalid choice: 'believe'"),
    (("--ha-mode", "dledger"), "invalid choice: 'dledger'"),
])
def test_bad_input_is_refused_with_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          args: tuple[str, ...], words: str) -> None:
    code, out, err = dlab(capsys, "chaos", "explore", *args, "--out", str(tmp_path / "out"))
    assert code == 2, out + err
    assert words in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()  # refused before anything ran


def test_a_crash_point_the_reference_run_lacks_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = dlab(capsys, "chaos", "explore", "--events", "5000", "--out",
                          str(tmp_path / "out"))
    assert code == 2, out + err
    assert "--events 5000: the reference run has" in err
