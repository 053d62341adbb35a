"""Issue 15 §4: bad input that used to end in a traceback. Each case exits
2 with one line naming the problem and the fix, and a node whose store
fails to open leaves the store directory exactly as it found it (it used to
leave `abort`, so the next start ran abnormal recovery).

- node start: a non-UTF-8 config/consumerOffset.json (and, with a valid
  `.bak`, the node starts from the `.bak` and logs that it did);
  `checkpoint` a directory; as a user that may not write the store (a
  root-owned store, a read-only data directory, an unreadable segment);
- `dlab cluster up --dir FILE`, `dlab chaos run --out FILE`;
- `dlab consume --mode broadcast` with an --offset-file it cannot save
  (refused up front; a save that fails later is named, exit 2);
- `dlab report` loading a run with a non-UTF-8 observations.jsonl (the run
  is named and left out, the others are reported);
- a node whose stop could not persist the consumer offsets logs that the
  store did not close cleanly, instead of "closed cleanly".
"""

from __future__ import annotations

import hashlib
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.cli_helpers import dlab
from support.ha_helpers import running_cluster, send_n, wait_until
from support.pipeline_fixtures import make_run, op, rec
from support.store_helpers import fill

from chaos.check.run_dirs import load_runs
from cluster.node.auth import write_token_file
from cluster.node.role import Role
from store.config import KIB, StoreConfig
from store.store import MessageStore, StoreOpenError

REPO = Path(__file__).resolve().parents[2]
CONFIG = StoreConfig(segment_size_bytes=256 * KIB, max_message_size_bytes=64 * KIB)
NOT_UTF8 = b'\xff\xfe{"offsetTable": {}}'



def refused(r: subprocess.CompletedProcess[str], *words: str) -> str:
    """Exit 2, no traceback, and the last stderr line names every word."""
    assert "Traceback" not in r.stderr, r.stderr
    assert r.returncode == 2, (r.returncode, r.stderr)
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("dlab: error: "), r.stderr
    for w in words:
        assert w in last, (w, last)
    return last


def tree(path: str) -> dict[str, tuple[int, int, int, str]]:
    """Every entry under `path`: type, mode, owner and content hash (but of
    `lock` only that it is there: it holds the pid of whoever took it last)."""
    out: dict[str, tuple[int, int, int, str]] = {}
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            p = os.path.join(root, name)
            st = os.lstat(p)
            digest = ""
            if stat.S_ISREG(st.st_mode) and name != "lock":
                digest = hashlib.sha256(Path(p).read_bytes()).hexdigest()
            out[os.path.relpath(p, path)] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode),
                                             st.st_uid, digest)
    return out


def node_args(d: str, *extra: str) -> list[str]:
    return ["node", "--name", "n1", "--role", "ASYNC_MASTER", "--data-dir",
            os.path.join(d, "data"), "--listen", "127.0.0.1:0", "--token-file",
            os.path.join(d, "token"), "--segment-size", "256KiB", "--max-message-size",
            "64KiB", *extra]


def make_store(d: str) -> str:
    """A store of 50 records closed cleanly, and a token beside it."""
    os.makedirs(d, exist_ok=True)
    write_token_file(os.path.join(d, "token"), "tok")
    data = os.path.join(d, "data")
    fill(data, 50, CONFIG)
    return data


# ------------------------------------------------------------ node start
def test_node_start_with_a_non_utf8_offset_table_exits_2_and_leaves_the_store(
        tmp_path: Path) -> None:
    data = make_store(str(tmp_path))
    os.makedirs(os.path.join(data, "config"), exist_ok=True)
    Path(data, "config", "consumerOffset.json").write_bytes(NOT_UTF8)
    before = tree(data)
    last = refused(dlab(*node_args(str(tmp_path))), "consumerOffset.json", "not a consumer "
                   "offset table", "Fix or remove the file")
    assert "utf-8" in last
    assert tree(data) == before  # no `abort` left behind


def test_a_failed_open_closes_every_file_it_opened(tmp_path: Path) -> None:
    """An open that fails late (the offset table, after the checkpoint and
    the consume queues are open) closes what it opened: a process that
    retries the open does not collect file descriptors."""
    data = make_store(str(tmp_path))
    os.makedirs(os.path.join(data, "config"), exist_ok=True)
    Path(data, "config", "consumerOffset.json").write_bytes(NOT_UTF8)
    fds = lambda: len(os.listdir("/proc/self/fd"))  # noqa: E731
    before = fds()
    for _ in range(3):
        with pytest.raises(StoreOpenError, match="consumerOffset.json"):
            MessageStore.open(data, CONFIG)
    assert fds() == before


