"""`dlab chaos run --backend compose --ha-mode controller`: node containers
and the controller's container (cluster/backends/compose.py). The
scenario's promote waits for the controller's election, the old master
rejoins by starting its container and asking the controller whom to
follow, and the run is judged as any run: with every SyncStateSet member's
ack required, a SIGKILLed master loses nothing acknowledged."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.compose_support import needs_engine, one_engine_user

from chaos.harness.runner import LOCAL_CONTROLLER

pytestmark = [needs_engine, one_engine_user]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_compose_controller_mode_run_fails_over_by_election_and_loses_nothing(
        tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "chaos.cli", "chaos", "run", "--backend", "compose",
         "--ha-mode", "controller", "--all-ack-in-sync-state-set", "--slaves", "2",
         "--scenario", "master-crash-failover", "--role", "SYNC_MASTER",
         "--flush", "ASYNC_FLUSH", "--seed", "1", "--keep-stores", "all",
         "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=850)  # the first compose run builds the image
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "elected by the controller" in out.stdout
    assert " 0 acked lost on the master, 0 lost everywhere" in out.stdout
    run = tmp_path / ("master-crash-failover-SYNC_MASTER-ASYNC_FLUSH-power-reject-"
                      "controller-allack-compose-s1")
    params = json.loads((run / "params.json").read_text())
    assert params["backend"] == "compose"
    assert params["controller"] == {
        "heartbeat_timeout_ms": LOCAL_CONTROLLER.heartbeat_timeout_ms,
        "scan_interval_ms": LOCAL_CONTROLLER.scan_interval_ms, "elect_unclean": False}
    assert params["nodes"][0]["name"] != "master"  # the run's master at the end: elected
    faults = [json.loads(line) for line in (run / "faults.jsonl").read_text().splitlines()]
    promote = [f for f in faults if f["kind"] == "promote"]
    assert len(promote) == 1 and promote[0]["detail"] == "elected by the controller"
    # The controller's state, written in its container, is on the host with
    # the run's cluster directory; no container is left.
    state = json.loads((run / "cluster" / "controller" / "controller-state.json").read_text())
    assert state["master_epoch"] >= 2
    project = json.loads((run / "cluster" / "compose.yml").read_text().split("\n", 1)[1])
    names = [svc["container_name"] for svc in project["services"].values()]
    left = subprocess.run(["docker", "ps", "--all", "--quiet", *(
        arg for n in names for arg in ("--filter", f"name=^{n}$"))],
        capture_output=True, text=True, check=True, timeout=60)
    assert left.stdout.strip() == ""
