"""The known-bug corpus (chaos/commands/bugs.py): each `--emulate BUG` switch brings
its RocketMQ defect back where the real fix removed it, and the checker
catches it in its scenario.

The chaos tests run each corpus entry's scenario (a switch's, or another
shape of one, named SWITCH/SHAPE) on real local clusters, seed 1 with
the switch and without, and judge the runs with chaos.commands.bugs.judge_run
(the report's promise rules, chaos.check.promises.judge, and the consume checker,
without Spark). The 5 + 5 seed figures are in docs/known-bugs.md (`dlab chaos
bugs --check --runs 5`). The sim tests do the same on the simulated cluster
for the bugs it can check, seeds 1 and 2 (200 seeds each in docs/known-bugs.md,
`--backend sim`), and pin that it checks every bug (it refuses only the
process crash model). The unit tests pin each
switch point on its own.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from typing import Any

import pytest

from chaos.commands import bugs
from chaos.commands.run import make_run
from chaos.harness.runner import RunConfig
from ha.config import TESTING as HA_TESTING
from ha.config import SlaveAheadPolicy
from ha.session import Accept, Close, MasterSession
from store.config import TESTING, ConfigError, FlushMode
from store.consume import consume_side
from store.emulate import (
    RMQ_405,
    RMQ_3015,
    RMQ_3349,
    RMQ_8239,
    RMQ_10666,
    RMQ_EPOCH_IN_PLACE,
    SWITCHES,
)
from store.failpoints import Failpoints
from store.log.record import Message
from store.store import MessageStore

SEEDS = (1,)


def _run(fields: dict[str, Any]) -> str:
    return make_run(RunConfig(**fields).validate()).execute()


@pytest.mark.parametrize("name", [b.name for b in bugs.CORPUS
                                  if bugs.backend_refusal(b, "local") is None])
def test_the_checker_catches_each_bug_with_its_switch_and_never_without(
        tmp_path: str, name: str) -> None:
    bug = bugs.get(name)
    check = bugs.check_bug(bug, SEEDS, str(tmp_path), _run)
    detail = [(r.emulated, r.seed, r.error or r.figures) for r in check.runs]
    assert check.failed_runs == 0, detail
    assert check.caught == check.with_switch == len(SEEDS), detail
    assert check.false_positives == 0 and check.without_switch == len(SEEDS), detail
    # The switch is recorded with the run, and only with its side.
    for r in check.runs:
        assert r.run_dir is not None
        with open(os.path.join(r.run_dir, "params.json")) as f:
            assert json.load(f)["emulate"] == ([bug.id] if r.emulated else [])


# ------------------------------------------------------------- switch points
def test_rmq_8239_lets_consumers_read_what_is_not_flushed(tmp_path: str) -> None:
    """Under SYNC_FLUSH with a stalled flusher, the fixed store lets
    consumers read only up to `flushed`; with the switch, up to `wrote`."""

    async def readable(emulate: frozenset[str], path: str) -> tuple[int, int]:
        cfg = TESTING.with_(flush_mode=FlushMode.SYNC_FLUSH, emulate=emulate)
        store = MessageStore.open(path, cfg,
                                  failpoints=Failpoints("flush_before_write=delay:1000@1"))
        await store.start()
        put = asyncio.ensure_future(store.put(Message("t", b"x" * 100, {"UNIQ_KEY": "a"})))
        await asyncio.sleep(0.3)  # the flush of that put is stalled
        count = store.queue_offsets("t", 0)[1]
        wrote_then = store.log.wrote
        await put
        await store.close()
        return count, wrote_then

    fixed, wrote = asyncio.run(readable(frozenset(), os.path.join(tmp_path, "a")))
    assert wrote > 0 and fixed == 0
    buggy, _ = asyncio.run(readable(frozenset({RMQ_8239}), os.path.join(tmp_path, "b")))
    assert buggy == 1


@pytest.mark.parametrize("policy", list(SlaveAheadPolicy))
def test_rmq_3349_believes_a_first_report_beyond_the_master_whatever_the_policy(
        policy: SlaveAheadPolicy) -> None:
    cfg = HA_TESTING.with_(slave_ahead_policy=policy)
    fixed = MasterSession("s", cfg, now_s=0).on_report(5000, master_wrote=1000, master_min=0,
                                                      now_s=0)
    if policy is SlaveAheadPolicy.TRUST:
        assert fixed == Accept(5000)
    else:
        assert not isinstance(fixed, Accept)
    session = MasterSession("s", cfg.with_(emulate=frozenset({RMQ_3349})), now_s=0)
    assert session.on_report(5000, master_wrote=1000, master_min=0, now_s=0) == Accept(5000)
    # Only the first report: later ones keep the #3016 check (beyond shipped: closed).
    assert isinstance(session.on_report(9000, master_wrote=1000, master_min=0, now_s=0), Close)


def test_rmq_3015_believes_a_later_report_beyond_what_was_shipped() -> None:
    """The #3016 check closes a stream whose later report is beyond what
    was shipped; with the switch the report is the stream's acked offset,
    and shipping goes on from where it was."""
    def session(emulate: frozenset[str]) -> MasterSession:
        s = MasterSession("rogue", HA_TESTING.with_(emulate=emulate), now_s=0)
        assert s.on_report(1000, master_wrote=1500, master_min=0, now_s=0) == Accept(1000)
        s.on_shipped(1000, 1500, now_s=0)
        return s

    assert isinstance(session(frozenset()).on_report(1 << 30, master_wrote=1500, master_min=0,
                                                     now_s=0), Close)
    buggy = session(frozenset({RMQ_3015}))
    assert buggy.on_report(1 << 30, master_wrote=1500, master_min=0, now_s=0) == Accept(1 << 30)
    assert buggy.acked == 1 << 30 and buggy.shipped == 1500
    ship = buggy.next_ship(2000)
    assert ship is not None and ship.offset == 1500
    buggy.on_shipped(1500, 2000, now_s=0)  # acked beyond shipped is no invariant broken here


def _crash(s: MessageStore) -> None:
    """What a SIGKILL leaves of an open store in this process: files closed
    without a flush or a close; `abort` stays."""
    s.log.close()
    s.queues.close()
    s._executor.shutdown()
    s._lock.release()


@pytest.mark.parametrize("emulate", [frozenset(), frozenset({RMQ_10666})])
def test_rmq_10666_a_truncation_crash_brings_the_cut_tail_back(
        tmp_path: str, emulate: frozenset[str]) -> None:
    """A slave's truncation, then a crash before anything overwrites the cut
    tail: the fixed store recovers to the cut; with the switch recovery
    takes the cut records back (they are valid, CRCs and all)."""
    cfg = TESTING.with_(emulate=emulate)
    s = MessageStore.open(tmp_path, cfg)
    try:
        results = s.log.append([Message("t", b"x" * 300, {"UNIQ_KEY": f"m{i}"})
                                for i in range(20)])
        s.log.flush()
        wrote = s.log.wrote
        cut = results[12].offset
        s.truncate_to(cut)
        assert s.log.wrote == cut
    finally:
        _crash(s)
    s = MessageStore.open(tmp_path, cfg)
    try:
        if emulate:
            assert s.log.wrote == wrote
            assert s.log.read_record(cut).msg_id == "m12"
        else:
            assert s.log.wrote == cut
    finally:
        s.close_sync()


@pytest.mark.parametrize("emulate", [frozenset(), frozenset({RMQ_405})])
def test_rmq_405_a_clean_stop_with_dispatch_stalled_leaves_records_without_units(
        tmp_path: str, emulate: frozenset[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Dispatch stalls (failpoint reput_before_dispatch); a clean close
    meanwhile. The fixed close waits and dispatches everything; with the
    switch it gives up after its bound and the clean open dispatches
    nothing, so the queue lacks the records the stall held back."""
    monkeypatch.setattr(consume_side, "RMQ_405_DRAIN_S", 0.3)
    cfg = TESTING.with_(emulate=emulate, consume_queue_flush_interval_ms=50)

    async def stall_then_close() -> tuple[int, int]:
        store = MessageStore.open(tmp_path, cfg,
                                  failpoints=Failpoints("reput_before_dispatch=delay:1500@1"))
        await store.start()
        for i in range(10):
            await store.put(Message("t", b"x" * 100, {"UNIQ_KEY": f"m{i}"}))
        await asyncio.sleep(0.3)  # the service's pass has found them and stalled
        during = store.queue_offsets("t", 0)[1]  # a read does not wait for the stall
        await store.close()
        assert store.close_problem is None  # a clean close either way
        return during, store.log.wrote

    during, wrote = asyncio.run(stall_then_close())
    assert during == 0
    s = MessageStore.open(tmp_path, cfg)
    try:
        assert s.log.wrote == wrote and not s.recovery.abnormal
        assert s.queue_offsets("t", 0)[1] == (0 if emulate else 10)
    finally:
        s.close_sync()


