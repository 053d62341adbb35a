"""Errors that name the real problem: a cluster command on a directory that
holds no cluster (and creates nothing there), a segment file under a name
that is not its start offset, a segment size too small for the largest
message, `dlab store inspect` on a store a running process has open, and
`dlab cluster up` with --node-args that take the node's address away from
the cluster."""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
from pathlib import Path

import pytest
from support.cli_helpers import dlab
from support.ha_helpers import FAST
from support.store_helpers import SEG, fill, message, snapshot

from cluster.backends.interface import BackendError, ClusterSpec, NodeSpec
from cluster.backends.local import LocalBackend
from cluster.node.auth import generate_token, write_token_file
from cluster.node.role import Role
from store.config import TESTING
from store.log.segments import segment_name
from store.store import MessageStore, StoreOpenError


# ------------------------------------------------------- cluster commands
def test_cluster_commands_on_a_directory_without_a_cluster_create_nothing(
        tmp_path: Path) -> None:
    missing = tmp_path / "nosuchdir"
    empty = tmp_path / "empty"
    empty.mkdir()
    for d in (missing, empty):
        for action in (["status"], ["down"], ["stop", "master"], ["partition", "a", "b"]):
            r = dlab("cluster", *action, "--dir", str(d))
            assert r.returncode == 2, (action, r.stderr)
            assert f"no cluster in {d}; start one with `dlab cluster up --dir {d}`" in r.stderr
            assert "Traceback" not in r.stderr
    assert not missing.exists()
    assert os.listdir(empty) == []


# ------------------------------------------------------- misnamed segments
def test_a_segment_named_off_its_start_is_named_as_such(tmp_path: Path) -> None:
    fill(tmp_path, 700, body_size=333)  # five 64 KiB segments
    cl = tmp_path / "commitlog"
    assert len(os.listdir(cl)) == 5
    (cl / segment_name(2 * SEG)).rename(cl / segment_name(2 * SEG - 72))
    before = snapshot(tmp_path)
    with pytest.raises(StoreOpenError) as err:
        MessageStore.open(str(tmp_path), TESTING)
    text = str(err.value)
    assert (f"commitlog/{segment_name(2 * SEG - 72)}: the file name is not a multiple of the "
            f"segment size {SEG}") in text
    assert f"its first record says it starts at {2 * SEG}: rename it to " \
           f"{segment_name(2 * SEG)}" in text
    assert "a segment is missing" not in text
    assert snapshot(tmp_path) == before  # refused: nothing changed
    r = dlab("store", "inspect", str(tmp_path))
    assert r.returncode == 0 and "not a multiple of the segment size" in r.stdout
    assert "a segment is missing" not in r.stdout


def test_with_two_segments_a_misnamed_one_does_not_change_the_segment_size(
        tmp_path: Path) -> None:
    fill(tmp_path, 250, body_size=333)
    cl = tmp_path / "commitlog"
    assert sorted(os.listdir(cl)) == [segment_name(0), segment_name(SEG)]
    (cl / segment_name(SEG)).rename(cl / segment_name(SEG - 536))
    with pytest.raises(StoreOpenError) as err:
        MessageStore.open(str(tmp_path), TESTING)
    text = str(err.value)
    assert f"not a multiple of the segment size {SEG}" in text, text
    assert f"rename it to {segment_name(SEG)}" in text
    assert "open it with segment size" not in text


# ------------------------------------------------------- sizes
def test_a_segment_size_below_the_largest_message_names_both_options(tmp_path: Path) -> None:
    token = tmp_path / "token"
    write_token_file(str(token), generate_token())
    r = dlab("node", "--name", "n", "--role", "ASYNC_MASTER", "--data-dir",
             str(tmp_path / "data"), "--token-file", str(token), "--segment-size", "1048576")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "--max-message-size (4194304)" in r.stderr and "--segment-size 1048576" in r.stderr
    assert "raise --segment-size to at least 4194816 or lower --max-message-size to at most " \
           "1048064" in r.stderr
    assert not (tmp_path / "data").exists()
    start = time.monotonic()
    r = dlab("cluster", "up", "--dir", str(tmp_path / "c"), "--slaves", "0",
             "--segment-size", "1048576")
    assert r.returncode == 2 and time.monotonic() - start < 30  # no node was started
    assert "--max-message-size" in r.stderr and "--node-args '--max-message-size" in r.stderr
    assert not (tmp_path / "c").exists()


