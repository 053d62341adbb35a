"""The compose backend against a real Docker engine: a cluster comes up
healthy and replicates, the faults do what they say, and `down` leaves no
container, network or volume behind.

The node image is built once per module from a snapshot of the sources; the
clusters then use it as is (`build_image=False`). Each test tears its
cluster down, and a finalizer removes anything a failed test left.
"""

from __future__ import annotations

import csv
import functools
import json
import os
import random
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from support.compose_support import needs_engine, one_engine_user, remove_images, snapshot_sources

from chaos.harness.disk_faults import torn_tail
from cluster.backends import image as img
from cluster.backends.compose import ComposeBackend, compose_document, node_command, project_name
from cluster.backends.failover import decide_promote
from cluster.backends.interface import BackendError, ClusterSpec, NodeSpec, NodeState
from cluster.backends.local import spec_to_dict
from cluster.client.node_client import NodeCallError, NodeClient, make_message
from cluster.node.role import Role

TOKEN = "compose-test-token"
pytestmark = [pytest.mark.timeout(600), one_engine_user]


# --- pure: the compose document ----------------------------------------------------


def _doc() -> dict:
    master = NodeSpec(name="master", role=Role.SYNC_MASTER, flush="SYNC_FLUSH")
    slave = NodeSpec(name="slave1", role=Role.SLAVE, crash_model="process")
    crash = "after_append_before_flush=crash@3"
    nodes = {ns.name: {"spec": spec_to_dict(ns), "port": port, "failpoints": fp}
             for ns, port, fp in ((master, 41000, ""), (slave, 41001, crash))}
    return compose_document(project="dlab-x", directory="/runs/r1", image="img:1",
                            master="master", nodes=nodes, user="1000:1000")


def test_compose_document_wires_modes_mounts_ports_and_networks() -> None:
    doc = _doc()
    master, slave = doc["services"]["master"], doc["services"]["slave1"]
    assert master["command"][:1] == ["node"]
    assert master["command"][master["command"].index("--flush") + 1] == "SYNC_FLUSH"
    assert slave["command"][slave["command"].index("--crash-model") + 1] == "process"
    assert slave["command"][slave["command"].index("--master") + 1] == "repl-master:7000"
    failpoints = slave["command"][slave["command"].index("--failpoints") + 1]
    assert failpoints == "after_append_before_flush=crash@3"
    assert "--master" not in master["command"]
    # Only the master answers to repl-master, and only on the repl network.
    assert master["networks"] == {"client": {}, "repl": {"aliases": ["repl-master"]}}
    assert slave["networks"] == {"client": {}, "repl": {}}
    assert master["ports"] == ["127.0.0.1:41000:7000"]
    assert {"type": "bind", "source": "/runs/r1/nodes/slave1", "target": "/node"} in \
        slave["volumes"]
    assert slave["user"] == "1000:1000" and master["container_name"] == "dlab-x-master"
    assert "grpc_health" in " ".join(master["healthcheck"]["test"])
    assert doc["networks"]["repl"]["name"] == "dlab-x-repl"


def test_after_a_promotion_the_alias_and_a_masters_command_move_to_the_promoted_node() -> None:
    """What the compose backend recreates containers from: the promoted
    slave answers to repl-master and runs as master (repairing from and
    counting the others); the old master runs as a slave of the alias."""
    master = NodeSpec(name="master", role=Role.SYNC_MASTER, flush="SYNC_FLUSH")
    slaves = [NodeSpec(name=f"slave{i}", role=Role.SLAVE) for i in (1, 2)]
    nodes = {ns.name: {"spec": spec_to_dict(ns), "port": 41000 + i, "failpoints": "",
                       "address": f"127.0.0.1:{41000 + i}"}
             for i, ns in enumerate([master, *slaves])}
    state = {"master": "master", "nodes": nodes, "started_ms": 1}
    decide_promote(state, "slave1", running={"slave1", "slave2"}, now_ms=2)
    doc = compose_document(project="dlab-x", directory="/runs/r1", image="img:1",
                           master=state["master"], nodes=nodes, user="1000:1000")
    new, old = doc["services"]["slave1"], doc["services"]["master"]
    assert new["networks"]["repl"] == {"aliases": ["repl-master"]}
    assert old["networks"]["repl"] == {} == doc["services"]["slave2"]["networks"]["repl"]
    assert new["command"][new["command"].index("--role") + 1] == "SYNC_MASTER"
    assert new["command"][new["command"].index("--flush") + 1] == "SYNC_FLUSH"
    assert "--master" not in new["command"]
    assert [new["command"][i + 1] for i, a in enumerate(new["command"]) if a == "--ha-slave"] \
        == ["master", "slave2"]
    assert old["command"][old["command"].index("--role") + 1] == "SLAVE"
    assert old["command"][old["command"].index("--master") + 1] == "repl-master:7000"


