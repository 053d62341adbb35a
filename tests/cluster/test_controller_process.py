"""`dlab controller run` as a real process over real gRPC on loopback:
brokers register and heartbeat, a master whose heartbeats stop is replaced
by the process's own liveness scan, the state survives SIGKILL, a wrong or
missing token and a malformed request are refused and logged without a
traceback, and a damaged state file or a second controller on the same
directory stops the start with exit 2.

Timeouts are short but with margins for a loaded machine (load 8 on 2
cores): a 3 s heartbeat timeout against heartbeats every 0.3 s."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from support.cli_helpers import REPO, dlab

from cluster.backends.procs import free_ports
from cluster.controller.client import ControllerClient
from cluster.controller.servicer import MAX_BROKERS
from cluster.controller.state_file import STATE_FILE
from cluster.node.auth import write_token_file
from proto import controller_pb2

TOKEN = "tok-controller"
HEARTBEAT_TIMEOUT_MS = 3_000
SCAN_INTERVAL_MS = 200
HEARTBEAT_EVERY_S = 0.3
START_TIMEOUT_S = 60.0


@dataclass
class Controller:
    proc: subprocess.Popen[bytes]
    address: str
    state_dir: Path
    log: Path

    def client(self, token: str = TOKEN) -> ControllerClient:
        return ControllerClient(self.address, token, timeout_s=20)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


def _run_args(state_dir: Path, token_file: Path, address: str,
              heartbeat_timeout_ms: int) -> list[str]:
    return [sys.executable, "-m", "cluster.cli", "controller", "run", "--dir", str(state_dir),
            "--token-file", str(token_file), "--listen", address,
            "--heartbeat-timeout-ms", str(heartbeat_timeout_ms),
            "--scan-interval-ms", str(SCAN_INTERVAL_MS)]


def start_controller(tmp_path: Path, state_dir: Path, address: str | None = None, *,
                     heartbeat_timeout_ms: int = HEARTBEAT_TIMEOUT_MS,
                     extra: tuple[str, ...] = ()) -> Controller:
    token_file = tmp_path / "token"
    if not token_file.exists():
        write_token_file(str(token_file), TOKEN)
    address = address or f"127.0.0.1:{free_ports(1)[0]}"
    log = tmp_path / f"controller-{time.monotonic_ns()}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([*_run_args(state_dir, token_file, address,
                                            heartbeat_timeout_ms), *extra],
                                stdout=out,
                                stderr=subprocess.STDOUT, cwd=REPO)
    ctl = Controller(proc, address, state_dir, log)
    deadline = time.monotonic() + START_TIMEOUT_S
    with ctl.client() as client:
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"controller exited {proc.returncode}: {ctl.log_text()}")
            try:
                if client.health() == "SERVING":
                    return ctl
            except grpc.RpcError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"controller not serving in {START_TIMEOUT_S} s: "
                                     f"{ctl.log_text()}")
            time.sleep(0.1)


@pytest.fixture
def controllers(tmp_path: Path) -> Iterator[list[Controller]]:
    """Every controller a test starts is killed at its end."""
    started: list[Controller] = []
    yield started
    for ctl in started:
        if ctl.proc.poll() is None:
            ctl.proc.kill()
        ctl.proc.wait(timeout=30)


def _elect_first_master(client: ControllerClient) -> tuple[int, int]:
    """Two brokers, b1 the first master, the SyncStateSet {b1, b2}."""
    b1 = client.register("b1").broker_id
    b2 = client.register("b2").broker_id
    assert (b1, b2) == (1, 2)
    for broker, port in ((b1, 7001), (b2, 7002)):
        assert client.heartbeat(broker, address=f"127.0.0.1:{port}").outcome == \
            "heartbeat_accepted"
    elected = client.elect_master(requester=b1)
    assert elected.outcome == "master_elected"
    assert elected.replica_info.master_id == b1 and elected.replica_info.master_epoch == 1
    grown = client.alter_sync_state_set(master=b1, master_epoch=1, sync_state_set_epoch=1,
                                        new_set=[b1, b2])
    assert grown.outcome == "sync_state_set_changed", grown
    assert list(grown.replica_info.sync_state_set) == [b1, b2]
    return b1, b2


def _info(reply: controller_pb2.ControllerReply) -> tuple[int, str, int, list[int], int]:
    r = reply.replica_info
    return (r.master_id, r.master_address, r.master_epoch, list(r.sync_state_set),
            r.sync_state_set_epoch)


# ---------------------------------------------------------------- route
def test_the_route_it_publishes_follows_its_elections_and_waits_for_a_restarted_master(
        tmp_path: Path, controllers: list[Controller]) -> None:
    """--publish-route DIR: DIR/route.json names the master and its address
    at each election, its epoch one more each time; after a SIGKILL and a
    restart the old route stays until the master has heartbeaten to the
    new process, which then publishes the address it heartbeats from."""
    cluster = tmp_path / "cluster"
    cluster.mkdir()
    route_file = cluster / "route.json"
    extra = ("--publish-route", str(cluster))
    ctl = start_controller(tmp_path, tmp_path / "ctl", extra=extra)
    controllers.append(ctl)

    def route() -> tuple[str | None, str | None, int]:
        r = json.loads(route_file.read_text())
        return r["master"], r["address"], r["epoch"]

    with ctl.client() as client:
        assert not route_file.exists()  # no master yet: nothing published
        b1, b2 = _elect_first_master(client)
        assert route() == ("b1", "127.0.0.1:7001", 1)
        deadline = time.monotonic() + 60
        while route()[0] != "b2":  # b1 silent: b2 is elected
            assert time.monotonic() < deadline, ctl.log_text()
            client.heartbeat(b2, epoch=1, max_offset=100, confirmed_offset=100,
                             address="127.0.0.1:7002")
            time.sleep(HEARTBEAT_EVERY_S)
        assert route() == ("b2", "127.0.0.1:7002", 2)
    ctl.proc.kill()
    ctl.proc.wait(timeout=30)
    stamp = route_file.stat()
    ctl = start_controller(tmp_path, tmp_path / "ctl", extra=extra)
    controllers.append(ctl)
    with ctl.client() as client:
        assert client.register("b1").broker_id == b1
        client.heartbeat(b1, epoch=1, max_offset=100, address="127.0.0.1:7001")
        time.sleep(4 * SCAN_INTERVAL_MS / 1000)
        # The master b2 is not heard from yet: the old route stands, untouched.
        assert route() == ("b2", "127.0.0.1:7002", 2)
        assert (route_file.stat().st_ino, route_file.stat().st_mtime_ns) == (
            stamp.st_ino, stamp.st_mtime_ns)
        assert client.heartbeat(b2, epoch=2, max_offset=100,
                                address="127.0.0.1:7012").outcome == "heartbeat_accepted"
        assert route() == ("b2", "127.0.0.1:7012", 3)
    assert not (cluster / "route.json.tmp").exists()


def test_the_route_names_a_broker_at_its_client_address_where_one_is_given(
        tmp_path: Path, controllers: list[Controller]) -> None:
    """--route-address NAME=HOST:PORT: the route names that broker at the
    address clients reach it at (a container's published port), while the
    controller keeps handing out the address it heartbeats from (its
    service name, which its peers resolve) as the master's."""
    cluster = tmp_path / "cluster"
    cluster.mkdir()
    ctl = start_controller(tmp_path, tmp_path / "ctl", extra=(
        "--publish-route", str(cluster), "--route-address", "b1=127.0.0.1:17001"))
    controllers.append(ctl)
    with ctl.client() as client:
        b1 = client.register("b1").broker_id
        client.heartbeat(b1, address="b1:7000")
        elected = client.elect_master(requester=b1)
        assert elected.replica_info.master_address == "b1:7000"
    published = json.loads((cluster / "route.json").read_text())
    assert (published["master"], published["address"]) == ("b1", "127.0.0.1:17001")


@pytest.mark.parametrize(("args", "message"), [
    (["--route-address", "b1=127.0.0.1:17001"], "it needs --publish-route DIR"),
    (["--route-address", "b1"], "expected NAME=HOST:PORT"),
    (["--route-address", "b1=nohost"], "expected HOST:PORT"),
])
def test_a_bad_route_address_is_a_usage_error(tmp_path: Path, args: list[str],
                                              message: str) -> None:
    write_token_file(str(tmp_path / "token"), TOKEN)
    r = dlab("controller", "run", "--dir", str(tmp_path / "ctl"), "--token-file",
             str(tmp_path / "token"), "--listen", f"127.0.0.1:{free_ports(1)[0]}", *args)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert message in r.stderr


def test_publish_route_needs_an_existing_directory(tmp_path: Path) -> None:
    write_token_file(str(tmp_path / "token"), TOKEN)
    r = dlab("controller", "run", "--dir", str(tmp_path / "ctl"), "--token-file",
             str(tmp_path / "token"), "--listen", f"127.0.0.1:{free_ports(1)[0]}",
             "--publish-route", str(tmp_path / "missing"))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "--publish-route" in r.stderr and "not a directory" in r.stderr


# ------------------------------------------------------------- election
def test_a_master_whose_heartbeats_stop_is_replaced_by_the_in_sync_slave(
        tmp_path: Path, controllers: list[Controller]) -> None:
    ctl = start_controller(tmp_path, tmp_path / "ctl")
    controllers.append(ctl)
    with ctl.client() as client:
        b1, b2 = _elect_first_master(client)
        # Both alive for a while: no election while the master heartbeats.
        for _ in range(5):
            # Before it is sent: the controller records the heartbeat later,
            # so the time from here to the election is at least its timeout
            # (measured after the answer, a loaded machine's pause between
            # the two shortened it below the timeout: 2.85 s of 2.95).
            b1_last = time.monotonic()
            client.heartbeat(b1, epoch=1, max_offset=100, confirmed_offset=100,
                             address="127.0.0.1:7001")
            client.heartbeat(b2, epoch=1, max_offset=100, confirmed_offset=100,
                             address="127.0.0.1:7002")
            time.sleep(HEARTBEAT_EVERY_S)
        assert _info(client.replica_info())[:3] == (b1, "127.0.0.1:7001", 1)
        deadline = b1_last + 60
        while _info(client.replica_info())[0] != b2:
            assert time.monotonic() < deadline, ctl.log_text()
            client.heartbeat(b2, epoch=1, max_offset=100, confirmed_offset=100,
                             address="127.0.0.1:7002")
            time.sleep(HEARTBEAT_EVERY_S)
        waited_s = time.monotonic() - b1_last
        info = _info(client.replica_info())
        md = client.metadata()
    # The new master alone in the set; both epochs up by one.
    assert info == (b2, "127.0.0.1:7002", 2, [b2], 3)
    # Not before the timeout: the process's clock drove it.
    assert waited_s >= HEARTBEAT_TIMEOUT_MS / 1000 - 0.05, waited_s
    alive = {m.name: m.alive for m in md.members}
    assert alive == {"b1": False, "b2": True}
    log = ctl.log_text()
    assert "master 1 is down" in log and "elected master 2 at master epoch 2" in log
    assert "Traceback" not in log


def test_a_master_alone_in_the_set_leaves_no_master_when_it_dies(
        tmp_path: Path, controllers: list[Controller]) -> None:
    """No live SyncStateSet member and no unclean election: deposed, the
    master epoch up by one so its requests are fenced off."""
    ctl = start_controller(tmp_path, tmp_path / "ctl")
    controllers.append(ctl)
    with ctl.client() as client:
        b1 = client.register("b1").broker_id
        b2 = client.register("b2").broker_id
        client.heartbeat(b1)
        assert client.elect_master(requester=b1).outcome == "master_elected"
        deadline = time.monotonic() + 60
        while _info(client.replica_info())[0] != 0:
            assert time.monotonic() < deadline, ctl.log_text()
            client.heartbeat(b2, address="127.0.0.1:7002")
            time.sleep(HEARTBEAT_EVERY_S)
        assert _info(client.replica_info()) == (0, "", 2, [b1], 1)
        stale = client.alter_sync_state_set(master=b1, master_epoch=1, sync_state_set_epoch=1,
                                            new_set=[b1, b2])
    assert (stale.outcome, stale.refusal) == ("refused", "fenced_master_epoch")
    assert "stale" in stale.reason


# ------------------------------------------------------------ durability
def test_the_state_survives_sigkill_and_restart(
        tmp_path: Path, controllers: list[Controller]) -> None:
    state_dir = tmp_path / "ctl"
    ctl = start_controller(tmp_path, state_dir)
    controllers.append(ctl)
    with ctl.client() as client:
        b1, b2 = _elect_first_master(client)
        before = _info(client.replica_info())
    ctl.proc.send_signal(signal.SIGKILL)
    assert ctl.proc.wait(timeout=30) == -signal.SIGKILL
    again = start_controller(tmp_path, state_dir, ctl.address)
    controllers.append(again)
    with again.client() as client:
        after = _info(client.replica_info())
        # The master, both epochs and the set as answered before the kill;
        # the address is the master's to tell this process again.
        assert after[0] == before[0] == b1 and after[2:] == before[2:] == (1, [b1, b2], 2)
        assert after[1] == ""
        rejoin = client.register("b2")
        assert (rejoin.broker_id, rejoin.rejoined) == (b2, True)
        assert client.register("b3").broker_id == 3
        # Not judged dead before it heartbeats to this process: no election.
        time.sleep((HEARTBEAT_TIMEOUT_MS + 3 * SCAN_INTERVAL_MS) / 1000)
        assert _info(client.replica_info())[0] == b1
    assert "Traceback" not in again.log_text()


def test_a_clean_stop_releases_the_directory_and_keeps_the_state(
        tmp_path: Path, controllers: list[Controller]) -> None:
    state_dir = tmp_path / "ctl"
    ctl = start_controller(tmp_path, state_dir)
    controllers.append(ctl)
    with ctl.client() as client:
        _elect_first_master(client)
    ctl.proc.send_signal(signal.SIGTERM)
    assert ctl.proc.wait(timeout=30) == 0
    doc = json.loads((state_dir / STATE_FILE).read_text())
    assert (doc["master"], doc["master_epoch"], doc["sync_state_set"]) == (1, 1, [1, 2])
    assert sorted(os.listdir(state_dir)) == ["controller-state.json", "lock"]


def test_a_second_controller_on_the_same_directory_is_refused(
        tmp_path: Path, controllers: list[Controller]) -> None:
    ctl = start_controller(tmp_path, tmp_path / "ctl")
    controllers.append(ctl)
    r = dlab("controller", "run", "--dir", str(tmp_path / "ctl"), "--token-file",
             str(tmp_path / "token"), "--listen", f"127.0.0.1:{free_ports(1)[0]}", timeout=60)
    assert r.returncode == 2, r.stderr
    assert "another controller holds" in r.stderr and str(tmp_path / "ctl" / "lock") in r.stderr
    assert "Traceback" not in r.stderr
    with ctl.client() as client:  # the first one is untouched
        assert client.health() == "SERVING"


@pytest.mark.parametrize("damage", ["truncated", "empty", "not-json", "inconsistent",
                                    "future-version"])
def test_a_damaged_state_file_stops_the_start_with_exit_2(tmp_path: Path, damage: str) -> None:
    state_dir = tmp_path / "ctl"
    state_dir.mkdir()
    good = json.dumps({"format": "dlab-controller-state", "version": 1,
                       "members": [{"name": "b1", "broker_id": 1}], "next_id": 2,
                       "master": 1, "master_epoch": 1, "sync_state_set": [1],
                       "sync_state_set_epoch": 1})
    text = {"truncated": good[:len(good) // 2], "empty": "", "not-json": "\x00garbage\xff",
            "inconsistent": good.replace('"sync_state_set": [1]', '"sync_state_set": []'),
            "future-version": good.replace('"version": 1', '"version": 9')}[damage]
    path = state_dir / STATE_FILE
    path.write_text(text, errors="surrogateescape")
    write_token_file(str(tmp_path / "token"), TOKEN)
    r = dlab("controller", "run", "--dir", str(state_dir), "--token-file",
             str(tmp_path / "token"), "--listen", f"127.0.0.1:{free_ports(1)[0]}", timeout=60)
    assert r.returncode == 2, r.stderr
    assert f"controller state file {path} cannot be read" in r.stderr
    assert "Restore it from a copy" in r.stderr
    assert "Traceback" not in r.stderr
    assert path.read_text(errors="surrogateescape") == text  # never replaced


# ---------------------------------------------------------------- refusals
ALL_CALLS = [
    ("RegisterBroker", controller_pb2.RegisterBrokerRequest(name="intruder")),
    ("Heartbeat", controller_pb2.HeartbeatRequest(broker_id=1)),
    ("ElectMaster", controller_pb2.ElectMasterRequest(requester=1)),
    ("GetReplicaInfo", controller_pb2.GetReplicaInfoRequest()),
    ("AlterSyncStateSet", controller_pb2.AlterSyncStateSetRequest(master=1, master_epoch=1)),
    ("GetMetadata", controller_pb2.GetMetadataRequest()),
]


def test_a_wrong_or_missing_token_is_refused_and_logged(
        tmp_path: Path, controllers: list[Controller]) -> None:
    ctl = start_controller(tmp_path, tmp_path / "ctl")
    controllers.append(ctl)
    channel = grpc.insecure_channel(ctl.address)
    for method, request in ALL_CALLS:
        call = channel.unary_unary(f"/dlab.controller.Controller/{method}",
                                   request_serializer=type(request).SerializeToString,
                                   response_deserializer=lambda b: b)
        for metadata, why in (((("x-dlab-token", "not-the-token"),), "wrong"), ((), "missing")):
            with pytest.raises(grpc.RpcError) as err:
                call(request, metadata=metadata, timeout=20)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED, method
            assert f"{why} cluster token" in (err.value.details() or "")
    channel.close()
    with ctl.client() as client:
        assert client.metadata().members == []  # the refused register changed nothing
    log = ctl.log_text()
    assert "refused /dlab.controller.Controller/RegisterBroker from" in log
    assert "wrong token" in log and "missing token" in log
    assert "Traceback" not in log


def test_malformed_requests_and_names_are_refused_clearly(
        tmp_path: Path, controllers: list[Controller]) -> None:
    ctl = start_controller(tmp_path, tmp_path / "ctl")
    controllers.append(ctl)
    with ctl.client() as client:
        for name in ("", "../../etc/passwd", "a/b", "x" * 65, "b1\x00", "é"):
            with pytest.raises(grpc.RpcError) as err:
                client.register(name)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, name
            assert "a broker name is 1..64 characters" in (err.value.details() or "")
        b1 = client.register("b1").broker_id
        bad_calls = [
            (lambda: client.heartbeat(0), "broker_id 0 is out of range"),
            (lambda: client.heartbeat(b1, max_offset=-1), "max_offset -1 is out of range"),
            (lambda: client.heartbeat(b1, address="no port"), "expected HOST:PORT"),
            (lambda: client.elect_master(preferred=-3), "preferred -3 is out of range"),
            (lambda: client.alter_sync_state_set(master=b1, master_epoch=0,
                                                 sync_state_set_epoch=0, new_set=[]),
             "new_sync_state_set has 0 ids"),
        ]
        for call, message in bad_calls:
            with pytest.raises(grpc.RpcError) as err:
                call()
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert message in (err.value.details() or "")
        # Bytes that are no protobuf message at all.
        raw = client.channel.unary_unary("/dlab.controller.Controller/Heartbeat",
                                         request_serializer=lambda b: b,
                                         response_deserializer=lambda b: b)
        with pytest.raises(grpc.RpcError) as err:
            raw(b"\xff\xff\xff\xff", metadata=client.call_metadata, timeout=20)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "proto/controller.proto" in (err.value.details() or "")
        # The state machine's own refusals are answers, not errors.
        unknown = client.heartbeat(9)
        assert (unknown.outcome, unknown.refusal) == ("refused", "not_registered")
        assert [m.name for m in client.metadata().members] == ["b1"]
        # A bounded set: the state file stays small whatever names are sent.
        for i in range(2, MAX_BROKERS + 1):
            assert client.register(f"b{i}").broker_id == i
        with pytest.raises(grpc.RpcError) as err:
            client.register("one-too-many")
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert f"already has {MAX_BROKERS} brokers" in (err.value.details() or "")
        assert client.register("b7").rejoined  # a known name still registers
    # A name is data, never a path: nothing was created for any of them.
    assert sorted(os.listdir(ctl.state_dir)) == ["controller-state.json", "lock"]
    assert not (tmp_path / "etc").exists()
    assert "Traceback" not in ctl.log_text()


# ---------------------------------------------------------------- the CLI
def test_status_reports_health_and_state_and_an_operator_elects(
        tmp_path: Path, controllers: list[Controller]) -> None:
    # A long timeout: the master must stay while `dlab` subprocesses start.
    ctl = start_controller(tmp_path, tmp_path / "ctl", heartbeat_timeout_ms=600_000)
    controllers.append(ctl)
    with ctl.client() as client:
        _elect_first_master(client)
    token = str(tmp_path / "token")
    r = dlab("controller", "status", "--address", ctl.address, "--token-file", token,
             "--json", timeout=60)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["health"] == "SERVING" and doc["master_name"] == "b1"
    assert (doc["master_epoch"], doc["sync_state_set"]) == (1, [1, 2])
    assert [b["name"] for b in doc["brokers"]] == ["b1", "b2"]
    text = dlab("controller", "status", "--address", ctl.address, "--token-file", token,
                timeout=60)
    assert text.returncode == 0 and "master: b1 (id 1) at 127.0.0.1:7001" in text.stdout
    write_token_file(str(tmp_path / "wrong"), "wrong-token")
    wrong = dlab("controller", "status", "--address", ctl.address, "--token-file",
                 str(tmp_path / "wrong"), timeout=60)
    assert wrong.returncode == 2 and "refused the token" in wrong.stderr
    nobody = dlab("controller", "status", "--address", f"127.0.0.1:{free_ports(1)[0]}",
                  "--token-file", token, "--timeout-s", "2", timeout=60)
    assert nobody.returncode == 1 and "does not answer" in nobody.stderr
    for r in (wrong, nobody):
        assert "Traceback" not in r.stderr
    # An operator's election: the preferred live SyncStateSet member wins.
    moved = dlab("controller", "elect", "--address", ctl.address, "--token-file", token,
                 "--broker", "2", "--json", timeout=60)
    assert moved.returncode == 0, moved.stderr
    decision = json.loads(moved.stdout)
    assert (decision["outcome"], decision["master_id"], decision["master_epoch"],
            decision["sync_state_set"]) == ("master_elected", 2, 2, [2])
    stays = dlab("controller", "elect", "--address", ctl.address, "--token-file", token,
                 timeout=60)
    assert stays.returncode == 0 and stays.stdout.startswith("master_still_alive"), stays


def test_help_teaches() -> None:
    r = dlab("controller", "run", "--help", timeout=60)
    assert r.returncode == 0
    for words in ("SyncStateSet", "fsync, rename, directory fsync", "--heartbeat-timeout-ms",
                  "--elect-unclean", "MAY LOSE", "dlab controller status"):
        assert words in r.stdout, words
