"""Recovery, as a pure decision: which bytes of the CommitLog are valid.

Input: the segments' bytes (through a callable), whether the last shutdown
was clean, and the checkpoint. Output: a RecoveryPlan naming the offset just
past the last good record and why scanning stopped. Applying the plan (the
truncation) is IO and lives in commitlog.py.

- Clean shutdown (no `abort` file): scan from the third-last segment, as
  RocketMQ's recoverNormally does; older segments were verified when written.
- Abnormal shutdown: walk segments backwards to the first whose first record
  is older than the checkpoint (minus RocketMQ's 3 s margin); no usable
  checkpoint means from the first segment. Then scan forward.

Scanning verifies size, magic, PHYSICALOFFSET and body CRC of every record. A
blank moves to the next segment; an all-zero header is the normal end of
data; anything else is damage, and everything from it on is dropped.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

from store import native as native_codec
from store.checkpoint import Checkpoint
from store.record import (
    BLANK_MAGIC,
    BORNHOST_V6_FLAG,
    MESSAGE_MAGIC,
    STOREHOST_V6_FLAG,
    V4_FIXED_SIZE,
    CorruptRecordError,
    peek,
    verify,
)

Buffer = bytes | memoryview

_PREFIX = struct.Struct(">iI")
# TOTALSIZE, MAGICCODE, BODYCRC, PHYSICALOFFSET, SYSFLAG, STORETIMESTAMP and
# BODY length of an IPv4 record, skipping the fields recovery does not check.
_FAST = struct.Struct(">iIi16xqi16xq20xi")
assert _FAST.size == V4_FIXED_SIZE
_MIN_SIZE = V4_FIXED_SIZE + 3
_V6_FLAGS = BORNHOST_V6_FLAG | STOREHOST_V6_FLAG


@dataclass(frozen=True)
class SegmentScan:
    start: int
    scanned_from: int
    end: int  # offset just past the last good record (segment end after a blank)
    records: int
    last_store_timestamp_ms: int | None
    stop: str  # "blank" | "end" | "damage"
    reason: str | None = None  # damage: size, magic, crc, layout, position, truncated
    detail: str | None = None
    trailing_nonzero: bool = False  # bytes that are not zero after the end of data


def _all_zero(buf: Buffer, pos: int) -> bool:
    view = memoryview(buf)[pos:]
    step = 1 << 20
    zeros = bytes(step)
    for i in range(0, len(view), step):
        chunk = view[i : i + step]
        if chunk != zeros[: len(chunk)]:
            return False
    return True


def scan_segment(
    buf: Buffer,
    seg_start: int,
    from_offset: int,
    *,
    seg_size: int | None = None,
    check_trailing: bool = False,
) -> SegmentScan:
    """Scan one segment's bytes from `from_offset` (an absolute offset).
    `seg_size` is the segment's nominal size when `buf` is shorter (a file
    cut short); a blank must reach exactly to the nominal end."""
    view = memoryview(buf)
    limit = len(view)
    nominal = seg_size if seg_size is not None else limit
    pos = from_offset - seg_start
    records = 0
    last_ts: int | None = None
    _verify = verify
    fast = _FAST.unpack_from
    prefix = _PREFIX.unpack_from
    crc32 = zlib.crc32
    scan = native_codec.scan
    try:
        while True:
            if scan is not None:
                # The run of ordinary records, verified natively; anything
                # else (a blank, zeros, damage, IPv6) is decided below.
                pos, n, ts_n = scan(view, pos, limit, seg_start)
                if n:
                    records += n
                    last_ts = ts_n
            if pos + 8 > limit:
                if pos < limit and not _all_zero(view, pos):
                    raise CorruptRecordError("truncated", f"{limit - pos} bytes at the segment end")
                stop = "end"
                break
            size, magic = prefix(view, pos)
            if magic == MESSAGE_MAGIC:
                # Fast path for the common (IPv4) layout: the same checks as
                # record.verify, inlined because this loop is recovery's cost.
                end = pos + size
                if size >= _MIN_SIZE and end <= limit:
                    _, _, crc, phys, sys_flag, ts, body_len = fast(view, pos)
                    b = pos + V4_FIXED_SIZE
                    e = b + body_len
                    if (
                        not sys_flag & _V6_FLAGS
                        and phys == seg_start + pos
                        and body_len >= 0
                        and e + 3 <= end
                        and crc32(view[b:e]) & 0x7FFFFFFF == crc
                    ):
                        pa = e + 1 + view[e]
                        # view[pa] < 0x80: PROPERTIES length is a signed short.
                        if (pa + 2 <= end and view[pa] < 0x80
                                and pa + 2 + (view[pa] << 8 | view[pa + 1]) == end):
                            pos = end
                            last_ts = ts
                            records += 1
                            continue
                # Anything unusual: the full check says what is wrong (or
                # accepts an IPv6 layout).
                size, last_ts = _verify(view, pos, seg_start + pos)
                pos += size
                records += 1
                continue
            if magic == BLANK_MAGIC:
                if size != nominal - pos:
                    raise CorruptRecordError(
                        "size", f"blank of {size} bytes but {nominal - pos} remain in the segment"
                    )
                stop = "blank"
                break
            if size == 0 and magic == 0:
                stop = "end"
                break
            raise CorruptRecordError("magic", f"magic code 0x{magic:08X} is not a record")
    except CorruptRecordError as exc:
        return SegmentScan(
            seg_start, from_offset, seg_start + pos, records, last_ts, "damage", exc.reason,
            exc.detail,
            trailing_nonzero=True,
        )
    end = seg_start + (nominal if stop == "blank" else pos)
    trailing = stop == "end" and check_trailing and not _all_zero(view, pos)
    return SegmentScan(seg_start, from_offset, end, records, last_ts, stop,
                       trailing_nonzero=trailing)


@dataclass(frozen=True)
class RecoveryPlan:
    abnormal: bool
    start_segment: int | None  # where scanning began
    max_valid_offset: int  # wrote = flushed after recovery
    records_scanned: int
    last_store_timestamp_ms: int | None
    first_bad_offset: int | None
    bad_reason: str | None
    bad_detail: str | None
    segments_to_drop: list[int] = field(default_factory=list)  # wholly past the end
    notes: list[str] = field(default_factory=list)
    # Non-zero bytes right after the end of data: the tail of an earlier cut
    # that crashed between zeroing the header and clearing the rest. They
    # must be cleared before anything is appended, or new records ending
    # where an old one began would make the old tail valid again.
    stale_tail: bool = False

    def describe(self) -> str:
        kind = "abnormal" if self.abnormal else "normal"
        text = f"{kind} recovery: {self.records_scanned} records verified, valid to offset " + str(
            self.max_valid_offset
        )
        if self.first_bad_offset is not None:
            text += f"; damage at {self.first_bad_offset} ({self.bad_reason}: {self.bad_detail})"
            text += ", everything from there on dropped"
        if self.segments_to_drop:
            text += f"; {len(self.segments_to_drop)} later segment(s) removed"
        if self.stale_tail:
            text += "; stale bytes after the end (an interrupted truncation) cleared"
        return text


def first_record_timestamp(buf: Buffer, seg_start: int) -> int | None:
    try:
        size, magic = peek(buf, 0)
        if magic != MESSAGE_MAGIC:
            return None
        return verify(buf, 0, seg_start)[1]
    except CorruptRecordError:
        return None


def plan_recovery(
    starts: list[int],
    read: Callable[[int], Buffer],
    *,
    seg_size: int | None = None,
    abnormal: bool,
    checkpoint: Checkpoint | None,
    checkpoint_problem: str | None = None,
) -> RecoveryPlan:
    """Decide what is valid. `starts` are the segments' start offsets, sorted;
    `read(start)` gives a segment's bytes."""
    notes: list[str] = []
    if not starts:
        return RecoveryPlan(abnormal, None, 0, 0, None, None, None, None, [], notes)
    if not abnormal:
        first = max(0, len(starts) - 3)
    else:
        first = 0
        if checkpoint is None:
            notes.append(f"{checkpoint_problem or 'no checkpoint'}: scanning every segment")
        else:
            limit = checkpoint.min_timestamp_ms
            for i in range(len(starts) - 1, -1, -1):
                ts = first_record_timestamp(read(starts[i]), starts[i])
                if ts is not None and ts <= limit:
                    first = i
                    break
    total = 0
    last_ts: int | None = None
    offset = starts[first]
    scan: SegmentScan | None = None
    i = first
    for i in range(first, len(starts)):
        scan = scan_segment(read(starts[i]), starts[i], starts[i], seg_size=seg_size)
        total += scan.records
        if scan.last_store_timestamp_ms is not None:
            last_ts = scan.last_store_timestamp_ms
        offset = scan.end
        if scan.stop != "blank":
            break
    assert scan is not None
    # Scanning stopped inside segment i (or ran off the last one): anything
    # after it is past the end of data.
    drop = starts[i + 1 :]
    bad = scan.end if scan.stop == "damage" else None
    stale = scan.stop == "end" and _stale_after(read(starts[i]), scan.end - starts[i])
    return RecoveryPlan(
        abnormal, starts[first], offset, total, last_ts, bad, scan.reason, scan.detail, drop, notes,
        stale,
    )


STALE_CHECK_BYTES = 4096


def _stale_after(buf: Buffer, pos: int) -> bool:
    """Whether the bytes just after a zero header at `pos` are not zero. An
    interrupted cut (store.commitlog.cut_on_disk step 1 done, step 2 not)
    leaves exactly that: the header zeroed, the old record's fields right
    behind it (a stored record always has a non-zero store timestamp in its
    first 64 bytes). One page is checked, not the rest of the segment, to
    keep a normal open from reading a whole segment of zeros."""
    view = memoryview(buf)[pos : pos + STALE_CHECK_BYTES]
    return view.tobytes().count(0) != len(view)