def test_token_is_never_on_the_command_line() -> None:
    ns = NodeSpec(name="m", role=Role.ASYNC_MASTER)
    assert "--token-file" in node_command(ns, failpoints="")
    assert TOKEN not in " ".join(node_command(ns, failpoints=""))


def test_project_names_differ_per_directory() -> None:
    assert project_name("/a/run1") != project_name("/a/run2")
    assert project_name("/a/run1") == project_name("/a/run1/")


def test_up_says_clearly_when_no_engine_answers(monkeypatch: pytest.MonkeyPatch,
                                                tmp_path: Path) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    spec = ClusterSpec(directory=str(tmp_path / "c"),
                       master=NodeSpec(name="master", role=Role.ASYNC_MASTER))
    with pytest.raises(BackendError, match="no Docker engine answers"):
        ComposeBackend(build_image=False).up(spec, token=TOKEN)


# --- real clusters ------------------------------------------------------------------


@pytest.fixture(scope="module")
def node_image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The node image of a snapshot of the sources, under a tag of its own."""
    sources = snapshot_sources(tmp_path_factory.mktemp("sources"))
    tag = f"durability-lab/node:test-backend-{os.getpid()}"
    img.build_node_image(tag=tag, source_root=sources)
    yield tag
    remove_images(tag)


@pytest.fixture
def cluster(node_image: str, tmp_path: Path) -> Iterator[ComposeBackend]:
    backend = ComposeBackend(image=node_image, build_image=False)
    yield backend
    if (tmp_path / "cluster" / "cluster.json").exists():
        backend.down()
    _assert_nothing_left(project_name(str(tmp_path / "cluster")))


def _assert_nothing_left(project: str) -> None:
    import docker

    client = docker.from_env(version="auto")
    label = {"label": f"com.docker.compose.project={project}"}
    leftovers = (client.containers.list(all=True, filters=label)
                 + client.networks.list(filters=label) + client.volumes.list(filters=label))
    names = [getattr(x, "name", x) for x in leftovers]
    for x in leftovers:  # clean up for the next test, then fail this one
        x.remove(force=True) if hasattr(x, "attach") else x.remove()
    assert not names, f"left behind: {names}"


def _spec(tmp_path: Path, *, role: Role = Role.SYNC_MASTER, slaves: int = 2,
          flush: str = "ASYNC_FLUSH", extra: tuple[str, ...] = ()) -> ClusterSpec:
    def node(name: str, node_role: Role) -> NodeSpec:
        return NodeSpec(name=name, role=node_role, flush=flush, segment_size_bytes=8 << 20,
                        extra_args=extra)

    return ClusterSpec(directory=str(tmp_path / "cluster"), master=node("master", role),
                       slaves=tuple(node(f"slave{i + 1}", Role.SLAVE) for i in range(slaves)))


def _send(address: str, n: int, *, timeout_s: float = 10) -> list[str]:
    with NodeClient(address, token=TOKEN, timeout_s=timeout_s) as client:
        return [client.send(make_message("t", f"m{i}".encode() * 10)).status for i in range(n)]


def _status(address: str, *, timeout_s: float = 5) -> dict:
    with NodeClient(address, token=TOKEN, timeout_s=timeout_s) as client:
        return client.status_dict()


def _wrote_is(address: str, wrote: int) -> bool:
    return bool(_status(address)["wrote"] == wrote)


def _eventually(check: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.1)


@needs_engine
def test_three_nodes_come_up_healthy_replicate_and_go_down_leaving_nothing(
        cluster: ComposeBackend, tmp_path: Path) -> None:
    started = time.monotonic()
    infos = cluster.up(_spec(tmp_path), token=TOKEN)
    up_s = time.monotonic() - started
    assert [i.state for i in infos] == [NodeState.RUNNING] * 3
    assert all(i.container and i.address.startswith("127.0.0.1:") for i in infos)
    print(f"compose cluster of 3 up and healthy in {up_s:.1f} s")

    assert _send(infos[0].address, 50) == ["PUT_OK"] * 50  # SYNC_MASTER: a slave has each
    wrote = _status(infos[0].address)["wrote"]
    for slave in infos[1:]:
        _eventually(functools.partial(_wrote_is, slave.address, wrote))
    with NodeClient(infos[1].address, token=TOKEN) as client:
        assert len(client.read_all()) == 50
    # The stores are on the host, where the harness reads them after the run.
    for info in infos:
        assert Path(info.data_dir, "commitlog").is_dir()
    project = infos[0].extra["project"]

    cluster.down()
    _assert_nothing_left(project)
    assert Path(infos[0].data_dir, "commitlog").is_dir()  # down keeps the data


@needs_engine
def test_kill_is_a_crash_and_start_recovers(cluster: ComposeBackend, tmp_path: Path) -> None:
    infos = cluster.up(_spec(tmp_path, role=Role.ASYNC_MASTER, slaves=1), token=TOKEN)
    master = infos[0]
    assert set(_send(master.address, 20)) == {"PUT_OK"}
    cluster.kill("master")
    assert cluster.node("master").state == NodeState.STOPPED
    assert cluster.node("master").extra["container_status"] == "exited"
    assert os.path.exists(os.path.join(master.data_dir, "abort"))  # no clean shutdown

    back = cluster.start("master")
    assert back.state == NodeState.RUNNING and back.address == master.address
    assert _status(master.address)["recovery"]["abnormal"] is True

    cluster.stop("slave1")  # clean: SIGTERM, the node removes `abort`
    assert not os.path.exists(os.path.join(infos[1].data_dir, "abort"))
    assert cluster.restart("slave1").state == NodeState.RUNNING


@needs_engine
def test_a_paused_master_answers_nothing(cluster: ComposeBackend, tmp_path: Path) -> None:
    infos = cluster.up(_spec(tmp_path, role=Role.ASYNC_MASTER, slaves=1), token=TOKEN)
    cluster.pause("master")
    assert cluster.node("master").state == NodeState.PAUSED
    with pytest.raises(NodeCallError) as caught:
        _status(infos[0].address, timeout_s=1.0)
    assert caught.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert _send(infos[0].address, 1, timeout_s=1.0) == ["INDETERMINATE"]
    cluster.resume("master")
    assert cluster.node("master").state == NodeState.RUNNING
    assert _status(infos[0].address)["role"] == "ASYNC_MASTER"


@needs_engine
def test_a_partitioned_slave_stops_acking_and_catches_up_after_heal(
        cluster: ComposeBackend, tmp_path: Path) -> None:
    infos = cluster.up(_spec(tmp_path, slaves=1, extra=("--slave-timeout-ms", "1000")),
                       token=TOKEN)
    master, slave = infos
    assert _send(master.address, 5) == ["PUT_OK"] * 5

    cluster.partition("master", "slave1")
    assert cluster.node("slave1").extra["partitioned"] is True
    statuses = _send(master.address, 3)
    assert set(statuses) <= {"SLAVE_NOT_AVAILABLE", "FLUSH_SLAVE_TIMEOUT"}, statuses
    # The harness still sees the slave (the client network is not cut)...
    behind = _status(slave.address)["wrote"]
    # ...and it has not received what the master stored after the cut.
    assert behind < _status(master.address)["wrote"]

    cluster.heal("master", "slave1")
    _eventually(lambda: _status(slave.address)["wrote"] == _status(master.address)["wrote"],
                timeout_s=30)
    _eventually(lambda: _send(master.address, 1) == ["PUT_OK"], timeout_s=30)


@needs_engine
def test_disk_faults_act_on_a_stopped_nodes_bind_mounted_files(
        cluster: ComposeBackend, tmp_path: Path) -> None:
    infos = cluster.up(_spec(tmp_path, role=Role.ASYNC_MASTER, slaves=0,
                             flush="SYNC_FLUSH"), token=TOKEN)
    assert set(_send(infos[0].address, 10)) == {"PUT_OK"}
    cluster.kill("master")
    detail = torn_tail(infos[0].data_dir, random.Random(7))
    assert detail.startswith("torn record at")
    cluster.start("master")
    recovery = _status(infos[0].address)["recovery"]
    assert recovery["abnormal"] is True and recovery["first_bad_offset"] is not None
    assert _status(infos[0].address)["wrote"] == recovery["max_valid_offset"]


@needs_engine
def test_failpoints_set_later_recreate_the_container_and_keep_a_partition(
        cluster: ComposeBackend, tmp_path: Path) -> None:
    cluster.up(_spec(tmp_path, slaves=1), token=TOKEN)
    cluster.partition("master", "slave1")
    first = cluster.node("slave1")
    cluster.set_failpoints("slave1", "slave_after_append_before_report=delay:1@1000000")
    again = cluster.restart("slave1")
    assert again.extra["failpoints"] == "slave_after_append_before_report=delay:1@1000000"
    assert again.extra["partitioned"] is True
    import docker

    container = docker.from_env(version="auto").containers.get(first.container)
    assert "slave_after_append_before_report=delay:1@1000000" in container.attrs["Args"]
    networks = container.attrs["NetworkSettings"]["Networks"]
    assert not any(name.endswith("-repl") for name in networks), networks


# --- chaos on compose ------------------------------------------------------------------


@pytest.fixture(scope="module")
def compose_run(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One cell of the matrix on compose: master-crash, ASYNC_MASTER +
    ASYNC_FLUSH. The harness builds the default node image itself, as
    `dlab chaos run --backend compose` does."""
    from chaos.commands.run import make_run
    from chaos.harness import scenarios
    from chaos.harness.runner import RunConfig
    from chaos.harness.workload import WorkloadConfig

    out = tmp_path_factory.mktemp("compose-run")
    cfg = RunConfig(scenario=scenarios.get("master-crash"), role="ASYNC_MASTER",
                    flush="ASYNC_FLUSH", seed=3, out_dir=str(out), backend="compose",
                    workload=WorkloadConfig(producers=2, body_min_bytes=256,
                                            body_max_bytes=1024))
    run = make_run(cfg)
    run_dir = run.execute()
    _assert_nothing_left(project_name(run.cluster_dir))
    return run_dir


