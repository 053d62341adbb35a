"""`dlab cluster up --corruption-policy repair` on a stopped cluster whose
master holds a damaged flushed record its slave holds intact: the master
repairs from the slave every time (the slaves start first, and a repairing
node waits for a replica to answer), and an `up` that fails on a refusal
leaves the cluster so `dlab cluster start master --corruption-policy
repair` works — on the local and compose backends
(cluster/backends/local.py, compose.py, cluster/node/repair.py)."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator

import pytest
from support.cli_helpers import dlab, ok
from support.compose_support import needs_engine, one_engine_user
from support.ha_helpers import FAST, wait_until

from chaos.harness.readback import read_back
from cluster.backends.procs import free_ports
from cluster.backends.registry import backend_of
from cluster.client.node_client import NodeClient
from cluster.node.repair import grpc_repair_source
from store.log.segments import segment_name
from store.store import RepairUnavailableError

SEGMENT = 256 * 1024
COUNT = 3000
UP = ("--role", "ASYNC_MASTER", "--flush", "ASYNC_FLUSH", "--slaves", "1",
      "--segment-size", str(SEGMENT), "--node-args", " ".join(FAST))


def msg_ids(d: str, name: str) -> list[str | None]:
    b = backend_of(d)
    with NodeClient(b.node(name).address, token=b.token(), timeout_s=10) as c:
        return [r.msg_id for r in c.read_all()]


def master_recovery(d: str) -> dict[str, object]:
    r = dlab("cluster", "status", "--dir", d, "--json")
    assert r.returncode == 0, r.stderr
    rows = {row["name"]: row for row in json.loads(r.stdout)}
    return rows["master"]["status"]["recovery"]  # type: ignore[no-any-return]


def flip(d: str, nth: int) -> int:
    """Flip a bit in the body of a record of the second-to-last segment of
    the stopped master (recovery after a clean stop checks the last three);
    a different record each `nth`. Returns the record's offset."""
    data = os.path.join(d, "nodes", "master", "data")
    rb = read_back(data)
    assert len(rb.records) == COUNT
    seg = rb.records[-1]["offset"] // SEGMENT - 1
    in_seg = [r for r in rb.records if r["offset"] // SEGMENT == seg]
    victim = in_seg[len(in_seg) // 2 + nth]
    with open(os.path.join(data, "commitlog", segment_name(seg * SEGMENT)), "r+b") as f:
        at = victim["offset"] - seg * SEGMENT + 88 + 10
        f.seek(at)
        byte = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte ^ 0x10]))
    return int(victim["offset"])


@pytest.fixture(params=["local", pytest.param("compose", marks=[needs_engine,
                                                                   one_engine_user])])
def stopped(request: pytest.FixtureRequest, tmp_path: str
            ) -> Iterator[tuple[str, list[str | None], tuple[str, ...]]]:
    """A stopped cluster (`cluster down`) whose master and slave hold the
    same COUNT messages over several segments; those messages' ids; and the
    `cluster up` arguments that made it (compose starts every node at once:
    there the master's repair waits for its slave)."""
    d = os.path.join(str(tmp_path), "c")
    up = (*UP, "--backend", request.param)
    ok("cluster", "up", "--dir", d, *up)
    try:
        out = ok("send", "--dir", d, "--count", str(COUNT), "--size", "200",
                 "--concurrency", "8")
        assert re.search(rf"PUT_OK\s+{COUNT}\b", out), out
        wait_until(lambda: msg_ids(d, "slave1") == msg_ids(d, "master"), 30,
                   "the slave to catch up")
        expected = msg_ids(d, "master")
    finally:
        ok("cluster", "down", "--dir", d)
    assert len(expected) == COUNT
    try:
        yield d, expected, up
    finally:
        dlab("cluster", "down", "--dir", d)


def test_up_with_repair_repairs_the_master_every_time(
        stopped: tuple[str, list[str | None], tuple[str, ...]]) -> None:
    d, expected, up = stopped
    for attempt in range(3):
        bad = flip(d, attempt)
        r = dlab("cluster", "up", "--dir", d, *up, "--corruption-policy", "repair")
        assert r.returncode == 0 and "Traceback" not in r.stderr, (attempt, r.stderr)
        rec = master_recovery(d)
        assert rec["corruption_action"] == "repaired", (attempt, rec)
        assert rec["repaired_ranges"][0][0] == bad  # type: ignore[index]
        assert msg_ids(d, "master") == expected
        ok("cluster", "down", "--dir", d)


def test_a_refused_up_leaves_the_cluster_for_start_with_repair(
        stopped: tuple[str, list[str | None], tuple[str, ...]]) -> None:
    d, expected, up = stopped
    bad = flip(d, 0)
    r = dlab("cluster", "up", "--dir", d, *up)  # the default policy: refuse
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "node master refused to start" in r.stderr and f"at offset {bad}" in r.stderr
    ok("cluster", "start", "master", "--dir", d, "--corruption-policy", "repair")
    assert f"dlab cluster start master --dir {os.path.abspath(d)} --corruption-policy repair" \
        in r.stderr  # the refusal said how
    assert master_recovery(d)["corruption_action"] == "repaired"
    assert msg_ids(d, "master") == expected
    assert msg_ids(d, "slave1") == expected


def test_repair_waits_for_a_replica_then_names_the_fix() -> None:
    # Nobody listens at the address: asked again until the wait ends, then
    # a message that says what to do.
    (port,) = free_ports(1)
    now = [0.0]
    asked: list[float] = []

    def sleep(s: float) -> None:
        asked.append(now[0])
        now[0] += s

    fetch = grpc_repair_source([f"127.0.0.1:{port}"], "tok", timeout_s=2, wait_s=3,
                               clock=lambda: now[0], sleep=sleep)
    with pytest.raises(RepairUnavailableError) as err:
        fetch(0, 100)
    assert len(asked) >= 10
    assert "no replica answered within 3 s" in str(err.value)
    assert "dlab cluster start SLAVE" in str(err.value)
