"""VirtualTimeLoop: a deterministic asyncio event loop on virtual time.

The loop is asyncio's own selector loop with two things replaced: time()
returns a virtual clock, and the selector never waits. When no callback is
ready, the loop asks its selector to wait until the next timer; the selector
instead moves the virtual clock to that timer and returns at once. So a
`sleep(3600)` takes no wall time, timers fire in the order of their virtual
deadlines (ties in scheduling order, as asyncio's heap does), and a run is a
pure function of its inputs: no wall-clock reads, no threads.

Everything asyncio builds on timers works unchanged: asyncio.sleep,
asyncio.timeout, wait_for, call_later, tenacity's retries. `clock()` is the
matching store Clock (its monotonic() is this loop's time(); wall_ms is
derived from it), so a store or an HA session given that clock and run on
this loop has one time.

Real file descriptors are still polled (without waiting) while timers are
due, and the loop blocks on them only when nothing at all is scheduled —
the case where only another thread (run_in_executor) or a socket can make
progress. A simulation uses neither: its flush executor is inline
(store/flush_executor.py) and its transport in memory (ha/transport.py).
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Mapping
from typing import Any

from store.clock import LoopClock

# 2023-11-14T22:13:20Z: a fixed epoch, so wall timestamps are reproducible.
DEFAULT_START_WALL_MS = 1_700_000_000_000


class _NoWaitSelector(selectors.BaseSelector):
    """A real selector that, instead of waiting `timeout` seconds, polls
    once and moves the loop's virtual clock by `timeout`."""

    def __init__(self, loop: VirtualTimeLoop) -> None:
        self._real = selectors.DefaultSelector()
        self._loop = loop

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._real.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.modify(fileobj, events, data)

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return self._real.get_map()

    def close(self) -> None:
        self._real.close()

    def select(self, timeout: float | None = None
               ) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:
            # Nothing ready, no timer: only a thread or a socket can wake the
            # loop. Wait for it (a simulation never gets here: it would hang).
            return self._real.select(None)
        events = self._real.select(0)
        if not events and timeout > 0:
            self._loop.advance(timeout)
        return events


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An asyncio loop whose time() is virtual and jumps to the next timer
    whenever nothing is ready (see the module docstring)."""

    def __init__(self, start_wall_ms: int = DEFAULT_START_WALL_MS) -> None:
        self._now = 0.0
        self._start_wall_ms = start_wall_ms
        super().__init__(_NoWaitSelector(self))

    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        """Move virtual time forward (the selector does, when idle)."""
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
