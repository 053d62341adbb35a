"""InlineFlushExecutor: the flush executor seam's deterministic twin
(store/seams/flush_executor.py describes the seam and its three
implementations). Everything runs on the loop, in call_soon order: no thread,
so a simulated run is reproducible."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from store.seams.flush_executor import FlushWorker, StoreLock

T = TypeVar("T")


class InlineWorker:
    """A group-commit worker on the loop: a kick runs the job once, soon (or
    after the drawn fsync latency). `_run` is the kick's callback."""

    def __init__(self, loop: asyncio.AbstractEventLoop, job: Callable[[], bool],
                 latency_s: Callable[[], float] | None = None) -> None:
        self._loop = loop
        self._job = job
        self._latency_s = latency_s
        self._pending = False
        self._stopped = False

    def kick(self) -> None:
        if not self._pending and not self._stopped:
            self._pending = True
            if self._latency_s is None:
                self._loop.call_soon(self._run)
            else:
                self._loop.call_later(self._latency_s(), self._run)

    def kicked(self) -> bool:
        return self._pending

    def to_loop(self, fn: Callable[..., object], *args: Any) -> bool:
        if self._loop.is_closed():
            return False
        self._loop.call_soon(fn, *args)
        return True

    def _run(self) -> None:
        self._pending = False
        if not self._stopped and not self._job():
            self._stopped = True

    def stop(self) -> None:
        self._stopped = True


class InlineFlushExecutor:
    """Everything on the loop, in call_soon order: deterministic, no thread.
    `fsync_latency_s`, when given, draws how long each group-commit flush
    takes (virtual seconds; see the module docstring)."""

    def __init__(self, fsync_latency_s: Callable[[], float] | None = None) -> None:
        self._latency_s = fsync_latency_s
        self.timed_flushes = fsync_latency_s is not None

    def run(self, fn: Callable[[], T]) -> asyncio.Future[T]:
        return _done_future(fn)

    def worker(self, loop: asyncio.AbstractEventLoop, job: Callable[[], bool]) -> FlushWorker:
        return InlineWorker(loop, job, self._latency_s)

    def run_blocking(self, fn: Callable[[], T]) -> asyncio.Future[T]:
        return _done_future(fn)

    def run_alone(self, fn: Callable[[], T]) -> asyncio.Future[T]:
        return _done_future(fn)

    def lock(self) -> StoreLock:
        return threading.Lock()

    def shutdown(self) -> None:
        pass


def _done_future(fn: Callable[[], T]) -> asyncio.Future[T]:
    fut: asyncio.Future[T] = asyncio.get_running_loop().create_future()
    try:
        fut.set_result(fn())
    except Exception as exc:
        fut.set_exception(exc)
    return fut