def test_every_corpus_entry_has_a_switch_and_unknown_ids_are_refused() -> None:
    assert {b.id for b in bugs.CORPUS} <= set(SWITCHES)
    # A second shape of a switch is its own entry, named SWITCH/SHAPE.
    failover = bugs.get("rmq-3349/failover")
    assert (failover.id, failover.shape) == (RMQ_3349, "failover")
    assert failover.scenario != bugs.get(RMQ_3349).scenario
    with pytest.raises(ConfigError, match="unknown bug"):
        TESTING.with_(emulate=frozenset({"rmq-1"}))
    out = subprocess.run([sys.executable, "-m", "chaos.cli", "chaos", "bugs", "--json"],
                         capture_output=True, text=True, check=True).stdout
    listed = json.loads(out)
    assert [b["id"] for b in listed] == [b.id for b in bugs.CORPUS]
    assert [b["name"] for b in listed] == [b.name for b in bugs.CORPUS]
    text = subprocess.run([sys.executable, "-m", "chaos.cli", "chaos", "bugs", "--bug",
                           "rmq-3349/failover"], capture_output=True, text=True,
                          check=True).stdout
    assert text.startswith("rmq-3349/failover  apache/rocketmq#3349")
    assert "--emulate rmq-3349 (its failover shape)" in text
    assert "cut-off-master-crash-failover (SYNC_MASTER + ASYNC_FLUSH" in text
    bad = subprocess.run([sys.executable, "-m", "chaos.cli", "chaos", "run", "--scenario",
                          "fsync-eio", "--role", "SYNC_MASTER", "--flush", "SYNC_FLUSH",
                          "--out", "/nonexistent-never-used", "--emulate", "rmq-1"],
                         capture_output=True, text=True)
    assert bad.returncode == 2
    assert "unknown bug 'rmq-1'" in bad.stderr and "rmq-2706" in bad.stderr


