"""The failover rules (cluster/backends/failover.py) on a cluster state
alone, and the route's format (cluster/node/route.py): what each operation
changes, and the route a client reads back."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cluster.backends.failover import (
    decide_promote,
    decide_rejoin,
    plan_lose,
    plan_promote,
    plan_rejoin,
    refuse_lost,
    route_of,
)
from cluster.backends.interface import BackendError
from cluster.node.role import Role
from cluster.node.route import Route, RouteError, read_route
from store.config import FlushMode


def state(slaves: int = 2) -> dict[str, Any]:
    """A cluster state as the local backend's `up` writes it."""
    nodes: dict[str, Any] = {"master": {"spec": {"role": "SYNC_MASTER", "flush": "SYNC_FLUSH"},
                                        "address": "127.0.0.1:7000", "master_via": None}}
    proxies: dict[str, Any] = {}
    for i in range(1, slaves + 1):
        nodes[f"slave{i}"] = {"spec": {"role": "SLAVE", "flush": "ASYNC_FLUSH"},
                              "address": f"127.0.0.1:70{i:02d}",
                              "master_via": f"127.0.0.1:71{i:02d}"}
        proxies[f"slave{i}"] = {"port": 7100 + i, "target": "127.0.0.1:7000", "pid": None,
                                "start_time": None, "cut": False}
    return {"master": "master", "started_ms": 5, "nodes": nodes, "proxies": proxies,
            "route": {"master": "master", "since_ms": 5, "epoch": 1}}


def ports() -> Any:
    return iter(range(7200, 7300)).__next__


def test_promote_takes_the_old_masters_modes_and_the_others_follow() -> None:
    s = state()
    plan = plan_promote(s, "slave1", running={"slave1", "slave2"}, now_ms=9, free_port=ports())
    assert s["master"] == "slave1"
    assert s["nodes"]["slave1"]["spec"] == {"role": "SYNC_MASTER", "flush": "SYNC_FLUSH"}
    assert s["nodes"]["slave1"]["master_via"] is None and "slave1" not in s["proxies"]
    assert plan.dropped_proxy is not None and plan.dropped_proxy["port"] == 7101
    # slave2's proxy leads to the new master; the old master gets a proxy of its own.
    assert s["proxies"]["slave2"]["target"] == "127.0.0.1:7001"
    assert s["proxies"]["master"] == {"port": 7200, "target": "127.0.0.1:7001", "pid": None,
                                      "start_time": None, "cut": False}
    assert s["nodes"]["master"]["master_via"] == "127.0.0.1:7200"
    assert s["nodes"]["master"]["spec"]["role"] == "SLAVE"
    assert set(plan.retarget) == {"slave2", "master"}
    assert plan.restart == ("slave1",)  # the old master is not running: nothing to restart
    assert route_of(s) == Route(master="slave1", address="127.0.0.1:7001", since_ms=9, epoch=2)


def test_a_cut_link_to_the_old_master_does_not_cut_the_link_to_the_new_one() -> None:
    """The master cut off from both slaves (an isolated master), slave2
    promoted: slave1's proxy now leads to slave2 and is whole, as the sim's
    partition of the pair master-slave1 leaves slave1-slave2 alone."""
    s = state()
    for name in ("slave1", "slave2"):
        s["proxies"][name]["cut"] = True
    plan = plan_promote(s, "slave2", running={"master", "slave1", "slave2"}, now_ms=9,
                        free_port=ports())
    assert s["proxies"]["slave1"] == {"port": 7101, "target": "127.0.0.1:7002", "pid": None,
                                      "start_time": None, "cut": False}
    assert "slave1" in plan.retarget


def test_promote_with_given_modes_restarts_a_running_old_master_as_a_slave() -> None:
    s = state(slaves=1)
    plan = plan_promote(s, "slave1", running={"master", "slave1"}, now_ms=9,
                        free_port=ports(), role=Role.ASYNC_MASTER, flush=FlushMode.ASYNC_FLUSH)
    assert s["nodes"]["slave1"]["spec"] == {"role": "ASYNC_MASTER", "flush": "ASYNC_FLUSH"}
    assert plan.restart == ("slave1", "master") and plan.old_master == "master"


@pytest.mark.parametrize(("name", "running", "message"), [
    ("nope", {"slave1"}, "no node 'nope'"),
    ("master", {"master", "slave1"}, "already the master"),
    ("slave1", {"master"}, "it is not running"),
])
def test_promote_refusals_change_nothing(name: str, running: set[str], message: str) -> None:
    s = state()
    before = json.dumps(s, sort_keys=True)
    with pytest.raises(BackendError, match=message):
        plan_promote(s, name, running=running, now_ms=9, free_port=ports())
    assert json.dumps(s, sort_keys=True) == before


