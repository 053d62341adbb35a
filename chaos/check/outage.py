"""How long a run's master could not take writes, from its faults and the
client history (docs/report.md, "Availability").

A fault's outage runs from the fault to its recovery: the first PUT_OK
**invoked after the faulted node answered again**. A put invoked before
that, even in the same millisecond as a kill, may have reached the node
before the signal did; its PUT_OK says nothing about recovery. When the node
answered again is in faults.jsonl (chaos/schema.py):

- kill, stop, failpoint, refused, lose leave the node down: it answered
  again when the next start, restart or rejoin of that node ended (that
  row's end_ms), or, for a master, when a promotion of another node in its
  place ended (a promote row whose peer it is: writes go to the new master
  from then); a row that carries its own end_ms says so itself; none →
  never, in this run;
- pause and partition end at their own end_ms (resume, heal); null → never;
- every other kind (restart, promote, torn_tail, bit_flip, rogue_peer)
  leaves the node answering at its end_ms, or at once when that is null.

A partition or pause leaves the cluster able to write again before it
ends (a controller's SyncStateSet shrunk to the master, a slave dropped by
a master that may go on alone): its recovery is the earlier of that rule's
and the first PUT_OK invoked after the first put that failed during it.

An outage starts at the fault, or later when puts invoked after the fault
were still acknowledged before the first one failed: at the last such put's
invocation (the master was writable then). A partition of an asynchronous
master from its slave costs it nothing; a kill of it during the partition
does, and the outage of both runs from that kill, not from the partition's
start (in lone-in-sync-master, 1-3 s of a 25 s partition, not 25 s).
An outage with no recovery lasts to the end of the load (the last answer
in the history). Only outages during which some put failed stop writes:
a slave killed under ASYNC_MASTER costs the master nothing, and its
downtime is not time without a writable master. The time without one is
the union of those outages, so overlapping faults (a kill, then a torn
tail on the stopped node) count once. These are seconds of wall time (of
simulated time on the sim backend), the same for runs of any length with
the same outage; the failed share is given over the puts from the first
fault on, and per second of load from it, for the same reason.

Pure: rows in, figures out. chaos/report/pipeline.py computes the per-fault
rows with Spark (_recovery), chaos/report/tables.py turns them into a run's
figures; fault_rows computes the same rows in Python for one run's console
line (chaos/check/summary.py), and a test holds the two to the same answer.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from chaos.schema import CONSUMER_NODE

# Fault kinds that end a fault rather than start one: not outages themselves.
ENDING = frozenset({"start", "resume", "heal", "rejoin"})
# Fault kinds that leave the node down until a later start or restart.
DOWNING = frozenset({"kill", "stop", "failpoint", "refused", "lose"})
# Fault kinds that last until their own end_ms (resume, heal).
LASTING = frozenset({"pause", "partition"})
STARTS = frozenset({"start", "restart", "rejoin"})


def answered_ms(faults: Sequence[Mapping[str, Any]], i: int) -> int | None:
    """When the node of faults[i] answered again (epoch ms), None if it did
    not in this run (module doc)."""
    f = faults[i]
    if f["end_ms"] is not None:
        return int(f["end_ms"])
    if f["kind"] in LASTING:
        return None
    if f["kind"] not in DOWNING:
        return int(f["start_ms"])
    for later in faults[i + 1:]:
        back = (later["kind"] in STARTS and later["node"] == f["node"]) or (
            later["kind"] == "promote" and later["peer"] == f["node"])
        if back and later["start_ms"] >= f["start_ms"]:
            return None if later["end_ms"] is None else int(later["end_ms"])
    return None


def union_ms(spans: Iterable[tuple[int, int]]) -> int:
    """The length of the union of [start, end) spans, in ms."""
    total, reach = 0, None
    for start, end in sorted(spans):
        if reach is None or start > reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total


@dataclass(frozen=True)
class FaultRow:
    """One fault of a run, with what the history says after it (all epoch ms):
    the recovery PUT_OK's answer (None: none came), the first failed put
    invoked at or after the fault, the run's last answer, the puts invoked
    at or after the fault and how many of them failed, and the last PUT_OK
    invoked at or after the fault and before that first failure (None:
    none)."""

    fault_ms: int
    put_ok_ms: int | None
    first_failed_ms: int | None
    load_end_ms: int
    puts_after: int
    failed_after: int
    ok_until_ms: int | None = None

    @property
    def stopped_writes(self) -> bool:
        return self.first_failed_ms is not None and (
            self.put_ok_ms is None or self.first_failed_ms < self.put_ok_ms)

    @property
    def outage(self) -> tuple[int, int]:
        start = self.fault_ms if self.ok_until_ms is None else max(self.fault_ms,
                                                                   self.ok_until_ms)
        end = self.load_end_ms if self.put_ok_ms is None else self.put_ok_ms
        return start, max(start, end)


def fault_rows(faults: Sequence[Mapping[str, Any]], history: Sequence[Mapping[str, Any]],
               ok_status: str) -> list[FaultRow]:
    """Every fault that can stop writes (not an ending step, not the
    consumer's) as a FaultRow, from a run's faults and history rows;
    `ok_status` is PutStatus.PUT_OK."""
    rows = []
    load_end = max((int(h["complete_ms"]) for h in history), default=0)
    for i, f in enumerate(faults):
        if f["kind"] in ENDING or f["node"] == CONSUMER_NODE:
            continue
        at, back = int(f["start_ms"]), answered_ms(faults, i)
        after = [h for h in history if h["invoke_ms"] >= at]
        failed = [int(h["invoke_ms"]) for h in after if h["status"] != ok_status]
        first_failed = min(failed, default=None)
        recovered = [int(h["complete_ms"]) for h in history if h["status"] == ok_status
                     and back is not None and h["invoke_ms"] > back]
        ok_until = [int(h["invoke_ms"]) for h in after if h["status"] == ok_status
                    and first_failed is not None and h["invoke_ms"] < first_failed]
        if f["kind"] in LASTING and first_failed is not None:  # writes resumed during it
            recovered += [int(h["complete_ms"]) for h in history
                          if h["status"] == ok_status and h["invoke_ms"] > first_failed]
        rows.append(FaultRow(fault_ms=at, put_ok_ms=min(recovered, default=None),
                             first_failed_ms=first_failed, load_end_ms=load_end,
                             puts_after=len(after), failed_after=len(failed),
                             ok_until_ms=max(ok_until, default=None)))
    return rows


# The columns of the pipeline's recovery rows, after run and fault_id.
RECOVERY_COLUMNS = tuple(f.name for f in fields(FaultRow))


@dataclass(frozen=True)
class Availability:
    """A run's figures per unit of time (module doc); None where it had no fault."""

    fault_to_put_ok_s: float | None  # the longest fault -> recovery PUT_OK
    unwritable_until_end: bool  # some fault had no recovery PUT_OK
    unwritable_s: float | None  # time without a writable master
    failed_after_fault_share: float | None
    failed_after_fault_per_s: float | None


def availability(rows: Sequence[FaultRow]) -> Availability:
    if not rows:
        return Availability(None, False, None, None, None)
    back = [r.put_ok_ms - r.fault_ms for r in rows if r.put_ok_ms is not None]
    first = min(rows, key=lambda r: r.fault_ms)
    load_s = max(0, first.load_end_ms - first.fault_ms) / 1000
    return Availability(
        fault_to_put_ok_s=max(back) / 1000 if back else None,
        unwritable_until_end=any(r.put_ok_ms is None for r in rows),
        unwritable_s=union_ms(r.outage for r in rows if r.stopped_writes) / 1000,
        failed_after_fault_share=(first.failed_after / first.puts_after
                                  if first.puts_after else 0.0),
        failed_after_fault_per_s=first.failed_after / load_s if load_s else None,
    )
