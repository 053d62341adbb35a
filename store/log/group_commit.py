"""SYNC_FLUSH group commit: every put waiting at the moment a flush starts
waits on the same generation, so one fsync and one wake-up serve them all.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from store.config import KIB
from store.log.commitlog import CommitLog, StoreFailedError
from store.seams.flush_executor import FlushExecutor

_log = logging.getLogger("dlab.store")


class Generation:
    """The puts waiting for one group-commit flush share it: callbacks run
    at once, on the loop, when the flush resolves it (one wake-up per flush,
    no extra loop iteration)."""

    __slots__ = ("resolved", "timer", "waiters")

    def __init__(self) -> None:
        self.resolved = False
        self.timer: asyncio.TimerHandle | None = None
        self.waiters: list[Callable[[str], None]] = []

    def resolve(self, outcome: str) -> None:
        if self.timer is not None:
            self.timer.cancel()
        if self.resolved:
            return
        self.resolved = True
        waiters, self.waiters = self.waiters, []
        for waiter in waiters:
            try:
                waiter(outcome)
            except Exception:  # one batch's bug must not keep the others waiting
                _log.exception("a group-commit waiter failed")


# A flush with more than this to write runs on the flush thread even when the
# loop is idle: an fsync of a few puts is worth running inline (no
# cross-thread wake-up), copying megabytes into the page cache is not (a
# catching-up slave stopped receiving while the loop wrote its ranges).
INLINE_FLUSH_MAX_BYTES = 256 * KIB


class GroupCommit:
    """SYNC_FLUSH group commit: on the event loop when it is idle, else on the
    flush executor's worker (a thread in production).

    Ordering: a put appends, THEN joins the open generation (both on the loop
    thread). A flush closes the open generation under the append lock at the
    moment it snapshots what it will write, so a put found in a closed
    generation was appended before that snapshot and is covered by its fsync.
    A put that finds no open generation opens the next one.

    Where the flush runs: a new generation schedules a check at the end of
    the loop's current work, which looks again one loop iteration later. If
    no more puts came in that iteration (`puts_coming`, the put path's
    signal: bytes appended since, or puts submitted and not yet appended)
    and at most INLINE_FLUSH_MAX_BYTES wait to be written, the loop flushes
    inline: every waiting put is waiting for this
    fsync anyway, and each cross-thread wake-up (kicking the thread, the
    thread waking the loop) costs more than it saves (see
    docs/performance-notes.md, "Group commit"). If puts keep coming, or the
    worker is flushing, the worker takes it and the fsync overlaps the
    loop's work; it hands results back with one to_loop call per flush. A
    store with the before_flush_sync or flush_before_write failpoint armed
    (a delay there is a slow disk or a stalled flusher) always uses the
    worker, so a slow fsync never blocks the loop."""

    def __init__(self, log: CommitLog, loop: asyncio.AbstractEventLoop,
                 executor: FlushExecutor, puts_coming: Callable[[int], bool],
                 activity: Callable[[], int], *, inline: bool = True) -> None:
        self.log = log
        self.loop = loop
        self.inline = inline
        self.open: Generation | None = None
        self._closed: Generation | None = None
        self._puts_coming = puts_coming
        self._activity = activity
        self._mark = 0
        self._busy = False  # the worker is flushing
        self._stopped = False
        self._worker = executor.worker(loop, self._flush_on_worker)

    def join_generation(self) -> Generation:
        gen = self.open
        if gen is None:
            gen = self.open = Generation()
            if self.inline:
                self.loop.call_soon(self._flush_when_idle, False)
                return gen
        if not self.inline and not self._worker.kicked():
            # No time.sleep(0) to hand the flush thread the GIL at once: it
            # made the loop wait for the switch on every generation, fewer
            # puts/s than letting the thread start when the loop next blocks
            # (see docs/performance-notes.md, "Group commit").
            self._worker.kick()
        return gen

    def _flush_when_idle(self, retried: bool) -> None:
        if self._stopped or self.open is None:
            return
        big = self.log.dirty_bytes > INLINE_FLUSH_MAX_BYTES
        if self._busy or big or (retried and self._puts_coming(self._mark)):
            self._worker.kick()
            return
        if not retried:
            # One more loop iteration first: what this one scheduled (the
            # rest of a tick's puts, the HA shippers an append woke) runs
            # before the loop may block in an fsync.
            self._mark = self._activity()
            self.loop.call_soon(self._flush_when_idle, True)
            return
        closed: list[Generation | None] = []

        def close_open() -> None:  # under the append lock
            closed.append(self.open)
            self.open = None

        try:
            self.log.flush(close_open)
            outcome = "ok"
        except StoreFailedError:
            outcome = "failed"
        gen = closed[0] if closed else None
        if gen is not None:
            gen.resolve(outcome)
        if outcome == "failed":
            self._fail_open()

    def _close_open(self) -> None:  # on the worker, under the append lock
        self._closed, self.open = self.open, None

    def _flush_on_worker(self) -> bool:
        """One flush on the worker; False ends the worker."""
        self._busy = True
        try:
            self.log.flush(self._close_open)
            outcome = "ok"
        except StoreFailedError:
            outcome = "failed"
        finally:
            self._busy = False
        gen, self._closed = self._closed, None
        if gen is not None and not self._worker.to_loop(gen.resolve, outcome):
            return False  # the loop is gone: nobody is waiting
        if outcome == "failed":
            # Fail everyone still waiting; new puts are refused by append.
            self._fail_open()
            return False
        return True

    def _fail_open(self) -> None:
        with self.log._lock:
            self._close_open()
        gen, self._closed = self._closed, None
        if gen is not None:
            self._worker.to_loop(gen.resolve, "failed")

    def stop(self) -> None:
        self._stopped = True
        self._worker.stop()
