"""Failpoints: named places in node code that crash or stall the process on
the N-th time they are reached, so chaos runs hit narrow windows on purpose.

Armed from a spec string (the harness passes it on the node's command line or
in DLAB_FAILPOINTS): `name=action@N[,name=action@N...]` where action is
`crash` (SIGKILL to this process: the node's crash model applies),
`delay:MS` (sleep, blocking the thread that hit it), `delay:MS+crash` (sleep,
then SIGKILL: a crash while that thread is stalled), or `eio` (only at
`flush_fsync`: a disk fault, the fsync fails with EIO; see hit()). Disarmed,
`hit` is one dict lookup on an empty dict.

The sleep is a seam (`stall`): time.sleep in a node process; on a simulated
cluster the flush executor's stall, which parks the work that hit it for
that much virtual time (store/sim/cooperative_executor.py).
"""

from __future__ import annotations

import asyncio
import errno
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

KNOWN = {
    "sync_state_set_adopt": "master (controller mode): the controller's answer to a "
                            "SyncStateSet change received, before the master adopts it "
                            "(a delay here is an answer late in coming: the node goes on)",
    "after_append_before_flush": "master/any: a put appended, before its flush",
    "after_ship_before_ack": "master: a range sent to a slave, before the slave's ack",
    "slave_after_append_before_report": "slave: shipped bytes appended, before the report",
    "slave_after_truncate_before_report": "slave: its log truncated as the master asked, "
                                          "before it reports the cut offset",
    "segment_roll": "any: a new segment created, before a record goes into it",
    "recovery_truncate": "any: recovery zeroed the header at the cut, before clearing the tail",
    "recovery_repair": "any: recovery wrote a repaired range but its first header, before "
                       "writing that header",
    "consume_queue_truncate": "any: a ConsumeQueue cut zeroed its first dropped unit, before "
                              "shortening the file",
    "consumer_offsets_before_rename": "any: the offset table's temp file written and synced, "
                                      "before the renames that replace the file",
    "before_flush_sync": "any: a flush wrote its bytes, before the fsync (delay: a slow disk)",
    "flush_before_write": "any: a flush took what it will write (still in memory under the "
                          "power model), before writing it (delay: a stalled flusher)",
    "reput_before_dispatch": "any: the consume-side service's dispatch pass found records, "
                             "before dispatching them (delay: a stalled reput service; "
                             "reads serve what was dispatched meanwhile)",
    "slave_after_report": "slave: a report of a new offset written to the master",
    "after_put_answered": "master: a put's answer handed to the client's connection",
    "epoch_file_before_fsync": "controller mode: the epoch file's temp file written, before "
                               "its fsync",
    "epoch_file_before_rename": "controller mode: the epoch file's temp file synced, before the "
                                "rename that replaces the file",
    "epoch_file_before_dir_fsync": "controller mode: the epoch file renamed into place, before "
                                   "the directory fsync that makes the rename durable",
    "epoch_file_before_overwrite": "controller mode, --emulate rmq-epoch-in-place: the .bak "
                                   "copy written, before the epoch file is overwritten",
    "epoch_file_mid_overwrite": "controller mode, --emulate rmq-epoch-in-place: the epoch file "
                                "emptied for its rewrite in place, before its new bytes",
    "rejoin_after_log_cut": "controller mode, a rejoining replica: its log and consume queues "
                            "cut at the truncation point, before its epoch file is",
    "flush_fsync": "any: a flush's fsync (eio: it fails with EIO and what it was to make "
                   "durable is discarded, as Linux drops dirty pages after a failed writeback)",
}
# Failpoints that may take the `eio` action (a fault of the fsync itself).
EIO_POINTS = frozenset({"flush_fsync"})


class InjectedEIOError(OSError):
    """The `eio` failpoint: an fsync that failed (errno EIO)."""

    def __init__(self, name: str) -> None:
        super().__init__(errno.EIO, f"Input/output error (injected by failpoint {name})")


class FailpointSpecError(ValueError):
    pass


@dataclass
class _Armed:
    action: str
    delay_ms: int
    nth: int
    hits: int = 0


