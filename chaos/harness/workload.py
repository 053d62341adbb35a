"""The chaos workload: producers sending messages with unique ids, every
operation recorded as one history row (chaos/schema.py HISTORY).

Each producer draws its body sizes and bodies from its own seeded stream,
so a producer's sequence of messages is the same in every run of a seed.
A call that fails or times out is INDETERMINATE (it may or may not have been
stored), never "lost". With `retries` > 0 a producer re-sends the same
msg_id after an INDETERMINATE or not-stored answer, as RocketMQ producers
do, which is how duplicates arise.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, NamedTuple, Protocol

from chaos.harness.plan import stream
from store.status import INDETERMINATE

TOPIC = "chaos"
# Statuses after which a retrying producer sends the same message again.
RETRY_ON = {INDETERMINATE, "SERVICE_NOT_AVAILABLE", "UNKNOWN_ERROR", "SLAVE_NOT_AVAILABLE",
            "FLUSH_SLAVE_TIMEOUT", "FLUSH_DISK_TIMEOUT"}


class SendOutcome(NamedTuple):
    status: str  # a PutStatus name or INDETERMINATE
    offset: int | None
    size: int | None
    detail: str | None
    # A PUT_OK's evidence (store/status.py Evidence.as_json), else None.
    evidence: dict[str, Any] | None = None
    # The node the call went to when the sender chose it (a sender that
    # follows the cluster's route); None: the workload's node.
    node: str | None = None


# What a routed sender answers while the route names no master (its master
# lost, no slave promoted yet): nothing was sent; a retrying producer tries
# again (history statuses are PutStatus names, so it is this one).
NO_ROUTE_STATUS = "SERVICE_NOT_AVAILABLE"
NO_ROUTE_DETAIL = "no route: the master was lost and no slave is promoted yet"


class Sender(Protocol):
    async def send(self, topic: str, body: bytes, msg_id: str, timeout_s: float
                   ) -> SendOutcome: ...


@dataclass(frozen=True, kw_only=True)
class WorkloadConfig:
    producers: int = 4
    rate_per_s: float | None = None  # per producer; None = as fast as answers come
    body_min_bytes: int = 128
    body_max_bytes: int = 2048
    timeout_s: float = 5.0
    retries: int = 0
    failure_backoff_s: float = 0.05  # after a failed call, so a down node is not spun on
    max_ops: int = 200_000  # hard bound on operations per run

    def validate(self) -> WorkloadConfig:
        if self.producers < 1:
            raise ValueError("producers must be at least 1")
        if not 1 <= self.body_min_bytes <= self.body_max_bytes:
            raise ValueError("body sizes must satisfy 1 <= min <= max")
        if self.rate_per_s is not None and self.rate_per_s <= 0:
            raise ValueError("rate must be positive")
        if self.retries < 0:
            raise ValueError("retries must be 0 or more")
        return self


def with_retries(config: WorkloadConfig, at_least: int) -> WorkloadConfig:
    """`config` with at least `at_least` retries (a scenario's floor)."""
    return config if config.retries >= at_least else replace(config, retries=at_least)


class Workload:
    def __init__(self, config: WorkloadConfig, sender: Sender, *, seed: int, node: str,
                 run_tag: str, clock_ns: Callable[[], int] | None = None,
                 monotonic: Callable[[], float] | None = None) -> None:
        self.config = config.validate()
        self.sender = sender
        self.seed = seed
        self.node = node
        self.run_tag = run_tag
        self.history: list[dict[str, Any]] = []
        self._next_op = 0
        # Wall-clock nanoseconds; history rows carry them as ms and as µs
        # (the latency is complete_us - invoke_us).
        self._clock_ns = clock_ns or time.time_ns
        # Paces a rate (a simulated run passes its loop's virtual time).
        self._monotonic = monotonic or time.monotonic
        self._stop = asyncio.Event()
        self._sleeping: set[asyncio.Future[None]] = set()

    def stop(self) -> None:
        self._stop.set()
        for fut in self._sleeping:
            if not fut.done():
                fut.set_result(None)

    async def run(self, duration_s: float) -> list[dict[str, Any]]:
        """Run every producer until `duration_s` passes, stop() is called or
        max_ops is reached; returns the history (in invoke order)."""
        tasks = [asyncio.create_task(self._producer(p)) for p in range(self.config.producers)]
        await self._sleep(duration_s)
        self.stop()
        await asyncio.gather(*tasks)
        self.history.sort(key=lambda row: row["op_id"])
        return self.history

    async def _producer(self, p: int) -> None:
        cfg = self.config
        rng = stream(self.seed, f"producer{p}")
        interval = 1.0 / cfg.rate_per_s if cfg.rate_per_s else 0.0
        seq = 0
        next_at = self._monotonic()
        while not self._stop.is_set() and self._next_op < cfg.max_ops:
            size = rng.randint(cfg.body_min_bytes, cfg.body_max_bytes)
            body = rng.randbytes(size)
            msg_id = f"{self.run_tag}-p{p}-{seq}"
            seq += 1
            for attempt in range(1, cfg.retries + 2):
                status = await self._one(p, msg_id, body, attempt)
                if status not in RETRY_ON or self._stop.is_set():
                    break
            if interval:
                next_at += interval
                delay = next_at - self._monotonic()
                if delay > 0:
                    await self._sleep(delay)
                else:
                    next_at = self._monotonic()

    async def _one(self, p: int, msg_id: str, body: bytes, attempt: int) -> str:
        op_id = self._next_op
        self._next_op += 1
        invoke = self._clock_ns()
        try:
            out = await self.sender.send(TOPIC, body, msg_id, self.config.timeout_s)
        except Exception as exc:  # the client reports failures as outcomes; belt and braces
            out = SendOutcome(INDETERMINATE, None, None, f"{type(exc).__name__}: {exc}")
        complete = self._clock_ns()
        self.history.append({
            "op_id": op_id, "msg_id": msg_id, "producer": p, "attempt": attempt,
            "invoke_ms": invoke // 1_000_000, "complete_ms": complete // 1_000_000,
            "invoke_us": invoke // 1_000, "complete_us": complete // 1_000, "status": out.status,
            "offset": out.offset, "size": out.size, "node": out.node or self.node,
            "detail": out.detail,
            "evidence": out.evidence,
        })
        if out.status in (INDETERMINATE, "SERVICE_NOT_AVAILABLE", "UNKNOWN_ERROR"):
            await self._sleep(self.config.failure_backoff_s)
        return out.status

    async def _sleep(self, seconds: float) -> None:
        """Sleep, but wake as soon as stop() is called. (A timer and a
        future: wait_for would start a task per sleep, a cost a simulated
        run pays on every operation.)"""
        if self._stop.is_set():
            return
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        timer = loop.call_later(seconds, _wake, fut)
        self._sleeping.add(fut)
        try:
            await fut
        finally:
            timer.cancel()
            self._sleeping.discard(fut)


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
