"""ha/wake.py: the HA loops' bounded wait. It wakes on set() or at its
deadline, in the same order of events as asyncio.Event.wait under
asyncio.timeout, so a simulated run stays the same run
(docs/performance-notes.md, "The simulated cluster";
tests/chaos/test_sim_ha_waits.py checks the loops use it)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

from ha.wake import Wake
from store.sim import loop as sim_loop
from store.sim.loop import VirtualTimeLoop


def test_a_wait_ends_at_its_deadline_or_at_set_whichever_comes_first() -> None:
    async def main(loop: VirtualTimeLoop) -> list[tuple[float, bool]]:
        w = Wake()
        out = []
        woke = await w.wait(2.0)  # nobody sets it: the deadline
        out.append((loop.time(), woke))
        loop.call_later(0.5, w.set)
        woke = await w.wait(2.0)  # set after 0.5 s
        out.append((loop.time(), woke))
        woke = await w.wait(2.0)  # still set: at once
        out.append((loop.time(), woke))
        w.clear()
        out.append((loop.time(), w.is_set()))
        return out

    assert sim_loop.run(main) == [(2.0, False), (2.5, True), (2.5, True), (2.5, False)]


def test_a_cancelled_wait_leaves_no_timer_and_takes_a_new_waiter() -> None:
    async def main(loop: VirtualTimeLoop) -> tuple[bool, float]:
        w = Wake()
        t = loop.create_task(w.wait(5.0))
        await asyncio.sleep(1.0)
        t.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await t
        loop.call_later(1.0, w.set)
        return await w.wait(10.0), loop.time()

    assert sim_loop.run(main) == (True, 2.0)


def _trace(make_wait: Callable[[VirtualTimeLoop], tuple[Callable[[], None],
                                                        Callable[[float], Awaitable[Any]]]]
           ) -> list[tuple[float, str]]:
    """What happens when, around a loop that waits on a flag with a bound
    while other callbacks set it, some at the very moment the bound expires."""

    async def main(loop: VirtualTimeLoop) -> list[tuple[float, str]]:
        seen: list[tuple[float, str]] = []
        set_flag, wait = make_wait(loop)

        def other(tag: str) -> None:
            seen.append((loop.time(), tag))

        async def waiter() -> None:
            for i in range(8):
                await wait(1.0)
                seen.append((loop.time(), f"woke {i}"))

        for at in (0.25, 1.25, 3.25, 4.25):  # a set() on the deadline, or just after one
            loop.call_later(at, set_flag)
            loop.call_later(at, other, f"beside set {at}")
        for at in (1.0, 2.0, 2.25):
            loop.call_later(at, other, f"tick {at}")
        await loop.create_task(waiter())
        return seen

    return sim_loop.run(main)


def test_waking_happens_in_the_order_event_wait_under_asyncio_timeout_gives() -> None:
    def with_wake(loop: VirtualTimeLoop) -> tuple[Callable[[], None],
                                                  Callable[[float], Awaitable[Any]]]:
        w = Wake()

        async def wait(t: float) -> None:
            await w.wait(t)
            w.clear()
        return w.set, wait

    def with_event(loop: VirtualTimeLoop) -> tuple[Callable[[], None],
                                                   Callable[[float], Awaitable[Any]]]:
        ev = asyncio.Event()

        async def wait(t: float) -> None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(t):
                    await ev.wait()
            ev.clear()
        return ev.set, wait

    assert _trace(with_wake) == _trace(with_event)