class Failpoints:
    def __init__(self, spec: str = "", *, on_crash: Callable[[], None] | None = None,
                 stall: Callable[[float], None] | None = None) -> None:
        # `on_crash` replaces the SIGKILL of the `crash` actions (a simulated
        # cluster crashes the node in-process: chaos/sim/run.py); `stall`
        # (seconds) replaces the sleep of the `delay` actions.
        self._on_crash = on_crash
        self._stall = stall
        self._armed: dict[str, _Armed] = {}
        self.fired: list[str] = []
        # Told the name of every failpoint passed, armed or not (an
        # exploration's crash points, chaos/explore/); None: nobody listens.
        self.observe: Callable[[str], None] | None = None
        for item in filter(None, (p.strip() for p in spec.split(","))):
            name, sep, rest = item.partition("=")
            if not sep:
                raise FailpointSpecError(f"failpoint {item!r}: expected name=action@N")
            if name not in KNOWN:
                raise FailpointSpecError(
                    f"unknown failpoint {name!r}; known: {', '.join(sorted(KNOWN))}"
                )
            action, _, nth_s = rest.partition("@")
            try:
                nth = int(nth_s or "1")
            except ValueError:
                raise FailpointSpecError(f"failpoint {item!r}: N must be an integer") from None
            if nth < 1:
                raise FailpointSpecError(f"failpoint {item!r}: N must be at least 1")
            delay_ms = 0
            if action.startswith("delay:"):
                ms, plus, then = action[6:].partition("+")
                try:
                    delay_ms = int(ms)
                except ValueError:
                    raise FailpointSpecError(f"failpoint {item!r}: delay:MS needs ms") from None
                if plus and then != "crash":
                    raise FailpointSpecError(f"failpoint {item!r}: after a delay only "
                                             "+crash may follow (delay:MS+crash)")
                action = "delay+crash" if plus else "delay"
            elif action == "eio":
                if name not in EIO_POINTS:
                    raise FailpointSpecError(
                        f"failpoint {item!r}: eio is a fault of an fsync; only "
                        f"{', '.join(sorted(EIO_POINTS))} takes it")
            elif action != "crash":
                raise FailpointSpecError(f"failpoint {item!r}: action is crash, delay:MS, "
                                         "delay:MS+crash or eio")
            self._armed[name] = _Armed(action, delay_ms, nth)

    @classmethod
    def from_env(cls) -> Failpoints:
        return cls(os.environ.get("DLAB_FAILPOINTS", ""))

    def hit(self, name: str, *, on_eio: Callable[[], None] | None = None) -> None:
        """Count a pass through `name`; on its N-th, act. The `eio` action
        calls `on_eio` (what the fault does to the bytes: the caller's
        model of a failed writeback), then raises InjectedEIOError."""
        if self.observe is not None:
            self.observe(name)
        if not self._armed:
            return
        fp = self._armed.get(name)
        if fp is None:
            return
        fp.hits += 1
        if fp.hits != fp.nth:
            return
        self.fired.append(name)
        print(f"failpoint {name} fired ({fp.action}) on hit {fp.hits}", file=sys.stderr,
              flush=True)
        if fp.action == "crash":
            self._crash()
        elif fp.action == "eio":
            if on_eio is not None:
                on_eio()
            raise InjectedEIOError(name)
        else:
            (self._stall or time.sleep)(fp.delay_ms / 1000)
            if fp.action == "delay+crash":
                self._crash()

    async def hit_async(self, name: str) -> None:
        """hit() for a coroutine: a `delay` waits on the event loop (the
        node goes on; only the coroutine that hit it waits), then a
        `+crash` crashes as hit() does."""
        fp = self._armed.get(name)
        if fp is None or fp.action not in ("delay", "delay+crash") or fp.hits + 1 != fp.nth:
            self.hit(name)
            return
        fp.hits += 1
        self.fired.append(name)
        print(f"failpoint {name} fired ({fp.action}) on hit {fp.hits}", file=sys.stderr,
              flush=True)
        await asyncio.sleep(fp.delay_ms / 1000)
        if fp.action == "delay+crash":
            self._crash()

    def _crash(self) -> None:
        if self._on_crash is not None:
            self._on_crash()
        else:
            os.kill(os.getpid(), signal.SIGKILL)

    def armed(self, name: str) -> bool:
        return name in self._armed

    def watched(self, name: str) -> bool:
        """Whether passing `name` does anything (armed, or observed): a
        caller may skip the work of reaching a failpoint nobody watches."""
        return self.observe is not None or name in self._armed

    def delays(self) -> bool:
        """Whether any failpoint is armed with a `delay` action."""
        return any(fp.action.startswith("delay") for fp in self._armed.values())

    def hits(self) -> dict[str, int]:
        return {name: fp.hits for name, fp in self._armed.items()}


DISARMED = Failpoints()
