"""RocketMQ v1 message layout: encode and decode one CommitLog record.

Byte layout (big-endian, as RocketMQ's CommitLog.DefaultAppendMessageCallback
writes it; the field order is the wire contract with real broker stores):

    off  size  field
      0     4  TOTALSIZE        whole record, these 4 bytes included
      4     4  MAGICCODE        0xDAA320A7 for a message, 0xCBD43194 for a blank
      8     4  BODYCRC          CRC-32 of BODY with the sign bit cleared
     12     4  QUEUEID
     16     4  FLAG
     20     8  QUEUEOFFSET      position in the ConsumeQueue
     28     8  PHYSICALOFFSET   this record's offset in the CommitLog
     36     4  SYSFLAG          bit 4: born host is IPv6, bit 5: store host is IPv6
     40     8  BORNTIMESTAMP    ms
     48  8|20  BORNHOST         IPv4 (4) or IPv6 (16) address + port (4)
      .     8  STORETIMESTAMP   ms
      .  8|20  STOREHOSTADDRESS address + port
      .     4  RECONSUMETIMES
      .     8  PREPARED TRANSACTION OFFSET
      .   4+n  BODY             length, bytes
      .   1+n  TOPIC            length, UTF-8
      .   2+n  PROPERTIES       length, `name\\x01value\\x02` repeated

A *blank* ends a segment whose remaining space cannot hold the next record:
8 bytes, TOTALSIZE = the remaining space, MAGICCODE = BLANK_MAGIC. A record is
never split across segments.

What the CRC covers: BODYCRC covers the body only (that is RocketMQ's
format). Everything else is checked structurally: the magic, TOTALSIZE equal to
the sum of the variable-length fields, PHYSICALOFFSET equal to where the
record was found. Any way a decode can fail raises CorruptRecordError. The
text inside TOPIC and PROPERTIES is not checked (no CRC covers it, and
verify() does not parse it): decode reads it leniently, as RocketMQ's
MessageDecoder does, so decode and verify accept exactly the same records.
"""

from __future__ import annotations

import socket
import struct
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from types import MappingProxyType
from typing import NamedTuple

MESSAGE_MAGIC = 0xDAA320A7
BLANK_MAGIC = 0xCBD43194
BLANK_SIZE = 8  # TOTALSIZE + MAGICCODE: what RocketMQ calls END_FILE_MIN_BLANK_LENGTH
UNIQ_KEY = "UNIQ_KEY"
BORNHOST_V6_FLAG = 1 << 4
STOREHOST_V6_FLAG = 1 << 5
NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"
_NO_PROPERTIES: Mapping[str, str] = MappingProxyType({})

# The fixed part up to SYSFLAG, then the timestamps and hosts, then the tail.
_HEAD = struct.Struct(
    ">"
    "i"  # TOTALSIZE
    "I"  # MAGICCODE
    "i"  # BODYCRC
    "i"  # QUEUEID
    "i"  # FLAG
    "q"  # QUEUEOFFSET
    "q"  # PHYSICALOFFSET
    "i"  # SYSFLAG
    "q"  # BORNTIMESTAMP
)
# IPv4 layout of the hosts section: BORNHOST(4+4), STORETIMESTAMP, STOREHOST(4+4).
_HOSTS_V4 = struct.Struct(">4si" "q" "4si")
_TAIL = struct.Struct(
    ">"
    "i"  # RECONSUMETIMES
    "q"  # PREPARED TRANSACTION OFFSET
    "i"  # BODY length
)
_PREFIX = struct.Struct(">iI")  # TOTALSIZE, MAGICCODE: enough to walk records
# The whole fixed part of an all-IPv4 record, for the fast encoder.
_V4_FIXED = struct.Struct(">iIiiiqqiq4siq4siiqi")
V4_FIXED_SIZE = _V4_FIXED.size  # 88: everything before the body bytes
assert _HEAD.size + _HOSTS_V4.size + _TAIL.size == V4_FIXED_SIZE


