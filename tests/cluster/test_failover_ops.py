"""`dlab cluster promote | lose | rejoin` and routed sends, on the local
backend with real processes: a master killed and replaced by its slave,
clients following the route to it, a machine lost and replaced, an old
master rejoining with a longer log under each slave-ahead policy, and every
refusal as exit 2 with its reason."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.cli_helpers import REPO, dlab, fails, ok
from support.ha_helpers import FAST, wait_until

from cluster.client.node_client import NodeClient, SendOutcome, make_message
from cluster.node.auth import read_token_file

NODE_ARGS = " ".join(FAST)


def up(d: str, *extra: str) -> None:
    ok("cluster", "up", "--dir", d, "--segment-size", "256KiB", "--node-args", NODE_ARGS,
       *extra)


def status(d: str) -> dict[str, dict[str, object]]:
    r = dlab("cluster", "status", "--dir", d, "--json")  # exit 1 while a node is down
    assert r.returncode in (0, 1) and "Traceback" not in r.stderr, r.stderr
    return {row["name"]: row for row in json.loads(r.stdout)}


def route(d: str) -> dict[str, object]:
    data: dict[str, object] = json.loads(Path(d, "route.json").read_text())
    return data


def send(d: str, count: int, *extra: str) -> tuple[int, dict[str, object]]:
    r = dlab("send", "--dir", d, "--count", str(count), "--size", "200", "--timeout", "3",
             "--json", *extra)
    assert "Traceback" not in r.stderr, r.stderr
    summary: dict[str, object] = json.loads(r.stdout)
    return r.returncode, summary


def process_gone(pid: int) -> bool:
    """No process `pid`, or only its zombie (exited, not yet reaped by
    whoever adopted it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat[stat.rindex(")") + 2] in "ZX"


def records(d: str, name: str) -> list[str]:
    addr = str(status(d)[name]["address"])
    with NodeClient(addr, token=read_token_file(os.path.join(d, "token"))) as c:
        return [r.msg_id or "" for r in c.read_all()]


def wrote(d: str, name: str) -> int:
    st = status(d)[name].get("status") or {}
    return int(st.get("wrote", -1))  # type: ignore[union-attr]


@pytest.fixture
def cluster_dirs(tmp_path: Path) -> Iterator[list[str]]:
    made: list[str] = []
    yield made
    for d in made:
        if os.path.exists(os.path.join(d, "cluster.json")):
            dlab("cluster", "down", "--dir", d)


def test_promote_after_killing_the_master_routes_puts_to_the_new_master(
        tmp_path: Path, cluster_dirs: list[str]) -> None:
    d = str(tmp_path / "c")
    cluster_dirs.append(d)
    up(d, "--slaves", "2", "--role", "SYNC_MASTER")
    assert route(d)["master"] == "master" and route(d)["epoch"] == 1
    code, first = send(d, 20)
    assert code == 0 and first["counts"] == {"PUT_OK": 20}
    wait_until(lambda: wrote(d, "slave1") == wrote(d, "master"), 30, "slave1 caught up")
    old = status(d)

    # A producer at a steady rate across the failover, retrying per --retries.
    producer = subprocess.Popen(
        [sys.executable, "-m", "chaos.cli", "send", "--dir", d, "--count", "60", "--rate", "10",
         "--size", "200", "--timeout", "2", "--retries", "12", "--json"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(1.5)
    ok("cluster", "kill", "master", "--dir", d)
    code, during = send(d, 3)  # no retries: the route still names the dead master
    assert code == 1 and during["counts"] == {"INDETERMINATE": 3}, during

    out = ok("cluster", "promote", "slave1", "--dir", d)
    assert "slave2: connected" in out, out
    new = status(d)
    assert new["slave1"]["role"] == "SYNC_MASTER" and new["slave1"]["route_master"] is True
    assert new["master"]["role"] == "SLAVE" and new["master"]["state"] == "stopped"
    r = route(d)
    assert (r["master"], r["address"], r["epoch"]) == ("slave1", old["slave1"]["address"], 2)

    # Puts now reach the new master through the route, and are replicated
    # to slave2 (now its slave): SYNC_MASTER acknowledges them.
    code, after = send(d, 20)
    assert code == 0 and after["counts"] == {"PUT_OK": 20}, after
    assert after["nodes"] == {old["slave1"]["address"]: 20}

    stdout, stderr = producer.communicate(timeout=120)
    assert producer.returncode == 0 and "Traceback" not in stderr, stderr
    moving = json.loads(stdout)
    assert "INDETERMINATE" not in moving["counts"], moving  # each failed send was retried
    assert moving["retried"] >= 1
    assert set(moving["nodes"]) == {old["master"]["address"], old["slave1"]["address"]}


def test_lose_moves_the_store_aside_and_rejoin_catches_up_from_empty(
        tmp_path: Path, cluster_dirs: list[str]) -> None:
    d = str(tmp_path / "c")
    cluster_dirs.append(d)
    up(d, "--slaves", "2", "--role", "ASYNC_MASTER", "--crash-model", "process")
    assert send(d, 30)[0] == 0
    wait_until(lambda: wrote(d, "slave2") == wrote(d, "master"), 30, "slave2 caught up")
    before = records(d, "slave2")
    pid = int(status(d)["slave2"]["pid"])  # type: ignore[call-overload]

    out = json.loads(ok("cluster", "lose", "slave2", "--dir", d, "--json"))
    assert out["node"]["state"] == "lost"
    lost_dir = Path(d, "nodes", "slave2", "lost-1")
    assert out["node"]["lost"] == [str(lost_dir)]
    assert out["node"]["pid"] is None and process_gone(pid)
    assert sorted(os.listdir(Path(d, "nodes", "slave2", "data"))) == []
    assert (lost_dir / "commitlog").is_dir() and os.listdir(lost_dir / "commitlog")
    assert status(d)["slave2"]["state"] == "lost"
    fails("cluster", "start", "slave2", "--dir", d, message="was lost")

    # A replacement machine: empty store, catches up from the master.
    assert send(d, 10)[0] == 0
    out = ok("cluster", "rejoin", "slave2", "--dir", d)
    assert "connected" in out, out
    wait_until(lambda: wrote(d, "slave2") == wrote(d, "master"), 30, "replacement caught up")
    assert records(d, "slave2") == records(d, "master")
    assert records(d, "slave2")[:len(before)] == before
    assert (lost_dir / "commitlog").is_dir()  # the evidence stays

    # Losing the master leaves no route until a slave is promoted.
    ok("cluster", "lose", "master", "--dir", d)
    assert route(d)["master"] is None and route(d)["epoch"] == 2
    code, summary = send(d, 2)
    assert code == 1 and summary["counts"] == {"NO_ROUTE": 2}
    fails("cluster", "rejoin", "master", "--dir", d, message="no master to follow")
    ok("cluster", "promote", "slave1", "--dir", d)
    assert status(d)["slave1"]["role"] == "ASYNC_MASTER"  # the old master's role
    assert send(d, 5)[0] == 0


def _longer_old_master(d: str, policy: str) -> tuple[list[str], list[str]]:
    """An ASYNC_MASTER that took puts its slave never got (the link cut),
    killed (process crash model: it keeps them), and the slave promoted.
    Returns (old master's records, new master's records) after 5 more puts
    on the new master."""
    up(d, "--slaves", "1", "--role", "ASYNC_MASTER", "--crash-model", "process",
       "--slave-ahead-policy", policy)
    assert send(d, 10)[0] == 0
    wait_until(lambda: wrote(d, "slave1") == wrote(d, "master"), 30, "slave1 caught up")
    ok("cluster", "partition", "master", "slave1", "--dir", d)
    assert send(d, 8)[0] == 0  # acknowledged, never replicated
    old_log = records(d, "master")
    ok("cluster", "kill", "master", "--dir", d)
    ok("cluster", "promote", "slave1", "--dir", d)
    assert send(d, 5)[0] == 0
    return old_log, records(d, "slave1")


@pytest.mark.parametrize("policy", ["reject", "truncate"])
def test_rejoin_of_an_old_master_ahead_follows_the_slave_ahead_policy(
        tmp_path: Path, cluster_dirs: list[str], policy: str) -> None:
    d = str(tmp_path / "c")
    cluster_dirs.append(d)
    old_log, new_log = _longer_old_master(d, policy)
    assert len(old_log) == 18 and len(new_log) == 15 and old_log[:10] == new_log[:10]

    out = json.loads(ok("cluster", "rejoin", "master", "--dir", d, "--json"))
    assert out["node"]["role"] == "SLAVE" and out["route"]["master"] == "slave1"
    if policy == "reject":
        # Both logs kept as they are; the master refuses the link.
        assert out["node"]["link"].startswith("rejected"), out
        assert records(d, "master") == old_log
        assert records(d, "slave1") == new_log
    else:
        # The old master's unreplicated tail is cut; it then follows.
        wait_until(lambda: records(d, "master") == records(d, "slave1"), 30,
                   "the old master truncated and caught up")
        assert records(d, "master") == new_log
        links = status(d)["slave1"]["status"]["slaves"]  # type: ignore[index]
        assert [(x["slave"], x["state"]) for x in links] == [("master", "connected")]


def test_refusals_exit_2_with_their_reason(tmp_path: Path, cluster_dirs: list[str]) -> None:
    d = str(tmp_path / "c")
    cluster_dirs.append(d)
    up(d, "--slaves", "1", "--role", "ASYNC_MASTER")
    for action in ("promote", "lose", "rejoin"):
        fails("cluster", action, "nope", "--dir", d, message="no node 'nope'")
    fails("cluster", "promote", "master", "--dir", d, message="already the master")
    fails("cluster", "rejoin", "slave1", "--dir", d, message="it is running")
    fails("cluster", "rejoin", "master", "--dir", d, message="it is running")
    ok("cluster", "stop", "slave1", "--dir", d)
    fails("cluster", "promote", "slave1", "--dir", d, message="it is not running")
    ok("cluster", "lose", "slave1", "--dir", d)
    fails("cluster", "lose", "slave1", "--dir", d, message="already lost")
    fails("cluster", "lose", "master", "--dir", d, message="only node left")
    fails("cluster", "promote", "slave1", "--dir", d, message="it was lost")
    assert status(d)["master"]["state"] == "running"  # no refusal changed anything
    assert send(d, 3)[0] == 0
    r = dlab("cluster", "promote", "master", "--dir", d, "--role", "SLAVE")
    assert r.returncode == 2 and "invalid choice" in r.stderr
    fails("cluster", "promote", "slave1", "--dir", str(tmp_path / "none"),
          message="no cluster in")


def test_every_failover_command_has_help() -> None:
    for action in ("promote", "lose", "rejoin"):
        r = dlab("cluster", action, "--help")
        assert r.returncode == 0 and "--json" in r.stdout and "exit status" in r.stdout


def test_a_put_stored_by_a_node_the_route_no_longer_names_master_is_marked_stale(
        tmp_path: Path, cluster_dirs: list[str]) -> None:
    """The split brain a client can see: its put is stalled on the master
    (a failpoint delay after the append) while the route moves to another
    node (as a name server would after the operator promoted it); the old
    master then stores and acknowledges the put."""
    import asyncio

    from cluster.backends.local import LocalBackend
    from cluster.client.routing import RoutedClient, RouteSource
    from cluster.client.sendload import LoadReport
    from cluster.node.route import Route

    d = str(tmp_path / "c")
    cluster_dirs.append(d)
    up(d, "--slaves", "1", "--role", "ASYNC_MASTER")
    backend = LocalBackend(d)
    backend.set_failpoints("master", "after_append_before_flush=delay:2000@1")
    backend.restart("master")
    addresses = {n.name: n.address for n in backend.nodes()}
    token = read_token_file(os.path.join(d, "token"))

    def move_route_to_slave1() -> None:
        tmp = Path(d, "route.json.tmp")
        tmp.write_text(json.dumps(Route(master="slave1", address=addresses["slave1"],
                                        since_ms=1, epoch=2).to_dict()))
        os.replace(tmp, Path(d, "route.json"))

    async def go() -> list[SendOutcome]:
        async with RoutedClient(RouteSource(d), token=token, timeout_s=10) as c:
            stalled = asyncio.ensure_future(c.send(make_message("t", b"x", msg_id="m1")))
            await asyncio.sleep(0.7)  # the put is in the master's stall now
            move_route_to_slave1()
            first = await stalled
            second = await c.send(make_message("t", b"y", msg_id="m2"))
            return [first, second]

    first, second = asyncio.run(go())
    assert first.status == "PUT_OK" and first.node == addresses["master"]
    assert first.stale_master
    # The next put follows the route to slave1, which refuses puts (not
    # stale: it stored nothing).
    assert second.status == "SERVICE_NOT_AVAILABLE" and not second.stale_master
    report = LoadReport("x", 2, 1, 1, 0.0, outcomes=[first, second])
    assert report.summary()["stale_master_acks"] == 1


def test_promote_over_a_partitioned_master_leaves_it_running_as_a_second_master(
        tmp_path: Path, cluster_dirs: list[str]) -> None:
    """The operator cannot reach a master cut off from the slave it promotes
    (the isolated-master scenario, as the sim does it): the promotion
    restarts only the slave, says the old master is cut off, and the old
    master still serves puts as a master; once stopped, it rejoins as a
    slave, and a log that took other puts at the same offsets is reported
    as diverged, not waited on until the timeout."""
    d = str(tmp_path / "c")
    cluster_dirs.append(d)
    up(d, "--role", "ASYNC_MASTER")
    code, first = send(d, 10)
    assert code == 0
    wait_until(lambda: wrote(d, "slave1") == wrote(d, "master"), 30, "slave1 caught up")
    ok("cluster", "partition", "master", "slave1", "--dir", d)
    old_address = str(status(d)["master"]["address"])
    out = ok("cluster", "promote", "slave1", "--dir", d, "--json")
    assert json.loads(out)["node"]["cut_off"] == ["master"], out
    st = status(d)
    assert st["master"]["state"] == "running" and route(d)["master"] == "slave1"
    # The old master still acknowledges a put sent to it directly.
    with NodeClient(old_address, token=read_token_file(os.path.join(d, "token"))) as c:
        outcome = c.send(make_message("t", b"x" * 100, msg_id="split-brain-1"))
    assert outcome.status == "PUT_OK", outcome
    code, after = send(d, 5)  # the route leads to the new master
    assert code == 0
    ok("cluster", "heal", "master", "slave1", "--dir", d)
    ok("cluster", "stop", "master", "--dir", d)
    started = time.monotonic()
    out = ok("cluster", "rejoin", "master", "--dir", d, "--json")
    link = json.loads(out)["node"]["link"]
    # Its 11th record (100 bytes) ends inside the new master's 11th (200):
    # no record starts there, so nothing can be shipped to it.
    assert link.startswith("diverged") and "diverged from this master" in link, link
    assert time.monotonic() - started < 45, "rejoin waited for a link that cannot settle"
