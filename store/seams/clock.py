"""The time seam: the store and nodes ask a Clock, never the time module."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol


class Clock(Protocol):
    def wall_ms(self) -> int:
        """Milliseconds since the epoch: store timestamps, the checkpoint."""
        ...

    def monotonic(self) -> float:
        """Seconds, for intervals and timeouts."""
        ...


class SystemClock:
    def wall_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic(self) -> float:
        return time.monotonic()


class LoopClock:
    """The Clock of an event loop: monotonic() IS the loop's time(), so every
    asyncio timer, timeout and call_later of that loop runs on this Clock.

    On asyncio's standard loops time() is time.monotonic(), so this agrees
    with SystemClock; on a VirtualTimeLoop (store/sim/loop.py) both are the
    loop's virtual time. `wall_ms` defaults to the system's wall clock; a
    simulated loop passes its own (derived from its virtual time)."""

    def __init__(self, loop: asyncio.AbstractEventLoop,
                 wall_ms: Callable[[], int] | None = None) -> None:
        self.loop = loop
        self._wall_ms = wall_ms or SystemClock().wall_ms

    def wall_ms(self) -> int:
        return self._wall_ms()

    def monotonic(self) -> float:
        return self.loop.time()