class CorruptRecordError(ValueError):
    """The bytes at an offset are not a valid record. `reason` is one word a
    report can group by: size, magic, crc, layout, position, truncated."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def _misplaced(phys: int, offset: int) -> str:
    return (f"the record at offset {offset} names offset {phys} in its PHYSICALOFFSET "
            "field: its header is damaged, or it is not where the log wrote it")


class Message(NamedTuple):
    """What a producer hands the store. `properties` carries UNIQ_KEY.
    A NamedTuple rather than a dataclass: it is built once per put, and
    construction cost is on the group-commit hot path."""

    topic: str
    body: bytes
    properties: Mapping[str, str] = _NO_PROPERTIES
    queue_id: int = 0
    flag: int = 0
    born_timestamp_ms: int = 0
    born_host: tuple[str, int] = ("127.0.0.1", 0)

    @property
    def msg_id(self) -> str | None:
        return self.properties.get(UNIQ_KEY)


@dataclass(frozen=True)
class Record:
    """One decoded message record."""

    offset: int
    size: int
    body_crc: int
    queue_id: int
    flag: int
    queue_offset: int
    sys_flag: int
    born_timestamp_ms: int
    born_host: tuple[str, int]
    store_timestamp_ms: int
    store_host: tuple[str, int]
    reconsume_times: int
    prepared_transaction_offset: int
    body: bytes
    topic: str
    properties: dict[str, str]

    @property
    def msg_id(self) -> str | None:
        return self.properties.get(UNIQ_KEY)


def body_crc(body: bytes | memoryview) -> int:
    """RocketMQ's UtilAll.crc32: CRC-32 (zlib's polynomial) with the sign bit cleared."""
    return zlib.crc32(body) & 0x7FFFFFFF


def encode_properties(properties: Mapping[str, str]) -> bytes:
    """`name\x01value\x02` repeated, as MessageDecoder.messageProperties2String."""
    text = "".join([f"{k}\x01{v}\x02" for k, v in properties.items()])
    n = len(properties)
    # One count per separator instead of a scan per name and value: a
    # separator inside a name or value shows up as an extra one.
    if text.count(NAME_VALUE_SEPARATOR) != n or text.count(PROPERTY_SEPARATOR) != n:
        raise ValueError("a property name or value contains a separator character (\x01 or \x02)")
    return text.encode("utf-8")


def decode_properties(raw: bytes, *, lenient: bool = False) -> dict[str, str]:
    """Parse `name\x01value\x02` pairs. Strict by default (ValueError on bad
    UTF-8 or an item without a separator); `lenient` replaces bad UTF-8 and
    skips items without a separator, as RocketMQ's string2messageProperties does."""
    text = raw.decode("utf-8", "replace" if lenient else "strict")
    result: dict[str, str] = {}
    for item in text.split(PROPERTY_SEPARATOR):
        if not item:
            continue
        name, sep, value = item.partition(NAME_VALUE_SEPARATOR)
        if not sep:
            if lenient:
                continue
            raise ValueError(f"property without a name/value separator: {item[:40]!r}")
        result[name] = value
    return result


@lru_cache(maxsize=256)
def ipv4_field(host: str) -> bytes:
    """A host's 4 address bytes as the IPv4 layout stores them (loopback where
    the name is not an IPv4 address)."""
    try:
        return socket.inet_aton(host)
    except OSError:
        return b"\x7f\x00\x00\x01"


@lru_cache(maxsize=1024)
def _topic_field(topic: str) -> bytes:
    """TOPIC as stored: 1 length byte + UTF-8."""
    raw = topic.encode("utf-8")
    if not 0 < len(raw) <= 127:
        raise ValueError(f"topic must be 1..127 UTF-8 bytes, got {len(raw)}")
    return len(raw).to_bytes(1, "big") + raw


def encode(
    msg: Message,
    *,
    offset: int,
    queue_offset: int,
    store_timestamp_ms: int,
    store_host: tuple[str, int] = ("127.0.0.1", 0),
) -> bytes:
    """Encode one message as stored at `offset`. Raises ValueError on a topic
    or property the layout cannot hold (too long, bad characters)."""
    topic = _topic_field(msg.topic)
    props = encode_properties(msg.properties)
    if len(props) > 32767:
        raise ValueError(f"properties must be at most 32767 bytes, got {len(props)}")
    body = msg.body
    n = len(body)
    born_host = msg.born_host
    head = _V4_FIXED.pack(
        V4_FIXED_SIZE + n + len(topic) + 2 + len(props),
        MESSAGE_MAGIC,
        zlib.crc32(body) & 0x7FFFFFFF,
        msg.queue_id,
        msg.flag,
        queue_offset,
        offset,
        0,
        msg.born_timestamp_ms,
        ipv4_field(born_host[0]),
        born_host[1],
        store_timestamp_ms,
        ipv4_field(store_host[0]),
        store_host[1],
        0,
        0,
        n,
    )
    return b"".join((head, body, topic, len(props).to_bytes(2, "big"), props))


