"""SYNC_MASTER replica waits: puts keyed by the offset their bytes end at.

A put waits until some slave's acked offset reaches its end. Waiters sit in a
heap by end offset; when the best acked offset advances, `advance` pops every
waiter it now covers, cheapest first — one heap operation per put, no
polling. Timeouts are the caller's business (a waiter that already timed out
is simply skipped when popped).
"""

from __future__ import annotations

import heapq
import itertools
from typing import Generic, TypeVar

T = TypeVar("T")


class ReplicaWaitQueue(Generic[T]):
    def __init__(self) -> None:
        self._heap: list[tuple[int, int, T]] = []
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, end: int, item: T) -> None:
        heapq.heappush(self._heap, (end, next(self._seq), item))

    def advance(self, acked: int) -> list[T]:
        """Remove and return every waiter whose end is <= acked, in end order."""
        out: list[T] = []
        heap = self._heap
        while heap and heap[0][0] <= acked:
            out.append(heapq.heappop(heap)[2])
        return out

    def drain(self) -> list[T]:
        """Remove and return every waiter (shutdown)."""
        out = [item for _, _, item in sorted(self._heap)]
        self._heap.clear()
        return out
