"""The master's side of the SyncStateSet: which set to ask the controller for.

RocketMQ 5's master (AutoSwitchHAService) decides, the controller only
fences (machine.py). Rules (reference: RIP-44 and docs/cn/controller/design.md):
- shrink: a member other than the master leaves when it is disconnected, or
  has not caught up with the master for `max_time_not_catchup_ms`
  (haMaxTimeSlaveNotCatchup, 15 s; the master checks every 5 s);
- expand: a connected replica outside the set joins when its acked offset
  has reached both the master's confirmed offset and the start offset of the
  master's current epoch (so it holds everything acknowledged, from this
  master's own history).
The master is always in the set it asks for. The answer is the set to
request, or None when it equals the current one (nothing to ask).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

# RocketMQ's haMaxTimeSlaveNotCatchup default.
MAX_TIME_NOT_CATCHUP_MS = 15_000


@dataclass(frozen=True)
class ReplicaProgress:
    """What the master knows of one replica's HA connection."""

    connected: bool
    acked_offset: int
    last_caught_up_ms: int  # when its ack last reached the master's max offset


def next_sync_state_set(*, master: int, current: frozenset[int],
                        replicas: Mapping[int, ReplicaProgress], confirmed_offset: int,
                        epoch_start_offset: int, now_ms: int,
                        max_time_not_catchup_ms: int = MAX_TIME_NOT_CATCHUP_MS,
                        ) -> frozenset[int] | None:
    assert master in current, f"master {master} is not in its SyncStateSet {sorted(current)}"
    keep = {master}
    for broker, progress in replicas.items():
        if broker == master or not progress.connected:
            continue
        if broker in current:
            if now_ms - progress.last_caught_up_ms <= max_time_not_catchup_ms:
                keep.add(broker)
        elif (progress.acked_offset >= confirmed_offset
              and progress.acked_offset >= epoch_start_offset):
            keep.add(broker)
    new = frozenset(keep)
    return None if new == current else new
