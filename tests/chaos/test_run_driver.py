"""One run driver (chaos/harness/: run_config.py, recorder.py, run_base.py):
a run's states are enums and a wrong one is named with the right ones; a
step's action is an enum checked at its definition; a sim run keeps the
process's logging as it found it while it captures the nodes' lines; the
recorder alone writes a result directory the schema accepts."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from chaos.commands.replay import recorded_config
from chaos.harness import scenarios
from chaos.harness.plan import plan_run
from chaos.harness.recorder import RunRecorder
from chaos.harness.run_config import Backend, RunConfig, SimDiskFaults
from chaos.harness.scenarios import Action, Step
from chaos.harness.settle import SettleWatch
from chaos.schema import load_json_file, read_jsonl, validate_run_dir
from chaos.sim.run import SimRun
from cluster.node.role import Role
from ha.config import ShipLimit, SlaveAheadPolicy
from store.config import CorruptionPolicy, CrashModel, FlushMode
from store.tools.cli_args import UserError


def _cfg(**fields: object) -> RunConfig:
    base: dict[str, object] = {"scenario": scenarios.get("master-crash"),
                               "role": "SYNC_MASTER", "flush": "ASYNC_FLUSH", "seed": 3,
                               "out_dir": ""}
    return RunConfig(**(base | fields)).validate()  # type: ignore[arg-type]


def test_run_config_holds_enums_that_read_as_the_strings() -> None:
    cfg = _cfg(backend="sim", ha_ship_limit="flushed", sim_disk_faults="drawn")
    assert cfg.role is Role.SYNC_MASTER and cfg.flush is FlushMode.ASYNC_FLUSH
    assert cfg.backend is Backend.SIM and cfg.crash_model is CrashModel.POWER
    assert cfg.ha_ship_limit is ShipLimit.FLUSHED
    assert cfg.slave_ahead_policy is SlaveAheadPolicy.REJECT
    assert cfg.corruption_policy is CorruptionPolicy.REFUSE
    assert cfg.sim_disk_faults is SimDiskFaults.DRAWN
    # What params.json records reads exactly as the strings did.
    assert cfg.run_id == "master-crash-SYNC_MASTER-ASYNC_FLUSH-power-reject-diskfaults-sim-s3"
    rec = json.loads(json.dumps(cfg.to_record(), sort_keys=True))
    assert (rec["role"], rec["backend"], rec["ha_ship_limit"]) == ("SYNC_MASTER", "sim",
                                                                    "flushed")


@pytest.mark.parametrize(("field", "value", "message"), [
    ("role", "SLAVE", "role must be one of SYNC_MASTER, ASYNC_MASTER, got 'SLAVE'"),
    ("flush", "FAST", "flush must be one of SYNC_FLUSH, ASYNC_FLUSH, got 'FAST'"),
    ("backend", "k8s", "backend must be one of local, compose, sim, got 'k8s'"),
    ("crash_model", "fire", "crash model must be one of power, process, got 'fire'"),
    ("slave_ahead_policy", "ignore",
     "slave-ahead policy must be one of reject, trust, truncate, got 'ignore'"),
    ("ha_ship_limit", "all", "HA ship limit must be one of wrote, flushed, got 'all'"),
    ("corruption_policy", "fix",
     "corruption policy must be one of refuse, truncate, repair, got 'fix'"),
    ("sim_disk_faults", "many", "sim disk faults must be one of torn, drawn, got 'many'"),
])
def test_a_wrong_state_is_named_with_the_right_ones(field: str, value: str,
                                                    message: str) -> None:
    with pytest.raises(ValueError) as err:
        _cfg(**{field: value})
    assert str(err.value) == message


def test_a_replayed_config_with_a_wrong_state_says_which_and_what_is_right(
        tmp_path: Path) -> None:
    rec = _cfg().to_record() | {"ha_ship_limit": "everything"}
    params = json.loads(json.dumps({"config": rec}))
    with pytest.raises(UserError) as err:
        recorded_config(params, "RUN/params.json")
    assert "HA ship limit must be one of wrote, flushed, got 'everything'" in str(err.value)


def test_a_step_action_is_an_enum_checked_where_the_step_is_written() -> None:
    assert Step("kill").action is Action.KILL  # type: ignore[arg-type]
    assert f"{Step(Action.AWAIT_CRASH).action}" == "await_crash"
    with pytest.raises(ValueError, match="'kil' is not a valid Action"):
        Step("kil")  # type: ignore[arg-type]
    assert all(isinstance(st.action, Action)
               for sc in scenarios.SCENARIOS.values() for st in sc.steps)


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.NOTSET)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_a_sim_run_leaves_the_process_logging_as_it_found_it(tmp_path: Path) -> None:
    """The nodes' INFO lines go to their node.log, not to the handlers of
    whoever runs the sim (a sweep, a test, a CLI at WARNING), and no
    logger's level or propagation is changed after the run."""
    root, dlab = logging.getLogger(), logging.getLogger("dlab")
    seen = _Collect()
    old_level = root.level
    root.addHandler(seen)
    root.setLevel(logging.WARNING)
    try:
        run_dir = SimRun(_cfg(out_dir=str(tmp_path), backend="sim",
                              sim_duration_s=6.0)).execute()
        assert root.level == logging.WARNING
    finally:
        root.removeHandler(seen)
        root.setLevel(old_level)
    leaked = [r for r in seen.records if r.levelno < logging.WARNING]
    assert leaked == [], [f"{r.name}: {r.getMessage()}" for r in leaked[:3]]
    assert (dlab.level, dlab.propagate, dlab.handlers) == (logging.NOTSET, True, [])
    # The nodes' lines were captured all the same.
    with open(os.path.join(run_dir, "nodes", "master", "node.log"), encoding="utf-8") as f:
        lines = f.read().splitlines()
    assert any(" INFO dlab." in line for line in lines), lines[:5]
    assert validate_run_dir(run_dir) == ["master", "slave1"]


