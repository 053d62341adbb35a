"""`dlab cluster partition` / `heal` on a local controller-mode cluster:
every node reaches every other, and the controller, through link proxies
of its own (cluster/backends/controller_links.py), so a partition cuts one
pair and nothing else. Real processes on loopback: a master cut from
slave1 stops slave1's replication and not slave2's; cut from the
controller as well, it is deposed after the heartbeat timeout and the
in-sync slave2 is elected, while the isolated master still serves as one;
healed from the controller alone (it was never cut from slave2), it hears
of the election and follows slave2 until the logs hold the same records."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.cli_helpers import dlab, fails, ok
from support.ha_helpers import FAST, SEGMENT, client, send_n, status, wait_until

from cluster.backends.interface import BackendError, ClusterSpec, ControllerSpec, NodeSpec
from cluster.backends.local import LocalBackend
from cluster.node.auth import generate_token
from cluster.node.role import Role
from ha.config import HAMode
from store.log.record import Record

# The controller deposes a master silent this long; nodes heartbeat every
# second. 3 s keeps the test short and a loaded machine's pauses (load 8)
# short of a false deposition.
HEARTBEAT_TIMEOUT_MS = 3000
SCAN_INTERVAL_MS = 250
# What an election may take beyond the timeout on a loaded machine: the
# scan, the new master's next heartbeat, process scheduling.
MARGIN_S = 20.0


def controller_spec(directory: str) -> ClusterSpec:
    common: dict[str, Any] = dict(segment_size_bytes=SEGMENT, extra_args=FAST,
                                  ha_mode=HAMode.CONTROLLER, all_ack_in_sync_state_set=True)
    return ClusterSpec(
        directory=directory,
        master=NodeSpec(name="master", role=Role.SYNC_MASTER, **common),
        slaves=tuple(NodeSpec(name=f"slave{i}", role=Role.SLAVE, **common) for i in (1, 2)),
        controller=ControllerSpec(heartbeat_timeout_ms=HEARTBEAT_TIMEOUT_MS,
                                  scan_interval_ms=SCAN_INTERVAL_MS))


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[LocalBackend, str, str]]:
    d = str(tmp_path / "c")
    backend = LocalBackend()
    token = generate_token()
    backend.up(controller_spec(d), token=token, timeout_s=120)
    try:
        yield backend, token, d
    finally:
        backend.down()


def wrote(backend: LocalBackend, token: str, name: str) -> int:
    return int(status(backend, token, name)["wrote"])


def records(backend: LocalBackend, token: str, name: str) -> list[Record]:
    """The node's whole log, record by record (every field, body included)."""
    with client(backend, token, name) as c:
        return c.read_all()


def status_line(d: str, name: str) -> str:
    text = ok("cluster", "status", "--dir", d)
    return next(line for line in text.splitlines() if line.startswith(f"{name} "))


@pytest.mark.slow
def test_a_partition_cuts_one_pair_and_a_cut_from_the_controller_elects_a_slave(
        cluster: tuple[LocalBackend, str, str]) -> None:
    backend, token, d = cluster
    state = json.loads(Path(d, "cluster.json").read_text())
    # Each node's proxy to each other node and to the controller: 6 + 3.
    assert sorted(state["proxies"]) == sorted(
        [f"{a}.{b}" for a in ("master", "slave1", "slave2")
         for b in ("master", "slave1", "slave2", "controller") if a != b])
    assert all(r.status == "PUT_OK" for r in send_n(backend, token, 30, size=200, prefix="a"))

    # master - slave1: slave1 stops receiving, slave2 does not.
    assert ok("cluster", "partition", "master", "slave1", "--dir", d).strip() == \
        "partition master slave1: done"
    assert backend.node("master").extra["cut_from"] == ["slave1"]
    assert backend.node("slave1").extra["cut_from"] == ["master"]
    assert backend.node("slave2").extra["cut_from"] == []
    assert "CUT FROM slave1" in status_line(d, "master")
    held = wrote(backend, token, "slave1")
    # Puts wait for every SyncStateSet member until the master drops
    # slave1 (no stream for the 2 s housekeeping, then its next check).
    wait_until(lambda: backend.sync_state_set() == {"master", "slave2"}, 60,
               "the SyncStateSet without slave1")
    assert all(r.status == "PUT_OK" for r in send_n(backend, token, 30, size=200, prefix="b"))
    end = wrote(backend, token, "master")
    wait_until(lambda: wrote(backend, token, "slave2") == end, 30, "slave2 replicating")
    assert wrote(backend, token, "slave1") == held < end

    # master - controller too: its heartbeats stop; the in-sync slave2 is
    # elected (slave1, out of the set, is not), and slave1, cut from the
    # old master only, follows it.
    cut_at = time.monotonic()
    ok("cluster", "partition", "master", "controller", "--dir", d)
    assert backend.node("master").extra["cut_from"] == ["controller", "slave1"]
    wait_until(lambda: backend.route().master == "slave2",
               HEARTBEAT_TIMEOUT_MS / 1000 + MARGIN_S, "slave2's election in route.json")
    assert time.monotonic() - cut_at >= HEARTBEAT_TIMEOUT_MS / 1000 - 1.5
    # The isolated master never heard of it: it still serves as a master.
    assert status(backend, token, "master")["role"] != "SLAVE"
    r = dlab("send", "--dir", d, "--count", "30", "--size", "200", "--timeout", "3",
             "--retries", "20", "--json")
    assert r.returncode == 0, r.stderr
    sent = json.loads(r.stdout)
    assert sent["counts"] == {"PUT_OK": 30}, sent
    assert set(sent["nodes"]) == {backend.node("slave2").address}, sent
    wait_until(lambda: wrote(backend, token, "slave1") == wrote(backend, token, "slave2"),
               60, "slave1 following slave2")

    # Heal master - controller alone: its next heartbeat names slave2, which
    # it was never cut from, and it follows it (its link to slave1 stays cut).
    ok("cluster", "heal", "master", "controller", "--dir", d)
    new_end = wrote(backend, token, "slave2")
    wait_until(lambda: status(backend, token, "master")["role"] == "SLAVE"
               and wrote(backend, token, "master") == new_end, 60,
               "the old master following slave2")
    assert backend.node("master").extra["cut_from"] == ["slave1"]
    on_master = records(backend, token, "master")
    assert len(on_master) == 90
    assert on_master == records(backend, token, "slave2") == records(backend, token, "slave1")
    ok("cluster", "heal", "slave1", "master", "--dir", d)
    assert all(not backend.node(n).extra["cut_from"] for n in ("master", "slave1", "slave2"))
    assert "CUT FROM" not in ok("cluster", "status", "--dir", d)

    fails("cluster", "partition", "master", "master", "--dir", d,
          message="no link between master and itself")
    fails("cluster", "partition", "master", "nobody", "--dir", d, message="no node 'nobody'")


def test_no_controller_mode_node_may_be_called_controller(tmp_path: Path) -> None:
    spec = controller_spec(str(tmp_path / "d"))
    spec = ClusterSpec(directory=spec.directory, controller=spec.controller, master=spec.master,
                       slaves=(NodeSpec(name="controller", role=Role.SLAVE,
                                        ha_mode=HAMode.CONTROLLER),))
    with pytest.raises(BackendError, match="no node may be called 'controller'"):
        LocalBackend().up(spec, token=generate_token(), timeout_s=30)
    assert not Path(tmp_path, "d", "controller.log").exists()
