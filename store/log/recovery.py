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
- Either way, every segment before the scan's start gets its first record
  (or blank) verified: one header and record per segment, so a segment of
  zeros (or garbage) in the middle of the log is found at open, not by a
  consumer that later skips its messages. The scan then starts just before
  it, and what it finds there is damage like any other.

Scanning verifies size, magic, PHYSICALOFFSET and body CRC of every record. A
blank moves to the next segment; an all-zero header is the normal end of
data; anything else is damage.

Damage is then classified (after Protocol-Aware Recovery, FAST '18; and
TigerBeetle, which tells corruption in the middle of the committed journal
from torn writes at its end):
- TAIL: nothing past the damage is vouched for as flushed. A crash mid-flush
  leaves such a torn or garbage tail (every write this store makes to a
  segment is sequential, so a torn write is never followed by good records):
  cutting it loses nothing that was promised. It is cut, as always.
- FLUSHED: corruption of data that was flushed. Any of these vouches for it:
  the last shutdown was clean (a clean close flushes everything); a valid
  record lies past the damage (found by resynchronising on the next record
  that verifies at its own PHYSICALOFFSET); the damage lies below the
  checkpoint's flushed END (store/log/checkpoint.py: every byte below it was
  fsynced). Positions decide, not timestamps: many records share a store
  millisecond, and a clock that steps back puts the checkpoint's timestamp
  ahead of records written later. Only a checkpoint an older version wrote
  (no flushed end) falls back to its timestamp: a record stored later than
  the last good record was flushed. A zero header (normally the end of
  data) counts as damage when it lies below the flushed end (or, for an
  old checkpoint, by its timestamp), or when it is the first header of a
  segment that later segments follow: zeros where records were flushed are
  a hole. Cutting here deletes acknowledged, flushed data; what the store
  does about it is its CorruptionPolicy (store/config.py), and the plan
  carries the figures (segment, offset, bytes and records past the damage)
  for that decision and its message.
