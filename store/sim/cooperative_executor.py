"""CooperativeFlushExecutor: the simulation's flush executor for a node with
a `delay` failpoint armed, where a stall must take virtual time.

It runs the store's blocking work as cooperative tasks on the loop's
thread (store/sim/cooperative.py) and keeps production's threads' order:
- `run(fn)`: ThreadFlushExecutor's one "flusher" thread: one job at a
  time, first come first served; a job submitted while an earlier one is
  parked in a stall waits behind it (CommitLog.flush holds `_flush_lock`
  across the stall: two flushes on one thread would deadlock);
- `worker(loop, job)`: one group-commit thread per worker: a kick while
  its job is parked runs the job again once it ends, never beside it;
- `run_blocking(fn)` and `run_alone(fn)`: threads of their own (asyncio's
  default pool; the reput service's thread): each a task of its own;
- `lock()`: CooperativeLock, which a task may hold across a stall;
- `stall(seconds)`: Failpoints' stall seam: parks the calling task.

While nothing parks, every job runs to its end inside the call that
started it, exactly where InlineFlushExecutor runs it (and group-commit
flushes take the same drawn fsync latency), so a run differs from an
inline one only from its first stall on. The simulation uses it only
for nodes with a `delay` armed (chaos/sim/cluster.py): every other run
goes through InlineFlushExecutor, unchanged.
"""

from __future__ import annotations

import asyncio
import functools
from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

from store.seams.flush_executor import FlushWorker
from store.sim.cooperative import (
    CooperativeLock,
    CooperativeTasks,
    LoopWouldBlockError,
    current,
    in_task,
)
from store.sim.inline_executor import InlineWorker

T = TypeVar("T")


def _settle(fut: asyncio.Future[Any], result: Any, exc: BaseException | None) -> None:
    if fut.done():  # its awaiter was cancelled (a kill, a close)
        return
    if exc is None:
        fut.set_result(result)
    else:
        fut.set_exception(exc)


class _Serial:
    """One job at a time, in the order submitted (a single thread)."""

    def __init__(self, tasks: CooperativeTasks) -> None:
        self._tasks = tasks
        self._jobs: deque[tuple[Callable[[], Any], asyncio.Future[Any]]] = deque()
        self._busy = False

    def submit(self, fn: Callable[[], Any], fut: asyncio.Future[Any]) -> None:
        self._jobs.append((fn, fut))
        self._next()

    def _next(self) -> None:
        while self._jobs and not self._busy and not self._tasks.abandoned:
            fn, fut = self._jobs.popleft()
            self._busy = True
            self._tasks.start(fn, functools.partial(self._done, fut))

    def _done(self, fut: asyncio.Future[Any], result: Any, exc: BaseException | None) -> None:
        self._busy = False
        _settle(fut, result, exc)
        self._next()


class _CooperativeWorker(InlineWorker):
    """A group-commit worker: its job as a task, never two at once. Kicks
    are InlineWorker's; only running the job differs."""

    def __init__(self, loop: asyncio.AbstractEventLoop, job: Callable[[], bool],
                 tasks: CooperativeTasks, latency_s: Callable[[], float] | None) -> None:
        super().__init__(loop, job, latency_s)
        self._tasks = tasks
        self._due = False  # the kick's time came while the job ran
        self._running = False
        self._stop_waiters: list[Any] = []

    def _run(self) -> None:
        if self._running:  # the thread picks the kick up when its job ends
            self._due = True
            return
        self._start()

    def _start(self) -> None:
        self._pending = self._due = False
        if self._stopped:
            return
        self._running = True
        self._tasks.start(self._job, self._ended)

    def _ended(self, keep_going: bool, exc: BaseException | None) -> None:
        self._running = False
        if exc is not None or not keep_going:
            self._stopped = True
        for waiter in self._stop_waiters:
            self._tasks.wake(waiter, None)
        self._stop_waiters.clear()
        if exc is not None:
            raise exc  # to the loop's exception handler, as an inline job's
        if self._due:
            self._start()

    def stop(self) -> None:
        """End the worker; from a task, wait for a job in progress (a join)."""
        self._stopped = True
        if self._running and in_task():
            self._stop_waiters.append(current())
            self._tasks.park()


class CooperativeFlushExecutor:
    """See the module docstring. `fsync_latency_s` as InlineFlushExecutor's."""

    def __init__(self, loop: asyncio.AbstractEventLoop,
                 fsync_latency_s: Callable[[], float] | None = None) -> None:
        self.tasks = CooperativeTasks(loop)
        self._loop = loop
        self._latency_s = fsync_latency_s
        self.timed_flushes = fsync_latency_s is not None
        self._flusher = _Serial(self.tasks)

    def run(self, fn: Callable[[], T]) -> asyncio.Future[T]:
        fut: asyncio.Future[T] = self._loop.create_future()
        self._flusher.submit(fn, fut)
        return fut

    def worker(self, loop: asyncio.AbstractEventLoop, job: Callable[[], bool]) -> FlushWorker:
        return _CooperativeWorker(loop, job, self.tasks, self._latency_s)

    def run_blocking(self, fn: Callable[[], T]) -> asyncio.Future[T]:
        return self._alone(fn)

    def run_alone(self, fn: Callable[[], T]) -> asyncio.Future[T]:
        return self._alone(fn)

    def _alone(self, fn: Callable[[], T]) -> asyncio.Future[T]:
        fut: asyncio.Future[T] = self._loop.create_future()
        self.tasks.start(fn, functools.partial(_settle, fut))
        return fut

    def lock(self) -> CooperativeLock:
        return CooperativeLock(self.tasks)

    def stall(self, seconds: float) -> None:
        if not in_task():
            raise LoopWouldBlockError(
                "a `delay` failpoint was hit on the event loop itself (in production that "
                "freezes the node's loop); the simulation stalls only work on the flush "
                "executor")
        self.tasks.sleep(seconds)

    def shutdown(self) -> None:
        pass  # the store's close ran its last job (its files) to the end

    def abandon(self) -> None:
        """The node's process is gone: none of its tasks runs again."""
        self.tasks.abandon()
