"""Process handling for the local backend: start detached, identify a
process across CLI invocations (pid + start time, so a reused pid is never
mistaken for our node), signal, and wait for a state.

The processes one backend started are its ChildProcesses (it reaps them
once they exit, so none lingers as a zombie); a process another CLI
invocation started is known by its ProcId alone, read from /proc."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass

from cluster.backends.dir_files import append_no_link


@dataclass(frozen=True)
class ProcId:
    pid: int
    start_time: int  # /proc/PID/stat field 22 (clock ticks since boot)


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat from field 3 (state) on, or None if there is no such
    process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode("ascii", "replace")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # comm may contain spaces and parentheses: split after the last ')'.
    return raw[raw.rindex(")") + 2:].split()


def _stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time) of pid, or None if there is no such process."""
    rest = _stat_fields(pid)
    return None if rest is None else (rest[0], int(rest[19]))


def cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system, every thread) process `pid` has used."""
    rest = _stat_fields(pid)
    if rest is None:
        raise ProcessLookupError(f"no process {pid}")
    return (int(rest[11]) + int(rest[12])) / os.sysconf("SC_CLK_TCK")


def proc_state(proc: ProcId | None) -> str:
    """'running', 'paused' (stopped by a signal) or 'gone' (exited, zombie, or
    the pid now belongs to another process)."""
    if proc is None:
        return "gone"
    st = _stat(proc.pid)
    if st is None or st[1] != proc.start_time or st[0] in ("Z", "X"):
        return "gone"
    if st[0] in ("T", "t"):
        return "paused"
    return "running"


class ChildProcesses:
    """The processes one owner (a backend, a benchmark) started: spawned
    detached, signalled and waited for by ProcId, and reaped as soon as
    they are seen to have exited."""

    def __init__(self) -> None:
        self._popen: dict[int, subprocess.Popen[bytes]] = {}

    def spawn(self, cmd: Sequence[str], *, log_path: str,
              env: dict[str, str] | None = None) -> ProcId:
        """Start cmd detached from this process (own session, stdin closed,
        stdout+stderr appended to log_path), so it outlives the CLI call."""
        with open(append_no_link(log_path), "ab") as log:
            p = subprocess.Popen(list(cmd), stdin=subprocess.DEVNULL, stdout=log,
                                 stderr=subprocess.STDOUT, start_new_session=True, env=env)
        self._popen[p.pid] = p
        for _ in range(100):
            st = _stat(p.pid)
            if st is not None:
                return ProcId(p.pid, st[1])
            time.sleep(0.001)
        return ProcId(p.pid, -1)

    def state(self, proc: ProcId | None) -> str:
        """proc_state, reaping the process first if it is ours and exited."""
        if proc is not None:
            p = self._popen.get(proc.pid)
            if p is not None and p.poll() is not None:
                del self._popen[proc.pid]
        return proc_state(proc)

    def signal(self, proc: ProcId | None, sig: signal.Signals) -> bool:
        """Signal the process if it is still there; False when it is gone."""
        if proc is None or self.state(proc) == "gone":
            return False
        try:
            os.kill(proc.pid, sig)
        except ProcessLookupError:
            return False
        return True

    def wait_state(self, proc: ProcId | None, want: set[str], timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        delay = 0.002
        while True:
            if self.state(proc) in want:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(delay)
            delay = min(delay * 2, 0.05)


#: Where free_ports looks when the kernel's ephemeral range cannot be read.
_EPHEMERAL_DEFAULT = (32768, 60999)
_LOWEST_PORT = 10000


def _ephemeral_range() -> tuple[int, int]:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(x) for x in f.read().split())
        return low, high
    except (OSError, ValueError):
        return _EPHEMERAL_DEFAULT


def _listen_candidates() -> list[int]:
    """Ports to listen on outside the kernel's ephemeral range: a port
    from that range, once released, is the next outgoing connection's of
    any process on the machine, so a node restarted on it could find it
    taken. Outside it, only another listener can take it."""
    low, high = _ephemeral_range()
    ports = [p for p in range(_LOWEST_PORT, 65536) if not low <= p <= high]
    return ports or list(range(_LOWEST_PORT, 65536))


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """n distinct free TCP ports on host, chosen at random outside the
    ephemeral range (all held open while choosing, so they differ; another
    listener may still take one before it is used, which random choice over
    thousands of ports makes rare)."""
    rng = random.Random(int.from_bytes(os.urandom(8), "little"))
    candidates = _listen_candidates()
    socks: list[socket.socket] = []
    try:
        for port in rng.sample(candidates, min(len(candidates), 64 * n + 64)):
            if len(socks) == n:
                break
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.bind((host, port))
            except OSError:
                s.close()
                continue
            socks.append(s)
        while len(socks) < n:  # everything sampled was taken: let the kernel choose
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()