"""

from __future__ import annotations

import enum
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from store.log import native as native_codec
from store.log.checkpoint import Checkpoint
from store.log.record import (
    BLANK_MAGIC,
    BLANK_SIZE,
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


class ScanStop(enum.StrEnum):
    """Why a segment scan stopped."""

    BLANK = "blank"  # the segment's closing blank: it is full
    END = "end"  # zeros: no more data
    DAMAGE = "damage"  # a bad record (SegmentScan.reason says which check failed)
    UNREADABLE = "unreadable"  # the file could not be read (store inspect only)


@dataclass(frozen=True)
class SegmentScan:
    start: int
    scanned_from: int
    end: int  # offset just past the last good record (segment end after a blank)
    records: int
    last_store_timestamp_ms: int | None
    stop: ScanStop
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


def _verify_but_crc(buf: Buffer, pos: int, offset: int) -> tuple[int, int]:
    """record.verify, except that a body CRC mismatch passes (the planted
    fault --emulate planted-recovery-skips-crc; no fixed path calls it)."""
    try:
        return verify(buf, pos, offset)
    except CorruptRecordError as exc:
        if exc.reason != "crc":
            raise
        size, _, _, _, sys_flag, ts, _ = _FAST.unpack_from(buf, pos)
        if sys_flag & _V6_FLAGS:  # its timestamp is elsewhere; not worth a planted path
            raise
        return size, ts


def scan_segment(
    buf: Buffer,
    seg_start: int,
    from_offset: int,
    *,
    seg_size: int | None = None,
    check_trailing: bool = False,
    check_crc: bool = True,
) -> SegmentScan:
    """Scan one segment's bytes from `from_offset` (an absolute offset).
    `seg_size` is the segment's nominal size when `buf` is shorter (a file
    cut short); a blank must reach exactly to the nominal end. `check_crc`
    False is the planted fault --emulate planted-recovery-skips-crc
    (store/emulate.py): a record whose only fault is its body CRC is kept."""
    view = memoryview(buf)
    limit = len(view)
    nominal = seg_size if seg_size is not None else limit
    pos = from_offset - seg_start
    records = 0
    last_ts: int | None = None
    fast = _FAST.unpack_from
    prefix = _PREFIX.unpack_from
    crc32 = zlib.crc32
    # The native scan checks the CRC; without the check, the loop below.
    scan = native_codec.scan if check_crc else None
    _verify = verify if check_crc else _verify_but_crc
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
                stop = ScanStop.END
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
                        and (not check_crc or crc32(view[b:e]) & 0x7FFFFFFF == crc)
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
                stop = ScanStop.BLANK
                break
            if size == 0 and magic == 0:
                stop = ScanStop.END
                break
            raise CorruptRecordError("magic", f"magic code 0x{magic:08X} is not a record")
    except CorruptRecordError as exc:
        return SegmentScan(
            seg_start, from_offset, seg_start + pos, records, last_ts, ScanStop.DAMAGE, exc.reason,
            exc.detail,
            trailing_nonzero=True,
        )
    end = seg_start + (nominal if stop == ScanStop.BLANK else pos)
    trailing = stop == ScanStop.END and check_trailing and not _all_zero(view, pos)
    return SegmentScan(seg_start, from_offset, end, records, last_ts, stop,
                       trailing_nonzero=trailing)


class DamageKind(enum.StrEnum):
    TAIL = "tail"  # torn or garbage tail past what is vouched flushed: safe to cut
    FLUSHED = "flushed"  # corruption of flushed data: cutting loses promised data


@dataclass(frozen=True)
class Damage:
    """The first damage recovery found, classified, with what cutting there
    would lose: every valid record past it (`records_past`, in bytes up to the
    end of the last of them: `bytes_past`). `resume_offset` is where valid
    records start again (the damaged range is [offset, resume_offset)), None
    when none follows."""

    kind: DamageKind
    segment: int  # start offset of the segment holding the damage
    offset: int
    reason: str | None
    detail: str | None
    records_past: int
    bytes_past: int
    resume_offset: int | None
    evidence: str  # why the data there is (or is not) known to be flushed
    # The checkpoint's flushed end when it lies past the damage: the bytes
    # [offset, flushed_end) were flushed, whatever they read as now.
    flushed_end: int | None = None
    # What the damage may be besides lost data (an old checkpoint's
    # timestamp ahead of the records: a clock that stepped back).
    note: str | None = None

    @property
    def bytes_lost(self) -> int:
        """What cutting at the damage loses: the valid records past it, and
        at least every flushed byte from it to the checkpoint's end."""
        missing = self.flushed_end - self.offset if self.flushed_end is not None else 0
        return max(self.bytes_past, missing)

    def describe(self, seg_name: Callable[[int], str]) -> str:
        text = (f"commitlog/{seg_name(self.segment)} at offset {self.offset} "
                f"({self.reason}: {self.detail})")
        if self.kind is DamageKind.FLUSHED:
            text = f"corruption of flushed data in {text}; {self.evidence}"
            if self.flushed_end is not None and self.bytes_lost > self.bytes_past:
                # A hole: what was flushed there reads as zeros or garbage.
                text += (f"; the {self.flushed_end - self.offset} flushed bytes from there to "
                         f"{self.flushed_end} no longer hold valid records (acknowledged "
                         f"records there are lost); cutting there would lose those "
                         f"{self.bytes_lost} bytes and the {self.records_past} valid "
                         "record(s) still among them")
            else:
                text += (f"; cutting there would lose {self.bytes_lost} bytes holding "
                         f"{self.records_past} valid record(s)")
            return text + (f" ({self.note})" if self.note else "")
        return f"torn tail at {text}; {self.evidence}"


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
    damage: Damage | None = None  # set whenever first_bad_offset is
    # With stale_tail: the end of the stale bytes in that segment (what
    # completing the interrupted cut clears is [max_valid_offset, stale_end)).
    stale_end: int | None = None

    def describe(self) -> str:
        kind = "abnormal" if self.abnormal else "normal"
        text = f"{kind} recovery: {self.records_scanned} records verified, valid to offset " + str(
            self.max_valid_offset
        )
        if self.first_bad_offset is not None:
            text += f"; damage at {self.first_bad_offset} ({self.bad_reason}: {self.bad_detail})"
            if self.damage is not None and self.damage.kind is DamageKind.FLUSHED:
                text += (f", corruption of flushed data ({self.damage.evidence}): "
                         f"{self.damage.records_past} valid record(s), "
                         f"{self.damage.bytes_lost} bytes past it")
            else:
                text += " (a torn tail)"
            text += ", everything from there on dropped"
        if self.segments_to_drop:
            text += f"; {len(self.segments_to_drop)} later segment(s) removed"
        if self.stale_tail:
            text += ("; an interrupted truncation completed: stale bytes "
                     f"[{self.max_valid_offset}, {self.stale_end}) cleared")
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
    check_crc: bool = True,
) -> RecoveryPlan:
    """Decide what is valid. `starts` are the segments' start offsets, sorted;
    `read(start)` gives a segment's bytes. `check_crc` False: the planted
    fault --emulate planted-recovery-skips-crc (scan_segment)."""
    notes: list[str] = []
    if not starts:
        return RecoveryPlan(abnormal, None, 0, 0, None, None, None, None, [], notes)
    vouched = checkpoint.flushed_end if checkpoint is not None else None
    first = _scan_start(starts, read, abnormal=abnormal, checkpoint=checkpoint,
                        checkpoint_problem=checkpoint_problem, notes=notes)
    bad_head = _first_bad_head(starts[:first], read, seg_size, vouched)
    if bad_head is not None:
        first = max(0, bad_head - 1)  # from the segment before: its end is the cut
    total = 0
    last_ts: int | None = None
    offset = starts[first]
    scan: SegmentScan | None = None
    i = first
    for i in range(first, len(starts)):
        scan = scan_segment(read(starts[i]), starts[i], starts[i], seg_size=seg_size,
                            check_crc=check_crc)
        total += scan.records
        if scan.last_store_timestamp_ms is not None:
            last_ts = scan.last_store_timestamp_ms
        offset = scan.end
        if scan.stop != ScanStop.BLANK:
            break
    assert scan is not None
    # Scanning stopped inside segment i (or ran off the last one): anything
    # after it is past the end of data.
    drop = starts[i + 1 :]
    damage = None
    hole = None
    if scan.stop == ScanStop.END:
        hole = _zero_hole(scan.end, vouched, checkpoint, last_ts,
                          segment_head=bad_head is not None and scan.end == starts[bad_head])
    if hole is not None:
        # Zeros where records were flushed: a hole in flushed data (a lost
        # or zeroed block), not the end of data. (A cut lowers the
        # checkpoint before it zeroes a header, so an interrupted one never
        # looks like this.)
        scan = replace(scan, stop=ScanStop.DAMAGE, reason="zeros", detail=hole)
        damage = classify_damage(
            starts, read, i, scan, seg_size=seg_size, abnormal=abnormal, checkpoint=checkpoint,
            last_good_ts=last_ts)
    elif scan.stop == ScanStop.DAMAGE:
        damage = classify_damage(
            starts, read, i, scan, seg_size=seg_size, abnormal=abnormal, checkpoint=checkpoint,
            last_good_ts=last_ts)
    elif (scan.stop == ScanStop.END and vouched is None and checkpoint is not None
          and last_ts is not None and checkpoint.physic_ms == last_ts):
        notes.append(
            f"the checkpoint (written by an older version, without the flushed end) cannot "
            f"tell whether records stored in the same millisecond as the last one found "
            f"({last_ts} ms) were flushed past offset {scan.end}; the next flush records the "
            "end, so later opens can tell")
    bad = scan.end if scan.stop == ScanStop.DAMAGE else None
    buf = read(starts[i])
    stale = scan.stop == ScanStop.END and _stale_after(buf, scan.end - starts[i])
    stale_end = starts[i] + _nonzero_end(buf, scan.end - starts[i]) if stale else None
    return RecoveryPlan(
        abnormal, starts[first], offset, total, last_ts, bad, scan.reason, scan.detail, drop, notes,
        stale, damage, stale_end,
    )


