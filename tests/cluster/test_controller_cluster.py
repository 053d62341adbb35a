"""`dlab cluster up --backend local --ha-mode controller` with real
processes: the controller process started first, three nodes registering
with it over gRPC on loopback, the first one elected; a SIGKILLed master
replaced by the controller's election within its heartbeat timeout (plus a
loaded machine's margin), route.json following it so `dlab send --dir`
reaches the new master, and the old master, started again on its own disk,
following the new one until both logs hold the same bytes. Bad controller
options are refused before anything starts."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from support.cli_helpers import dlab, fails, ok
from support.ha_helpers import FAST, wait_until

from cluster.node.auth import read_token_file
from ha.credentials import token_metadata
from proto import broker_pb2, broker_pb2_grpc

# The controller deposes a master silent this long; nodes heartbeat every
# second. 3 s keeps the test short and a loaded machine's pauses (load 8)
# short of a false deposition.
HEARTBEAT_TIMEOUT_MS = 3000
SCAN_INTERVAL_MS = 250
# What an election may take beyond the timeout on a loaded machine: the
# scan, the new master's next heartbeat, process scheduling.
MARGIN_S = 20.0


def status(d: str) -> dict[str, dict[str, object]]:
    r = dlab("cluster", "status", "--dir", d, "--json")  # exit 1 while a node is down
    assert r.returncode in (0, 1) and "Traceback" not in r.stderr, r.stderr
    return {row["name"]: row for row in json.loads(r.stdout)}


def route(d: str) -> dict[str, object]:
    data: dict[str, object] = json.loads(Path(d, "route.json").read_text())
    return data


def send(d: str, count: int) -> dict[str, object]:
    r = dlab("send", "--dir", d, "--count", str(count), "--size", "200", "--timeout", "3",
             "--retries", "20", "--json")
    assert r.returncode == 0 and "Traceback" not in r.stderr, (r.stdout, r.stderr)
    summary: dict[str, object] = json.loads(r.stdout)
    return summary


def log_bytes(d: str, address: str) -> bytes:
    """The node's whole log, as its Read RPC returns it."""
    metadata = token_metadata(read_token_file(os.path.join(d, "token")))
    out = bytearray()
    with grpc.insecure_channel(address) as channel:
        stub = broker_pb2_grpc.BrokerStub(channel)
        offset = 0
        while True:
            resp = stub.Read(broker_pb2.ReadRequest(offset=offset, max_bytes=1 << 20),
                             timeout=10, metadata=metadata)
            out += resp.data
            if resp.next_offset <= offset or resp.next_offset >= resp.wrote:
                return bytes(out)
            offset = resp.next_offset


def node_status(d: str, name: str) -> dict[str, object]:
    st = status(d)[name].get("status")
    return st if isinstance(st, dict) else {}


def process_gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat[stat.rindex(")") + 2] in "ZX"


@pytest.fixture
def cdir(tmp_path: Path) -> Iterator[str]:
    d = str(tmp_path / "c")
    yield d
    if os.path.exists(os.path.join(d, "cluster.json")):
        dlab("cluster", "down", "--dir", d)