def test_losing_the_master_empties_the_route_until_a_promotion() -> None:
    s = state()
    assert plan_lose(s, "master", now_ms=7, taken={"data", "lost-1"}) == "lost-2"
    assert route_of(s) == Route(master=None, address=None, since_ms=7, epoch=2)
    with pytest.raises(BackendError, match="no master to follow"):
        plan_rejoin(s, "master", running={"slave1", "slave2"}, free_port=ports())
    with pytest.raises(BackendError, match="it was lost"):
        plan_promote(s, "master", running=set(), now_ms=8, free_port=ports())
    plan_promote(s, "slave2", running={"slave1", "slave2"}, now_ms=8, free_port=ports())
    assert s["nodes"]["slave2"]["spec"]["role"] == "SYNC_MASTER"  # the lost master's
    assert route_of(s).epoch == 3 and route_of(s).master == "slave2"
    # The promotion gave the lost master a proxy to slave2 already.
    assert not plan_rejoin(s, "master", running={"slave1", "slave2"}, free_port=ports())
    assert s["nodes"]["master"]["lost"] is False
    assert s["proxies"]["master"]["target"] == "127.0.0.1:7002"


def test_the_last_node_with_a_store_cannot_be_lost() -> None:
    s = state(slaves=1)
    plan_lose(s, "slave1", now_ms=1, taken=set())
    with pytest.raises(BackendError, match="only node left"):
        plan_lose(s, "master", now_ms=2, taken=set())
    with pytest.raises(BackendError, match="already lost"):
        plan_lose(s, "slave1", now_ms=2, taken=set())


def test_rejoin_refuses_a_running_node_and_the_master() -> None:
    s = state()
    with pytest.raises(BackendError, match="it is running"):
        plan_rejoin(s, "slave1", running={"slave1"}, free_port=ports())
    with pytest.raises(BackendError, match="it is the cluster's master"):
        plan_rejoin(s, "master", running=set(), free_port=ports())
    assert not plan_rejoin(s, "slave1", running=set(), free_port=ports())  # proxy as it was


def test_a_backend_without_link_proxies_gets_the_same_decisions() -> None:
    """compose's state (no proxies, no master_via): decide_* change the
    roles and the route exactly as plan_* do, and touch no link."""
    s = state(slaves=2)
    for n in s["nodes"].values():
        del n["master_via"]
    s["proxies"] = {}
    plan = decide_promote(s, "slave2", running={"master", "slave1", "slave2"}, now_ms=9)
    assert (plan.old_master, plan.restart, plan.followers) == (
        "master", ("slave2", "master"), ("master", "slave1"))
    assert plan.dropped_proxy is None and plan.retarget == ()
    assert s["proxies"] == {} and all("master_via" not in n for n in s["nodes"].values())
    assert [s["nodes"][n]["spec"]["role"] for n in ("master", "slave1", "slave2")] == [
        "SLAVE", "SLAVE", "SYNC_MASTER"]
    assert route_of(s) == Route(master="slave2", address="127.0.0.1:7002", since_ms=9, epoch=2)
    plan_lose(s, "slave1", now_ms=10, taken=set())
    with pytest.raises(BackendError, match="was lost .* rejoin slave1"):
        refuse_lost(s, "slave1")
    assert decide_rejoin(s, "slave1", running={"slave2"}) == route_of(s)
    assert s["nodes"]["slave1"]["lost"] is False and s["proxies"] == {}
    refuse_lost(s, "slave1")  # rejoined: it may start again


def test_an_old_master_cut_off_from_the_promoted_slave_keeps_running_as_a_master() -> None:
    """The operator cannot reach a master partitioned from the slave it
    promotes (the isolated-master scenario, alike on every backend): the
    plan restarts only the new master, names the old one `cut_off`, and the
    state makes it a slave from its next start; without the cut it is
    restarted as a slave at once."""
    s = state(slaves=1)
    plan = decide_promote(s, "slave1", running={"master", "slave1"}, now_ms=5,
                          cut_off=frozenset({"master"}))
    assert (plan.restart, plan.cut_off) == (("slave1",), ("master",))
    assert s["nodes"]["master"]["spec"]["role"] == "SLAVE"
    assert route_of(s).master == "slave1"
    s = state(slaves=1)
    plan = decide_promote(s, "slave1", running={"master", "slave1"}, now_ms=5)
    assert (plan.restart, plan.cut_off) == (("slave1", "master"), ())
    s = state(slaves=1)  # a cut-off master that is down is simply a follower
    plan = decide_promote(s, "slave1", running={"slave1"}, now_ms=5,
                          cut_off=frozenset({"master"}))
    assert (plan.restart, plan.cut_off) == (("slave1",), ())


def test_a_route_reads_back_and_a_bad_one_is_named(tmp_path: Path) -> None:
    with pytest.raises(RouteError, match="no route in"):
        read_route(str(tmp_path))
    r = Route(master="slave1", address="127.0.0.1:7001", since_ms=3, epoch=2)
    (tmp_path / "route.json").write_text(json.dumps(r.to_dict()))
    assert read_route(str(tmp_path)) == r
    for bad in ('{"version": 1, "master": "a", "address": null, "since_ms": 1, "epoch": 1}',
                '{"version": 1, "master": null, "address": null, "since_ms": 1, "epoch": 0}',
                '{"version": 9}', "[]", "{"):
        (tmp_path / "route.json").write_text(bad)
        with pytest.raises(RouteError):
            read_route(str(tmp_path))