def _scan_start(starts: list[int], read: Callable[[int], Buffer], *, abnormal: bool,
                checkpoint: Checkpoint | None, checkpoint_problem: str | None,
                notes: list[str]) -> int:
    """The index of the segment the scan starts from (module docstring)."""
    if not abnormal:
        return max(0, len(starts) - 3)
    if checkpoint is None:
        notes.append(f"{checkpoint_problem or 'no checkpoint'}: scanning every segment")
        return 0
    limit = checkpoint.min_timestamp_ms
    for i in range(len(starts) - 1, -1, -1):
        ts = first_record_timestamp(read(starts[i]), starts[i])
        if ts is not None and ts <= limit:
            return i
    return 0


def _head_ok(buf: Buffer, seg_start: int, seg_size: int | None) -> bool:
    """Whether a segment starts as a written one does: a record that
    verifies at its own offset, or a blank closing it."""
    size, magic = peek(buf, 0)
    if magic == BLANK_MAGIC:
        return size == (seg_size if seg_size is not None else len(buf))
    if magic != MESSAGE_MAGIC:
        return False
    try:
        verify(buf, 0, seg_start)
    except CorruptRecordError:
        return False
    return True


def _first_bad_head(starts: list[int], read: Callable[[int], Buffer], seg_size: int | None,
                    vouched: int | None) -> int | None:
    """The index of the first of `starts` (segments the scan would skip)
    whose first bytes are not a valid record or blank. A segment at or past
    the checkpoint's flushed end is not checked: a cut interrupted before
    it removed later segments leaves a zeroed head there, and the cut
    lowered the flushed end first (store/log/cuts.py)."""
    for j, start in enumerate(starts):
        if vouched is not None and start >= vouched:
            return None
        if not _head_ok(read(start), start, seg_size):
            return j
    return None


