"""VirtualTimeLoop: a deterministic asyncio event loop on virtual time.

The loop is asyncio's selector loop with its scheduling core replaced:
time() returns a virtual clock, and when no callback is ready the loop
moves that clock straight to the next timer instead of waiting for it. So a
`sleep(3600)` takes no wall time, timers fire in the order of their virtual
deadlines (ties in the order they were scheduled), and a run is a pure
function of its inputs: no wall-clock reads, no threads.

Everything asyncio builds on timers works unchanged: asyncio.sleep,
asyncio.timeout, wait_for, call_later, tenacity's retries. `clock()` is the
matching store Clock (its monotonic() is this loop's time(); wall_ms is
derived from it), so a store or an HA session given that clock and run on
this loop has one time.

It is also cheaper per event than asyncio's own loop, since a simulation
runs hundreds of thousands of events a run (docs/performance-notes.md, "The
simulated cluster"): the timer heap holds (deadline, sequence, handle)
tuples compared in C rather than handles compared in Python, handles are
made without asyncio's debug-mode checks (unless the loop is in debug
mode), what callbacks make ready runs back to back while asyncio's next
iteration would run just that, and no selector is polled on every
iteration. Real file descriptors (a socket some code opened) are polled
without waiting on each iteration, as asyncio does; the loop's own
self-pipe, which only another thread writes to, is waited on only when
nothing at all is scheduled — the case where only another thread
(run_in_executor) or a socket can make progress. A simulation uses
neither: its flush executor is inline (store/seams/flush_executor.py) and its
transport in memory (ha/transport/).

The scheduling core (_run_once, call_soon, call_at) follows CPython 3.11's
asyncio.base_events and uses its private attributes (_ready, _scheduled,
_stopping, _timer_cancelled_count); tests/store/test_sim_loop.py and the sim
determinism tests exercise it.
"""

from __future__ import annotations

import asyncio
import contextvars
import heapq
import selectors
from asyncio import events
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, TypeVarTuple, Unpack

from store.seams.clock import LoopClock

# 2023-11-14T22:13:20Z: a fixed epoch, so wall timestamps are reproducible.
DEFAULT_START_WALL_MS = 1_700_000_000_000
# asyncio's rule for sweeping cancelled timers out of the heap at once
# (base_events._MIN_SCHEDULED_TIMER_HANDLES and _FRACTION).
_SWEEP_MIN_TIMERS = 100
_SWEEP_CANCELLED_FRACTION = 0.5

_Ts = TypeVarTuple("_Ts")
_heappush = heapq.heappush
_heappop = heapq.heappop
_copy_context = contextvars.copy_context


class _Handle(events.Handle):
    """asyncio's Handle, made without the debug-mode check (a loop in debug
    mode makes asyncio's own)."""

    __slots__ = ()

    def __init__(self, callback: Callable[..., object], args: tuple[Any, ...],
                 loop: asyncio.AbstractEventLoop,
                 context: contextvars.Context | None = None) -> None:
        self._context = context if context is not None else _copy_context()
        self._loop = loop
        self._callback = callback
        self._args = args
        self._cancelled = False
        self._repr = None
        self._source_traceback = None


class _TimerHandle(events.TimerHandle):
    """asyncio's TimerHandle, made without the debug-mode check."""

    __slots__ = ()
    _scheduled: bool

    def __init__(self, when: float, callback: Callable[..., object], args: tuple[Any, ...],
                 loop: asyncio.AbstractEventLoop,
                 context: contextvars.Context | None = None) -> None:
        self._context = context if context is not None else _copy_context()
        self._loop = loop
        self._callback = callback
        self._args = args
        self._cancelled = False
        self._repr = None
        self._source_traceback = None
        self._when = when
        self._scheduled = False


