"""The processes a backend starts belong to it (cluster/backends/procs.py
ChildProcesses), not to a table shared by the whole module: its owner reaps
what it started, and any owner can still see and signal a process by its
ProcId (as a later CLI invocation does, from the cluster's state file)."""

from __future__ import annotations

import signal
import socket
import sys
from typing import Any

from cluster.backends import procs
from cluster.backends.procs import ChildProcesses, proc_state


def _zombie_or_gone(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            raw = f.read()
    except FileNotFoundError:
        return "reaped"
    return "zombie" if raw[raw.rindex(")") + 2] in "ZX" else "alive"


def test_the_owner_reaps_the_child_it_started(tmp_path: Any) -> None:
    children = ChildProcesses()
    proc = children.spawn([sys.executable, "-c", "print('bye')"],
                          log_path=str(tmp_path / "child.log"))
    assert children.wait_state(proc, {"gone"}, 30)
    assert _zombie_or_gone(proc.pid) == "reaped"  # no zombie left behind
    with open(tmp_path / "child.log", encoding="utf-8") as f:
        assert f.read() == "bye\n"


def test_another_owner_signals_by_proc_id_and_leaves_the_reaping_to_the_owner(
        tmp_path: Any) -> None:
    owner, other = ChildProcesses(), ChildProcesses()
    proc = owner.spawn([sys.executable, "-c", "import time; time.sleep(60)"],
                       log_path=str(tmp_path / "child.log"))
    assert other.state(proc) == "running"
    assert other.signal(proc, signal.SIGKILL)
    assert other.wait_state(proc, {"gone"}, 30)
    # Not its child: it sees the exit but does not reap what it did not start.
    assert _zombie_or_gone(proc.pid) == "zombie"
    assert owner.state(proc) == "gone" and proc_state(proc) == "gone"
    assert _zombie_or_gone(proc.pid) == "reaped"
    assert not other.signal(proc, signal.SIGTERM)  # gone: nothing is signalled


def test_free_ports_are_distinct_bindable_and_outside_the_ephemeral_range() -> None:
    """A released ephemeral port is the next outgoing connection's of any
    process (CI once saw a restarted node find its port taken that way)."""
    low, high = procs._ephemeral_range()
    ports = procs.free_ports(20)
    assert len(set(ports)) == 20
    assert all(not low <= p <= high for p in ports), ports
    for p in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))