# ----------------------------------------------------------- the sim backend
SIM_BUGS = [b.name for b in bugs.CORPUS if bugs.sim_refusal(b) is None]
SIM_SEEDS = (1, 2)


def _sim_run(fields: dict[str, Any]) -> str:
    return _run({**fields, "backend": "sim", "sim_duration_s": 15.0})


def test_the_sim_checks_the_bugs_whose_scenario_it_runs() -> None:
    # Which bugs the sim can check is a claim of docs/known-bugs.md: pin it.
    # rmq-8239 and rmq-405 stall a flusher and a dispatch pass (`delay`
    # failpoints), on virtual time there (store/sim/cooperative_executor.py).
    assert SIM_BUGS == ["rmq-3349", "rmq-3349/failover", "rmq-8239", "rmq-2706", "rmq-3015",
                        "rmq-10666", "rmq-405", "rmq-5663", "rmq-epoch-in-place",
                        "rmq-7689"]
    assert "power crash model only" in (bugs.sim_refusal(bugs.get(RMQ_405), "process") or "")


@pytest.mark.parametrize("name", SIM_BUGS)
def test_on_the_sim_the_checker_catches_each_bug_with_its_switch_and_never_without(
        tmp_path: str, name: str) -> None:
    """The 200-seed figures (docs/known-bugs.md) on two seeds: 15 s of
    cluster time a run, about a second of wall time."""
    bug = bugs.get(name)
    check = bugs.check_bug(bug, SIM_SEEDS, str(tmp_path), _sim_run)
    detail = [(r.emulated, r.seed, r.error or r.figures) for r in check.runs]
    assert check.failed_runs == 0, detail
    assert check.caught == check.with_switch == len(SIM_SEEDS), detail
    assert check.false_positives == 0 and check.without_switch == len(SIM_SEEDS), detail
    for r in check.runs:
        assert r.run_dir is not None
        with open(os.path.join(r.run_dir, "params.json")) as f:
            params = json.load(f)
        assert params["backend"] == "sim"
        assert params["emulate"] == ([bug.id] if r.emulated else [])


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def test_the_failover_shape_is_a_first_report_so_rmq_3015s_switch_leaves_it_refused(
        tmp_path: str) -> None:
    """rmq-3349/failover's scenario brings the old master back ahead of the
    promoted slave: its first report is believed under rmq-3349's switch
    and refused under rmq-3015's, which re-opens only later reports (#3016's
    check), so that switch makes no violation here."""
    fields = {**bugs.get("rmq-3349/failover").run_fields(), "seed": 1, "backend": "sim",
              "sim_duration_s": 15.0}
    runs = {bug: _run({**fields, "emulate": (bug,), "out_dir": os.path.join(tmp_path, bug)})
            for bug in (RMQ_3349, RMQ_3015)}
    for run_dir in runs.values():
        with open(os.path.join(run_dir, "observations.jsonl")) as f:
            ahead = [json.loads(line) for line in f if '"slave_ahead"' in line]
        assert [(a["master"], a["slave"]) for a in ahead] == [("slave1", "master")]
        assert ahead[0]["detail"].startswith("slave ahead by ")
    believed = _read(os.path.join(runs[RMQ_3349], "nodes", "slave1", "node.log"))
    assert "slave master: slave ahead of the master by" in believed
    assert "trusted (--emulate rmq-3349)" in believed
    assert (bugs.judge_run(runs[RMQ_3349])["replica_violations"] or 0) > 0
    refused = _read(os.path.join(runs[RMQ_3015], "nodes", "slave1", "node.log"))
    assert "rejecting slave master" in refused and "trusted" not in refused
    assert bugs.judge_run(runs[RMQ_3015])["replica_violations"] == 0


