"""The master's messages on the replication stream, encoded and decoded by
hand where they carry data. Pure: bytes in, bytes or frames out.

Why by hand: a shipped Range holds up to a batch (1 MiB by default) of
records. Through the protobuf runtime the master copies those bytes into a
message and again out of it, and the slave copies them out of the parsed
message once more: building and serializing a 1 MiB Range cost the master
more than reading the bytes from the segment (see docs/performance-notes.md).
Here the master writes a header, the data and a trailer in one join, and
the slave takes the data as a zero-copy view of the received message.

The bytes are exactly what protobuf makes of proto/ha.proto's MasterMessage
(fields in number order, proto3 defaults omitted), so any protobuf peer
reads them, and a peer's encoding this fast path does not recognise is
parsed by the protobuf runtime instead (tests/ha/test_ha_frames.py holds the
two to each other):

    MasterMessage{range: Range{offset, data, master_wrote}}
      0x0A varint(len(R))            field 1 (range), length-delimited
      R = [0x08 varint(offset)]      Range.offset        (omitted when 0)
          [0x12 varint(len) data]    Range.data          (omitted when empty)
          [0x18 varint(wrote)]       Range.master_wrote  (omitted when 0)

A Truncate (rare) goes through the protobuf runtime both ways.
"""

from __future__ import annotations

from dataclasses import dataclass

from google.protobuf.message import DecodeError

from proto import ha_pb2

_RANGE_TAG = 0x0A  # MasterMessage field 1 (range), wire type 2
_OFFSET_TAG = 0x08  # Range field 1, varint
_DATA_TAG = 0x12  # Range field 2, length-delimited
_WROTE_TAG = 0x18  # Range field 3, varint
_U64 = 1 << 64


class FrameError(Exception):
    """Bytes from the master that are not a MasterMessage (a remote error)."""


@dataclass(frozen=True, slots=True)
class RangeFrame:
    """A Range: `data` (possibly a view into the received message) starts at
    `offset`; empty data is the master's heartbeat."""

    offset: int
    data: bytes | memoryview
    master_wrote: int


@dataclass(frozen=True, slots=True)
class TruncateFrame:
    offset: int
    reason: str


def _varint(n: int) -> bytes:
    assert 0 <= n < _U64, n
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def encode_range(offset: int, data: bytes, master_wrote: int) -> bytes:
    """The wire bytes of MasterMessage{range: Range{offset, data,
    master_wrote}}; one copy of `data`."""
    assert offset >= 0 and master_wrote >= 0, (offset, master_wrote)
    head = (bytes((_OFFSET_TAG,)) + _varint(offset)) if offset else b""
    if data:
        head += bytes((_DATA_TAG,)) + _varint(len(data))
    tail = (bytes((_WROTE_TAG,)) + _varint(master_wrote)) if master_wrote else b""
    body_len = len(head) + len(data) + len(tail)
    return b"".join((bytes((_RANGE_TAG,)), _varint(body_len), head, data, tail))


def encode_truncate(offset: int, reason: str) -> bytes:
    return ha_pb2.MasterMessage(truncate=ha_pb2.Truncate(offset=offset, reason=reason)
                                ).SerializeToString()


def _read_varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    """(value, next position); raises FrameError on a cut or overlong varint."""
    value = shift = 0
    while pos < end and shift < 64:
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7
    raise FrameError("a varint runs past its message or is longer than 10 bytes")


def _int64(v: int) -> int:
    """A varint's value as protobuf's int64 (two's complement)."""
    v &= _U64 - 1
    return v - _U64 if v >= 1 << 63 else v


def decode(buf: bytes) -> RangeFrame | TruncateFrame:
    """One message from the master. The canonical Range layout above is
    decoded here without copying the data; anything else (a Truncate, other
    field order, unknown fields) by the protobuf runtime. Raises FrameError
    for bytes that are not a MasterMessage, or one that carries neither."""
    frame = _decode_range(buf)
    if frame is not None:
        return frame
    try:
        msg = ha_pb2.MasterMessage.FromString(buf)
    except DecodeError as exc:
        raise FrameError(f"malformed message (not a dlab.ha.MasterMessage): {exc}") from None
    kind = msg.WhichOneof("kind")
    if kind == "range":
        r = msg.range
        return RangeFrame(r.offset, r.data, r.master_wrote)
    if kind == "truncate":
        return TruncateFrame(msg.truncate.offset, msg.truncate.reason)
    raise FrameError("the master sent a message with neither a range nor a truncate "
                     "(a newer protocol?)")


def _decode_range(buf: bytes) -> RangeFrame | None:
    """The fast path: None unless `buf` is exactly the canonical layout."""
    n = len(buf)
    if n < 2 or buf[0] != _RANGE_TAG:
        return None
    try:
        body_len, pos = _read_varint(buf, 1, n)
        if pos + body_len != n:
            return None
        offset = master_wrote = 0
        data: bytes | memoryview = b""
        if pos < n and buf[pos] == _OFFSET_TAG:
            raw, pos = _read_varint(buf, pos + 1, n)
            offset = _int64(raw)
        if pos < n and buf[pos] == _DATA_TAG:
            size, pos = _read_varint(buf, pos + 1, n)
            if pos + size > n:
                return None
            data = memoryview(buf)[pos:pos + size]
            pos += size
        if pos < n and buf[pos] == _WROTE_TAG:
            raw, pos = _read_varint(buf, pos + 1, n)
            master_wrote = _int64(raw)
    except FrameError:
        return None  # let the protobuf runtime say what is wrong
    if pos != n:
        return None
    return RangeFrame(offset, data, master_wrote)