@pytest.mark.slow
def test_controller_elects_the_route_follows_and_the_old_master_rejoins(cdir: str) -> None:
    d = cdir
    printed = ok("cluster", "up", "--dir", d, "--ha-mode", "controller", "--slaves", "2",
       "--segment-size", "256KiB", "--node-args", " ".join(FAST),
       "--controller-heartbeat-timeout-ms", str(HEARTBEAT_TIMEOUT_MS),
       "--controller-scan-interval-ms", str(SCAN_INTERVAL_MS), "--timeout", "120")
    state = json.loads(Path(d, "cluster.json").read_text())
    controller = state["controller"]
    assert controller["address"].startswith("127.0.0.1:")
    assert "route: master master at 127.0.0.1:" in printed
    assert f"controller {controller['address']}: running" in printed
    # The first node was elected and serves; the route names it.
    assert route(d)["master"] == "master"
    rows = status(d)
    assert rows["master"]["role"] != "SLAVE" and rows["master"]["route_master"]
    assert rows["slave1"]["role"] == rows["slave2"]["role"] == "SLAVE"
    text = dlab("cluster", "status", "--dir", d)
    assert text.returncode == 0, text.stderr
    assert f"controller {controller['address']}: running" in text.stdout
    assert f"heartbeat timeout {HEARTBEAT_TIMEOUT_MS} ms" in text.stdout
    # Its state file is real, and names the three brokers.
    ctl_state = json.loads(Path(d, "controller", "controller-state.json").read_text())
    assert ctl_state["master_epoch"] == 1
    assert "master" in json.dumps(ctl_state) and "slave2" in json.dumps(ctl_state)

    first = send(d, 100)
    assert first["counts"] == {"PUT_OK": 100}, first

    killed_at = time.monotonic()
    ok("cluster", "kill", "master", "--dir", d)
    elected = wait_until(lambda: route(d)["master"] not in ("master", None)
                         and route(d)["master"],
                         timeout_s=HEARTBEAT_TIMEOUT_MS / 1000 + MARGIN_S,
                         what="the controller's election published in route.json")
    took_s = time.monotonic() - killed_at
    assert elected in ("slave1", "slave2")
    # Not before the master could have been judged dead.
    assert took_s >= HEARTBEAT_TIMEOUT_MS / 1000 - 1.5, took_s
    new_address = str(route(d)["address"])
    assert new_address == status(d)[str(elected)]["address"]
    assert int(route(d)["epoch"]) == 2  # type: ignore[call-overload]

    after = send(d, 50)
    assert after["counts"] == {"PUT_OK": 50}, after
    assert set(after["nodes"]) == {new_address}, after  # type: ignore[arg-type]
    assert node_status(d, str(elected))["role"] != "SLAVE"
    # Its puts as master continue the queue offsets of what it received as
    # a replica: every message of both sends has its consume queue unit.
    consume = node_status(d, str(elected))["consume"]
    assert consume["queues"]["dlab-load/0"] == [0, 150], consume  # type: ignore[index]

    # The operator does not promote in this mode (partitions:
    # test_controller_partition.py).
    fails("cluster", "promote", "master", "--dir", d,
          message="in controller mode the controller elects the master")
    fails("cluster", "partition", str(elected), str(elected), "--dir", d,
          message=f"no link between {elected} and itself")

    # The old master, on its own disk: it asks the controller, follows the
    # new master, and ends with the same bytes.
    ok("cluster", "rejoin", "master", "--dir", d)
    master_address = str(status(d)["master"]["address"])

    def caught_up() -> bool:
        old, new = node_status(d, "master"), node_status(d, str(elected))
        return (old.get("role") == "SLAVE" and new.get("wrote") is not None
                and old.get("wrote") == new.get("wrote"))

    wait_until(caught_up, timeout_s=60, what="the old master following the new one")
    assert log_bytes(d, master_address) == log_bytes(d, new_address)
    other = "slave2" if elected == "slave1" else "slave1"
    other_address = str(status(d)[other]["address"])
    assert log_bytes(d, other_address) == log_bytes(d, new_address)
    assert len(log_bytes(d, new_address)) > 0
    assert route(d)["master"] == elected  # the old master's return changed nothing

    ok("cluster", "down", "--dir", d)
    assert wait_until(lambda: process_gone(int(controller["pid"])), timeout_s=30,
                      what="the controller stopped by down")
    assert not Path(d, "route.json").exists()


@pytest.mark.parametrize(("args", "message"), [
    (["--ha-mode", "controller", "--slaves", "2", "--in-sync-replicas", "5"],
     "--in-sync-replicas 5: it counts copies, the master's included: 1..3"),
    (["--ha-mode", "controller", "--min-in-sync-replicas", "0"],
     "--min-in-sync-replicas: 0 must be at least 1"),
    (["--ha-mode", "controller", "--controller-heartbeat-timeout-ms", "5"],
     "--controller-heartbeat-timeout-ms 5: expected 100..3600000 ms"),
    (["--ha-mode", "controller", "--role", "ASYNC_MASTER"],
     "--role is for classic mode"),
    (["--elect-unclean"], "--elect-unclean: controller mode only"),
    (["--ha-mode", "controller", "--node-args", "--controller 127.0.0.1:1"],
     "--node-args cannot set --controller"),
])
def test_bad_controller_options_are_refused_before_anything_starts(
        tmp_path: Path, args: list[str], message: str) -> None:
    d = str(tmp_path / "c")
    fails("cluster", "up", "--dir", d, *args, message=message)
    assert not Path(d, "cluster.json").exists()
    assert not Path(d, "controller.log").exists()


def test_a_bad_controller_option_value_is_a_usage_error(tmp_path: Path) -> None:
    r = dlab("cluster", "up", "--dir", str(tmp_path / "c"), "--ha-mode", "controller",
             "--in-sync-replicas", "two")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "--in-sync-replicas: 'two' is not a whole number" in r.stderr