def encode_blank(remaining: int) -> bytes:
    """The 8-byte blank that ends a segment with `remaining` bytes left."""
    return _PREFIX.pack(remaining, BLANK_MAGIC)


def peek(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    """(TOTALSIZE, MAGICCODE) at pos; (0, 0) where fewer than 8 bytes remain."""
    if len(buf) - pos < 8:
        return 0, 0
    return _PREFIX.unpack_from(buf, pos)


def _host(buf: bytes | memoryview, pos: int, v6: bool) -> tuple[tuple[str, int], int]:
    n = 16 if v6 else 4
    addr = bytes(buf[pos : pos + n])
    (port,) = struct.unpack_from(">i", buf, pos + n)
    family = socket.AF_INET6 if v6 else socket.AF_INET
    return (socket.inet_ntop(family, addr), port), pos + n + 4


def decode(
    buf: bytes | memoryview, pos: int = 0, *, offset: int | None = None, check_crc: bool = True
) -> Record:
    """Decode the message record at buf[pos:]. `offset` is where it claims to be
    (PHYSICALOFFSET must match); None skips that check. Raises
    CorruptRecordError for anything that is not exactly one valid message
    (a blank is not a message: callers check the magic with `peek` first)."""
    avail = len(buf) - pos
    if avail < _HEAD.size:
        raise CorruptRecordError("truncated", f"{avail} bytes left, a header needs {_HEAD.size}")
    (size, magic, crc, queue_id, flag, queue_offset, phys, sys_flag, born_ts) = _HEAD.unpack_from(
        buf, pos
    )
    if magic != MESSAGE_MAGIC:
        raise CorruptRecordError("magic", f"magic code 0x{magic:08X} is not a message")
    if size < V4_FIXED_SIZE + 3:
        raise CorruptRecordError("size", f"total size {size} is below the minimum")
    if size > avail:
        raise CorruptRecordError("truncated", f"record of {size} bytes but {avail} remain")
    if offset is not None and phys != offset:
        raise CorruptRecordError("position", _misplaced(phys, offset))
    end = pos + size
    try:
        p = pos + _HEAD.size
        born_host, p = _host(buf, p, bool(sys_flag & BORNHOST_V6_FLAG))
        (store_ts,) = struct.unpack_from(">q", buf, p)
        store_host, p = _host(buf, p + 8, bool(sys_flag & STOREHOST_V6_FLAG))
        reconsume, prepared, body_len = _TAIL.unpack_from(buf, p)
        p += _TAIL.size
        if body_len < 0 or p + body_len + 3 > end:
            raise CorruptRecordError("layout", f"body length {body_len} overruns the record")
        body = bytes(buf[p : p + body_len])
        p += body_len
        topic_len = buf[p]
        topic_raw = bytes(buf[p + 1 : p + 1 + topic_len])
        p += 1 + topic_len
        if p + 2 > end:
            raise CorruptRecordError("layout", "topic overruns the record")
        (props_len,) = struct.unpack_from(">h", buf, p)
        p += 2
        if props_len < 0 or p + props_len != end:
            raise CorruptRecordError(
                "layout", f"fields end at {p + max(props_len, 0) - pos}, total size says {size}"
            )
        props_raw = bytes(buf[p : p + props_len])
    except struct.error as exc:
        raise CorruptRecordError("layout", str(exc)) from exc
    except (IndexError, ValueError, OSError) as exc:
        if isinstance(exc, CorruptRecordError):
            raise
        raise CorruptRecordError("layout", str(exc)) from exc
    if check_crc and body_crc(body) != crc:
        raise CorruptRecordError("crc", f"body CRC {body_crc(body)} != stored {crc}")
    # Lenient, like RocketMQ's decoder: a record that verify() (and so
    # recovery) keeps must stay readable, whatever bytes its text holds.
    topic = topic_raw.decode("utf-8", "replace")
    properties = decode_properties(props_raw, lenient=True)
    return Record(
        offset=phys,
        size=size,
        body_crc=crc,
        queue_id=queue_id,
        flag=flag,
        queue_offset=queue_offset,
        sys_flag=sys_flag,
        born_timestamp_ms=born_ts,
        born_host=born_host,
        store_timestamp_ms=store_ts,
        store_host=store_host,
        reconsume_times=reconsume,
        prepared_transaction_offset=prepared,
        body=body,
        topic=topic,
        properties=properties,
    )


_VERIFY_V4 = struct.Struct(">iIiiiqqiq8sq8siqi")  # same as _V4_FIXED, hosts opaque


def verify(buf: bytes | memoryview, pos: int, offset: int) -> tuple[int, int]:
    """Check the message record at buf[pos:] without building a Record: size,
    magic, layout, PHYSICALOFFSET == offset, body CRC. Returns (size,
    store_timestamp_ms). The hot loop of recovery and of a slave accepting
    shipped bytes; decode() is the full, slower twin (tests cross-check them)."""
    avail = len(buf) - pos
    if avail < V4_FIXED_SIZE + 3:
        if avail >= 8 and _PREFIX.unpack_from(buf, pos)[1] != MESSAGE_MAGIC:
            raise CorruptRecordError("magic", "not a message")
        raise CorruptRecordError("truncated", f"{avail} bytes left")
    (size, magic, crc, _q, _f, _qo, phys, sys_flag, _bt, _bh, store_ts, _sh, _r, _p, body_len) = (
        _VERIFY_V4.unpack_from(buf, pos)
    )
    if magic != MESSAGE_MAGIC:
        raise CorruptRecordError("magic", f"magic code 0x{magic:08X} is not a message")
    if sys_flag & (BORNHOST_V6_FLAG | STOREHOST_V6_FLAG):
        rec = decode(buf, pos, offset=offset)  # rare layout: take the full path
        return rec.size, rec.store_timestamp_ms
    if size < V4_FIXED_SIZE + 3:
        raise CorruptRecordError("size", f"total size {size} is below the minimum")
    if size > avail:
        raise CorruptRecordError("truncated", f"record of {size} bytes but {avail} remain")
    if phys != offset:
        raise CorruptRecordError("position", _misplaced(phys, offset))
    body_start = pos + V4_FIXED_SIZE
    body_end = body_start + body_len
    end = pos + size
    if body_len < 0 or body_end + 3 > end:
        raise CorruptRecordError("layout", f"body length {body_len} overruns the record")
    topic_len = buf[body_end]
    props_at = body_end + 1 + topic_len
    # PROPERTIES length is a signed short, as decode (and RocketMQ) read it:
    # a length of 32,768 or more is negative, never a valid record.
    if props_at + 2 > end or props_at + 2 + int.from_bytes(
            buf[props_at : props_at + 2], signed=True) != end:
        raise CorruptRecordError("layout", f"fields do not add up to total size {size}")
    if zlib.crc32(buf[body_start:body_end]) & 0x7FFFFFFF != crc:
        raise CorruptRecordError("crc", f"body CRC mismatch (stored {crc})")
    return size, store_ts


class RecordSummary(NamedTuple):
    """What a read-back lists of a record (chaos/harness/readback.py)."""

    size: int
    body_crc: int
    store_timestamp_ms: int
    msg_id: str | None


_INT32 = struct.Struct(">i")
_CRC_AT, _SYSFLAG_AT = 8, 36  # BODYCRC and SYSFLAG (the layout above)
_BODY_LEN_AT = V4_FIXED_SIZE - 4  # IPv4 layout: the BODY length ends the fixed part


def summarize(buf: bytes | memoryview, pos: int, offset: int) -> RecordSummary:
    """verify() plus the stored body CRC and UNIQ_KEY: the same checks and
    the same answers as decode(buf, pos, offset=offset), without building
    the Record (its hosts, body and topic copies). The read-back of every
    record after a sim run spent most of its time in decode
    (docs/performance-notes.md, "The simulated cluster")."""
    size, store_ts = verify(buf, pos, offset)
    (sys_flag,) = _INT32.unpack_from(buf, pos + _SYSFLAG_AT)
    if sys_flag & (BORNHOST_V6_FLAG | STOREHOST_V6_FLAG):
        rec = decode(buf, pos, offset=offset)  # rare layout: take the full path
        return RecordSummary(rec.size, rec.body_crc, rec.store_timestamp_ms, rec.msg_id)
    (crc,) = _INT32.unpack_from(buf, pos + _CRC_AT)
    (body_len,) = _INT32.unpack_from(buf, pos + _BODY_LEN_AT)
    body_end = pos + V4_FIXED_SIZE + body_len
    props_at = body_end + 1 + buf[body_end] + 2  # past TOPIC and the PROPERTIES length
    props = decode_properties(bytes(buf[props_at:pos + size]), lenient=True)
    return RecordSummary(size, crc, store_ts, props.get(UNIQ_KEY))