def test_the_recorder_alone_writes_a_run_directory_the_schema_reads(tmp_path: Path) -> None:
    """What either backend records goes through these calls; the files
    they write are the result schema (chaos/schema.py)."""
    said: list[str] = []
    rec = RunRecorder(str(tmp_path / "run"), said.append)
    rec.open()
    rec.kill("master", 100)
    rec.fault("pause", "slave1", 110)
    rec.close_fault("pause", "slave1", 150)
    rec.refused("master", 200, "corruption at 4096")
    rec.damage("bit_flip", "slave1", 210, 220, "bit 3 of byte 99")
    rec.slave_ahead(300, "master", 1000, {"slave1": 1200})
    rec.settle(400, "master", 1200, "replication settled")
    for name, role in (("master", Role.SYNC_MASTER), ("slave1", Role.SLAVE)):
        data = tmp_path / name
        data.mkdir()
        rec.node(name, role, str(data), log_lines=[f"{name} line"])
    rec.run_files([], None)
    cfg = _cfg()
    rec.params(cfg, plan_run(cfg.scenario, cfg.seed), backend="local",
               nodes={"master": Role.SYNC_MASTER, "slave1": Role.SLAVE}, failpoints={},
               started_ms=1, ended_ms=500)
    run_dir = str(tmp_path / "run")
    assert validate_run_dir(run_dir) == ["master", "slave1"]
    faults = read_jsonl(os.path.join(run_dir, "faults.jsonl"))
    assert [(f["fault_id"], f["kind"], f["end_ms"]) for f in faults] == [
        (0, "kill", None), (1, "pause", 150), (2, "refused", None), (3, "bit_flip", 220)]
    assert said[0] == "  fault kill master"
    obs = read_jsonl(os.path.join(run_dir, "observations.jsonl"))
    assert obs[0]["detail"] == "slave ahead by 200 bytes" and obs[1]["kind"] == "settle"
    master = load_json_file(os.path.join(run_dir, "nodes", "master", "final.json"))
    assert (master["killed"], master["recoveries"]) == (True, ["refused: corruption at 4096"])
    slave = load_json_file(os.path.join(run_dir, "nodes", "slave1", "final.json"))
    assert (slave["disk_damaged"], slave["role"]) == (True, "SLAVE")
    params = load_json_file(os.path.join(run_dir, "params.json"))
    assert params["config"]["role"] == params["role"] == "SYNC_MASTER"
    assert set(params["versions"]) == {"python", "durability-lab", "grpcio"}


def test_settle_watch_says_why_the_end_phase_stops_waiting() -> None:
    w = SettleWatch(2, started_s=0.0)
    assert w.verdict(0.1, 100, [90, 100], []) is None  # a slave is behind: look again
    assert w.verdict(0.2, 100, [100, 120], []) == "replication settled"
    assert w.verdict(0.3, 100, [90, 90], ["slave1", "slave2"]) == (
        "slave(s) slave1, slave2 rejected as ahead; logs kept")
    assert w.verdict(0.4, 100, [95, 90], ["slave1"]) is None  # one rejected, one may catch up
    assert w.verdict(1.3, 100, [95, 90], []) is None  # quiet for 0.9 s only
    assert w.verdict(1.5, 100, [95, 90], [], stall_note="") == (
        "replication stalled: master at 100, slaves at [95, 90] ()")
    sim = SettleWatch(1, started_s=5.0)
    assert sim.verdict(5.0, None, [7], []) is None
    assert sim.verdict(6.1, None, [7], []) == "replication stalled: master at None, slaves at [7]"
