"""The simulation's cooperative flush executor (store/sim/cooperative_executor.py)
on a VirtualTimeLoop: a `delay` stalls just the work that hit it, for
exactly that much virtual time, while the loop goes on; work behind it
keeps production's order (one flusher thread, one thread per group-commit
worker); a lock a stalled task holds makes others wait in virtual time.
Wall time stays small throughout: nothing sleeps."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from store.failpoints import Failpoints
from store.seams.flush_executor import ThreadFlushExecutor
from store.sim import loop as sim_loop
from store.sim.cooperative import LoopWouldBlockError
from store.sim.cooperative_executor import CooperativeFlushExecutor
from store.sim.loop import VirtualTimeLoop

STALL_S = 30.0  # virtual: a wall-clock sleep of this would fail the wall bound


def _run(main: Any) -> Any:
    t0 = time.monotonic()
    out = sim_loop.run(main)
    assert time.monotonic() - t0 < 5.0  # generous: it takes milliseconds
    return out


def test_a_stalled_run_parks_for_its_virtual_time_while_the_loop_goes_on() -> None:
    async def main(loop: VirtualTimeLoop) -> tuple[list[tuple[str, float]], list[float]]:
        ex = CooperativeFlushExecutor(loop)
        lock = ex.lock()
        failpoints = Failpoints("flush_before_write=delay:30000@1", stall=ex.stall)
        events: list[tuple[str, float]] = []

        def stalled() -> str:
            with lock:  # held across the stall, as CommitLog.flush holds _flush_lock
                events.append(("first starts", loop.time()))
                failpoints.hit("flush_before_write")
                events.append(("first ends", loop.time()))
            return "first"

        def second() -> str:
            events.append(("second runs", loop.time()))
            return "second"

        def blocked() -> None:  # a thread of its own, blocking on the lock
            with lock:
                events.append(("lock taken", loop.time()))

        ticks: list[float] = []

        async def ticker() -> None:
            for _ in range(4):
                await asyncio.sleep(10.0)
                ticks.append(loop.time())

        tick = loop.create_task(ticker())
        first = ex.run(stalled)
        second_done = ex.run(second)  # the one flusher thread: queued behind
        alone = ex.run_alone(blocked)
        assert not first.done() and not second_done.done() and not alone.done()
        assert events == [("first starts", 0.0)]
        assert not lock.acquire(blocking=False)  # a reput() on the loop: just fails
        assert await first == "first"
        assert await second_done == "second"
        await alone
        await tick
        return events, ticks

    events, ticks = _run(main)
    assert events == [("first starts", 0.0), ("first ends", STALL_S),
                      ("second runs", STALL_S), ("lock taken", STALL_S)]
    assert ticks == [10.0, 20.0, 30.0, 40.0]  # the loop went on during the stall


def test_a_lock_wait_times_out_in_virtual_seconds() -> None:
    async def main(loop: VirtualTimeLoop) -> list[tuple[bool, float]]:
        ex = CooperativeFlushExecutor(loop)
        lock = ex.lock()
        out: list[tuple[bool, float]] = []

        def holder() -> None:
            with lock:
                ex.stall(12.0)

        def drain(timeout: float) -> None:  # store close's _drain_dispatch
            got = lock.acquire(timeout=timeout)
            out.append((got, loop.time()))
            if got:
                lock.release()

        held = ex.run_alone(holder)
        await asyncio.sleep(1.0)
        await ex.run(lambda: drain(5.0))  # gives up at 1 + 5
        await ex.run(lambda: drain(-1))  # waits for the stall's end
        await held
        return out

    assert _run(main) == [(False, 6.0), (True, 12.0)]


def test_a_worker_kicked_while_its_job_is_stalled_runs_it_again_after_never_beside() -> None:
    async def main(loop: VirtualTimeLoop) -> list[tuple[str, float]]:
        ex = CooperativeFlushExecutor(loop)
        runs: list[tuple[str, float]] = []

        def job() -> bool:
            runs.append(("start", loop.time()))
            if len(runs) == 1:
                ex.stall(3.0)
            runs.append(("end", loop.time()))
            return True

        worker = ex.worker(loop, job)
        worker.kick()
        await asyncio.sleep(1.0)
        worker.kick()  # the job is parked: it waits
        assert worker.kicked()
        await asyncio.sleep(5.0)
        assert not worker.kicked()
        stop = ex.run_blocking(worker.stop)
        await stop
        return runs

    assert _run(main) == [("start", 0.0), ("end", 3.0), ("start", 3.0), ("end", 3.0)]


def test_closing_joins_a_stalled_worker_in_virtual_time() -> None:
    async def main(loop: VirtualTimeLoop) -> float:
        ex = CooperativeFlushExecutor(loop)

        def job() -> bool:
            ex.stall(4.0)
            return True

        worker = ex.worker(loop, job)
        worker.kick()
        await asyncio.sleep(0.5)
        await ex.run_blocking(worker.stop)  # GroupCommit.stop at a store's close
        return loop.time()

    assert _run(main) == 4.0


def test_the_loop_itself_never_waits() -> None:
    async def main(loop: VirtualTimeLoop) -> None:
        ex = CooperativeFlushExecutor(loop)
        lock = ex.lock()

        def holder() -> None:
            with lock:
                ex.stall(1.0)

        held = ex.run_alone(holder)
        with pytest.raises(LoopWouldBlockError, match="lock a parked"):
            lock.acquire()
        with pytest.raises(LoopWouldBlockError, match="event loop itself"):
            ex.stall(1.0)
        await held
        assert lock.acquire(blocking=False)  # free again once the stall ended

    _run(main)


def test_abandoned_tasks_never_resume() -> None:
    async def main(loop: VirtualTimeLoop) -> tuple[list[str], bool]:
        ex = CooperativeFlushExecutor(loop)
        lock = ex.lock()
        seen: list[str] = []

        def stalled() -> None:
            try:
                with lock:
                    ex.stall(2.0)
                    seen.append("resumed")
            finally:
                seen.append("unwound")

        pending = ex.run_alone(stalled)
        await asyncio.sleep(0.5)
        ex.abandon()  # the node's process exited
        await asyncio.sleep(5.0)
        return seen, pending.done()

    seen, done = _run(main)
    assert seen == ["unwound"] and not done


def test_without_a_stall_a_run_ends_inside_the_call_as_inline() -> None:
    async def main(loop: VirtualTimeLoop) -> None:
        ex = CooperativeFlushExecutor(loop)
        fut = ex.run(lambda: 7)
        assert fut.done() and fut.result() == 7
        failed = ex.run(lambda: 1 // 0)
        assert failed.done() and isinstance(failed.exception(), ZeroDivisionError)

    _run(main)


def test_production_runs_a_lone_pass_on_a_thread_of_its_own() -> None:
    async def main() -> tuple[str, str]:
        ex = ThreadFlushExecutor()
        try:
            name = await ex.run_alone(lambda: threading.current_thread().name)
            with pytest.raises(ZeroDivisionError):
                await ex.run_alone(lambda: 1 // 0)
            return name, type(ex.lock()).__name__
        finally:
            ex.shutdown()

    name, lock_type = asyncio.run(main())
    assert name == "reput" and lock_type == type(threading.Lock()).__name__
