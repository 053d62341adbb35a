"""A broker's epoch list and its rules, sans IO (RocketMQ 5's EpochFileCache,
store/ha/autoswitch; docs/design.md, "Controller mode: the broker's epoch
file and rejoin truncation").

Each entry says: master epoch `epoch` began writing at log offset
`start_offset`. Entry i covers [start_i, start_{i+1}); the last one covers
[start_last, the log's max offset). The master's list and max offset come in
the rejoin handshake; a replica's come from its epoch file and its log.

Invariants (`problems` lists the broken ones; every constructor checks):
    epochs strictly increasing; start offsets never decreasing; all >= 0.
An entry that starts where the next one starts is an epoch with no record
on this broker (a master elected again before anything it wrote in the
last epoch survived): its range is empty, and it is kept so that a replica
holding that epoch still finds it (below).
A replica appends an entry when the epoch of the records it receives
changes (a batch never spans two epochs); a broker appends one when it
becomes master (`begin_epoch`).

The rejoin rule (`last_common_point`, RocketMQ's findConsistentPoint and
AutoSwitchHAClient.doTruncate): walk the replica's epochs from newest to
oldest; at the first epoch the master also holds *with the same start
offset*, the logs agree up to the smaller of the two end offsets of that
epoch: that is the truncation point. An empty replica list is a new replica
(nothing truncated); no common epoch at all is refused.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


class EpochOrderError(ValueError):
    """An entry that would break the list's order (a stale epoch, an offset
    going backwards); the message names both entries."""


@dataclass(frozen=True, order=True)
class EpochEntry:
    epoch: int
    start_offset: int

    def __str__(self) -> str:
        return f"{self.epoch}@{self.start_offset}"


def problems(entries: Iterable[EpochEntry]) -> list[str]:
    """One sentence per broken invariant of a list in this order."""
    out: list[str] = []
    prev: EpochEntry | None = None
    for e in entries:
        if e.epoch < 0 or e.start_offset < 0:
            out.append(f"entry {e} is negative")
        if prev is not None and e.epoch <= prev.epoch:
            out.append(f"epoch {e.epoch} follows epoch {prev.epoch}: epochs must increase")
        if prev is not None and e.start_offset < prev.start_offset:
            out.append(f"entry {e} starts before the previous entry {prev}: "
                       "start offsets must not decrease")
        prev = e
    return out


@dataclass(frozen=True)
class EpochList:
    """The entries, oldest first (immutable: each change returns a new list)."""

    entries: tuple[EpochEntry, ...] = ()

    def __post_init__(self) -> None:
        broken = problems(self.entries)
        if broken:
            raise EpochOrderError("epoch list out of order: " + "; ".join(broken))

    @classmethod
    def of(cls, *pairs: tuple[int, int]) -> EpochList:
        return cls(tuple(EpochEntry(e, s) for e, s in pairs))

    def __len__(self) -> int:
        return len(self.entries)

    def __str__(self) -> str:
        return "[" + ", ".join(map(str, self.entries)) + "]"

    @property
    def last(self) -> EpochEntry | None:
        return self.entries[-1] if self.entries else None

    def get(self, epoch: int) -> EpochEntry | None:
        return next((e for e in self.entries if e.epoch == epoch), None)

    def end_of(self, epoch: int, max_offset: int) -> int:
        """Where `epoch`'s range ends: the next entry's start, or the log's
        max offset for the last entry."""
        for i, e in enumerate(self.entries):
            if e.epoch == epoch:
                return self.entries[i + 1].start_offset if i + 1 < len(self) else max_offset
        raise KeyError(epoch)

    # ------------------------------------------------------------- changes
    def append(self, entry: EpochEntry) -> EpochList:
        """`entry` added last. Refused (EpochOrderError): an epoch lower than
        the last, or the last epoch again at another offset, or a start
        before the last entry's. The last epoch again at its own offset
        changes nothing (a retried append after a crash). An entry starting
        where the last one starts is appended after it: the last epoch holds
        no record here, and stays listed with its empty range, so that a
        replica that holds records of it matches it and is cut at its start.
        (RocketMQ's appendEntry refuses that case and keeps the older epoch
        as the file's last, so the new master's records are listed as the
        old epoch's; dropping the empty epoch instead, as this list once did,
        left a replica holding it with no common epoch at all.)"""
        last = self.last
        if last is None:
            return EpochList((entry,))
        if entry == last:
            return self
        if entry.epoch <= last.epoch:
            raise EpochOrderError(f"epoch {entry} is not newer than the last entry {last}: "
                                  "a broker never goes back to an older epoch")
        if entry.start_offset < last.start_offset:
            raise EpochOrderError(f"epoch {entry} starts before the last entry {last}: "
                                  "an epoch starts at the log's end, which never moves back "
                                  "without truncate_from first")
        return EpochList(self.entries + (entry,))

    def begin_epoch(self, epoch: int, max_offset: int) -> EpochList:
        """Becoming master in `epoch` with the log ending at `max_offset`
        (RocketMQ's changeToMaster): refuse an epoch lower than the last;
        drop entries that start past the log's end (the log was cut below
        them) and any of this epoch or later; append (epoch, max_offset).

        Becoming master again in the same epoch (a restart the controller
        did not notice) moves the epoch's start to the log's end, as
        RocketMQ does: the tail the restart lost may be rewritten in this
        epoch, so a replica holding the old start must not match it. It
        falls back to the epoch before, whose end on this broker is now the
        new start, and on the replica the old start: the rule cuts at the
        old one."""
        last = self.last
        if last is not None and epoch < last.epoch:
            raise EpochOrderError(f"cannot become master in epoch {epoch}: this broker's "
                                  f"last epoch is {last.epoch}")
        kept = tuple(e for e in self.beyond_log_end_dropped(max_offset).entries
                     if e.epoch < epoch)
        return EpochList(kept).append(EpochEntry(epoch, max_offset))

    def truncate_from(self, offset: int) -> EpochList:
        """The entries starting before `offset` (RocketMQ's
        truncateSuffixByOffset: entries starting at or after a cut describe
        no record any more)."""
        return EpochList(tuple(e for e in self.entries if e.start_offset < offset))

    def beyond_log_end_dropped(self, max_offset: int) -> EpochList:
        """The entries starting at or before the log's end. One starting
        exactly there is kept: a master's epoch that has no record yet."""
        return EpochList(tuple(e for e in self.entries if e.start_offset <= max_offset))


def last_common_point(local: EpochList, local_max_offset: int,
                      master: EpochList, master_max_offset: int) -> int | None:
    """The offset up to which the replica's log and the master's agree, or
    None when no epoch is common (see the module docstring for the rule).
    Entries starting beyond a log's end are not counted (the log was cut
    below them)."""
    local = local.beyond_log_end_dropped(local_max_offset)
    for mine in reversed(local.entries):
        theirs = master.get(mine.epoch)
        if theirs is not None and theirs.start_offset == mine.start_offset:
            return min(local.end_of(mine.epoch, local_max_offset),
                       master.end_of(theirs.epoch, master_max_offset))
    return None
