"""`dlab chaos run --backend local --ha-mode controller`: real node
processes and a real `dlab controller run` process. The scenario's promote
waits for the controller's election (no operator), the old master rejoins
by starting and asking the controller whom to follow, and the run is
judged as any run: with every SyncStateSet member's ack required, a
SIGKILLed master loses nothing acknowledged."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from chaos.harness.runner import LOCAL_CONTROLLER


@pytest.mark.slow
def test_a_local_controller_mode_run_fails_over_by_election_and_loses_nothing(
        tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "chaos.cli", "chaos", "run", "--backend", "local",
         "--ha-mode", "controller", "--all-ack-in-sync-state-set", "--slaves", "2",
         "--scenario", "master-crash-failover", "--role", "SYNC_MASTER",
         "--flush", "ASYNC_FLUSH", "--seed", "1", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "elected by the controller" in out.stdout
    assert " 0 acked lost on the master, 0 lost everywhere" in out.stdout
    run = tmp_path / ("master-crash-failover-SYNC_MASTER-ASYNC_FLUSH-power-reject-"
                      "controller-allack-s1")
    params = json.loads((run / "params.json").read_text())
    assert params["backend"] == "local"
    assert params["controller"] == {
        "heartbeat_timeout_ms": LOCAL_CONTROLLER.heartbeat_timeout_ms,
        "scan_interval_ms": LOCAL_CONTROLLER.scan_interval_ms, "elect_unclean": False}
    # The run's master at the end is the elected one, not the first.
    assert params["nodes"][0]["name"] != "master"
    faults = [json.loads(line) for line in (run / "faults.jsonl").read_text().splitlines()]
    promote = [f for f in faults if f["kind"] == "promote"]
    assert len(promote) == 1 and promote[0]["detail"] == "elected by the controller"
    # The route moved when the controller published it: no PUT_OK is taken
    # for one from a node no longer master.
    assert "0 acked by a node no longer master" in out.stdout or \
        "acked by a node no longer master" not in out.stdout, out.stdout
    # The controller's state file is kept with the run's cluster directory.
    state = json.loads((run / "cluster" / "controller" / "controller-state.json").read_text())
    assert state["master_epoch"] == 2
