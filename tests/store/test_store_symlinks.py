"""A store never follows a symbolic link out of its directory (docs/design.md,
"A store never follows a link"; store/layout.py).

Each entry the store writes — `lock`, `abort`, `checkpoint`, `durable-mark`,
a segment, a consume queue file or directory, the consumer offsets, the
`commitlog/` directory itself — made a link to a scratch file or directory
under tmp_path with known content: opening the store refuses with an error
naming the link, the scratch target's bytes and mtime are unchanged, and
nothing in the store changed (every entry's kind, bytes and mtime, the lock
file's too: the refusal comes before the lock is taken). Also through a real
`dlab node` process, `dlab store inspect`, and the harness's power cut.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import stat
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from support.cli_helpers import REPO
from support.store_helpers import fill, mark_abnormal

from cluster.node.auth import write_token_file
from store.config import TESTING, CorruptionPolicy
from store.log.durable_mark import CHECKPOINT_AT, CHECKPOINT_BYTES, COMMITLOG_AT, power_cut
from store.log.segments import list_segments, segment_name
from store.seams.disk import RealDisk
from store.seams.lock import StoreLock
from store.store import MessageStore, StoreOpenError
from store.tools.inspect import InspectError, inspect_store

Entry = tuple[int, int, int, str]  # kind, size, mtime_ns, sha256 or link target


def fingerprint(path: Path) -> dict[str, Entry]:
    """`path` and everything under it, without following a link: kind,
    size, mtime and content (a link: where it points)."""
    out: dict[str, Entry] = {}
    todo = [path]
    while todo:
        p = todo.pop()
        st = os.lstat(p)
        if stat.S_ISLNK(st.st_mode):
            what = os.readlink(p)
        elif stat.S_ISREG(st.st_mode):
            what = hashlib.sha256(p.read_bytes()).hexdigest()
        else:
            what = ""
            if stat.S_ISDIR(st.st_mode):
                todo.extend(sorted(p.iterdir()))
        out[str(p.relative_to(path))] = (stat.S_IFMT(st.st_mode), st.st_size,
                                         st.st_mtime_ns, what)
    return out


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store of several segments, with consume queue files, consumer
    offsets, a checkpoint and a durable mark, closed cleanly; copied per test."""
    store = tmp_path_factory.mktemp("made") / "store"
    fill(store, 700)
    offsets = store / "config" / "consumerOffset.json"
    if not offsets.exists():  # the store writes one at close; make sure of it
        offsets.parent.mkdir(exist_ok=True)
        offsets.write_text('{"offsetTable": {}}')
    assert len(list_segments(str(store / "commitlog")).starts) >= 3
    return store


def _segment(store: Path, which: int) -> Path:
    starts = list_segments(str(store / "commitlog")).starts
    return store / "commitlog" / segment_name(starts[which])


def _queue_dir(store: Path) -> Path:
    return store / "consumequeue" / "TopicTest" / "0"


def _linked_file(where: Callable[[Path], Path], keep: int | None = None,
                 content: bytes | None = None) -> Callable[[Path, Path], Path]:
    """A case: the file `where(store)` becomes a link to a scratch file
    holding `content`, or by default the file's own bytes (its first `keep`):
    the store, through the link, would find what it expects there and carry
    on writing."""
    def make(store: Path, scratch: Path) -> Path:
        entry, target = where(store), scratch / "x"
        target.write_bytes(content if content is not None else entry.read_bytes()[:keep])
        entry.unlink(missing_ok=True)
        entry.symlink_to(target)
        return entry
    return make


def _linked_dir(where: Callable[[Path], Path]) -> Callable[[Path, Path], Path]:
    """A case: the directory `where(store)` moves to scratch and a link
    takes its place."""
    def make(store: Path, scratch: Path) -> Path:
        entry = where(store)
        shutil.move(str(entry), str(scratch / "x"))
        entry.symlink_to(scratch / "x", target_is_directory=True)
        return entry
    return make


