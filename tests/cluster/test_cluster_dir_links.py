"""`dlab cluster up` never writes through a symbolic link: not into a node's
store (the node refuses its open, store/layout.py), nor into the cluster
directory's own files (cluster/backends/dir_files.py). Each case links an
entry to a scratch file under tmp_path with known bytes, runs the real CLI
(real node processes), and checks the scratch file's bytes and mtime."""

from __future__ import annotations

import os
from pathlib import Path

from support.cli_helpers import dlab

SCRATCH = b"precious: not the cluster's\n"


def _scratch(tmp_path: Path) -> tuple[Path, tuple[int, int]]:
    target = tmp_path / "scratch"
    target.write_bytes(SCRATCH)
    st = os.stat(target)
    return target, (st.st_size, st.st_mtime_ns)


def _unchanged(target: Path, before: tuple[int, int]) -> None:
    st = os.stat(target)
    assert target.read_bytes() == SCRATCH
    assert (st.st_size, st.st_mtime_ns) == before


def test_cluster_up_refuses_a_linked_token_file(tmp_path: Path) -> None:
    target, before = _scratch(tmp_path)
    d = tmp_path / "cluster"
    d.mkdir()
    (d / "token").symlink_to(target)
    r = dlab("cluster", "up", "--dir", str(d), "--slaves", "0")
    try:
        assert r.returncode == 2, r.stderr
        assert "Traceback" not in r.stderr
        last = r.stderr.strip().splitlines()[-1]
        assert f"{d / 'token'} is a symbolic link" in last, r.stderr
    finally:
        if (d / "cluster.json").exists():
            dlab("cluster", "down", "--dir", str(d))
    _unchanged(target, before)


def test_cluster_up_with_a_linked_store_lock_starts_no_node_and_leaves_the_target(
        tmp_path: Path) -> None:
    """The node refuses to open its store; `up` reports it; the file the
    lock linked to does not get the node's pid."""
    target, before = _scratch(tmp_path)
    d = tmp_path / "cluster"
    data = d / "nodes" / "master" / "data"
    data.mkdir(parents=True)
    (data / "lock").symlink_to(target)
    r = dlab("cluster", "up", "--dir", str(d), "--slaves", "0")
    try:
        assert r.returncode != 0, r.stdout
        assert "Traceback" not in r.stderr
        assert f"{data / 'lock'} is a symbolic link" in r.stderr, r.stderr
    finally:
        if (d / "cluster.json").exists():
            dlab("cluster", "down", "--dir", str(d))
    _unchanged(target, before)
    assert (data / "lock").is_symlink()
    assert sorted(os.listdir(data)) == ["lock"]  # the node made nothing in its store
