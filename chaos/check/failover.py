"""What a failover did to a run's acknowledgements, from its faults and
history (docs/design.md, "Failover: routing, promotion, rejoin").

It verifies, per run:
- the route: who was master when, from the first master (params.json's
  node order before any failover is not kept, so the run's first master is
  given) and the faults that move it: `lose` of the route's master (no
  master until a promotion) and `promote` (its node from its start);
- split-brain acknowledgements: PUT_OKs answered by a node the route no
  longer named as master at the answer (an isolated or deposed master
  still taking writes). They are judged like every PUT_OK (chaos/check/
  promises.py, by their acker); here they are counted;
- the lag of the messages lost by failover: per such message, the time from
  its invoke to the moment of its loss, the earlier of its acker's first
  crash from then on (kill, lose, a crashing failpoint) and the route moving
  away from the acker (a promotion: an isolated master that kept running
  loses what it took when the cluster chooses the other log). That is how
  far behind the promoted node's copy ran at the loss; the run's figure is
  the largest. A split-brain ack, taken after the route moved, has no such
  moment and no lag: it is counted as split brain.
- which nodes were lost and never rejoined (no slave of the final master:
  promises.judge_acks's lost_mask).

It does not judge the messages themselves: chaos/check/promises.py does.
Pure: rows in, figures out.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

# Faults after which a node no longer serves writes it took (it crashed).
_CRASHES = frozenset({"kill", "lose", "failpoint"})


def lost_at_end(faults: Iterable[Mapping[str, Any]]) -> set[str]:
    """Nodes lost and not rejoined by the end of the run."""
    lost: set[str] = set()
    for f in faults:
        if f["kind"] == "lose":
            lost.add(f["node"])
        elif f["kind"] == "rejoin" and not str(f["detail"] or "").startswith("refused"):
            lost.discard(f["node"])
    return lost


def lost_mask(names: Sequence[str], faults: Iterable[Mapping[str, Any]]) -> int:
    """Bit i: node names[i] was lost and never rejoined."""
    lost = lost_at_end(faults)
    return sum(1 << i for i, name in enumerate(names) if name in lost)


def route_changes(faults: Iterable[Mapping[str, Any]], first_master: str
                  ) -> list[tuple[int, str | None]]:
    """(from_ms, master) of each route in order; the first from the start."""
    changes: list[tuple[int, str | None]] = [(-(2**63), first_master)]
    for f in faults:
        refused = str(f["detail"] or "").startswith("refused")
        if f["kind"] == "promote" and not refused:
            changes.append((int(f["start_ms"]), f["node"]))
        elif f["kind"] == "lose" and changes[-1][1] == f["node"]:
            changes.append((int(f["start_ms"]), None))
    return changes


def master_at(changes: Sequence[tuple[int, str | None]], t_ms: int) -> str | None:
    i = bisect.bisect_right([t for t, _ in changes], t_ms) - 1
    return changes[max(i, 0)][1]


def failed_over(faults: Iterable[Mapping[str, Any]]) -> bool:
    return any(f["kind"] == "promote" for f in faults)


def split_brain_acks(history: Iterable[Mapping[str, Any]],
                     changes: Sequence[tuple[int, str | None]], ok_status: str) -> int:
    """PUT_OKs answered by a node the route did not name at the answer."""
    return sum(1 for h in history if h["status"] == ok_status
               and master_at(changes, int(h["complete_ms"])) != h["node"])


def loss_ms(faults: Sequence[Mapping[str, Any]], changes: Sequence[tuple[int, str | None]],
            node: str, invoke_ms: int) -> int | None:
    """When what `node` took at `invoke_ms` was lost (see the module doc);
    None if the route had already moved away from it."""
    if master_at(changes, invoke_ms) != node:
        return None
    moments = [int(f["start_ms"]) for f in faults
               if f["node"] == node and f["kind"] in _CRASHES and f["start_ms"] >= invoke_ms]
    moments += [t for t, master in changes if t >= invoke_ms and master != node]
    return min(moments, default=None)


def failover_lag_ms(faults: Sequence[Mapping[str, Any]],
                    changes: Sequence[tuple[int, str | None]],
                    lost: Iterable[tuple[str, int]]) -> int | None:
    """The largest replication lag at the loss over the messages lost by
    failover, each as (acker, invoke_ms); None when none has a loss moment."""
    lags = [at - invoke for node, invoke in lost
            if (at := loss_ms(faults, changes, node, invoke)) is not None]
    return max(lags) if lags else None