# Each case makes one entry of a store a link into a scratch directory.
CASES: dict[str, Callable[[Path, Path], Path]] = {
    "lock": _linked_file(lambda s: s / "lock", content=b"precious\n"),
    "abort": _linked_file(lambda s: s / "abort", content=b"precious\n"),
    "checkpoint": _linked_file(lambda s: s / "checkpoint"),
    "durable-mark": _linked_file(lambda s: s / "durable-mark"),
    # Short: an open would extend the target with zeros.
    "last-segment": _linked_file(lambda s: _segment(s, -1), keep=1000),
    "middle-segment": _linked_file(lambda s: _segment(s, 1)),
    "consume-queue-file": _linked_file(lambda s: _queue_dir(s) / segment_name(0)),
    "consume-queue-dir": _linked_dir(_queue_dir),
    "consume-queue-topic": _linked_dir(lambda s: _queue_dir(s).parent),
    "consumer-offsets": _linked_file(lambda s: s / "config" / "consumerOffset.json"),
    "commitlog-dir": _linked_dir(lambda s: s / "commitlog"),
}


def _setup(made: Path, tmp_path: Path, case: str) -> tuple[Path, Path, Path]:
    store = tmp_path / "store"
    shutil.copytree(made, store)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    link = CASES[case](store, scratch)
    assert link.is_symlink()
    return store, link, scratch / "x"


@pytest.mark.parametrize("policy", [CorruptionPolicy.REFUSE, CorruptionPolicy.TRUNCATE])
@pytest.mark.parametrize("case", sorted(CASES))
def test_open_refuses_a_linked_entry_and_changes_nothing(
        made: Path, tmp_path: Path, case: str, policy: CorruptionPolicy) -> None:
    store, link, target = _setup(made, tmp_path, case)
    if case != "abort":
        mark_abnormal(store)  # abnormal recovery: the most an open would write
    store_before, target_before = fingerprint(store), fingerprint(target)
    with pytest.raises(StoreOpenError) as err:
        MessageStore.open(str(store), dataclasses.replace(TESTING, corruption_policy=policy))
    message = str(err.value)
    assert f"{link} is a symbolic link" in message, message
    assert "put the file itself there, or move the link aside" in message
    assert fingerprint(target) == target_before
    assert fingerprint(store) == store_before



def test_every_bad_entry_is_named_and_kinds_are_checked(made: Path, tmp_path: Path) -> None:
    store, link, target = _setup(made, tmp_path, "lock")
    (store / "abort").mkdir()  # a directory where the store keeps a file
    os.mkfifo(store / "a.fifo")  # not the store's: left alone
    (store / "durable-mark").unlink()
    os.mkfifo(store / "durable-mark")  # not a file: the open would write into a pipe
    before = fingerprint(store)
    with pytest.raises(StoreOpenError) as err:
        MessageStore.open(str(store), TESTING)
    lines = str(err.value).splitlines()
    assert lines[0] == (f"store {store} cannot be opened (nothing was changed, in it or "
                        "where a link points):"), lines
    assert sorted(line.strip().split(" ")[0] for line in lines[1:]) == sorted(
        [str(link), str(store / "abort"), str(store / "durable-mark")]), lines
    assert any("is a directory where the store keeps a file: move it aside" in ln
               for ln in lines)
    assert any("is not a regular file or directory" in ln for ln in lines)
    assert fingerprint(store) == before
    assert target.read_bytes() == b"precious\n"


def test_a_node_process_refuses_a_linked_lock_and_leaves_the_target(
        made: Path, tmp_path: Path) -> None:
    """`dlab cluster up` wrote the node's pid through nodes/<n>/data/lock."""
    store, link, target = _setup(made, tmp_path, "lock")
    before_store, before_target = fingerprint(store), fingerprint(target)
    write_token_file(str(tmp_path / "token"), "tok")
    r = subprocess.run(
        [sys.executable, "-m", "cluster.cli", "node", "--name", "n1", "--role", "ASYNC_MASTER",
         "--data-dir", str(store), "--listen", "127.0.0.1:0", "--token-file",
         str(tmp_path / "token"), "--segment-size", str(TESTING.segment_size_bytes),
         "--max-message-size", str(TESTING.max_message_size_bytes)],
        capture_output=True, text=True, timeout=120, check=False, cwd=REPO)
    assert r.returncode == 2, r.stderr  # a refused open is a usage error: fix the input
    assert "Traceback" not in r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(f"dlab: error: store {store} cannot be opened"), r.stderr
    assert f"{link} is a symbolic link" in last, last
    assert fingerprint(target) == before_target
    assert target.read_bytes() == b"precious\n"
    assert fingerprint(store) == before_store


