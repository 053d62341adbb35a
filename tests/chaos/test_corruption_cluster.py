"""Corruption policies on real nodes (docs/design.md, corruption policy): `dlab cluster` and
`dlab node` as separate processes, one bit flipped in the middle of a
stopped node's flushed CommitLog on disk.

- refuse (default): `cluster start` exits 2 naming the segment, offset and
  what a cut would lose; `cluster status` shows the node REFUSED; the store
  directory is as it was;
- repair: a master fetches the range from its slave over gRPC (refused
  while no replica is up), a slave from its master; every acknowledged
  message is back;
- truncate: RocketMQ's cut, logged at ERROR and shown in status."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator

import pytest
from support.cli_helpers import dlab, ok
from support.ha_helpers import FAST, log_text, wait_until
from support.store_helpers import snapshot

from chaos.harness.readback import read_back
from cluster.backends.local import LocalBackend
from cluster.client.node_client import NodeClient
from store.log.segments import segment_name

SEGMENT = 256 * 1024
COUNT = 3000




def status(d: str, *, down: str | None = None) -> dict[str, dict[str, object]]:
    """`cluster status --json` by node; it exits 1 (naming the node) while
    `down` is not running, 0 when every node answers."""
    r = dlab("cluster", "status", "--dir", d, "--json")
    assert "Traceback" not in r.stderr
    if down is None:
        assert r.returncode == 0, r.stderr
    else:
        assert r.returncode == 1 and down in r.stderr, (r.returncode, r.stderr)
    return {row["name"]: row for row in json.loads(r.stdout)}


def msg_ids(d: str, name: str) -> list[str | None]:
    b = LocalBackend(d)
    with NodeClient(b.node(name).address, token=b.token(), timeout_s=10) as c:
        return [r.msg_id for r in c.read_all()]


def data_dir(d: str, name: str) -> str:
    return os.path.join(d, "nodes", name, "data")


@pytest.fixture
def loaded(tmp_path: str) -> Iterator[str]:
    """An ASYNC_MASTER cluster with one slave holding COUNT acknowledged
    messages over several segments, replication caught up."""
    d = os.path.join(str(tmp_path), "c")
    ok("cluster", "up", "--dir", d, "--role", "ASYNC_MASTER", "--flush", "ASYNC_FLUSH",
       "--slaves", "1", "--segment-size", str(SEGMENT), "--node-args", " ".join(FAST))
    try:
        out = ok("send", "--dir", d, "--count", str(COUNT), "--size", "200",
                 "--concurrency", "8")
        assert re.search(rf"PUT_OK\s+{COUNT}\b", out), out
        b = LocalBackend(d)
        wait_until(lambda: all(
            NodeClient(b.node(n).address, token=b.token()).status().wrote
            == NodeClient(b.node("master").address, token=b.token()).status().wrote
            for n in ("slave1",)), 30, "the slave to catch up")
        yield d
    finally:
        dlab("cluster", "down", "--dir", d)


def flip_middle(d: str, name: str) -> tuple[int, int]:
    """Flip one bit in the body of a record in the middle of the
    second-to-last segment of a stopped node (recovery after a clean stop
    checks the last three, as RocketMQ's does); returns (record offset,
    records after it)."""
    rb = read_back(data_dir(d, name))
    assert len(rb.records) == COUNT
    seg = rb.records[-1]["offset"] // SEGMENT - 1
    assert seg >= 1
    in_seg = [r for r in rb.records if r["offset"] // SEGMENT == seg]
    victim = in_seg[len(in_seg) // 2]
    path = os.path.join(data_dir(d, name), "commitlog", segment_name(seg * SEGMENT))
    with open(path, "r+b") as f:
        at = victim["offset"] - seg * SEGMENT + 88 + 10
        f.seek(at)
        byte = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte ^ 0x10]))
    after = sum(1 for r in rb.records if r["offset"] > victim["offset"])
    return victim["offset"], after


def no_lock(snap: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in snap.items() if k != "lock"}  # the open wrote its pid there


def test_master_refuses_then_repairs_from_its_slave(loaded: str) -> None:
    d = loaded
    expected = msg_ids(d, "slave1")
    assert len(expected) == COUNT
    ok("cluster", "stop", "master", "--dir", d)
    bad, after = flip_middle(d, "master")
    before = snapshot(data_dir(d, "master"))

    r = dlab("cluster", "start", "master", "--dir", d)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "node master refused to start" in r.stderr
    assert f"commitlog/{segment_name(bad - bad % SEGMENT)} at offset {bad}" in r.stderr
    assert f"holding {after} valid record(s)" in r.stderr
    assert "--corruption-policy repair" in r.stderr and "--corruption-policy truncate" in r.stderr
    st = status(d, down="master")
    assert st["master"]["state"] == "refused"
    assert f"corruption at {bad}" in str(st["master"]["refused"])
    shown = dlab("cluster", "status", "--dir", d)
    assert shown.returncode == 1 and "refused" in shown.stdout
    assert no_lock(snapshot(data_dir(d, "master"))) == no_lock(before)
    assert not os.path.exists(os.path.join(data_dir(d, "master"), "abort"))

    # Repair with no replica up: refused, nothing changed.
    ok("cluster", "stop", "slave1", "--dir", d)
    r = dlab("cluster", "start", "master", "--dir", d, "--corruption-policy", "repair")
    assert r.returncode == 2 and "Repair was not possible" in r.stderr, r.stderr
    assert no_lock(snapshot(data_dir(d, "master"))) == no_lock(before)

    ok("cluster", "start", "slave1", "--dir", d)
    ok("cluster", "start", "master", "--dir", d, "--corruption-policy", "repair")
    assert msg_ids(d, "master") == expected
    rec = status(d)["master"]["status"]["recovery"]  # type: ignore[index]
    assert rec["corruption_action"] == "repaired" and rec["repaired_ranges"][0][0] == bad
    assert "repaired" in ok("cluster", "status", "--dir", d)


def test_truncate_cuts_logs_at_error_and_shows_in_status(loaded: str) -> None:
    d = loaded
    ok("cluster", "stop", "master", "--dir", d)
    bad, after = flip_middle(d, "master")
    ok("cluster", "start", "master", "--dir", d, "--corruption-policy", "truncate")
    rec = status(d)["master"]["status"]["recovery"]  # type: ignore[index]
    assert rec["corruption_action"] == "truncated" and rec["records_lost"] == after
    assert rec["max_valid_offset"] == bad
    assert len(msg_ids(d, "master")) == COUNT - after - 1
    log = log_text(os.path.join(d, "nodes", "master", "node.log"))
    assert re.search(rf"ERROR master dlab.store: .*cutting at {bad}, {after} valid record", log)
    assert f"{after} records" in ok("cluster", "status", "--dir", d)


def test_a_slave_repairs_from_its_master(loaded: str) -> None:
    d = loaded
    expected = msg_ids(d, "master")
    ok("cluster", "stop", "slave1", "--dir", d)
    flip_middle(d, "slave1")
    r = dlab("cluster", "start", "slave1", "--dir", d)
    assert r.returncode == 2 and "node slave1 refused to start" in r.stderr, r.stderr
    ok("cluster", "start", "slave1", "--dir", d, "--corruption-policy", "repair")
    assert msg_ids(d, "slave1") == expected
