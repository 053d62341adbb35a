"""The store's lock file keeps a second process out of an open store, and
the error says who holds it. A holder killed with SIGKILL releases it (the
kernel drops the flock), and the next opener runs abnormal recovery."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support.store_helpers import fill, ids, reopen, snapshot

from store.config import TESTING
from store.seams.lock import StoreLockedError
from store.store import MessageStore

HOLDER = """
import sys, time
from store.config import TESTING
from store.store import MessageStore
s = MessageStore.open(sys.argv[1], TESTING)
print("READY", flush=True)
time.sleep(60)
"""


def _start_holder(path: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 30)
    if not ready or proc.stdout.readline().strip() != "READY":
        proc.kill()
        _, err = proc.communicate()
        pytest.fail(f"holder did not open the store: {err[-2000:]}")
    return proc


def test_second_process_gets_store_locked_error_naming_the_holder(tmp_path: Path) -> None:
    fill(tmp_path, 20)
    holder = _start_holder(tmp_path)
    try:
        before = snapshot(tmp_path)
        with pytest.raises(StoreLockedError) as err:
            MessageStore.open(str(tmp_path), TESTING)
        text = str(err.value)
        assert f"in use by process {holder.pid}" in text
        assert "stop that process or choose another directory" in text
        assert snapshot(tmp_path) == before  # the refused open changed nothing
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.communicate(timeout=30)
    assert holder.returncode == -signal.SIGKILL
    records, report = reopen(tmp_path)  # the kernel released the lock with the process
    assert ids(records) == [f"m{i:06d}" for i in range(20)]
    assert report.abnormal  # the holder never closed: its abort file stayed


def test_the_same_process_cannot_open_a_store_twice(tmp_path: Path) -> None:
    s = MessageStore.open(str(tmp_path), TESTING)
    try:
        with pytest.raises(StoreLockedError, match=f"in use by process {os.getpid()}"):
            MessageStore.open(str(tmp_path), TESTING)
    finally:
        s.close_sync()
    MessageStore.open(str(tmp_path), TESTING).close_sync()  # released by close


def test_inspect_reads_a_store_another_process_holds(tmp_path: Path) -> None:
    """`dlab store inspect` takes no lock, so it works while a node has the
    store open, and says the store is in use by the pid holding the lock."""
    holder = _start_holder(tmp_path)
    try:
        out = subprocess.run([sys.executable, "-c",
                              "import sys; from cluster.cli.main import main; sys.exit(main())",
                              "store", "inspect", str(tmp_path)],
                             capture_output=True, text=True, timeout=60, check=False)
        assert out.returncode == 0, out.stderr
        assert f"held now by pid {holder.pid}: the store is in use" in out.stdout
        assert f"the store is in use: process {holder.pid} holds its lock" in out.stdout
        assert "Traceback" not in out.stderr
    finally:
        holder.kill()
        holder.communicate(timeout=30)
