"""Put outcomes, mirroring RocketMQ's PutMessageStatus."""

from __future__ import annotations

import enum
from typing import NamedTuple


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

# When flush and replica waits both fail, the worse one is reported.
SEVERITY = {
    PutStatus.PUT_OK: 0,
    PutStatus.FLUSH_SLAVE_TIMEOUT: 1,
    PutStatus.SLAVE_NOT_AVAILABLE: 2,
    PutStatus.FLUSH_DISK_TIMEOUT: 3,
}


def worse(a: PutStatus, b: PutStatus) -> PutStatus:
    return a if SEVERITY.get(a, 9) >= SEVERITY.get(b, 9) else b


class PutResult(NamedTuple):
    """One put's outcome (a NamedTuple: built once per put, on the hot path)."""

    status: PutStatus
    offset: int = -1
    size: int = 0
    msg_id: str | None = None
    store_timestamp_ms: int = 0
    detail: str = ""

    @property
    def end(self) -> int:
        return self.offset + self.size
