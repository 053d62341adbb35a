"""How long a real machine takes for what opens a run's windows, so that a
sim run on simulated time sees them open as often as a local run does.

A local run's windows (an acknowledged put unflushed at a crash, a range
shipped to the slave before the master's fsync completed) are open while an
fsync is in flight, and how often that is depends on three times of the
machine: an fsync, the node's own time per put, and a hop on the network.
The sim backend's node code takes no simulated time at all, so a sim run
given no timings draws a disk speed per seed (chaos/sim/cluster.py) and
answers for a range of machines; `dlab chaos compare-backends` measures
this machine instead and gives both of its sides the same timings:

- `fsync_us`: the distribution of a real fsync after a small append, in a
  file of the results directory, as quantiles at evenly spaced
  probabilities (a sim flush draws from it by interpolation);
- `put_us`: the node's time per put, a serial cost each put pays in the sim
  before its append (from the local runs of the same comparison: the median
  round trip of a put nothing waited on, ASYNC_MASTER + ASYNC_FLUSH before
  the first fault);
- `net_us`: the one-way delay of a message between two processes on this
  machine's loopback (low, high; drawn uniformly per message);
- `start_us`: how long a node takes to start (a process, its store's
  recovery, its server), from the local runs' `start` faults, or where
  none started a node (the failover scenarios) their `promote` faults (a
  clean stop and a start as master): a sim start, promotion or rejoin
  waits that long, the node down meanwhile, so the time without a
  writable master means the same on both sides.

The timings are recorded in every sim run's params.json (RunConfig), so a
replay uses the recorded ones, not the replaying machine's.
"""

from __future__ import annotations

import os
import random
import statistics
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

# Quantiles kept of the fsync distribution (0 %, 10 %, ..., 100 %).
QUANTILES = 11
FSYNC_SAMPLES = 200
FSYNC_MAX_S = 10.0  # a very slow disk is sampled for this long at most
FSYNC_APPEND_BYTES = 1024
# Loopback one-way delay between two Python processes (a gRPC message on
# 127.0.0.1): tens to a few hundred microseconds. Not measured per machine:
# the node's own per-put time (put_us) already carries the gRPC cost a put
# pays on each side.
LOOPBACK_NET_US = (50.0, 300.0)


@dataclass(frozen=True)
class MachineTimings:
    fsync_us: tuple[float, ...]
    put_us: float
    net_us: tuple[float, float] = LOOPBACK_NET_US
    start_us: float = 0.0

    def __post_init__(self) -> None:
        if len(self.fsync_us) < 2 or any(b < a for a, b in zip(self.fsync_us, self.fsync_us[1:],
                                                             strict=False)):
            raise ValueError("fsync_us must be at least two quantiles, in increasing order")
        if self.fsync_us[0] < 0 or self.put_us < 0 or self.start_us < 0:
            raise ValueError("timings must not be negative")
        if not 0 <= self.net_us[0] <= self.net_us[1]:
            raise ValueError("net_us must be (low, high) with 0 <= low <= high")

    def fsync_s(self, rng: random.Random) -> float:
        """One fsync's duration: a uniform draw through the quantiles,
        linear between two neighbours."""
        u = rng.random() * (len(self.fsync_us) - 1)
        i = min(int(u), len(self.fsync_us) - 2)
        lo, hi = self.fsync_us[i], self.fsync_us[i + 1]
        return (lo + (hi - lo) * (u - i)) / 1e6

    def net_s(self, rng: random.Random) -> float:
        return rng.uniform(*self.net_us) / 1e6

    @property
    def put_s(self) -> float:
        return self.put_us / 1e6

    @property
    def start_s(self) -> float:
        return self.start_us / 1e6

    def as_record(self) -> dict[str, Any]:
        return {"fsync_us": list(self.fsync_us), "put_us": self.put_us,
                "net_us": list(self.net_us), "start_us": self.start_us}

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> MachineTimings:
        return cls(fsync_us=tuple(float(v) for v in rec["fsync_us"]),
                   put_us=float(rec["put_us"]),
                   net_us=(float(rec["net_us"][0]), float(rec["net_us"][1])),
                   start_us=float(rec.get("start_us", 0.0)))

    def describe(self) -> str:
        q = self.fsync_us
        return (f"fsync median {q[len(q) // 2]:.0f} µs (10-90 %: {q[1]:.0f}-{q[-2]:.0f} µs), "
                f"node time per put {self.put_us:.0f} µs, network one way "
                f"{self.net_us[0]:.0f}-{self.net_us[1]:.0f} µs, a node start "
                f"{self.start_us / 1000:.0f} ms")


def quantiles(samples: Iterable[float], n: int = QUANTILES) -> tuple[float, ...]:
    """`n` quantiles at evenly spaced probabilities, min and max included."""
    xs = sorted(samples)
    if not xs:
        raise ValueError("no samples")
    return tuple(round(xs[round(i * (len(xs) - 1) / (n - 1))], 1) for i in range(n))


def measure_fsync_us(directory: str, samples: int = FSYNC_SAMPLES,
                     max_s: float = FSYNC_MAX_S) -> tuple[float, ...]:
    """The fsync latency of this machine's disk where `directory` is: a
    small append then an fsync, `samples` times (or for `max_s` seconds,
    at least 10 times); the file is removed after."""
    path = os.path.join(directory, ".fsync-probe")
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
    lat: list[float] = []
    try:
        chunk = b"\0" * FSYNC_APPEND_BYTES
        deadline = time.monotonic() + max_s
        while len(lat) < samples and (len(lat) < 10 or time.monotonic() < deadline):
            os.write(fd, chunk)
            t0 = time.perf_counter()
            os.fsync(fd)
            lat.append((time.perf_counter() - t0) * 1e6)
    finally:
        os.close(fd)
        os.unlink(path)
    return quantiles(lat)


def put_us_from_history(rows: Iterable[Mapping[str, Any]], before_ms: int | None) -> float | None:
    """The median round trip (µs) of the PUT_OKs invoked before `before_ms`
    (the run's first fault; None: all of them), or None without any."""
    lat = [r["complete_us"] - r["invoke_us"] for r in rows
           if r.get("status") == "PUT_OK" and r.get("invoke_us") is not None
           and (before_ms is None or r["invoke_ms"] < before_ms)]
    return float(statistics.median(lat)) if lat else None


def start_us_from_faults(rows: Iterable[Mapping[str, Any]], kind: str = "start"
                         ) -> list[float]:
    """How long each `kind` fault of a run took (µs): from the step to the
    node answering again (`start`; `promote`: the slave stopped and
    serving as master)."""
    return [float(r["end_ms"] - r["start_ms"]) * 1000 for r in rows
            if r.get("kind") == kind and r.get("end_ms") is not None]