def _zero_hole(end: int, vouched: int | None, checkpoint: Checkpoint | None,
               last_ts: int | None, *, segment_head: bool) -> str | None:
    """Why a zero header at `end` is a hole in flushed data rather than the
    end of data (module docstring), or None."""
    if vouched is not None:
        if end < vouched:
            return (f"a zero header where the checkpoint records every byte below offset "
                    f"{vouched} as flushed")
        return None
    if segment_head:
        return "a segment that begins with zeros, and later segments follow it"
    if checkpoint is not None and last_ts is not None and checkpoint.physic_ms > last_ts:
        return "a zero header where the checkpoint says records were flushed"
    return None


_MAGIC_BYTES = MESSAGE_MAGIC.to_bytes(4, "big")
_RESYNC_CHUNK = 1 << 20


def resync(buf: Buffer, seg_start: int, from_offset: int) -> int | None:
    """The offset of the first record at or after `from_offset` in this
    segment that verifies where it lies (its PHYSICALOFFSET equal to its
    position, its CRC right): where valid data starts again after damage.
    None when the rest of the segment holds none."""
    view = memoryview(buf)
    pos = max(0, from_offset - seg_start)
    n = len(view)
    while pos + 8 <= n:
        # The magic sits 4 bytes into a record; search a chunk at a time (a
        # torn tail's segment is mostly zeros: no copy of it all at once).
        hi = min(n, pos + 4 + _RESYNC_CHUNK + 3)
        chunk = bytes(view[pos + 4 : hi])
        at = chunk.find(_MAGIC_BYTES)
        if at < 0:
            pos += _RESYNC_CHUNK
            continue
        cand = pos + at
        try:
            verify(view, cand, seg_start + cand)
            return seg_start + cand
        except CorruptRecordError:
            pos = cand + 1
    return None


def classify_damage(
    starts: list[int],
    read: Callable[[int], Buffer],
    index: int,
    scan: SegmentScan,
    *,
    seg_size: int | None,
    abnormal: bool,
    checkpoint: Checkpoint | None,
    last_good_ts: int | None,
) -> Damage:
    """Tell a torn tail from corruption of flushed data (module docstring)
    for the damage `scan` stopped at in segment `starts[index]`, and count
    what lies past it."""
    bad = scan.end
    records = 0
    last_end: int | None = None
    resume: int | None = None
    i = index
    at: int | None = resync(read(starts[i]), starts[i], bad + 1)
    while True:
        if at is None:
            # Nothing more in this segment: later segments, from their start.
            i += 1
            if i >= len(starts):
                break
            at = starts[i]
        if resume is None and at > bad:
            resume = at
        seg = scan_segment(read(starts[i]), starts[i], at, seg_size=seg_size)
        records += seg.records
        if seg.records:
            last_end = _last_record_end(read(starts[i]), starts[i], at, seg)
            if resume is None or resume > at:
                resume = at
        if seg.stop == ScanStop.DAMAGE:
            at = resync(read(starts[i]), starts[i], seg.end + 1)
            continue
        at = None
        if seg.stop != ScanStop.BLANK:
            # The end of data in this segment: later segments may still hold
            # records (a lost blank, a gap): keep counting them.
            continue
    if records == 0:
        resume = None
    bytes_past = (last_end - bad) if last_end is not None else 0
    vouched = checkpoint.flushed_end if checkpoint is not None else None
    evidence, note = _flushed_evidence(bad, records, abnormal=abnormal, checkpoint=checkpoint,
                                       last_good_ts=last_good_ts)
    if evidence is None:
        return Damage(DamageKind.TAIL, starts[index], bad, scan.reason, scan.detail, 0, 0, None,
                      "nothing past it is known to have been flushed: safe to cut")
    return Damage(DamageKind.FLUSHED, starts[index], bad, scan.reason, scan.detail, records,
                  bytes_past, resume, evidence,
                  flushed_end=vouched if vouched is not None and vouched > bad else None,
                  note=note)


