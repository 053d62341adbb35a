"""The crash-test writer: a real child process (tests/support/store_child.py)
that writes with many producers and prints every acknowledgement, read as it
comes and killed with a real signal after a given number of acks."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from store.config import TESTING, CrashModel, FlushMode, StoreConfig
from support.store_helpers import CHILD

CHILD_DEADLINE_S = 60.0


@dataclass
class ChildRun:
    acks: dict[str, tuple[int, int]] = field(default_factory=dict)  # id -> (offset, size)
    flushed: int = 0  # the highest `flushed` the child reported
    lines: list[str] = field(default_factory=list)
    returncode: int = 0
    stderr: str = ""


def run_writer(
    path: Path,
    *,
    seed: int,
    flush: FlushMode,
    model: CrashModel,
    stop_after_acks: int,
    sig: signal.Signals = signal.SIGKILL,
    producers: int = 32,
    flush_interval_ms: int = 20,
) -> ChildRun:
    """Start the writer, read its acknowledgements as they come, send `sig`
    once `stop_after_acks` have been read, then read everything it printed
    before it died. Only complete lines count (a line cut by the kill is not
    an acknowledgement the client saw)."""
    cmd = [
        sys.executable, str(CHILD), "write", "--dir", str(path), "--flush", flush.value,
        "--crash-model", model.value, "--seed", str(seed), "--producers", str(producers),
        "--per-producer", "5000", "--flush-interval-ms", str(flush_interval_ms),
        "--report-flushed", "--max-seconds", "30",
    ]
    run = ChildRun()
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err)
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        pending = b""
        sent = False
        deadline = time.monotonic() + CHILD_DEADLINE_S
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    pytest.fail(f"writer did not finish within {CHILD_DEADLINE_S}s")
                ready, _, _ = select.select([fd], [], [], left)
                if not ready:
                    continue
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    break  # EOF: the child is gone
                pending += chunk
                *complete, pending = pending.split(b"\n")
                for raw in complete:
                    line = raw.decode()
                    run.lines.append(line)
                    kind, _, rest = line.partition(" ")
                    if kind == "OK":
                        msg_id, offset, size = rest.split()
                        run.acks[msg_id] = (int(offset), int(size))
                    elif kind == "FLUSHED":
                        run.flushed = max(run.flushed, int(rest))
                if not sent and len(run.acks) >= stop_after_acks:
                    proc.send_signal(sig)
                    sent = True
            run.returncode = proc.wait(timeout=CHILD_DEADLINE_S)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stdout.close()
        err.seek(0)
        run.stderr = err.read().decode(errors="replace")
    assert sent, f"the writer finished before {stop_after_acks} acks:\n{run.stderr[-2000:]}"
    return run


def config_for(flush: FlushMode, model: CrashModel) -> StoreConfig:
    return TESTING.with_(flush_mode=flush, crash_model=model, flush_interval_ms=20)
