"""The VirtualTimeLoop's scheduling core (store/sim/loop.py): virtual time
jumps to the next timer, timers with the same deadline fire in the order
they were scheduled, cancelled timers never fire, and the loop polls no
selector unless a real socket is watched — yet a socket, or another thread,
still wakes it."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from typing import Any

from store.sim import loop as sim_loop
from store.sim.loop import VirtualTimeLoop


def test_timers_with_one_deadline_fire_in_the_order_they_were_scheduled() -> None:
    fired: list[int] = []

    async def main(loop: VirtualTimeLoop) -> None:
        # Deadlines 0, 1, 2 seconds, interleaved: a heap of handles compared
        # by deadline alone keeps no order among equal ones.
        for i in range(60):
            loop.call_later(float(i % 3), fired.append, i)
        await asyncio.sleep(3)

    sim_loop.run(main)
    assert fired == sorted(fired, key=lambda i: (i % 3, i))


def test_time_jumps_to_each_deadline_and_cancelled_timers_never_fire() -> None:
    seen: list[tuple[str, float]] = []

    async def main(loop: VirtualTimeLoop) -> float:
        t0 = time.monotonic()
        handles = [loop.call_later(10.0 + i, seen.append, ("cancelled", i)) for i in range(300)]
        loop.call_later(2.5, lambda: seen.append(("timer", loop.time())))
        for h in handles:  # more than half cancelled: swept out of the heap at once
            h.cancel()
        await asyncio.sleep(3600)
        seen.append(("slept", loop.time()))
        return time.monotonic() - t0

    wall = sim_loop.run(main)
    assert seen == [("timer", 2.5), ("slept", 3600.0)]
    assert wall < 1.0, wall


def test_no_selector_is_polled_while_only_callbacks_and_timers_run() -> None:
    polls: list[Any] = []

    async def main(loop: VirtualTimeLoop) -> None:
        real = loop._selector.select

        def counting(timeout: float | None = None) -> Any:
            polls.append(timeout)
            return real(timeout)

        loop._selector.select = counting  # type: ignore[method-assign]
        for _ in range(200):
            await asyncio.sleep(0.01)
            await asyncio.sleep(0)

    sim_loop.run(main)
    assert polls == []


def test_a_watched_socket_is_still_polled_between_timers() -> None:
    a, b = socket.socketpair()
    got: list[tuple[bytes, float]] = []

    async def main(loop: VirtualTimeLoop) -> None:
        loop.add_reader(a.fileno(), lambda: got.append((a.recv(16), loop.time())))
        b.send(b"ping")
        # Timers keep the loop busy; the socket's data is read while they do.
        for _ in range(50):
            await asyncio.sleep(0.1)
            if got:
                break
        loop.remove_reader(a.fileno())

    try:
        sim_loop.run(main)
    finally:
        a.close()
        b.close()
    assert got and got[0][0] == b"ping"
    assert got[0][1] < 1.0, got


def test_another_thread_wakes_a_loop_with_nothing_scheduled() -> None:
    async def main(loop: VirtualTimeLoop) -> str:
        fut: asyncio.Future[str] = loop.create_future()
        threading.Timer(0.05, loop.call_soon_threadsafe, (fut.set_result, "woken")).start()
        return await fut  # no timer: the loop waits on its self-pipe

    assert sim_loop.run(main) == "woken"
