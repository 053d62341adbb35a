"""Put outcomes, mirroring RocketMQ's PutMessageStatus."""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from store.log.record import Record


class PutStatus(enum.StrEnum):
    PUT_OK = "PUT_OK"
    # Stored on the master, but the promise of the mode was not met in time.
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"
    # Not stored.
    MESSAGE_ILLEGAL = "MESSAGE_ILLEGAL"
    SERVICE_NOT_AVAILABLE = "SERVICE_NOT_AVAILABLE"
    UNKNOWN_ERROR = "UNKNOWN_ERROR"
    # Controller mode: the master's SyncStateSet is smaller than
    # min_in_sync_replicas, so the put is refused before it is stored
    # (RocketMQ 5's IN_SYNC_REPLICAS_NOT_ENOUGH).
    IN_SYNC_REPLICAS_NOT_ENOUGH = "IN_SYNC_REPLICAS_NOT_ENOUGH"

    @property
    def stored(self) -> bool:
        """True when the bytes were appended on the node that answered."""
        return self in _STORED


_STORED = {
    PutStatus.PUT_OK,
    PutStatus.FLUSH_DISK_TIMEOUT,
    PutStatus.FLUSH_SLAVE_TIMEOUT,
    PutStatus.SLAVE_NOT_AVAILABLE,
}

# What a client records for a put whose answer never came (the call failed or
# timed out): it may or may not be stored. No node answers it, so it is not a
# PutStatus; the client (cluster/client/node_client.py) and the chaos history use it.
INDETERMINATE = "INDETERMINATE"

# When flush and replica waits both fail, the worse one is reported.
SEVERITY = {
    PutStatus.PUT_OK: 0,
    PutStatus.FLUSH_SLAVE_TIMEOUT: 1,
    PutStatus.SLAVE_NOT_AVAILABLE: 2,
    PutStatus.FLUSH_DISK_TIMEOUT: 3,
}


def worse(a: PutStatus, b: PutStatus) -> PutStatus:
    return a if SEVERITY.get(a, 9) >= SEVERITY.get(b, 9) else b


class SlaveAck(NamedTuple):
    """One slave's positions as its master held them when it answered a put."""

    slave: str  # the name its stream's first report gave
    acked: int  # its last accepted report (its max offset)
    shipped: int  # where the master's next range to it starts


class Quorum(NamedTuple):
    """The slave acks a controller-mode put waited for: `needed` of them,
    from `members` (None: from any connected slave)."""

    needed: int
    members: tuple[str, ...] | None


class Evidence(NamedTuple):
    """The positions a node answered a put PUT_OK on (docs/design.md,
    "Evidence"): what the answer relied on, recorded when it was made, so
    a checker can verify the answer, not only the losses
    (chaos/check/evidence.py)."""

    wrote: int  # the node's wrote position
    flushed: int  # its flushed position
    acks: tuple[SlaveAck, ...] = ()  # each connected slave's (SYNC_MASTER only)
    by: str = ""  # the slave whose ack covered the put; "" when none did
    # Controller mode: the slave acks the put waited for, as the master's
    # quorum stood (ha/autoswitch/acks.py): how many, and from which
    # members (None: any connected slave); None in classic mode.
    quorum: Quorum | None = None

    def as_json(self) -> dict[str, object]:
        """The history's `evidence` field (chaos/schema.py HISTORY)."""
        out: dict[str, object] = {"wrote": self.wrote, "flushed": self.flushed, "by": self.by,
                                  "acks": [a._asdict() for a in self.acks]}
        if self.quorum is not None:
            members = self.quorum.members
            out["quorum"] = {"needed": self.quorum.needed,
                             "members": None if members is None else sorted(members)}
        return out


class PutResult(NamedTuple):
    """One put's outcome (a NamedTuple: built once per put, on the hot path).

    A node's answered PUT_OK is an AnsweredPut, which also carries its
    Evidence. That is not a field here: the native encoder builds these
    tuples with exactly the six fields below (native/src/lib.rs)."""

    status: PutStatus
    offset: int = -1
    size: int = 0
    msg_id: str | None = None
    store_timestamp_ms: int = 0
    detail: str = ""

    @property
    def end(self) -> int:
        return self.offset + self.size

    @property
    def evidence(self) -> Evidence | None:
        """The positions a node answered this PUT_OK on (AnsweredPut)."""
        return None


class AnsweredPut(PutResult):
    """A PutResult with the Evidence it was answered on, as a seventh item
    (see PutResult). A result derived from it (`_replace`) is a plain
    PutResult: evidence is of the answer it was given with."""

    __slots__ = ()

    def __new__(cls, result: PutResult, evidence: Evidence) -> AnsweredPut:
        return tuple.__new__(cls, (*result[:6], evidence))

    def __getnewargs__(self) -> tuple[PutResult, Evidence]:
        return self.plain(), self.evidence

    @property
    def evidence(self) -> Evidence:
        ev = tuple.__getitem__(self, 6)
        assert isinstance(ev, Evidence)
        return ev

    def plain(self) -> PutResult:
        return PutResult(*self[:6])

    def _replace(self, /, **changes: object) -> PutResult:  # type: ignore[override]
        return self.plain()._replace(**changes)  # type: ignore[arg-type]

    def __repr__(self) -> str:
        return f"{self.plain()!r}[evidence={self.evidence!r}]"


class GetMessageStatus(enum.StrEnum):
    """Mirrors RocketMQ's GetMessageStatus for a pull from one queue."""

    FOUND = "FOUND"
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"  # the queue has no consumable message
    NO_MATCHED_LOGIC_QUEUE = "NO_MATCHED_LOGIC_QUEUE"  # no such topic/queue
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"  # before the queue's first message
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"  # exactly at the end: nothing new yet
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"  # past the end
    OFFSET_FOUND_NULL = "OFFSET_FOUND_NULL"  # a unit without its record


class QueuedMessage(NamedTuple):
    """One pulled message: its queue offset, where its record is, the record."""

    queue_offset: int
    commitlog_offset: int
    record: Record


class GetMessagesResult(NamedTuple):
    status: GetMessageStatus
    messages: list[QueuedMessage]
    next_offset: int  # where the consumer should pull next
    min_offset: int
    max_offset: int  # the consumable end (records up to confirmed_offset())
