"""A replica's truncation when it rejoins a master in controller mode
(RocketMQ 5's AutoSwitchHAClient.doTruncate), decided sans IO and carried
out crash-safely on the store and the epoch file (docs/design.md,
"Controller mode: the broker's epoch file and rejoin truncation").

`decide` takes the replica's epochs and max offset and the master's, and
returns the decision as data (ha/autoswitch/epochs.py states the rule).

`carry_out` makes it true, in this order:
  1. the store: MessageStore.truncate_to cuts the CommitLog (header at the
     cut zeroed and fsynced first, store/log/cuts.py), lowers the
     checkpoint, and cuts the consume queues;
  2. the epoch file: the entries starting at or after the cut dropped,
     written atomically (ha/autoswitch/epoch_file.py).
Why this order: a crash between the two leaves the log cut and the epoch
file old. Its extra entries start at or past the cut, where no record is,
so they name no record wrongly; `recover` at the next open drops those
starting past the log's end, and the retried handshake decides the same
point again and finishes step 2. The other order is unsafe: an epoch file
already cut beside a log not yet cut hands the records of a dropped epoch
to the epoch before it, and the next handshake keeps them as if they were
the master's (the design doc has the example).

A crash inside step 1 is the store's: its recovery completes or undoes the
cut (store/log/recovery.py) and re-cuts the consume queues to the log.
Under `--emulate rmq-10666` step 1 keeps the cut tail on disk, which a
restart takes back: the known bug, left as it is.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from ha.autoswitch.epoch_file import EpochFile
from ha.autoswitch.epochs import EpochList, last_common_point
from store.store import MessageStore


class MasterEpochsError(ValueError):
    """The master's handshake contradicts itself (a remote error: the
    master's state or its message is wrong, not this replica's)."""


class RejoinKind(enum.Enum):
    NEW_REPLICA = "new-replica"  # no epochs: nothing truncated, replicate from the end
    TRUNCATE = "truncate"  # cut at the last common point (maybe at the log's end: no cut)
    NO_COMMON_POINT = "no-common-point"  # refused: nothing in common with the master


@dataclass(frozen=True)
class RejoinDecision:
    kind: RejoinKind
    # TRUNCATE: where the log is cut (== the replica's end: nothing to cut)
    truncate_to: int | None = None
    # TRUNCATE: the epoch list to write after the cut
    epochs_after: EpochList | None = None
    reason: str = ""


def decide(local: EpochList, local_max_offset: int,
           master: EpochList, master_max_offset: int) -> RejoinDecision:
    """The handshake's decision (epochs.py states the rule). Asserts the
    point is within the replica's log: it is the end of one of its epochs.
    MasterEpochsError when the master's max offset is negative or before its
    last epoch's start."""
    last = master.last
    if master_max_offset < 0 or (last is not None and last.start_offset > master_max_offset):
        raise MasterEpochsError(
            f"the master sent max offset {master_max_offset} with epochs {master}: its last "
            "epoch cannot start past its log's end; not truncating on its word")
    if not local.entries:
        return RejoinDecision(RejoinKind.NEW_REPLICA,
                              reason="the replica has no epochs: a new replica")
    point = last_common_point(local, local_max_offset, master, master_max_offset)
    if point is None:
        return RejoinDecision(RejoinKind.NO_COMMON_POINT, reason=(
            f"no epoch of the replica {local} is the master's {master} with the same "
            "start offset: the logs share nothing that can be proved; refusing to truncate"))
    assert 0 <= point <= local_max_offset, (point, local_max_offset)
    return RejoinDecision(RejoinKind.TRUNCATE, point, local.truncate_from(point),
                          f"last common point {point} (replica {local} ending at "
                          f"{local_max_offset}, master {master} ending at {master_max_offset})")


def carry_out(decision: RejoinDecision, store: MessageStore, epochs: EpochFile) -> None:
    """Make a TRUNCATE decision true: the store cut, then the epoch file
    (module docstring); returns once both are durable. Other kinds change
    nothing."""
    if decision.kind is not RejoinKind.TRUNCATE:
        return
    assert decision.truncate_to is not None and decision.epochs_after is not None
    if decision.truncate_to < store.log.wrote:
        store.truncate_to(decision.truncate_to)
    epochs.failpoints.hit("rejoin_after_log_cut")
    if decision.epochs_after != epochs.epochs:
        epochs.replace(decision.epochs_after)


def rejoin(store: MessageStore, epochs: EpochFile, master: EpochList,
           master_max_offset: int) -> RejoinDecision:
    """`decide` on the replica's state now, then `carry_out`."""
    decision = decide(epochs.epochs, store.log.wrote, master, master_max_offset)
    carry_out(decision, store, epochs)
    return decision


def recover(store: MessageStore, epochs: EpochFile) -> None:
    """At open, after the store's recovery: drop epoch entries that start
    past the log's end (the log was cut below them: a crash between the two
    steps of `carry_out`, or a torn tail recovery cut). One starting exactly
    at the end is kept: it may be a master's epoch with no record yet."""
    kept = epochs.epochs.beyond_log_end_dropped(store.log.wrote)
    if kept != epochs.epochs:
        epochs.replace(kept)
