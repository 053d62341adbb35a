"""Cooperative tasks: blocking store work that a `delay` failpoint may stall,
run on a simulated loop's own thread, so the stall takes virtual time and
holds back exactly that work while the rest of the cluster goes on.

In production a stall is `time.sleep` on the thread that hit it (the
flusher, a group-commit worker, the reput service's thread): that thread
waits, the event loop does not. A simulation runs everything on one
VirtualTimeLoop in one thread, where a sleep would freeze every node and
take wall time instead of virtual time. Here each such piece of work runs
as a greenlet on the loop's thread:

- the loop (the thread's main greenlet) switches into a task, which runs
  until it returns or parks; only then does the loop go on. One flow of
  control at a time, in an order fixed by the loop's callbacks: a run stays
  a pure function of its seed;
- a stall parks the task and schedules `call_later(seconds)` to switch back
  into it: the loop, the other nodes, producers and consumer run
  meanwhile, on virtual time;
- a task that waits for a CooperativeLock another task holds across a
  stall parks too, and is handed the lock at its release (or told it timed
  out, in virtual seconds), as a thread blocked in threading.Lock.acquire
  is.

Why greenlets and not a helper thread stepped in lockstep with the loop:
the task's code runs on the loop's own thread, so asyncio's per-thread
state (the running loop, asyncio.current_task) and a node's own
in-process crash (chaos/sim/cluster.py kills the node from inside the
task) work unchanged, with no hand-off between OS threads. The code that
runs in a task is the store's real code; only its locks held across a
stall (CommitLog._flush_lock, ConsumeSide._reput_lock) are this module's
CooperativeLock, made through the flush executor's lock() seam.

Rules:
- only the loop switches: tasks start and resume from loop callbacks (a
  task that wakes another schedules it with call_soon), so every switch
  returns to the loop, never into another task;
- the loop itself never waits: a blocking acquire on the loop of a lock a
  parked task holds, or a stall hit on the loop, raises
  LoopWouldBlockError (in production that would freeze the node's loop,
  which the simulation does not model);
- abandon() ends every task at once, as the exit of a process ends its
  threads: timers cancelled, each parked task unwound (GreenletExit) in
  order from the loop, none ever resumed.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections import deque
from collections.abc import Callable
from typing import Any

import greenlet

# A task's value to the loop when it parks (anything else: it ended).
_PARKED = object()


class LoopWouldBlockError(RuntimeError):
    """The loop itself would have to wait (see the module docstring)."""


class _Ended:
    """How a task ended: its result or its exception."""

    __slots__ = ("exc", "result")

    def __init__(self, result: Any, exc: BaseException | None) -> None:
        self.result = result
        self.exc = exc


Done = Callable[[Any, BaseException | None], None]


class CooperativeTasks:
    """The cooperative tasks of one node incarnation on `loop`."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        # Parked tasks, in the order they parked, with their wake-up timer
        # (None: woken by someone else, e.g. a lock's release).
        self._parked: dict[greenlet.greenlet, asyncio.TimerHandle | None] = {}
        self._done: dict[greenlet.greenlet, Done] = {}
        self.abandoned = False

    # ------------------------------------------------------------ the loop
    def start(self, fn: Callable[[], Any], done: Done) -> None:
        """Run fn() as a new task now (from a task: as soon as the loop
        can), until it ends or parks; done(result, exc) runs on the loop
        when it ends."""
        if self.abandoned:
            return
        if in_task():
            self.loop.call_soon(self.start, fn, done)
            return
        task = greenlet.greenlet(_body(fn))
        task.gr_context = contextvars.copy_context()  # a new greenlet's is empty
        self._done[task] = done
        self._step(task, None)

    def _step(self, task: greenlet.greenlet, value: Any) -> None:
        if self.abandoned or task.dead:
            return
        self._parked.pop(task, None)
        out = task.switch(value)
        if out is _PARKED:
            return
        assert isinstance(out, _Ended), out
        done = self._done.pop(task, None)
        if done is not None:
            done(out.result, out.exc)

    def wake(self, task: greenlet.greenlet, value: Any) -> None:
        """Resume a parked task soon, with `value` as park()'s return."""
        timer = self._parked.get(task)
        if timer is not None:
            timer.cancel()
        self._parked[task] = None
        self.loop.call_soon(self._step, task, value)

    def abandon(self) -> None:
        """End every task (module docstring): the process is gone."""
        if self.abandoned:
            return
        self.abandoned = True
        for timer in self._parked.values():
            if timer is not None:
                timer.cancel()
        if in_task():  # only the loop switches
            self.loop.call_soon(self._unwind)
        else:
            self._unwind()

    def _unwind(self) -> None:
        parked, self._parked = list(self._parked), {}
        self._done.clear()
        for task in parked:
            if not task.dead:
                task.throw(greenlet.GreenletExit)

    # --------------------------------------------------------------- tasks
    def park(self, seconds: float | None = None) -> Any:
        """Park the calling task until wake() (or `seconds` of loop time,
        then returning None)."""
        task = greenlet.getcurrent()
        if task.parent is None:
            raise LoopWouldBlockError("the loop itself cannot park: only a cooperative task "
                                      "(a flush, a dispatch pass, a close) can wait")
        if self.abandoned:
            raise greenlet.GreenletExit
        timer = None if seconds is None else self.loop.call_later(seconds, self._step, task, None)
        self._parked[task] = timer
        assert task.parent is not None
        return task.parent.switch(_PARKED)

    def sleep(self, seconds: float) -> None:
        """A stall of the calling task for `seconds` of loop time."""
        self.park(seconds)

    def parked(self) -> int:
        return len(self._parked)


def in_task() -> bool:
    """Whether the caller runs in a cooperative task (not on the loop)."""
    return greenlet.getcurrent().parent is not None


def current() -> greenlet.greenlet:
    """The calling task (to wake() later)."""
    return greenlet.getcurrent()


def _body(fn: Callable[[], Any]) -> Callable[[Any], _Ended]:
    def run(_first: Any) -> _Ended:
        try:
            return _Ended(fn(), None)
        except BaseException as exc:  # handed to the loop's side: done(None, exc)
            return _Ended(None, exc)

    return run


class CooperativeLock:
    """threading.Lock's interface, for a lock a task may hold across a stall
    (see the module docstring). Waiters are served in the order they came."""

    def __init__(self, tasks: CooperativeTasks) -> None:
        self._tasks = tasks
        self._held = False
        self._waiters: deque[greenlet.greenlet] = deque()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if not self._held:
            self._held = True
            return True
        if not blocking or timeout == 0:
            return False
        if not in_task():
            raise LoopWouldBlockError(
                "the loop would block on a lock a parked cooperative task holds (in "
                "production that freezes the node's loop until the stall ends); run the "
                "caller on the flush executor")
        me = current()
        self._waiters.append(me)
        try:
            got = self._tasks.park(None if timeout < 0 else timeout)
        finally:
            if me in self._waiters:  # timed out (or unwound): not handed the lock
                self._waiters.remove(me)
        return got is True

    def release(self) -> None:
        if not self._held:
            raise RuntimeError("release unlocked lock")
        if self._waiters and not self._tasks.abandoned:
            # Handed over: it stays held, by the first waiter, woken soon.
            self._tasks.wake(self._waiters.popleft(), True)
        else:
            self._held = False

    def locked(self) -> bool:
        return self._held

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
