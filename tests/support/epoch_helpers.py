"""Helpers the crash tests of ha/autoswitch share: run tests/support/
epoch_child.py as a real process killed by a failpoint, and crash code on
the simulation's MemoryDisk at a failpoint (a process kill: the disk keeps
all; a power cut: MemoryDisk.crash keeps what was fsynced)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from ha.autoswitch.epochs import EpochList
from store.failpoints import Failpoints

CHILD = Path(__file__).with_name("epoch_child.py")
CHILD_TIMEOUT_S = 60


class Crashed(BaseException):  # noqa: N818 - a crash, not an error to handle
    """Unwinds the code that hit a `crash` failpoint on a MemoryDisk (a
    BaseException, as the simulation's SimulatedCrash: no `except
    Exception` mistakes it for a failure)."""


def crash_at(name: str) -> Failpoints:
    """Failpoints whose `name` crashes on its first hit by raising Crashed."""

    def crash() -> None:
        raise Crashed(name)

    return Failpoints(f"{name}=crash@1", on_crash=crash)


def run_crashing(action: Callable[[Failpoints], object], failpoint: str) -> bool:
    """Run `action` with `failpoint` armed to crash; whether it crashed."""
    try:
        action(crash_at(failpoint))
    except Crashed:
        return True
    return False


def entries_arg(epochs: EpochList) -> str:
    return ",".join(f"{e.epoch}-{e.start_offset}" for e in epochs.entries)


def run_child(*args: str, failpoint: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run the child; with `failpoint`, it must die by SIGKILL there."""
    spec = f"{failpoint}=crash@1" if failpoint else ""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run([sys.executable, str(CHILD), *args, "--failpoints", spec],
                          capture_output=True, text=True, timeout=CHILD_TIMEOUT_S, env=env)
    if failpoint:
        assert proc.returncode == -signal.SIGKILL, (
            f"the child was to die at {failpoint}: rc {proc.returncode}\n{proc.stderr[-2000:]}")
        assert f"failpoint {failpoint} fired" in proc.stderr
    else:
        assert proc.returncode == 0 and "DONE" in proc.stdout, proc.stderr[-2000:]
    return proc
