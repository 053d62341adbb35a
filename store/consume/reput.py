"""Reput: walk CommitLog records and yield what their ConsumeQueue units
need (RocketMQ's ReputMessageService). Pure: bytes in, unit fields out.

Dispatch runs behind the appends, not on the put path: the store calls it
before serving a read, before flushing its queues, at close, and after
recovery from the point `ConsumeQueues.reput_start` gives.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

from store.consume.consumequeue import tags_hash
from store.log.record import (
    BLANK_MAGIC,
    BORNHOST_V6_FLAG,
    MESSAGE_MAGIC,
    STOREHOST_V6_FLAG,
    V4_FIXED_SIZE,
    CorruptRecordError,
    decode,
    decode_properties,
    peek,
)

# TOTALSIZE, MAGICCODE, QUEUEID, QUEUEOFFSET, SYSFLAG of any layout, and the
# BODY length and STORETIMESTAMP where both hosts are IPv4.
_HEAD = struct.Struct(">iI4xi4xq8xi")
_V4_BODY_LEN = struct.Struct(">i")
_V4_STORE_TS = struct.Struct(">q")
_V4_STORE_TS_AT = 56  # after BORNTIMESTAMP (40) and an IPv4 BORNHOST (48)
_TAGS = b"TAGS\x01"

# topic, queue id, queue offset, offset, size, tag hash, store timestamp (ms)
Unit = tuple[str, int, int, int, int, int, int]


def units(buf: bytes | memoryview, base: int) -> Iterator[Unit]:
    """Units for the whole records in `buf` (which starts at offset `base`),
    stopping at a blank or the end. Records here were verified when they
    were appended, so damage is a programming error: CorruptRecordError."""
    pos = 0
    n = len(buf)
    while pos + 8 <= n:
        size, magic = peek(buf, pos)
        if magic == BLANK_MAGIC or size == 0:
            return
        if magic != MESSAGE_MAGIC:
            raise CorruptRecordError("magic", f"no record at {base + pos} during dispatch")
        _, _, qid, qo, sys_flag = _HEAD.unpack_from(buf, pos)
        if sys_flag & (BORNHOST_V6_FLAG | STOREHOST_V6_FLAG):
            rec = decode(buf, pos, offset=base + pos, check_crc=False)
            yield (rec.topic, qid, qo, base + pos, size, tags_hash(rec.properties.get("TAGS")),
                   rec.store_timestamp_ms)
        else:
            (body_len,) = _V4_BODY_LEN.unpack_from(buf, pos + V4_FIXED_SIZE - 4)
            t = pos + V4_FIXED_SIZE + body_len
            tlen = buf[t]
            topic = bytes(buf[t + 1 : t + 1 + tlen]).decode("utf-8", "replace")
            p = t + 1 + tlen
            plen = buf[p] << 8 | buf[p + 1]
            props = bytes(buf[p + 2 : p + 2 + plen])
            tag = 0
            if _TAGS in props:
                tag = tags_hash(decode_properties(props, lenient=True).get("TAGS"))
            (store_ts,) = _V4_STORE_TS.unpack_from(buf, pos + _V4_STORE_TS_AT)
            yield (topic, qid, qo, base + pos, size, tag, store_ts)
        pos += size
