"""`dlab cluster promote | lose | rejoin` on a compose cluster, against a
real Docker engine: the master killed and its slave promoted (a new
container with the same bind-mounted store), the other slave following it,
clients following the route to its published address, the old master
rejoining as a slave; a machine lost and replaced with an empty store;
every refusal as exit 2 with its reason; and one failover scenario run end
to end by the chaos harness, as `dlab chaos run --backend compose` runs it.

The clusters come up through the backend with one CheckedImages for the
module, so the default node image (the tag the other compose tests use) is
brought up to date with this checkout once and then reused; the failover
itself goes through the command line, as an operator runs it.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.chaos_runs import SMALL
from support.cli_helpers import dlab, fails, ok
from support.compose_support import needs_engine, one_engine_user
from support.ha_helpers import FAST, wait_until

from chaos.check.summary import run_outcome
from chaos.harness import scenarios
from chaos.harness.run_config import Backend, RunConfig
from chaos.matrix.launch import make_run
from chaos.schema import read_jsonl
from cluster.backends.compose import ComposeBackend
from cluster.backends.image import CheckedImages
from cluster.backends.interface import BackendError, ClusterSpec, NodeSpec
from cluster.client.node_client import NodeClient, SendOutcome, make_message
from cluster.client.routing import RoutedClient, RouteSource
from cluster.node.auth import generate_token
from cluster.node.role import Role
from ha.config import SlaveAheadPolicy
from store.config import FlushMode

pytestmark = [pytest.mark.timeout(600), needs_engine, one_engine_user]

IMAGES = CheckedImages()  # the node image checked once for this module


@pytest.fixture
def compose_dir(tmp_path: Path) -> Iterator[str]:
    d = str(tmp_path / "c")
    yield d
    if os.path.exists(os.path.join(d, "cluster.json")):
        ComposeBackend(d, images=IMAGES).down()


def up(d: str, *, role: Role, slaves: int,
       policy: SlaveAheadPolicy = SlaveAheadPolicy.REJECT) -> ComposeBackend:
    def node(name: str, node_role: Role) -> NodeSpec:
        return NodeSpec(name=name, role=node_role, segment_size_bytes=8 << 20,
                        slave_ahead_policy=policy, extra_args=tuple(FAST))

    backend = ComposeBackend(d, images=IMAGES)
    spec = ClusterSpec(directory=d, master=node("master", role),
                       slaves=tuple(node(f"slave{i + 1}", Role.SLAVE) for i in range(slaves)))
    backend.up(spec, token=generate_token(), timeout_s=180)
    return backend


def send(d: str, count: int, tag: str) -> list[SendOutcome]:
    """`count` puts through the route (DIR/route.json), as `dlab send --dir`
    makes them, one after another, with retries."""
    token = ComposeBackend(d).token()

    async def go() -> list[SendOutcome]:
        async with RoutedClient(RouteSource(d), token=token, timeout_s=10, retries=5) as c:
            return [await c.send(make_message("t", os.urandom(200), msg_id=f"{tag}-{i}"))
                    for i in range(count)]

    return asyncio.run(go())


def status(d: str) -> dict[str, dict[str, object]]:
    r = dlab("cluster", "status", "--dir", d, "--json")  # exit 1 while a node is down
    assert r.returncode in (0, 1) and "Traceback" not in r.stderr, r.stderr
    return {row["name"]: row for row in json.loads(r.stdout)}


def records(backend: ComposeBackend, name: str) -> list[str]:
    with NodeClient(backend.node(name).address, token=backend.token()) as c:
        return [r.msg_id or "" for r in c.read_all()]


def wrote(backend: ComposeBackend, name: str) -> int:
    with NodeClient(backend.node(name).address, token=backend.token(), timeout_s=5) as c:
        return int(c.status_dict()["wrote"])  # type: ignore[call-overload]


def test_promote_moves_the_route_and_every_ack_is_on_the_new_master(compose_dir: str) -> None:
    d = compose_dir
    b = up(d, role=Role.SYNC_MASTER, slaves=2)
    addresses = {n.name: n.address for n in b.nodes()}
    assert json.loads(Path(d, "route.json").read_text())["master"] == "master"
    before = send(d, 20, "before")
    assert {o.status for o in before} == {"PUT_OK"}
    assert {o.node for o in before} == {addresses["master"]}

    ok("cluster", "kill", "master", "--dir", d)
    out = json.loads(ok("cluster", "promote", "slave1", "--dir", d, "--json"))
    assert (out["node"]["role"], out["node"]["state"]) == ("SYNC_MASTER", "running")
    assert out["node"]["promoted_from"] == "master"
    # slave2 kept running and now replicates from slave1 (the alias moved).
    assert out["node"]["links"]["slave2"].startswith("connected"), out
    route = out["route"]
    assert (route["master"], route["address"], route["epoch"]) == (
        "slave1", addresses["slave1"], 2)
    assert json.loads(Path(d, "route.json").read_text()) == route
    st = status(d)
    assert st["slave1"]["route_master"] is True and st["master"]["role"] == "SLAVE"
    assert st["master"]["state"] == "stopped"

    # The same clients, through the route: the new master acknowledges
    # (SYNC_MASTER: slave2 has each put).
    after = send(d, 20, "after")
    assert {o.status for o in after} == {"PUT_OK"}, [o.detail for o in after]
    assert {o.node for o in after} == {addresses["slave1"]}

    # The old master comes back as a slave of the new one, on its own store.
    out = json.loads(ok("cluster", "rejoin", "master", "--dir", d, "--json"))
    assert out["node"]["role"] == "SLAVE" and out["node"]["link"].startswith("connected"), out
    wait_until(lambda: wrote(b, "master") == wrote(b, "slave1"), 60, "old master caught up")
    acked = {o.msg_id for o in before + after}
    on_new_master = records(b, "slave1")
    assert acked <= set(on_new_master)
    assert records(b, "master") == on_new_master == records(b, "slave2")
    assert status(d)["master"]["status"]["master"]["state"] == "streaming"  # type: ignore[index]


def test_a_cut_follower_follows_the_new_master_while_the_cut_off_one_runs_on(
        compose_dir: str) -> None:
    """An isolated master's two slaves: promoting one leaves the old master
    running as a master (cut off) and the other slave's link leads to the
    new master whole, as on local (docs/design.md, "Failover")."""
    d = compose_dir
    b = up(d, role=Role.SYNC_MASTER, slaves=2)
    before = send(d, 10, "before")
    assert {o.status for o in before} == {"PUT_OK"}
    for s in ("slave1", "slave2"):
        ok("cluster", "partition", "master", s, "--dir", d)

    out = json.loads(ok("cluster", "promote", "slave1", "--dir", d, "--json"))
    assert out["node"]["cut_off"] == ["master"], out
    assert out["node"]["links"]["slave2"].startswith("connected"), out
    assert b.node("master").state == "running"  # left as it was: a second master
    # SYNC_MASTER: each ack needs slave2's, so slave2 replicates from slave1.
    after = send(d, 10, "after")
    assert {o.status for o in after} == {"PUT_OK"}, [o.detail for o in after]
    wait_until(lambda: wrote(b, "slave2") == wrote(b, "slave1"), 30, "slave2 caught up")
    assert records(b, "slave2") == records(b, "slave1")

    # Stopped, the old master rejoins as slave1's slave and catches up.
    ok("cluster", "stop", "master", "--dir", d)
    out = json.loads(ok("cluster", "rejoin", "master", "--dir", d, "--json"))
    assert out["node"]["link"].startswith("connected"), out
    wait_until(lambda: wrote(b, "master") == wrote(b, "slave1"), 30, "old master caught up")
    assert records(b, "master") == records(b, "slave1")


def test_lose_and_rejoin_a_replacement_and_every_refusal(compose_dir: str) -> None:
    d = compose_dir
    b = up(d, role=Role.ASYNC_MASTER, slaves=1)
    for action in ("promote", "lose", "rejoin"):
        fails("cluster", action, "nope", "--dir", d, message="no node 'nope'")
    fails("cluster", "promote", "master", "--dir", d, message="already the master")
    fails("cluster", "rejoin", "slave1", "--dir", d, message="it is running")
    fails("cluster", "rejoin", "master", "--dir", d, message="it is running")
    first = send(d, 15, "first")
    assert {o.status for o in first} == {"PUT_OK"}
    wait_until(lambda: wrote(b, "slave1") == wrote(b, "master"), 30, "slave1 caught up")
    ok("cluster", "stop", "slave1", "--dir", d)
    fails("cluster", "promote", "slave1", "--dir", d, message="it is not running")

    out = json.loads(ok("cluster", "lose", "slave1", "--dir", d, "--json"))
    lost_dir = Path(d, "nodes", "slave1", "lost-1")
    assert out["node"]["state"] == "lost" and out["node"]["lost"] == [str(lost_dir)]
    assert os.listdir(lost_dir / "commitlog") and not os.listdir(Path(d, "nodes", "slave1",
                                                                      "data"))
    fails("cluster", "lose", "slave1", "--dir", d, message="already lost")
    fails("cluster", "lose", "master", "--dir", d, message="only node left")
    fails("cluster", "promote", "slave1", "--dir", d, message="it was lost")
    fails("cluster", "start", "slave1", "--dir", d, message="was lost")
    assert status(d)["master"]["state"] == "running"  # no refusal changed anything

    # A replacement machine: an empty store, catching up from the master.
    out = json.loads(ok("cluster", "rejoin", "slave1", "--dir", d, "--json"))
    assert out["node"]["state"] == "running" and out["node"]["link"].startswith("connected")
    wait_until(lambda: wrote(b, "slave1") == wrote(b, "master"), 60, "replacement caught up")
    assert records(b, "slave1") == records(b, "master")
    assert (lost_dir / "commitlog").is_dir()  # the evidence stays

    # Losing the master: no route until slave1 is promoted.
    ok("cluster", "lose", "master", "--dir", d)
    assert json.loads(Path(d, "route.json").read_text())["master"] is None
    assert {o.status for o in send(d, 1, "none")} == {"NO_ROUTE"}
    fails("cluster", "rejoin", "master", "--dir", d, message="no master to follow")
    out = json.loads(ok("cluster", "promote", "slave1", "--dir", d, "--json"))
    assert out["node"]["role"] == "ASYNC_MASTER"  # the lost master's role
    assert {o.status for o in send(d, 5, "last")} == {"PUT_OK"}
    assert {o.msg_id for o in first} <= set(records(b, "slave1"))
    with pytest.raises(BackendError, match="it is running"):
        b.rejoin("slave1")


@pytest.mark.slow
def test_a_master_lost_chaos_run_on_compose_promotes_the_slave_and_loses_no_ack(
        tmp_path: Path) -> None:
    """`dlab chaos run --backend compose --scenario master-lost` under
    SYNC_MASTER, end to end: the master dies inside a put and is lost, the
    slave is promoted, the producers follow the route to it, and the judged
    run loses no acknowledged message (the promoted slave held every
    PUT_OK, as the mode promised)."""
    cfg = RunConfig(scenario=scenarios.get("master-lost"), role=Role.SYNC_MASTER,
                    flush=FlushMode.ASYNC_FLUSH, seed=1, out_dir=str(tmp_path),
                    backend=Backend.COMPOSE, workload=SMALL)
    run_dir = make_run(cfg, images=IMAGES).execute()

    faults = read_jsonl(os.path.join(run_dir, "faults.jsonl"))
    assert [f["kind"] for f in faults] == ["failpoint", "lose", "promote"], faults
    promote = faults[-1]
    assert (promote["node"], promote["peer"]) == ("slave1", "master")
    assert promote["end_ms"] is not None and "refused" not in (promote["detail"] or "")
    params = json.loads(Path(run_dir, "params.json").read_text())
    assert params["nodes"][0] == {"name": "slave1", "role": "SYNC_MASTER"}
    history = read_jsonl(os.path.join(run_dir, "history.jsonl"))
    # The producers followed the route: puts went to slave1 once promoted
    # (whether one was answered in the 1.5 s of load left after the
    # promotion depends on how soon the client reconnects).
    assert {"master", "slave1"} <= {h["node"] for h in history}

    outcome = run_outcome(run_dir)
    assert outcome.acked > 50
    assert (outcome.acked_lost_everywhere, outcome.acked_lost_failover,
            outcome.promise_violations, outcome.split_brain_acks) == (0, 0, 0, 0), outcome
    # the lost master's store is read back from where it was moved
    assert Path(run_dir, "nodes", "master", "records.jsonl").stat().st_size > 0
    assert not Path(run_dir, "cluster", "cluster.json").exists()  # the cluster is down