def _flushed_evidence(bad: int, records: int, *, abnormal: bool,
                      checkpoint: Checkpoint | None, last_good_ts: int | None
                      ) -> tuple[str | None, str | None]:
    """(why the damage at `bad` is known to lie in flushed data, or None for
    a torn tail; what else it may be)."""
    vouched = checkpoint.flushed_end if checkpoint is not None else None
    if not abnormal:
        if vouched is not None and bad < vouched:
            return (f"the last shutdown was clean and recorded every byte below offset "
                    f"{vouched} as flushed"), None
        return "the last shutdown was clean, so everything before it had been flushed", None
    if records:
        return f"{records} valid record(s) follow it", None
    if vouched is not None:
        # Positions decide; the timestamps are not consulted (module docstring).
        if bad < vouched:
            return f"the checkpoint records every byte below offset {vouched} as flushed", None
        return None, None
    if checkpoint is not None and checkpoint.physic_ms and (
            last_good_ts is None or checkpoint.physic_ms > last_good_ts):
        found = f" ({last_good_ts} ms)" if last_good_ts is not None else ""
        return (f"the checkpoint (written by an older version: timestamps only) names a record "
                f"stored at {checkpoint.physic_ms} ms as flushed, later than the last good "
                f"record{found}"), (
                "either records flushed after it were lost, or the system clock stepped back "
                "while the store ran, which leaves the checkpoint's timestamp ahead of records "
                "written later")
    return None, None


def _last_record_end(buf: Buffer, seg_start: int, at: int, seg: SegmentScan) -> int:
    """The end of the last record of a scanned run (a blank's scan ends at
    the segment's end, past the records)."""
    if seg.stop != ScanStop.BLANK:
        return seg.end
    pos = at - seg_start
    while True:
        size, magic = peek(buf, pos)
        if magic != MESSAGE_MAGIC:
            return seg_start + pos
        pos += size


def verify_range(data: Buffer, offset: int, end: int, seg_end: int) -> None:
    """Check that `data` (fetched from a replica to repair [offset, end)) is
    exactly whole valid records from `offset`, each at its own
    PHYSICALOFFSET with its CRC right, ending at `end` — or ending with a
    blank that closes the segment at `seg_end`. Raises CorruptRecordError."""
    view = memoryview(data)
    pos = 0
    while offset + pos < end:
        if pos + BLANK_SIZE <= len(view):
            size, magic = peek(view, pos)
            if magic == BLANK_MAGIC:
                if offset + pos + size != seg_end or pos + BLANK_SIZE != len(view):
                    raise CorruptRecordError("size", f"blank at {offset + pos} does not close "
                                             "its segment")
                return
        size, _ts = verify(view, pos, offset + pos)
        pos += size
    if offset + pos != end or pos != len(view):
        raise CorruptRecordError("size", f"records end at {offset + pos}, not at {end}")


STALE_CHECK_BYTES = 4096


def _nonzero_end(buf: Buffer, pos: int, step: int = 1 << 20) -> int:
    """The position just past the last non-zero byte at or after `pos`
    (`pos` if none), searched a chunk at a time from the end: what
    completing an interrupted cut clears."""
    view = memoryview(buf)
    hi = len(view)
    while hi > pos:
        lo = max(pos, hi - step)
        kept = len(view[lo:hi].tobytes().rstrip(b"\0"))
        if kept:
            return lo + kept
        hi = lo
    return pos


def _stale_after(buf: Buffer, pos: int) -> bool:
    """Whether the bytes just after a zero header at `pos` are not zero. An
    interrupted cut (store.log.cuts.cut_on_disk step 1 done, step 2 not)
    leaves exactly that: the header zeroed, the old record's fields right
    behind it (a stored record always has a non-zero store timestamp in its
    first 64 bytes). One page is checked, not the rest of the segment, to
    keep a normal open from reading a whole segment of zeros."""
    view = memoryview(buf)[pos : pos + STALE_CHECK_BYTES]
    return view.tobytes().count(0) != len(view)