# ------------------------------------------------------- inspect, live
def test_inspect_of_a_store_in_use_says_so_and_what_it_means(tmp_path: Path) -> None:
    async def run() -> None:
        s = MessageStore.open(str(tmp_path), TESTING)
        await s.start()
        try:
            results = await s.put_batch([message(i) for i in range(20)])
            await s.flush()
            end = results[-1].end
            # What a reader racing the writer sees: bytes past the end of
            # data it read (here written by hand, so the test is exact).
            with open(tmp_path / "commitlog" / segment_name(0), "r+b") as f:
                f.seek(end + 100)
                f.write(b"\x01in flight")
            r = dlab("store", "inspect", str(tmp_path))
            assert r.returncode == 0, r.stderr
            assert f"the store is in use: process {os.getpid()} holds its lock" in r.stdout
            assert "records not yet flushed are not in the files" in r.stdout
            assert "torn write" not in r.stdout
            assert "most likely records written while this was read" in r.stdout
            assert f"held now by pid {os.getpid()}" in r.stdout
            j = json.loads(dlab("store", "inspect", str(tmp_path), "--json").stdout)
            assert j["markers"]["lock_held_by"] == os.getpid()
            assert j["problems"][0].startswith("the store is in use")
        finally:
            await s.close()

    asyncio.run(run())
    j = json.loads(dlab("store", "inspect", str(tmp_path), "--json").stdout)
    assert j["markers"]["lock_held_by"] is None
    assert not any("in use" in p for p in j["problems"])
    assert any("torn write" in p for p in j["problems"])  # stopped: now it is damage


# ------------------------------------------------------- cluster up --node-args
def test_node_args_that_move_a_nodes_address_are_refused_at_once(tmp_path: Path) -> None:
    for node_args, option in (("--listen 0.0.0.0:0", "--listen"),
                              ("--liste=127.0.0.1:7777", "--listen"),
                              ("--data-dir /elsewhere", "--data-dir")):
        start = time.monotonic()
        r = dlab("cluster", "up", "--dir", str(tmp_path / "c"), "--slaves", "0",
                 "--timeout", "20", f"--node-args={node_args}")
        assert time.monotonic() - start < 15, "waited for a node instead of refusing"
        assert r.returncode == 2 and f"--node-args cannot set {option}" in r.stderr, r.stderr
        assert not (tmp_path / "c").exists()


@pytest.mark.parametrize(("args", "message"), [
    (["--advertise", "master:7000"], "--advertise is for --ha-mode controller"),
    (["--ha-mode", "controller", "--controller", "127.0.0.1:1", "--advertise", "nohost"],
     "argument --advertise: 'nohost': expected HOST:PORT"),
    (["--peer-address", "slave1=127.0.0.1:7101"], "--peer-address is for --ha-mode controller"),
    (["--ha-mode", "controller", "--controller", "127.0.0.1:1", "--peer-address",
      "127.0.0.1:7101"], "argument --peer-address: '127.0.0.1:7101': expected NAME=HOST:PORT"),
    (["--ha-mode", "controller", "--controller", "127.0.0.1:1", "--peer-address",
      "slave1=nohost"], "argument --peer-address: 'nohost': expected HOST:PORT"),
    (["--ha-mode", "controller", "--controller", "127.0.0.1:1", "--peer-address",
      "slave/1=127.0.0.1:7101"], "--peer-address slave/1=127.0.0.1:7101: expected NAME=HOST:PORT"),
])
def test_an_advertised_address_outside_controller_mode_or_malformed_is_refused(
        tmp_path: Path, args: list[str], message: str) -> None:
    write_token_file(str(tmp_path / "token"), "t")
    r = dlab("node", "--name", "master", "--role", "ASYNC_MASTER", "--data-dir",
             str(tmp_path / "data"), "--token-file", str(tmp_path / "token"), *args)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert message in r.stderr
    assert not (tmp_path / "data").exists()


def test_a_node_that_does_not_answer_at_its_address_is_named_with_it(tmp_path: Path) -> None:
    backend = LocalBackend()
    spec = ClusterSpec(directory=str(tmp_path / "c"), master=NodeSpec(
        name="master", role=Role.ASYNC_MASTER, segment_size_bytes=256 * 1024,
        extra_args=(*FAST, "--listen", "127.0.0.1:0")))
    with pytest.raises(BackendError) as err:
        backend.up(spec, token=generate_token(), timeout_s=5)
    # The address the cluster gave it (the node listens elsewhere: port 0).
    found = re.search(r"nothing answered a health check at 127\.0\.0\.1:(\d+), the address "
                      r"the cluster gave it \(--listen\)", str(err.value))
    assert found and int(found.group(1)) > 0, str(err.value)