@needs_engine
@pytest.mark.slow
def test_a_matrix_cell_on_compose_writes_a_valid_result_directory(compose_run: str) -> None:
    from chaos.schema import read_jsonl, validate_run_dir

    assert validate_run_dir(compose_run) == ["master", "slave1"]
    with open(os.path.join(compose_run, "params.json")) as f:
        params = json.load(f)
    assert params["backend"] == "compose"
    faults = [f["kind"] for f in read_jsonl(os.path.join(compose_run, "faults.jsonl"))]
    assert faults[:2] == ["kill", "start"]
    history = read_jsonl(os.path.join(compose_run, "history.jsonl"))
    assert sum(h["status"] == "PUT_OK" for h in history) > 50
    # The stores were read back from the bind-mounted data dirs.
    master_records = read_jsonl(os.path.join(compose_run, "nodes", "master", "records.jsonl"))
    assert master_records


@needs_engine
@pytest.mark.slow
def test_the_report_reads_a_compose_run(compose_run: str, tmp_path: Path) -> None:
    pipeline = pytest.importorskip("chaos.report.pipeline", reason="the Spark pipeline is not here")
    if shutil.which("java") is None:
        pytest.skip("the Spark report needs Java")
    pipeline.build_report([compose_run], str(tmp_path / "report"))
    with open(tmp_path / "report" / "verdicts.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["backend"], r["scenario"], r["role"], r["flush"]) for r in rows] == [
        ("compose", "master-crash", "ASYNC_MASTER", "ASYNC_FLUSH")]