def test_node_start_with_a_non_utf8_offset_table_uses_a_valid_bak_and_logs_it(
        tmp_path: Path) -> None:
    data = make_store(str(tmp_path))
    os.makedirs(os.path.join(data, "config"), exist_ok=True)
    Path(data, "config", "consumerOffset.json").write_bytes(NOT_UTF8)
    Path(data, "config", "consumerOffset.json.bak").write_text(
        '{"offsetTable": {"t@g": {"0": 7}}}')
    proc = subprocess.Popen([sys.executable, "-m", "cluster.cli", *node_args(str(tmp_path))],
                            stderr=subprocess.PIPE, text=True, cwd=REPO)
    assert proc.stderr is not None
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 60
        while not any("serving on" in ln for ln in lines):
            line = proc.stderr.readline()
            assert line or proc.poll() is None, "".join(lines)
            lines.append(line)
            assert time.monotonic() < deadline, "".join(lines)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, rest = proc.communicate(timeout=60)
    log = "".join(lines) + rest
    assert proc.returncode == 0, log
    assert "Traceback" not in log
    assert "consumerOffset.json is not a consumer offset table" in log, log
    assert "loaded " + os.path.join(data, "config", "consumerOffset.json.bak") + " instead" in log


def test_node_start_with_checkpoint_a_directory_exits_2_and_leaves_the_store(
        tmp_path: Path) -> None:
    data = make_store(str(tmp_path))
    os.unlink(os.path.join(data, "checkpoint"))
    os.mkdir(os.path.join(data, "checkpoint"))
    before = tree(data)
    refused(dlab(*node_args(str(tmp_path))), "checkpoint", "is a directory",
            "move it aside")
    assert tree(data) == before


