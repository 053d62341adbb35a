"""ManualClock: the time seam's twin that tests move by hand
(the production Clocks are in store/seams/clock.py)."""

from __future__ import annotations


class ManualClock:
    """A clock tests move by hand."""

    def __init__(self, wall_ms: int = 1_700_000_000_000, monotonic: float = 0.0) -> None:
        self._wall_ms = wall_ms
        self._monotonic = monotonic

    def wall_ms(self) -> int:
        return self._wall_ms

    def monotonic(self) -> float:
        return self._monotonic

    def advance(self, seconds: float) -> None:
        self._monotonic += seconds
        self._wall_ms += int(seconds * 1000)
