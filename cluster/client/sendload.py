"""The load loop behind `dlab send`: `count` messages at most, for
`max_seconds` at most, `concurrency` in flight, paced to `rate` per second
(open-loop schedule: message i is due at start + i/rate), with per-status
counts and latency percentiles."""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from cluster.client.node_client import SendOutcome, make_message
from store.log.record import Message


class Sender(Protocol):
    """What the load loop sends through: an AsyncNodeClient (one node) or a
    RoutedClient (the route's master, with retries)."""

    address: str

    async def send(self, msg: Message, *, timeout_s: float | None = None) -> SendOutcome: ...


@dataclass
class LoadReport:
    target: str
    count: int
    size: int
    concurrency: int
    rate: float
    elapsed_s: float = 0.0
    outcomes: list[SendOutcome] = field(default_factory=list)
    stopped_by_time: bool = False

    def counts(self) -> Counter[str]:
        return Counter(o.status for o in self.outcomes)

    def latencies_ms(self) -> dict[str, list[float]]:
        by: dict[str, list[float]] = defaultdict(list)
        for o in self.outcomes:
            by[o.status].append(o.latency_s * 1000)
            by["all"].append(o.latency_s * 1000)
        for v in by.values():
            v.sort()
        return by

    def details(self) -> dict[str, str]:
        """Per status, the first thing a node said with it (why it refused)."""
        out: dict[str, str] = {}
        for o in self.outcomes:
            if o.detail and o.status != "PUT_OK":
                out.setdefault(o.status, o.detail)
        return out

    def summary(self) -> dict[str, object]:
        lat = self.latencies_ms()
        sent = len(self.outcomes)
        return {
            "target": self.target, "sent": sent, "requested": self.count, "size": self.size,
            "concurrency": self.concurrency, "rate": self.rate,
            "elapsed_s": round(self.elapsed_s, 3),
            "throughput_per_s": round(sent / self.elapsed_s, 1) if self.elapsed_s else 0.0,
            "stopped_by_time": self.stopped_by_time,
            "counts": dict(self.counts()),
            # stored by a node the route no longer named master (routed sends)
            "stale_master_acks": sum(1 for o in self.outcomes if o.stale_master),
            "retried": sum(1 for o in self.outcomes if o.attempts > 1),
            "nodes": dict(Counter(o.node for o in self.outcomes if o.node)),
            "details": self.details(),
            "latency_ms": {k: {"p50": percentile(v, 50), "p90": percentile(v, 90),
                               "p99": percentile(v, 99), "max": v[-1] if v else 0.0}
                           for k, v in lat.items()},
        }


def _iec(n: int) -> str:
    """A byte count as `--size` takes it: 4MiB, 80KiB or 1000 (bytes)."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return str(n)


def size_refusal(size: int, max_message_size: int) -> str | None:
    """Why a load of `size`-byte bodies is refused before it starts: every
    put would come back MESSAGE_ILLEGAL from a node storing at most
    `max_message_size` bytes of body. None when it fits."""
    if size <= max_message_size:
        return None
    return (f"--size {_iec(size)} is over the node's maximum message size of "
            f"{max_message_size} bytes ({_iec(max_message_size)}): give --size "
            f"{_iec(max_message_size)} or less, or start the nodes with a larger "
            "--max-message-size")


def percentile(sorted_values: list[float], p: float) -> float:
    """Nearest-rank percentile of an ascending list (0.0 for an empty one)."""
    if not sorted_values:
        return 0.0
    k = max(0, min(len(sorted_values) - 1, math.ceil(p / 100 * len(sorted_values)) - 1))
    return round(sorted_values[k], 3)


async def run_load(client: Sender, *, count: int, size: int, concurrency: int,
                   rate: float = 0.0, topic: str = "dlab-load", max_seconds: float = 300.0,
                   timeout_s: float = 10.0, rng: random.Random | None = None,
                   on_outcome: Callable[[SendOutcome], None] | None = None) -> LoadReport:
    rng = rng or random.Random(0)
    body = rng.randbytes(size)
    report = LoadReport(client.address, count, size, concurrency, rate)
    next_index = 0
    start = time.monotonic()
    deadline = start + max_seconds

    async def worker() -> None:
        nonlocal next_index
        while next_index < count:
            now = time.monotonic()
            if now >= deadline:
                report.stopped_by_time = True
                return
            i = next_index
            next_index += 1
            if rate > 0:
                due = start + i / rate
                if due > now:
                    await asyncio.sleep(due - now)
            msg = make_message(topic, body, msg_id=f"{rng.getrandbits(64):016X}-{i}")
            outcome = await client.send(msg, timeout_s=timeout_s)
            report.outcomes.append(outcome)
            if on_outcome is not None:
                on_outcome(outcome)

    await asyncio.gather(*(worker() for _ in range(max(1, concurrency))))
    report.elapsed_s = time.monotonic() - start
    return report


def format_report(report: LoadReport) -> str:
    s = report.summary()
    lat = s["latency_ms"]
    assert isinstance(lat, dict)
    lines = [
        f"sent {s['sent']} of {s['requested']} messages of {report.size} bytes to "
        f"{report.target} in {s['elapsed_s']} s ({s['throughput_per_s']} msg/s, concurrency "
        f"{report.concurrency}" + (f", rate {report.rate:g}/s" if report.rate else "") + ")"
        + ("; stopped by --max-seconds" if report.stopped_by_time else ""),
        f"{'status':<22}{'count':>8}{'p50 ms':>10}{'p90 ms':>10}{'p99 ms':>10}{'max ms':>10}",
    ]
    counts = report.counts()
    for status in sorted(counts) + ["all"]:
        n = counts[status] if status != "all" else len(report.outcomes)
        q = lat.get(status, {"p50": 0, "p90": 0, "p99": 0, "max": 0})
        lines.append(f"{status:<22}{n:>8}{q['p50']:>10.2f}{q['p90']:>10.2f}{q['p99']:>10.2f}"
                     f"{q['max']:>10.2f}")
    for status in sorted(counts):
        # What the node said, once per refusing status (a full disk, a slave
        # not available...): the counts alone do not say why.
        detail = next((o.detail for o in report.outcomes if o.status == status and o.detail), "")
        if detail and status not in ("PUT_OK", "INDETERMINATE"):
            lines.append(f"{status}: {detail}")
    if s["retried"]:
        nodes = sorted({o.node for o in report.outcomes if o.node})
        lines.append(f"retried: {s['retried']} message(s) needed more than one send"
                     + (f" (answered by {', '.join(nodes)})" if nodes else ""))
    if s["stale_master_acks"]:
        lines.append(f"STALE MASTER: {s['stale_master_acks']} message(s) stored by a node the "
                     "route no longer named master when it answered (split brain)")
    if counts.get("INDETERMINATE"):
        lines.append("INDETERMINATE: the call failed or timed out; those messages may or may "
                     "not be stored (not counted as lost)")
    return "\n".join(lines)
