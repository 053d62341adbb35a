"""What a controller-mode master's put waits for, sans IO (RocketMQ 5's
CommitLog.handleHA with AutoSwitchHAService; reference/README.md, "Acks").

The rules, given the master's SyncStateSet (its own name included):
1. A set smaller than `min_in_sync_replicas` refuses the put at once,
   before it is stored: IN_SYNC_REPLICAS_NOT_ENOUGH (`refusal`).
2. `all_ack_in_sync_state_set=true`: the put waits for an ack from every
   other member of the set (up to the slave timeout, then
   FLUSH_SLAVE_TIMEOUT). A member with no stream is waited for all the same:
   the set shrinks only by the controller.
3. Otherwise it waits for `in_sync_replicas - 1` slave acks (the copies
   counted include the master's own), from any connected slave; the default
   1 waits for none: the master answers like an ASYNC_MASTER.
A set of the master alone, under rule 2, waits for no one.
"""

from __future__ import annotations

from dataclasses import dataclass

from ha.config import HAConfig


@dataclass(frozen=True)
class AckQuorum:
    """How many slave acks a put waits for, and whose count (`members`: the
    slave names that count; None: any connected slave)."""

    needed: int
    members: frozenset[str] | None

    @property
    def waits(self) -> bool:
        return self.needed > 0


NO_WAIT = AckQuorum(0, None)


def quorum(config: HAConfig, master: str, sync_state_set: frozenset[str]) -> AckQuorum:
    """Rules 2 and 3 for a master named `master` whose set is `sync_state_set`."""
    if config.all_ack_in_sync_state_set:
        others = sync_state_set - {master}
        return AckQuorum(len(others), frozenset(others))
    return AckQuorum(max(config.in_sync_replicas - 1, 0), None)


def refusal(config: HAConfig, sync_state_set: frozenset[str]) -> str | None:
    """Rule 1: why a put is refused before it is stored, or None."""
    if len(sync_state_set) < config.min_in_sync_replicas:
        return (f"the SyncStateSet {sorted(sync_state_set)} has {len(sync_state_set)} "
                f"replica(s), fewer than min_in_sync_replicas "
                f"{config.min_in_sync_replicas}: not stored; send again once a slave has "
                "caught up and joined it")
    return None


def quorum_acked(acks: dict[str, int], q: AckQuorum) -> int | None:
    """The highest offset `q.needed` counted slaves have all acknowledged:
    the `needed`-th best ack among them (None: fewer such slaves connected).
    `acks`: each established stream's acked offset by slave name."""
    if not q.waits:
        return None
    counted = sorted((a for name, a in acks.items()
                      if q.members is None or name in q.members), reverse=True)
    if len(counted) < q.needed:
        return None
    return counted[q.needed - 1]
