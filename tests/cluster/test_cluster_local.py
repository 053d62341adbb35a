"""`dlab cluster ...` and `dlab node` from the command line, as separate
processes (each CLI call is its own process; state lives in DIR)."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from support.cli_helpers import dlab, ok
from support.ha_helpers import FAST, log_text, wait_until

from cluster.backends.interface import BackendError, NodeState
from cluster.backends.local import LocalBackend
from cluster.backends.procs import free_ports
from cluster.client.node_client import NodeClient
from cluster.node.auth import write_token_file

# The module-scoped cluster below is started once: under pytest-xdist
# (scripts/test) this module's tests share one worker.
pytestmark = pytest.mark.xdist_group("test_cluster_local")


def fails(*args: str, message: str) -> None:
    r = dlab(*args)
    assert r.returncode == 2, r
    last = r.stderr.strip().splitlines()[-1]  # the error; argparse prints usage before it
    assert message in last and "error" in last, r.stderr
    assert "Traceback" not in r.stderr


def cluster_status(d: str) -> dict[str, dict[str, object]]:
    return {row["name"]: row for row in json.loads(ok("cluster", "status", "--dir", d, "--json"))}


@pytest.fixture(scope="module")
def cdir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    d = str(tmp_path_factory.mktemp("cli") / "cluster")
    out = ok("cluster", "up", "--dir", d, "--role", "SYNC_MASTER", "--flush", "ASYNC_FLUSH",
             "--slaves", "1", "--segment-size", "256KiB", "--node-args", " ".join(FAST))
    yield d
    if os.path.exists(os.path.join(d, "cluster.json")):
        dlab("cluster", "down", "--dir", d)
    del out


def test_up_prints_each_node_and_writes_a_private_token(cdir: str) -> None:
    st = cluster_status(cdir)
    assert st["master"]["role"] == "SYNC_MASTER" and st["slave1"]["role"] == "SLAVE"
    for row in st.values():
        assert str(row["address"]).startswith("127.0.0.1:")
        assert row["state"] == "running"
    mode = stat.S_IMODE(os.stat(os.path.join(cdir, "token")).st_mode)
    assert mode == 0o600
    text = ok("cluster", "status", "--dir", cdir)
    assert "master" in text and "slave1" in text and "[ahead=reject ship=wrote]" in text
    fails("cluster", "up", "--dir", cdir, message="a cluster is already up")


def test_send_then_faults_from_separate_cli_calls(cdir: str) -> None:
    # Each fault is its own CLI process; the state they share is DIR. The
    # observations use LocalBackend(DIR), which reads the same state.
    node = LocalBackend(cdir).node
    out = ok("send", "--dir", cdir, "--count", "20", "--size", "100")
    assert "PUT_OK" in out and "sent 20 of 20" in out

    ok("cluster", "partition", "master", "slave1", "--dir", cdir)
    assert node("slave1").extra["partitioned"] is True
    assert "PARTITIONED" in ok("cluster", "status", "--dir", cdir)
    ok("cluster", "heal", "slave1", "master", "--dir", cdir)
    assert node("slave1").extra["partitioned"] is False

    ok("cluster", "pause", "slave1", "--dir", cdir)
    assert node("slave1").state == NodeState.PAUSED
    ok("cluster", "resume", "slave1", "--dir", cdir)
    assert node("slave1").state == NodeState.RUNNING

    master_data = node("master").data_dir
    ok("cluster", "kill", "master", "--dir", cdir)
    assert node("master").state == NodeState.STOPPED and node("master").pid is None
    assert os.path.exists(os.path.join(master_data, "abort"))  # a crash leaves it
    ok("cluster", "start", "master", "--dir", cdir)
    assert node("master").state == NodeState.RUNNING

    ok("cluster", "stop", "slave1", "--dir", cdir)
    assert not os.path.exists(os.path.join(node("slave1").data_dir, "abort"))
    assert "store closed cleanly" in log_text(node("slave1").log_path)
    out = ok("cluster", "start", "slave1", "--dir", cdir)
    assert "slave1" in out and "running" in out

    before = node("master").pid
    ok("cluster", "restart", "master", "--dir", cdir)
    assert node("master").state == NodeState.RUNNING and node("master").pid != before
    st = cluster_status(cdir)
    assert st["master"]["status"]["wrote"] > 0  # type: ignore[index]


@pytest.mark.parametrize("args, message", [
    (["cluster", "kill", "nosuch"], "no node 'nosuch' in this cluster; nodes: master, slave1"),
    (["cluster", "partition", "slave1", "slave1"], "no replication link"),
    (["cluster", "resume", "master"], "resume master: done"),
])
def test_cluster_command_errors_are_one_clear_line(cdir: str, args: list[str],
                                                   message: str) -> None:
    if message.endswith("done"):  # resuming a running node is harmless
        assert message in ok(*args, "--dir", cdir)
        return
    fails(*args, "--dir", cdir, message=message)


def test_up_with_bad_arguments_is_refused(tmp_path: str) -> None:
    d = os.path.join(tmp_path, "x")
    fails("cluster", "up", "--dir", d, "--slaves", "9", message="--slaves must be between")
    fails("cluster", "up", "--dir", d, "--segment-size", "huge", message="is not a size")
    fails("cluster", "up", "--dir", d, "--node-args", "'unbalanced", message="--node-args")
    fails("cluster", "up", "--dir", d, "--node-args=--no-such-option",
          message="exited during start")
    fails("cluster", "status", "--dir", d, message="no cluster in")


def test_a_state_file_from_another_backend_or_dlab_is_refused(tmp_path: str) -> None:
    """A cluster directory written by the compose backend, or by a dlab with
    another state version, is refused with what to do, never misread."""
    d = os.path.join(tmp_path, "other")
    os.makedirs(d)
    with open(os.path.join(d, "cluster.json"), "w") as f:
        json.dump({"version": 1, "backend": "compose"}, f)
    with pytest.raises(BackendError, match="is a compose cluster, not a local one"):
        LocalBackend(d).nodes()
    with open(os.path.join(d, "cluster.json"), "w") as f:
        json.dump({"version": 99, "backend": "local"}, f)
    with pytest.raises(BackendError, match="has version 99"):
        LocalBackend(d).nodes()
    fails("cluster", "status", "--dir", d, message="has version 99")


def test_a_lost_link_proxy_comes_back_with_its_slave(cdir: str) -> None:
    backend = LocalBackend(cdir)
    old = backend.node("slave1").extra["proxy_pid"]
    os.kill(old, signal.SIGKILL)  # the proxy this cluster started for slave1
    wait_until(lambda: not _alive(old), 30, "the proxy to die")
    with pytest.raises(BackendError, match="link proxy of slave1 is not running"):
        backend.partition("master", "slave1")
    backend.restart("slave1")
    assert backend.node("slave1").extra["proxy_pid"] != old
    with NodeClient(backend.node("master").address, token=backend.token()) as c:
        wait_until(lambda: any(x.state == "connected" for x in c.status().slaves), 20,
                   "the slave to reconnect through the new proxy")
    out = ok("send", "--dir", cdir, "--count", "3")
    assert "PUT_OK" in out  # SYNC_MASTER: the slave is replicating again


def test_down_ends_every_process_and_keeps_data_and_logs(cdir: str) -> None:
    pids = [r["pid"] for r in cluster_status(cdir).values()]
    ok("cluster", "down", "--dir", cdir)
    for pid in pids:
        assert isinstance(pid, int)
        wait_until(lambda p=pid: not _alive(p), 30, f"process {pid} to end")
    assert not os.path.exists(os.path.join(cdir, "cluster.json"))
    assert os.path.isdir(os.path.join(cdir, "nodes", "master", "data", "commitlog"))
    assert os.path.getsize(os.path.join(cdir, "nodes", "slave1", "node.log")) > 0
    fails("cluster", "status", "--dir", cdir, message="no cluster in")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


# --------------------------------------------------------------- dlab node
def _node_args(d: str, port: int, *extra: str) -> list[str]:
    return ["node", "--name", "n1", "--role", "ASYNC_MASTER", "--data-dir",
            os.path.join(d, "data"), "--listen", f"127.0.0.1:{port}", "--token-file",
            os.path.join(d, "token"), "--segment-size", "256KiB", "--max-message-size",
            "64KiB", *extra]


def _healthy(port: int) -> bool:
    import grpc

    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        try:
            r = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(),
                                                     timeout=0.5)
            return bool(r.status == health_pb2.HealthCheckResponse.SERVING)
        except grpc.RpcError:
            return False


def test_node_sigterm_is_a_clean_shutdown_and_bad_options_are_named(tmp_path: str) -> None:
    d = str(tmp_path)
    write_token_file(os.path.join(d, "token"), "tok")
    port, other = free_ports(2)
    proc = subprocess.Popen([sys.executable, "-m", "cluster.cli", *_node_args(d, port)],
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: _healthy(port) or proc.poll() is not None, 30, "the node to serve")
        assert proc.poll() is None
        assert os.path.exists(os.path.join(d, "data", "abort"))
        # A second node on the same data dir or the same port is refused, clearly.
        fails(*_node_args(d, other), message="is in use by process")
        d2 = os.path.join(d, "second")
        os.makedirs(d2)
        write_token_file(os.path.join(d2, "token"), "tok")
        fails(*_node_args(d2, port), message="cannot listen on")
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert not os.path.exists(os.path.join(d, "data", "abort"))
    assert "store closed cleanly" in err
    assert time.strftime("%Y-") in err  # log lines carry timestamps


@pytest.mark.parametrize("change, message", [
    ({"--token-file": "/nonexistent/token"}, "does not exist"),
    ({"--role": "SLAVE"}, "a SLAVE needs --master"),
    ({"--listen": "localhost"}, "expected HOST:PORT"),
    ({"--segment-size": "4KiB"}, "--max-message-size (65536) must leave room"),
    ({"--failpoints": "nope=crash"}, "unknown failpoint"),
    ({"--slave-ahead-policy": "maybe"}, "invalid choice"),
    ({"--ha-heartbeat-ms": "30000"}, "housekeeping interval must be longer"),
])
def test_node_bad_options_exit_2_with_the_fix(tmp_path: str, change: dict[str, str],
                                               message: str) -> None:
    d = str(tmp_path)
    write_token_file(os.path.join(d, "token"), "tok")
    (port,) = free_ports(1)
    args = _node_args(d, port)
    for k, v in change.items():
        if k in args:
            args[args.index(k) + 1] = v
        else:
            args += [k, v]
    fails(*args, message=message)