@pytest.fixture
def open_tmp() -> Iterator[str]:
    """A directory any user can traverse (pytest's own are root's only)."""
    d = tempfile.mkdtemp(prefix="dlab-")
    os.chmod(d, 0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


# The node runs as `nobody`: a child started as root imports what it needs,
# drops to nobody's uid and gid, then runs `dlab` (the interpreter's own
# directory may be closed to nobody, so it cannot start as nobody).
_AS_NOBODY = """
import os, sys
import cluster.cli.main, cluster.cli.commands, cluster.node.server, store.failpoints
cluster.cli.main.build_parser()
os.setgroups([])
os.setgid(int(sys.argv[1]))
os.setuid(int(sys.argv[2]))
sys.exit(cluster.cli.main.main(sys.argv[3:]))
"""


@pytest.mark.parametrize("case", ["root-owned", "read-only-dir", "unreadable-segment"])
def test_node_start_on_a_store_it_may_not_write_exits_2_and_names_the_fix(
        open_tmp: str, case: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: the node runs as `nobody` against a store it may not write")
    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no `nobody` user to run the node as")
    data = make_store(open_tmp)
    os.chown(os.path.join(open_tmp, "token"), nobody.pw_uid, nobody.pw_gid)
    if case != "root-owned":
        for root, dirs, files in os.walk(data):
            for name in [*dirs, *files]:
                os.chown(os.path.join(root, name), nobody.pw_uid, nobody.pw_gid)
        os.chown(data, nobody.pw_uid, nobody.pw_gid)
    if case == "read-only-dir":
        os.chmod(data, 0o555)
    if case == "unreadable-segment":
        os.chmod(os.path.join(data, "commitlog", "0" * 20), 0)
    before = tree(data)
    r = subprocess.run([sys.executable, "-c", _AS_NOBODY, str(nobody.pw_gid),
                        str(nobody.pw_uid), *node_args(open_tmp)],
                       capture_output=True, text=True, timeout=120, check=False, cwd=REPO)
    where = {"root-owned": "lock", "read-only-dir": "abort",
             "unreadable-segment": "0" * 20}[case]
    refused(r, "Permission denied", where, "runs as nobody", f"chown -R nobody {data}")
    assert tree(data) == before


# ------------------------------------------------------------------ CLI
def test_cluster_up_with_dir_a_file_exits_2(tmp_path: Path) -> None:
    f = tmp_path / "afile"
    f.write_text("not a cluster")
    refused(dlab("cluster", "up", "--dir", str(f), "--slaves", "0"), str(f),
            "is a file, not a directory")
    refused(dlab("cluster", "status", "--dir", str(f)), "is a file, not a directory")
    refused(dlab("cluster", "up", "--dir", str(f / "sub"), "--slaves", "0"),
            "cannot use", "Not a directory")
    assert f.read_text() == "not a cluster"


def test_chaos_run_with_out_a_file_exits_2(tmp_path: Path) -> None:
    f = tmp_path / "afile"
    f.write_text("x")
    refused(dlab("chaos", "run", "--scenario", "clean-restart", "--role", "SYNC_MASTER",
                 "--flush", "SYNC_FLUSH", "--out", str(f)), str(f), "is a file, not a directory")
    refused(dlab("chaos", "matrix", "--quick", "--out", str(f)), "is a file, not a directory")
    refused(dlab("chaos", "run", "--scenario", "clean-restart", "--role", "SYNC_MASTER",
                 "--flush", "SYNC_FLUSH", "--out", str(f / "x")), "cannot create it")


def test_broadcast_consume_refuses_an_offset_file_it_cannot_save(tmp_path: Path) -> None:
    with running_cluster(str(tmp_path / "c"), role=Role.ASYNC_MASTER, flush="ASYNC_FLUSH",
                         slaves=0) as (b, tok):
        send_n(b, tok, 10, size=100)
        common = ["consume", "--dir", b.directory or "", "--group", "g", "--topic", "t",
                  "--mode", "broadcast", "--idle-exit", "1", "--jsonl"]
        # Up front: nothing is consumed into offsets that cannot be kept.
        missing = str(tmp_path / "nonexistent" / "dir" / "f.json")
        r = dlab(*common, "--offset-file", missing)
        refused(r, "--offset-file", "does not exist", "create it")
        assert r.stdout == ""
        refused(dlab(*common, "--offset-file", str(tmp_path)), "is a directory")
        # A save that fails after consuming (here its temp file cannot be
        # made) is named, and says what it means: exit 2, no traceback.
        target = tmp_path / "offsets" / "f.json"
        (tmp_path / "offsets" / "f.json.tmp").mkdir(parents=True)
        r = dlab(*common, "--offset-file", str(target))
        refused(r, "offsets not saved", str(target), "delivered again")
        assert len(r.stdout.splitlines()) == 10  # consumed, then the save failed
        assert not target.exists()


def test_report_names_a_run_with_a_non_utf8_observations_file_and_loads_the_others(
        tmp_path: Path) -> None:
    root = str(tmp_path / "runs")
    history = [op(1, "m1", 0)]
    good = make_run(root, "good", role="SYNC_MASTER", flush="SYNC_FLUSH", history=history,
                    records={"m": [rec(0, "m1")], "s": [rec(0, "m1")]})
    bad = make_run(root, "bad", role="SYNC_MASTER", flush="SYNC_FLUSH", history=history,
                   records={"m": [rec(0, "m1")], "s": [rec(0, "m1")]})
    with open(os.path.join(bad, "observations.jsonl"), "ab") as f:
        f.write(b'{"kind": "\xe9t\xe9"}\n')
    runs, problems = load_runs([bad, good])
    assert [r.run_dir for r in runs] == [good]
    assert [str(p) for p in problems] == [
        f"{bad}/observations.jsonl:1: not UTF-8 text (byte 0xe9 at column 11)"]


# ------------------------------------------------------------ node stop
def test_a_stop_that_cannot_persist_the_offsets_says_the_store_did_not_close_cleanly(
        tmp_path: Path) -> None:
    data = make_store(str(tmp_path))
    # The offset table's temp file cannot be made: every persist fails.
    os.makedirs(os.path.join(data, "config", "consumerOffset.json.tmp"))
    proc = subprocess.Popen([sys.executable, "-m", "cluster.cli", *node_args(str(tmp_path))],
                            stderr=subprocess.PIPE, text=True, cwd=REPO)
    assert proc.stderr is not None
    try:
        wait_until(lambda: os.path.exists(os.path.join(data, "abort")) or proc.poll() is not None,
                   60, "the node to open its store")
        time.sleep(0.5)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert os.path.exists(os.path.join(data, "abort"))  # the close was not clean...
    assert "closed cleanly" not in err, err  # ... and the log does not say it was
    assert "store closed, NOT cleanly: persisting the consumer offsets failed" in err, err
    assert "abort marker stays" in err
