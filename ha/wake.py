"""Wake: the flag an HA loop sleeps on between its turns, with a bounded wait.

The master's ship loop and the slave's report loop each wait, every turn,
for "something to do" or their heartbeat deadline, whichever comes first.
With an asyncio.Event under asyncio.timeout each turn built a Timeout
context, entered and left it, and on expiry cancelled and un-cancelled the
task; tens of thousands of turns a simulated run (docs/performance-notes.md,
"The simulated cluster"). `wait(timeout_s)` takes one future and one timer
instead.

Same order of events as Event.wait under asyncio.timeout, so a simulated run
stays the same: a set() resolves the waiting future (Event.set), an expiry
resolves it from the timer's callback (where the Timeout cancelled the
task's future); either way the waiter resumes in the next loop pass. A wait
on a flag already set returns at once.

One waiter at a time (each loop owns its Wake); set() and clear() are
called from the loop's thread only.
"""

from __future__ import annotations

import asyncio


class Wake:
    __slots__ = ("_set", "_waiter")

    def __init__(self) -> None:
        self._set = False
        self._waiter: asyncio.Future[None] | None = None

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        self._set = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def clear(self) -> None:
        self._set = False

    async def wait(self, timeout_s: float) -> bool:
        """Until set() or `timeout_s` (> 0) has passed; whether it is set."""
        assert timeout_s > 0, timeout_s
        if self._set:
            return True
        assert self._waiter is None, "a Wake has one waiter"
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        timer = loop.call_later(timeout_s, _expire, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None
        return self._set


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
