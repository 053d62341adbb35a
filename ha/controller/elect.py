"""The election policy (RocketMQ 5's DefaultElectPolicy), as one pure function.

Candidates are tried in two tiers: first the live members of the
SyncStateSet; then, only with enable_elect_unclean_master, every live
registered replica ("may lose messages": it may lack acknowledged data).
Within a tier, in order:
1. the old master, if it is a live candidate and no other broker is preferred;
2. else the preferred broker, if one is named: it, if it is a candidate, or
   nobody from this tier;
3. else the best candidate by (epoch desc, max offset desc, priority asc) —
   the broker with the newest epoch and the most data, lower priority
   numbers first. Ties go to the lower broker id, where RocketMQ picks
   whichever its set yields: the controller stays deterministic.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ha.controller.state import LiveInfo


@dataclass(frozen=True)
class Choice:
    winner: int
    unclean: bool  # chosen from outside the SyncStateSet
    reason: str


def rank_key(broker_id: int, info: LiveInfo) -> tuple[int, int, int, int]:
    """Sort key: the best candidate sorts first."""
    return (-info.epoch, -info.max_offset, info.priority, broker_id)


def _try_tier(candidates: Iterable[int], alive: Mapping[int, LiveInfo],
              old_master: int | None, preferred: int | None) -> tuple[int, str] | None:
    live = sorted(b for b in candidates if b in alive)
    if not live:
        return None
    if old_master in live and preferred in (None, old_master):
        return old_master, "the old master is alive"
    if preferred is not None:
        if preferred in live:
            return preferred, f"broker {preferred} is preferred"
        return None
    best = min(live, key=lambda b: rank_key(b, alive[b]))
    info = alive[best]
    return best, (f"best candidate: epoch {info.epoch}, max offset {info.max_offset}, "
                  f"priority {info.priority}")


def elect(*, sync_state_set: frozenset[int], all_replicas: frozenset[int],
          alive: Mapping[int, LiveInfo], old_master: int | None,
          preferred: int | None, unclean_allowed: bool) -> Choice | None:
    """The new master, or None when no tier has a candidate. `alive` holds
    the live brokers' last heartbeats (a dead broker is not in it)."""
    clean = _try_tier(sync_state_set, alive, old_master, preferred)
    if clean is not None:
        return Choice(clean[0], False, clean[1] + " (in the SyncStateSet)")
    if not unclean_allowed:
        return None
    dirty = _try_tier(all_replicas, alive, old_master, preferred)
    if dirty is None:
        return None
    return Choice(dirty[0], dirty[0] not in sync_state_set,
                  dirty[1] + " (unclean: outside the SyncStateSet, may lose messages)")