def _tree(root: str) -> dict[str, bytes]:
    out = {}
    for d, _dirs, files in os.walk(root):
        for name in files:
            with open(os.path.join(d, name), "rb") as f:
                out[os.path.relpath(os.path.join(d, name), root)] = f.read()
    return out


def test_the_sims_rogue_peer_is_refused_by_the_fixed_master_and_runs_reproducibly(
        tmp_path: str) -> None:
    """chaos/harness/rogue_peer.py's client as a task on the sim's loop: the fixed
    master closes its stream at the over-report (#3016), and the same seed
    gives the same bytes."""
    fields = {**bugs.get(RMQ_3015).run_fields(), "seed": 3, "backend": "sim",
              "sim_duration_s": 10.0}
    a = _run({**fields, "out_dir": os.path.join(tmp_path, "a")})
    b = _run({**fields, "out_dir": os.path.join(tmp_path, "b")})
    assert _tree(a) == _tree(b)
    with open(os.path.join(a, "rogue_peer0.log")) as f:
        log = f.read()
    assert "stream opened, first report" in log
    assert "the master ended the stream: INVALID_ARGUMENT" in log
    assert "beyond what was shipped" in log
    with open(os.path.join(a, "faults.jsonl")) as f:
        rogue = [json.loads(line) for line in f if '"rogue_peer"' in line]
    assert len(rogue) == 1 and rogue[0]["end_ms"] is not None


def test_bugs_check_on_the_sim_refuses_a_bug_it_cannot_run(tmp_path: str) -> None:
    # What the sim cannot check now is a mode, not a bug: the process crash model.
    cmd = [sys.executable, "-m", "chaos.cli", "chaos", "bugs", "--check", "--backend", "sim",
           "--crash-model", "process", "--runs", "1", "--out", str(tmp_path)]
    for bug_id in ("rmq-8239", "rmq-405"):
        bad = subprocess.run([*cmd, "--bug", bug_id], capture_output=True, text=True)
        assert bad.returncode == 2, bad.stderr
        assert f"{bug_id} cannot be checked on the sim backend" in bad.stderr
        assert "power crash model only" in bad.stderr and "Traceback" not in bad.stderr
    assert not os.listdir(tmp_path)  # refused before any run


def test_bugs_check_on_the_sim_skips_what_it_cannot_run_and_says_why(
        tmp_path: str, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    from chaos import cli

    # The sim refuses no bug under the power model today: give one a
    # reason, and check it with one it runs, through the same code path as
    # checking all bugs.
    monkeypatch.setattr(bugs, "sim_refusal", lambda bug, crash_model="power": (
        "a reason to refuse it" if bug.id == "rmq-405" else None))
    monkeypatch.setattr(bugs, "CORPUS", tuple(bugs.get(b) for b in ("rmq-2706", "rmq-405")))
    code = cli.main(["chaos", "bugs", "--check", "--backend", "sim", "--runs", "1",
                     "--sim-duration", "15", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "rmq-405: skipped on the sim backend: a reason to refuse it" in out
    with open(os.path.join(tmp_path, "bugs-check.json")) as f:
        rows = json.load(f)
    assert [(r["bug"], r["caught"], r["false_positives"]) for r in rows] == [
        ("rmq-2706", 1, 0)]


def test_rmq_epoch_in_place_the_power_cut_takes_the_old_masters_epochs_so_it_cuts_nothing(
        tmp_path: str) -> None:
    """Why rmq-epoch-in-place's scenario catches the bug, pinned on sim seed
    1: the old master wrote its epoch file once, at its election; with the
    switch the power cut takes it, the restarted node has no epochs and
    follows the new master from its own end, keeping its tail; without it
    the file says [1@0] and the node cuts its log at the new master's start."""
    fields = {**bugs.get(RMQ_EPOCH_IN_PLACE).run_fields(), "seed": 1, "backend": "sim",
              "sim_duration_s": 15.0}
    logs = {}
    for side, emulate in (("with", (RMQ_EPOCH_IN_PLACE,)), ("without", ())):
        run_dir = _run({**fields, "emulate": emulate, "out_dir": os.path.join(tmp_path, side)})
        log = _read(os.path.join(run_dir, "nodes", "master", "node.log"))
        assert log.count("is the master of epoch") == 1  # its one epoch-file write
        logs[side] = log.split("epoch file: ")[2]  # from its restart after the power cut
    assert logs["with"].startswith("no epochs (read from none)")
    assert "truncating" not in logs["with"]
    assert logs["without"].startswith("[1@0] (read from main)")
    assert "truncating to " in logs["without"]