@pytest.mark.parametrize("case", ["last-segment", "consume-queue-file", "checkpoint", "lock",
                                  "consume-queue-dir"])
def test_inspect_reads_no_link_and_names_each(made: Path, tmp_path: Path, case: str) -> None:
    store, link, target = _setup(made, tmp_path, case)
    before = fingerprint(tmp_path / "scratch")
    report = inspect_store(str(store))
    assert any(f"{link} is a symbolic link" in p for p in report.problems), report.problems
    # What an open would do agrees with the open: it refuses.
    assert not report.recovery.opens
    assert any(f"{link} is a symbolic link" in p for p in report.recovery.refusal)
    assert fingerprint(tmp_path / "scratch") == before
    if case == "last-segment":  # not read: the log ends where it starts
        full = inspect_store(str(made))
        assert report.max_valid_offset == int(link.name) < full.max_valid_offset
        assert link.name not in [s.name for s in report.segments]


def test_power_cut_does_not_write_through_a_link(made: Path, tmp_path: Path) -> None:
    """The harness's power cut of a dead node zeroes the last segment past
    the durable mark and rewrites the checkpoint: never a link's target."""
    store, link, target = _setup(made, tmp_path, "last-segment")
    (store / "checkpoint").rename(tmp_path / "scratch" / "cp")
    (store / "checkpoint").symlink_to(tmp_path / "scratch" / "cp")
    mark_abnormal(store)
    _lower_mark(store, int(link.name))
    before = fingerprint(tmp_path / "scratch")
    power_cut(str(store))
    assert fingerprint(tmp_path / "scratch") == before


def _lower_mark(store: Path, end: int) -> None:
    """Say in the durable mark that only bytes below `end` were fsynced, and
    that the checkpoint's last fsync held other bytes: a cut then writes
    both the segment at `end` and the checkpoint."""
    raw = bytearray((store / "durable-mark").read_bytes())
    raw[COMMITLOG_AT:COMMITLOG_AT + 8] = struct.pack(">q", end)
    raw[CHECKPOINT_AT:] = struct.pack(">q24s", 1, bytes(CHECKPOINT_BYTES))
    (store / "durable-mark").write_bytes(bytes(raw))


class _LinkAtLock(RealDisk):
    """The real disk, but `entry` becomes a link to `target` just after the
    open's layout check (when the lock is taken), as a racing process could
    make it: the O_NOFOLLOW opens must still refuse it."""

    def __init__(self, make: Callable[[], None]) -> None:
        self._make = make

    def lock(self, path: str) -> StoreLock:
        self._make()
        return super().lock(path)


@pytest.mark.parametrize("case", ["lock", "last-segment", "durable-mark"])
def test_a_link_made_after_the_check_is_not_followed_either(
        made: Path, tmp_path: Path, case: str) -> None:
    store = tmp_path / "store"
    shutil.copytree(made, store)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    made_link: dict[str, object] = {}

    def make() -> None:
        made_link["link"] = CASES[case](store, scratch)
        made_link["target"] = fingerprint(scratch / "x")

    with pytest.raises(StoreOpenError) as err:
        MessageStore.open(str(store), TESTING, disk=_LinkAtLock(make))
    link = made_link["link"]
    assert isinstance(link, Path) and link.is_symlink()
    message = str(err.value)
    assert str(link.relative_to(store)) in message and "symbolic link" in message, message
    assert fingerprint(scratch / "x") == made_link["target"]


def test_inspect_refuses_a_linked_commitlog_directory(made: Path, tmp_path: Path) -> None:
    store, link, target = _setup(made, tmp_path, "commitlog-dir")
    with pytest.raises(InspectError, match="commitlog is a symbolic link"):
        inspect_store(str(store))
