"""The flush executor seam: where the store's file IO runs.

A MessageStore never starts a thread itself; it asks its FlushExecutor:
- `run(fn)`: run one blocking call (a flush, a checkpoint sync, a consume
  queue flush, an offset table persist) off the loop's current callback; the
  returned future resolves on the loop;
- `worker(loop, job)`: the group commit's flusher. `kick()` asks for `job`
  to run once more soon (kicks before it starts count as one); the job
  delivers results with `to_loop(fn, *args)` and returns False to end the
  worker (the log failed, or the loop is gone);
- `run_blocking(fn)`: a call that may block on the executor itself (joining
  the worker at close) without blocking the loop;
- `run_alone(fn)`: one blocking call beside the flusher, on a thread of its
  own (a dispatch pass that a failpoint may stall, as RocketMQ's
  ReputMessageService runs on its own thread);
- `lock()`: a lock for the store's state that work on the executor may hold
  across a stall (CommitLog._flush_lock, ConsumeSide._reput_lock).

Three implementations:
- ThreadFlushExecutor (production): one "flusher" thread for `run`, one
  "group-commit" thread per worker, a "reput" thread per `run_alone`;
  results come back with call_soon_threadsafe. The fsync then overlaps the
  loop's work. Its locks are threading.Lock.
- InlineFlushExecutor (tests, the simulation): everything on the loop, in
  call_soon order. No thread: a run is deterministic. On a VirtualTimeLoop a
  flush takes no virtual time, unless the executor is given an fsync
  latency: then a group-commit flush runs that long after its kick, and
  meanwhile the loop goes on (appends, the HA master shipping what it
  wrote), as it does beside a flusher thread whose fsync is in progress. A
  flush covers what was appended up to its end (a thread's covers what was
  there when its write began: slightly more coalescing than real).
- CooperativeFlushExecutor (store/sim/cooperative_executor.py: the simulation,
  for a node with a `delay` failpoint armed): the inline executor's order
  until a stall, which then parks just the work that hit it for that much
  virtual time while the loop goes on.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


class FlushWorker(Protocol):
    def kick(self) -> None:
        """Run the job once more, soon (never inside this call)."""
        ...

    def kicked(self) -> bool:
        """A kick is pending (the job has not started on it yet)."""
        ...

    def to_loop(self, fn: Callable[..., object], *args: Any) -> bool:
        """Call fn(*args) on the loop; False when the loop is gone."""
        ...

    def stop(self) -> None:
        """End the worker; blocks until a job in progress has finished."""
        ...


class StoreLock(Protocol):
    """What the store uses of threading.Lock."""

    def acquire(self, blocking: bool = ..., timeout: float = ...) -> bool: ...

    def release(self) -> None: ...

    def __enter__(self) -> bool: ...

    def __exit__(self, *exc: Any) -> object: ...


class FlushExecutor(Protocol):
    # True when a group-commit flush takes loop time the executor models
    # (InlineFlushExecutor with an fsync latency): the store then always
    # flushes on the worker, where that time passes, never inline.
    timed_flushes: bool

    def run(self, fn: Callable[[], T]) -> asyncio.Future[T]: ...

    def worker(self, loop: asyncio.AbstractEventLoop, job: Callable[[], bool]) -> FlushWorker:
        ...

    def run_blocking(self, fn: Callable[[], T]) -> asyncio.Future[T]: ...

    def run_alone(self, fn: Callable[[], T]) -> asyncio.Future[T]: ...

    def lock(self) -> StoreLock: ...

    def shutdown(self) -> None:
        """Release the executor (waits for a `run` in progress)."""
        ...


# ------------------------------------------------------------- production
class _ThreadWorker:
    def __init__(self, loop: asyncio.AbstractEventLoop, job: Callable[[], bool]) -> None:
        self._loop = loop
        self._job = job
        self._kick = threading.Event()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="group-commit", daemon=True)
        self._thread.start()

    def kick(self) -> None:
        self._kick.set()

    def kicked(self) -> bool:
        return self._kick.is_set()

    def to_loop(self, fn: Callable[..., object], *args: Any) -> bool:
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # loop closed under us: nobody is waiting
            return False
        return True

    def _run(self) -> None:
        while True:
            self._kick.wait()
            self._kick.clear()
            if self._stop or not self._job():
                return

    def stop(self) -> None:
        self._stop = True
        self._kick.set()
        self._thread.join()


class ThreadFlushExecutor:
    """Today's threads: one "flusher" for run(), one per group-commit worker."""

    timed_flushes = False

    def __init__(self) -> None:
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="flusher")

    def run(self, fn: Callable[[], T]) -> asyncio.Future[T]:
        return asyncio.get_running_loop().run_in_executor(self._pool, fn)

    def worker(self, loop: asyncio.AbstractEventLoop, job: Callable[[], bool]) -> FlushWorker:
        return _ThreadWorker(loop, job)

    def run_blocking(self, fn: Callable[[], T]) -> asyncio.Future[T]:
        return asyncio.get_running_loop().run_in_executor(None, fn)

    def run_alone(self, fn: Callable[[], T]) -> asyncio.Future[T]:
        """fn on a daemon thread of its own (a stalled one must not keep the
        process from exiting); the future resolves on the loop."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[T] = loop.create_future()

        def settle(result: Any, exc: BaseException | None) -> None:
            if done.done():  # its awaiter was cancelled
                return
            if exc is None:
                done.set_result(result)
            else:
                done.set_exception(exc)

        def run() -> None:
            try:
                result, exc = fn(), None
            except BaseException as e:  # handed to the awaiter
                result, exc = None, e
            with contextlib.suppress(RuntimeError):  # the loop has closed
                loop.call_soon_threadsafe(settle, result, exc)

        threading.Thread(target=run, name="reput", daemon=True).start()
        return done

    def lock(self) -> StoreLock:
        return threading.Lock()

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True)