class _TrackingSelector(selectors.BaseSelector):
    """A real selector that tells its loop whether any file descriptor
    besides the loop's self-pipe (the first one registered) is watched."""

    def __init__(self, loop: VirtualTimeLoop) -> None:
        self._real = selectors.DefaultSelector()
        self._loop = loop

    def _update(self) -> None:
        self._loop._has_io = len(self._real.get_map()) > 1

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        key = self._real.register(fileobj, events, data)
        self._update()
        return key

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        key = self._real.unregister(fileobj)
        self._update()
        return key

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.modify(fileobj, events, data)

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return self._real.get_map()

    def close(self) -> None:
        self._real.close()

    def select(self, timeout: float | None = None
               ) -> list[tuple[selectors.SelectorKey, int]]:
        return self._real.select(timeout)


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An asyncio loop whose time() is virtual and jumps to the next timer
    whenever nothing is ready (see the module docstring)."""

    # asyncio.BaseEventLoop's private state this loop's core uses (typeshed
    # does not declare it).
    _ready: deque[events.Handle]
    _stopping: bool
    _closed: bool
    _debug: bool
    _clock_resolution: float
    _timer_cancelled_count: int
    _selector: selectors.BaseSelector
    _process_events: Callable[[list[tuple[selectors.SelectorKey, int]]], None]

    def __init__(self, start_wall_ms: int = DEFAULT_START_WALL_MS) -> None:
        self._now = 0.0
        self._start_wall_ms = start_wall_ms
        self._timer_seq = 0  # breaks deadline ties in scheduling order
        self._has_io = False
        super().__init__(_TrackingSelector(self))
        # (deadline, sequence, handle), a heap; asyncio's own methods only
        # clear it (close) or count cancellations in it.
        self._scheduled: list[tuple[float, int, _TimerHandle]] = []

    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        """Move virtual time forward (the loop does, when idle)."""
        assert seconds >= 0, seconds
        self._now += seconds

    def wall_ms(self) -> int:
        """Milliseconds since the epoch, derived from the virtual time."""
        return self._start_wall_ms + int(self._now * 1000)

    def wall_ns(self) -> int:
        """Nanoseconds since the epoch, derived from the virtual time (the
        history's µs latencies)."""
        return self._start_wall_ms * 1_000_000 + int(self._now * 1_000_000_000)

    def clock(self) -> LoopClock:
        """The store Clock that is this loop's time."""
        return LoopClock(self, wall_ms=self.wall_ms)

    # ----------------------------------------------------- scheduling core
    def call_soon(self, callback: Callable[[Unpack[_Ts]], object], *args: *_Ts,
                  context: contextvars.Context | None = None) -> events.Handle:
        if self._debug:
            return super().call_soon(callback, *args, context=context)
        if self._closed:
            raise RuntimeError("Event loop is closed")
        handle = _Handle(callback, args, self, context)
        self._ready.append(handle)
        return handle

    def call_later(self, delay: float, callback: Callable[[Unpack[_Ts]], object],
                   *args: *_Ts,
                   context: contextvars.Context | None = None) -> events.TimerHandle:
        if delay is None:
            raise TypeError("delay must not be None")
        return self.call_at(self._now + delay, callback, *args, context=context)

    def call_at(self, when: float, callback: Callable[[Unpack[_Ts]], object], *args: *_Ts,
                context: contextvars.Context | None = None) -> events.TimerHandle:
        if when is None:
            raise TypeError("when cannot be None")
        if self._closed:
            raise RuntimeError("Event loop is closed")
        timer = _TimerHandle(when, callback, args, self, context)
        self._timer_seq += 1
        _heappush(self._scheduled, (when, self._timer_seq, timer))
        timer._scheduled = True
        return timer

    def _run_once(self) -> None:
        """One iteration: drop cancelled timers, poll real sockets (if
        any), jump the clock to the next timer if nothing is ready, move
        the due timers to the ready queue and run what was ready, then
        what those callbacks made ready, batch after batch, for as long as
        asyncio's own next iterations would run just that batch."""
        scheduled = self._scheduled
        ready = self._ready
        n = len(scheduled)
        if (n > _SWEEP_MIN_TIMERS
                and self._timer_cancelled_count / n > _SWEEP_CANCELLED_FRACTION):
            kept = []
            for entry in scheduled:
                if entry[2]._cancelled:
                    entry[2]._scheduled = False
                else:
                    kept.append(entry)
            heapq.heapify(kept)
            scheduled[:] = kept
            self._timer_cancelled_count = 0
        else:
            while scheduled and scheduled[0][2]._cancelled:
                self._timer_cancelled_count -= 1
                _heappop(scheduled)[2]._scheduled = False

        idle = not ready and not self._stopping
        if self._has_io or (idle and not scheduled):
            # Real sockets: poll them; nothing scheduled at all: only
            # another thread or a socket can wake the loop, so wait.
            event_list = self._selector.select(None if idle and not scheduled else 0)
            self._process_events(event_list)
            idle = idle and not ready
        if idle and scheduled:
            when = scheduled[0][0]
            if when > self._now:
                self._now = when

        end = self._now + self._clock_resolution
        while scheduled and scheduled[0][0] < end:
            timer = _heappop(scheduled)[2]
            timer._scheduled = False
            ready.append(timer)

        popleft = ready.popleft
        while True:
            for _ in range(len(ready)):
                handle = popleft()
                if not handle._cancelled:
                    handle._run()
            # What those callbacks made ready runs next. While no timer is
            # due, no socket watched and no stop asked, asyncio's next
            # iteration would run exactly that batch (virtual time stands
            # still while anything is ready): run it here, without the
            # iteration's bookkeeping.
            if (not ready or self._stopping or self._has_io
                    or (scheduled and scheduled[0][0] < self._now + self._clock_resolution)):
                break
        del handle  # breaks a cycle when an exception occurs


def run(main: Any, *, start_wall_ms: int = DEFAULT_START_WALL_MS) -> Any:
    """asyncio.run(main) on a fresh VirtualTimeLoop. `main` is a coroutine
    function taking the loop (so it can hand the loop's clock around)."""
    loop = VirtualTimeLoop(start_wall_ms)
    try:
        return loop.run_until_complete(main(loop))
    finally:
        try:
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()
