"""Failpoints fire at their point and only there, on real nodes.

Every failpoint is armed on both nodes with a hit count never reached, so
the nodes count each visit; the counts must match what the traffic did.
Then each replication failpoint is armed to crash on its first hit and must
kill exactly the node it belongs to."""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Iterator

import pytest
from support.ha_helpers import wait_connected

from cluster.backends.interface import ClusterSpec, NodeSpec, NodeState
from cluster.backends.local import LocalBackend
from cluster.client.node_client import NodeClient, make_message
from cluster.node.role import Role
from store.failpoints import KNOWN, Failpoints, FailpointSpecError

COUNT_ONLY = ",".join(f"{name}=delay:0@999999999" for name in KNOWN)
SMALL = ("--max-message-size", "16384")


def _spec(directory: str, *, master_fp: str, slave_fp: str) -> ClusterSpec:
    common = {"flush": "SYNC_FLUSH", "segment_size_bytes": 64 * 1024, "extra_args": SMALL}
    return ClusterSpec(
        directory=directory,
        master=NodeSpec(name="master", role=Role.SYNC_MASTER, failpoints=master_fp, **common),
        slaves=(NodeSpec(name="slave1", role=Role.SLAVE, failpoints=slave_fp, **common),),
    )


@pytest.fixture
def backend(tmp_path: str) -> Iterator[LocalBackend]:
    b = LocalBackend(os.path.join(tmp_path, "cluster"))
    try:
        yield b
    finally:
        b.down()


def test_each_failpoint_is_visited_only_where_it_belongs(backend: LocalBackend,
                                                         tmp_path: str) -> None:
    token = secrets.token_hex(8)
    backend.up(_spec(os.path.join(tmp_path, "cluster"), master_fp=COUNT_ONLY,
                     slave_fp=COUNT_ONLY), token=token)
    wait_connected(backend, token)  # SYNC_MASTER: a put before the link is SLAVE_NOT_AVAILABLE
    sends = 40
    with NodeClient(backend.node("master").address, token=token) as client:
        for i in range(sends):
            out = client.send(make_message("fp", os.urandom(4000), msg_id=f"m{i}"))
            assert out.status == "PUT_OK", out
        master = client.status_dict()["failpoint_hits"]
    with NodeClient(backend.node("slave1").address, token=token) as client:
        slave = client.status_dict()["failpoint_hits"]

    def segments(name: str) -> int:
        return len(os.listdir(os.path.join(backend.node(name).data_dir, "commitlog")))

    assert master["after_append_before_flush"] == sends  # one append per send
    assert master["after_ship_before_ack"] >= 1
    assert master["segment_roll"] == segments("master") >= 3
    assert master["slave_after_append_before_report"] == 0
    assert master["recovery_truncate"] == 0
    assert master["before_flush_sync"] >= 1 and slave["before_flush_sync"] >= 1
    assert slave["slave_after_append_before_report"] >= 1
    assert slave["segment_roll"] == segments("slave1")
    assert slave["after_append_before_flush"] == 0  # a slave never appends a put
    assert slave["after_ship_before_ack"] == 0
    assert slave["recovery_truncate"] == 0
    assert master["after_put_answered"] == sends  # one answer per send, each PUT_OK
    assert slave["after_put_answered"] == 0
    assert slave["slave_after_report"] >= 1 and master["slave_after_report"] == 0


@pytest.mark.parametrize("node,failpoint", [
    ("master", "after_ship_before_ack"),
    ("slave1", "slave_after_append_before_report"),
    ("master", "after_append_before_flush"),
])
def test_a_crash_failpoint_kills_its_node_on_the_first_hit(backend: LocalBackend, tmp_path: str,
                                                           node: str, failpoint: str) -> None:
    token = secrets.token_hex(8)
    armed = f"{failpoint}=crash@1"
    backend.up(_spec(os.path.join(tmp_path, "cluster"),
                     master_fp=armed if node == "master" else "",
                     slave_fp=armed if node == "slave1" else ""), token=token)
    with NodeClient(backend.node("master").address, token=token, timeout_s=5) as client:
        client.send(make_message("fp", b"x" * 100, msg_id="first"))
    deadline = time.monotonic() + 30  # the crash is at once; the margin is for a loaded machine
    while backend.node(node).state != NodeState.STOPPED and time.monotonic() < deadline:
        time.sleep(0.05)
    assert backend.node(node).state == NodeState.STOPPED
    other = "slave1" if node == "master" else "master"
    assert backend.node(other).state == NodeState.RUNNING
    with open(backend.node(node).log_path) as f:
        assert f"failpoint {failpoint} fired (crash) on hit 1" in f.read()


@pytest.mark.parametrize("spec,message", [
    ("nope=crash@1", "unknown failpoint 'nope'"),
    ("segment_roll=explode@1", "action is crash, delay:MS"),
    ("segment_roll=crash@0", "at least 1"),
    ("segment_roll=crash@x", "must be an integer"),
    ("segment_roll", "expected name=action@N"),
])
def test_bad_failpoint_specs_are_refused_with_the_reason(spec: str, message: str) -> None:
    with pytest.raises(FailpointSpecError, match=message):
        Failpoints(spec)


def test_disarmed_failpoints_do_nothing_measurable() -> None:
    fp = Failpoints("")
    # CPU time, not wall time: another process on a loaded machine takes
    # the CPU away from this loop, not cycles per hit.
    t0 = time.process_time()
    for _ in range(100_000):
        fp.hit("after_append_before_flush")
    per_hit_us = (time.process_time() - t0) / 100_000 * 1e6
    assert per_hit_us < 2.0  # a dict check; a put costs tens of microseconds
    assert fp.hits() == {}
