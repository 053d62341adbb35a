"""A controller-mode master's confirm offset, sans IO (RocketMQ 5's
CommitLog.getConfirmOffset and AutoSwitchHAService.computeConfirmOffset,
as of apache/rocketmq#7657 and #6663).

The confirm offset is how far every member of the SyncStateSet holds the
master's log: consume-queue dispatch, and so consumers, stop there
(store/consume/consume_side.py), and the store keeps it in its checkpoint
to recover it after a restart. The rules, given the master's name, its
SyncStateSet (its own name included; while a change is on its way to the
controller, the union of the old and the new set), each connected slave's
acked offset and the master's max offset:

1. A set of the master alone, or `all_ack_in_sync_state_set` false: the
   master's max offset, and it follows the log (`FOLLOWS_WRITTEN`):
   nothing waits for a replica.
2. A member other than the master with no connected stream: unchanged
   (the current value): its ack cannot be known, and the offset never
   moves past what a member might lack (apache/rocketmq#6662: a member
   cut off would otherwise drop out of the minimum).
3. Otherwise the least of the master's max offset and every member's
   ack.

When it is computed: at every accepted ack of a member (RocketMQ's
updateConfirmOffsetWhenSlaveAck), whenever the set changes
(setSyncStateSet), and when the node becomes master (changeToMaster),
before it dispatches and counts its queue offsets.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

# Rule 1's answer: the store's confirm offset follows what it wrote.
FOLLOWS_WRITTEN: Final = None


def confirm_offset(*, master: str, local_set: frozenset[str], members: frozenset[str],
                   acks: Mapping[str, int], wrote: int, current: int,
                   all_ack: bool) -> int | None:
    """The master's confirm offset (None: FOLLOWS_WRITTEN). `local_set`:
    the set the master holds (rule 1 counts it alone, as RocketMQ's
    getLocalSyncStateSet); `members`: the set the minimum is over (the
    union while a change is on its way); `acks`: each connected slave's
    acked offset by name; `current`: the value now (rule 2)."""
    if len(local_set) <= 1 or not all_ack:
        return FOLLOWS_WRITTEN
    others = members - {master}
    if any(name not in acks for name in others):
        return current
    return min([wrote, *(acks[name] for name in others)])
