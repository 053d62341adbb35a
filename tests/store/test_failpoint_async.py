"""Failpoints.hit_async: a `delay` waits on the event loop (the rest of the
node goes on), a `+crash` then crashes; other actions act as hit() does."""

from __future__ import annotations

import asyncio

from store.failpoints import Failpoints
from store.sim import loop as sim_loop
from store.sim.loop import VirtualTimeLoop


def test_a_delay_waits_only_the_coroutine_that_hit_it_then_crashes() -> None:
    async def main(loop: VirtualTimeLoop) -> tuple[float, list[float], list[str]]:
        crashed: list[float] = []
        fp = Failpoints("sync_state_set_adopt=delay:3000+crash@2",
                        on_crash=lambda: crashed.append(loop.time()))
        ticks: list[str] = []

        async def other() -> None:  # the node going on meanwhile
            for _ in range(5):
                await asyncio.sleep(0.5)
                ticks.append("tick")

        t0 = loop.time()
        side = asyncio.ensure_future(other())
        await fp.hit_async("sync_state_set_adopt")  # the first hit: not armed for it
        assert loop.time() == t0 and not crashed
        await fp.hit_async("sync_state_set_adopt")
        await side
        return loop.time() - t0, [c - t0 for c in crashed], ticks

    waited, crashed_at, ticks = sim_loop.run(main)
    assert crashed_at == [3.0]  # after the delay, on virtual time
    assert ticks == ["tick"] * 5  # the loop ran other work during the delay
    assert waited >= 3.0


def test_an_unarmed_name_costs_nothing_and_counts_as_a_hit() -> None:
    seen: list[str] = []
    fp = Failpoints("")
    fp.observe = seen.append
    asyncio.run(fp.hit_async("sync_state_set_adopt"))
    assert seen == ["sync_state_set_adopt"]
