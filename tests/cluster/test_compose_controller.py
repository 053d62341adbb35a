"""`dlab cluster up --backend compose --ha-mode controller` against a real
Docker engine: the controller in a container of its own (its state on the
host, its port published on loopback), three node containers registering
with it by service name, the first one elected; the master's container
killed with `docker kill` (SIGKILL from the engine, no backend involved)
and replaced by the controller's election within its heartbeat timeout
(plus a loaded machine's margin); the route on the host following it at
the new master's published port, every acknowledged message on the new
master, which takes puts; the old master started again on its own disk
following it; a partition cutting one pair of nodes (or a node from the
controller) and a heal restoring it; the controller's container killed and
started again; classic-only operations refused; `down` leaving nothing.

The compose document of controller mode is checked without an engine."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.cli_helpers import dlab, fails, ok
from support.compose_support import needs_engine, one_engine_user
from support.ha_helpers import FAST, wait_until

from cluster.backends.compose import ComposeBackend, compose_document
from cluster.backends.interface import BackendError, ClusterSpec, ControllerSpec, NodeSpec
from cluster.backends.local import spec_to_dict
from cluster.client.node_client import NodeClient, SendOutcome, make_message
from cluster.client.routing import RoutedClient, RouteSource
from cluster.node.role import Role
from ha.config import HAMode

pytestmark = [pytest.mark.timeout(900), one_engine_user]

# The controller deposes a master silent this long; nodes heartbeat every
# second. 3 s keeps the test short and a loaded machine's pauses (load 8 on
# 2 cores) short of a false deposition.
HEARTBEAT_TIMEOUT_MS = 3000
SCAN_INTERVAL_MS = 250
# What an election may take beyond the timeout on a loaded machine: the
# scan, the new master's next heartbeat, containers scheduled late.
MARGIN_S = 30.0


# --- pure: the compose document -----------------------------------------------------


def test_controller_mode_document_runs_the_controller_and_points_every_node_at_it() -> None:
    common = dict(ha_mode=HAMode.CONTROLLER, all_ack_in_sync_state_set=True,
                  in_sync_replicas=2, min_in_sync_replicas=2)
    specs = [NodeSpec(name="master", role=Role.SYNC_MASTER, **common),  # type: ignore[arg-type]
             *(NodeSpec(name=f"slave{i}", role=Role.SLAVE, **common)  # type: ignore[arg-type]
               for i in (1, 2))]
    nodes = {ns.name: {"spec": spec_to_dict(ns), "port": 41000 + i, "failpoints": "",
                       "address": f"127.0.0.1:{41000 + i}"} for i, ns in enumerate(specs)}
    controller = {"port": 41009, "address": "127.0.0.1:41009", "starts": 0,
                  "settings": {"heartbeat_timeout_ms": 3000, "scan_interval_ms": 250,
                               "elect_unclean": True}}
    doc = compose_document(project="dlab-x", directory="/runs/r1", image="img:1",
                           master="master", nodes=nodes, user="1000:1000",
                           controller=controller)
    ctl = doc["services"]["controller"]
    cmd = ctl["command"]
    assert cmd[:2] == ["controller", "run"]

    def value(command: list[str], flag: str) -> str:
        return command[command.index(flag) + 1]

    # Its state and log in the cluster directory on the host, the route
    # published there, naming each node at its published port.
    assert value(cmd, "--dir") == "/cluster/controller"
    assert value(cmd, "--publish-route") == "/cluster"
    assert value(cmd, "--log-file") == "/cluster/controller.log"
    assert [cmd[i + 1] for i, a in enumerate(cmd) if a == "--route-address"] == [
        "master=127.0.0.1:41000", "slave1=127.0.0.1:41001", "slave2=127.0.0.1:41002"]
    assert (value(cmd, "--heartbeat-timeout-ms"), value(cmd, "--scan-interval-ms")) == (
        "3000", "250")
    assert "--elect-unclean" in cmd
    assert {"type": "bind", "source": "/runs/r1", "target": "/cluster"} in ctl["volumes"]
    token = {"type": "bind", "source": "/runs/r1/token", "target": "/run/dlab/token",
             "read_only": True}
    assert token in ctl["volumes"] and value(cmd, "--token-file") == "/run/dlab/token"
    assert ctl["ports"] == ["127.0.0.1:41009:9876"]
    assert ctl["container_name"] == "dlab-x-controller" and ctl["user"] == "1000:1000"
    assert "127.0.0.1:9876" in " ".join(ctl["healthcheck"]["test"])
    # Every pair of nodes has a link network, and every node one with the
    # controller, which is `controller.link` on each.
    links = {"link.master.slave1", "link.master.slave2", "link.slave1.slave2",
             "ctl.master", "ctl.slave1", "ctl.slave2"}
    assert set(doc["networks"]) == {"client", *links}
    assert doc["networks"]["link.master.slave1"] == {"name": "dlab-x-link.master.slave1"}
    assert ctl["networks"] == {"client": {}, **{
        k: {"aliases": ["controller.link"]} for k in links if k.startswith("ctl.")}}
    for name, svc in doc["services"].items():
        if name == "controller":
            continue
        c = svc["command"]
        others = [n for n in nodes if n != name]
        # No --master: a node follows whom the controller names, through
        # the link network of the two, where that node is `peer.NAME`; it
        # calls the controller on its own link network to it.
        assert svc["networks"] == {
            "client": {}, f"ctl.{name}": {},
            **{"link." + ".".join(sorted((name, o))): {"aliases": [f"peer.{name}"]}
               for o in others}}
        assert "--master" not in c
        assert (value(c, "--ha-mode"), value(c, "--controller"), value(c, "--advertise")) == (
            "controller", "controller.link:9876", f"{name}:7000")
        assert [c[i + 1] for i, a in enumerate(c) if a == "--peer-address"] == [
            f"{o}=peer.{o}:7000" for o in others]
        assert (value(c, "--in-sync-replicas"), value(c, "--min-in-sync-replicas")) == ("2", "2")
        assert "--all-ack-in-sync-state-set" in c
        assert [c[i + 1] for i, a in enumerate(c) if a == "--ha-slave"] == others
        assert [c[i + 1] for i, a in enumerate(c) if a == "--repair-from"] == [
            f"peer.{n}:7000" for n in others]


def test_a_node_named_like_the_controller_is_refused(tmp_path: Path) -> None:
    spec_dir = str(tmp_path / "c")
    spec = ClusterSpec(directory=spec_dir,
                       master=NodeSpec(name="controller", role=Role.ASYNC_MASTER,
                                       ha_mode=HAMode.CONTROLLER),
                       controller=ControllerSpec())
    with pytest.raises(BackendError, match="no node may be called 'controller'"):
        ComposeBackend(build_image=False).up(spec, token="t")
    assert not Path(spec_dir, "cluster.json").exists()


# --- a real cluster -----------------------------------------------------------------


@pytest.fixture
def cdir(tmp_path: Path) -> Iterator[str]:
    d = str(tmp_path / "c")
    yield d
    if os.path.exists(os.path.join(d, "cluster.json")):
        dlab("cluster", "down", "--dir", d, timeout=300)


def status(d: str) -> dict[str, dict[str, object]]:
    r = dlab("cluster", "status", "--dir", d, "--json")  # exit 1 while a node is down
    assert r.returncode in (0, 1) and "Traceback" not in r.stderr, r.stderr
    return {row["name"]: row for row in json.loads(r.stdout)}


def node_status(d: str, name: str) -> dict[str, object]:
    st = status(d)[name].get("status")
    return st if isinstance(st, dict) else {}


def route(d: str) -> dict[str, object]:
    data: dict[str, object] = json.loads(Path(d, "route.json").read_text())
    return data


def send(d: str, count: int, tag: str) -> list[SendOutcome]:
    """`count` puts through the route on the host (DIR/route.json, as
    `dlab send --dir` reads it), one after another, with retries."""
    token = ComposeBackend(d).token()

    async def go() -> list[SendOutcome]:
        async with RoutedClient(RouteSource(d), token=token, timeout_s=10, retries=20) as c:
            return [await c.send(make_message("t", os.urandom(200), msg_id=f"{tag}-{i}"))
                    for i in range(count)]

    return asyncio.run(go())


def records(d: str, name: str) -> list[str]:
    backend = ComposeBackend(d)
    with NodeClient(backend.node(name).address, token=backend.token(), timeout_s=10) as c:
        return [r.msg_id or "" for r in c.read_all()]


def connected_slaves(d: str, name: str) -> set[str]:
    links = node_status(d, name).get("slaves")
    return {str(s["slave"]) for s in links if s["state"] == "connected"} \
        if isinstance(links, list) else set()


@needs_engine
@pytest.mark.slow
def test_a_killed_master_container_is_replaced_by_the_controllers_election(cdir: str) -> None:
    d = cdir
    r = dlab("cluster", "up", "--backend", "compose", "--dir", d, "--ha-mode", "controller",
             "--slaves", "2", "--in-sync-replicas", "2", "--segment-size", "256KiB",
             "--node-args", " ".join(FAST),
             "--controller-heartbeat-timeout-ms", str(HEARTBEAT_TIMEOUT_MS),
             "--controller-scan-interval-ms", str(SCAN_INTERVAL_MS), "--timeout", "300",
             timeout=900)  # the first up of a checkout builds the node image
    assert r.returncode == 0 and "Traceback" not in r.stderr, (r.stdout, r.stderr)
    state = json.loads(Path(d, "cluster.json").read_text())
    controller, project = state["controller"], state["project"]
    addresses = {n: v["address"] for n, v in state["nodes"].items()}
    assert controller["address"].startswith("127.0.0.1:")
    assert f"controller {controller['address']}: running (container {project}-controller)" \
        in r.stdout
    # The first node was elected; the route on the host names its published port.
    assert (route(d)["master"], route(d)["address"]) == ("master", addresses["master"])
    assert f"route: master master at {addresses['master']}" in r.stdout
    rows = status(d)
    assert rows["master"]["role"] != "SLAVE" and rows["master"]["route_master"]
    assert rows["slave1"]["role"] == rows["slave2"]["role"] == "SLAVE"
    # The controller's state is on the host, and it knows each node by the
    # address its peers reach it at (its service name).
    ctl_state = json.loads(Path(d, "controller", "controller-state.json").read_text())
    assert ctl_state["master_epoch"] == 1
    ctl = json.loads(ok("controller", "status", "--address", controller["address"],
                        "--token-file", os.path.join(d, "token"), "--json"))
    assert {b["name"]: b["address"] for b in ctl["brokers"]} == {
        n: f"{n}:7000" for n in ("master", "slave1", "slave2")}
    backend = ComposeBackend(d)
    wait_until(lambda: backend.sync_state_set() == {"master", "slave1", "slave2"}, 60,
               "every node in the SyncStateSet")

    before = send(d, 60, "before")
    assert {o.status for o in before} == {"PUT_OK"}, [o.detail for o in before]
    assert {o.node for o in before} == {addresses["master"]}

    killed_ms = time.time_ns() // 1_000_000
    subprocess.run(["docker", "kill", f"{project}-master"], check=True, capture_output=True,
                   timeout=60)
    elected = wait_until(lambda: route(d)["master"] not in ("master", None)
                         and route(d)["master"],
                         timeout_s=HEARTBEAT_TIMEOUT_MS / 1000 + MARGIN_S,
                         what="the controller's election published in route.json")
    assert elected in ("slave1", "slave2")
    # Elected after the kill, not by a false deposition of a live master.
    assert int(route(d)["since_ms"]) >= killed_ms  # type: ignore[call-overload]
    assert route(d)["address"] == addresses[str(elected)]
    assert route(d)["epoch"] == 2
    # The controller publishes the route when it elects; the elected node
    # takes the role at its next heartbeat's answer, up to a second later.
    wait_until(lambda: status(d)[str(elected)]["role"] != "SLAVE", 30,
               f"{elected} taking the master's role")
    rows = status(d)
    assert rows["master"]["state"] == "stopped"
    assert rows[str(elected)]["role"] != "SLAVE" and rows[str(elected)]["route_master"]
    # Every acknowledged message is on the new master.
    assert {o.msg_id for o in before} <= set(records(d, str(elected)))

    # It takes puts once the other slave follows it (--in-sync-replicas 2:
    # each put waits for a slave's ack).
    other = "slave2" if elected == "slave1" else "slave1"
    wait_until(lambda: other in connected_slaves(d, str(elected)), 60,
               f"{other} following the new master")
    after = send(d, 40, "after")
    assert {o.status for o in after} == {"PUT_OK"}, [o.detail for o in after]
    assert {o.node for o in after} == {addresses[str(elected)]}
    on_new_master = records(d, str(elected))
    assert {o.msg_id for o in before + after} <= set(on_new_master)

    # The operator does not promote in this mode.
    fails("cluster", "promote", other, "--dir", d,
          message="in controller mode the controller elects the master")

    # The old master, on its own disk: it asks the controller, follows the
    # new master, and ends with the same records.
    out = json.loads(ok("cluster", "rejoin", "master", "--dir", d, "--json"))
    assert out["node"]["link"].startswith("connected"), out  # to the new master
    wait_until(lambda: node_status(d, "master").get("role") == "SLAVE"
               and records(d, "master") == records(d, str(elected)), 120,
               "the old master following the new one")
    wait_until(lambda: records(d, other) == records(d, str(elected)), 60,
               f"{other} holding what the new master holds")
    assert route(d)["master"] == elected  # the old master's return changed nothing

    # A partition cuts one pair's link network and nothing else: the new
    # master loses `other` (its HA housekeeping drops the silent stream) and
    # keeps the old master, so puts needing one slave's ack go on.
    ok("cluster", "partition", str(elected), other, "--dir", d)
    rows = status(d)
    assert (rows[other]["cut_from"], rows[str(elected)]["cut_from"], rows["master"]["cut_from"]
            ) == ([elected], [other], [])
    wait_until(lambda: connected_slaves(d, str(elected)) == {"master"}, 60,
               f"the new master without {other}")
    cut = send(d, 20, "cut")
    assert {o.status for o in cut} == {"PUT_OK"}, [o.detail for o in cut]
    ok("cluster", "heal", str(elected), other, "--dir", d)
    assert status(d)[other]["cut_from"] == []
    wait_until(lambda: connected_slaves(d, str(elected)) == {"master", other}, 60,
               f"{other} following the new master again")
    wait_until(lambda: records(d, other) == records(d, str(elected)), 60,
               f"{other} catching up after the heal")
    # A node cut from the controller (not from its peers) keeps replicating.
    ok("cluster", "partition", other, "controller", "--dir", d)
    assert status(d)[other]["cut_from"] == ["controller"]
    fails("cluster", "partition", other, other, "--dir", d, message="no link between")
    ok("cluster", "heal", "controller", other, "--dir", d)
    assert status(d)[other]["cut_from"] == []

    # The controller killed and started again: it keeps its master and epoch.
    backend.kill_controller()
    assert ComposeBackend(d).controller()["state"] == "stopped"  # type: ignore[index]
    backend.start_controller(timeout_s=120)
    wait_until(lambda: backend.sync_state_set() >= {str(elected)}, 60,
               "the restarted controller answering")
    assert route(d)["master"] == elected

    ok("cluster", "down", "--dir", d)
    left = subprocess.run(["docker", "ps", "--all", "--quiet", "--filter",
                           f"label=com.docker.compose.project={project}"],
                          capture_output=True, text=True, check=True, timeout=60)
    assert left.stdout.strip() == ""
    assert not Path(d, "route.json").exists()
    # Its state outlives the cluster, as a node's store does (a later
    # election may have happened while `down` stopped the nodes one by one).
    assert json.loads(Path(d, "controller", "controller-state.json").read_text())[
        "master_epoch"] >= 2
