"""Inspect a store directory without changing it: what `dlab store inspect` prints.

Reads any store root laid out as RocketMQ's (`commitlog/` segments named by
their 20-digit start offset, `checkpoint`, `abort`, `lock`) — ours, or one a
RocketMQ broker wrote in the v1 message layout. It opens every file
read-only, takes no lock, writes nothing and follows no symbolic link (each
is named as a problem, as store/layout.py refuses it at open), so it is safe
on a store a crashed node left behind, before recovery has touched it.

The core, `inspect_log`, is pure: it takes the segment listing, a function
giving a segment's bytes, and the marker files' contents, and returns an
`InspectReport`. It reuses the store's own checks (store.log.recovery.scan_segment
verifies size, magic, PHYSICALOFFSET and body CRC; store.log.recovery.plan_recovery
decides what a real open would keep), so the report and the store cannot
disagree about what is valid. `StoreFiles` is the IO edge.

Two views of the same bytes, both in the report:
- the full scan: every segment from its start, whatever the `abort` file
  says. `max_valid_offset` is just past the last good record of the
  contiguous log from the first segment; `first_bad_offset` is where the
  first damaged record starts (None when the data simply ends).
- `recovery`: what MessageStore.open would do with these files as they are
  now (normal recovery checks only the last three segments, abnormal
  recovery starts from the checkpoint), including where it would truncate.

What counts as damage: a record whose size, magic, layout, PHYSICALOFFSET or
body CRC is wrong, or partial record bytes at the end of a file. Zero bytes
after the last record are the normal end of data. A blank (8 bytes: size +
BLANK_MAGIC) ends every segment but the last; a segment that ends without one
while later segments exist ends the log there, and the later segments are
past the end of data (recovery removes them).
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from store.consume.consumequeue import DIR_NAME as CQ_DIR
from store.consume.consumequeue import UNIT, UNIT_SIZE
from store.layout import layout_problems
from store.log.checkpoint import Checkpoint, read_checkpoint
from store.log.record import MESSAGE_MAGIC, CorruptRecordError, Record, decode, peek
from store.log.recovery import (
    DamageKind,
    ScanStop,
    first_record_timestamp,
    plan_recovery,
    scan_segment,
)
from store.log.segments import NAME_DIGITS, SegmentListing, list_segments, segment_name
from store.seams.disk import RealDisk
from store.seams.lock import lock_holder

Buffer = bytes | memoryview

# RocketMQ 5's v2 layout (2-byte topic length); named in reports so a user
# who points this at a v2 store learns why nothing decodes.
MESSAGE_MAGIC_V2 = 0xDAA320AB


class InspectError(ValueError):
    """The path is not a store directory; the message says what to pass instead."""


@dataclass(frozen=True)
class SegmentReport:
    """One segment file as the full scan found it.

    stop: why the scan stopped (store/log/recovery.py ScanStop; a DAMAGE record
    is at `bad_offset`). `end` is just past the last good record (the segment's end after
    a blank). `in_log` is False for a segment past the end of the contiguous
    log: recovery would remove it, and its records do not count."""

    name: str
    start: int
    file_size: int
    records: int
    stop: ScanStop
    end: int
    in_log: bool
    last_store_timestamp_ms: int | None = None
    bad_offset: int | None = None
    reason: str | None = None
    detail: str | None = None
    problems: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class RecoveryPreview:
    """What MessageStore.open would do with the files as they are now."""

    mode: str  # "normal" (no abort file) | "abnormal"
    opens: bool  # False: the store refuses to open (see `refusal`)
    refusal: list[str]
    scans_from: str | None  # the segment recovery starts scanning at
    max_valid_offset: int | None  # wrote/flushed after recovery
    first_bad_offset: int | None
    bad_reason: str | None
    truncates_at: int | None  # bytes from here on are removed; None: nothing is
    segments_removed: list[str]
    notes: list[str]


@dataclass(frozen=True)
class Markers:
    """The store root's small files, read as they are."""

    abort_present: bool = False
    abort_pid: str | None = None
    lock_present: bool = False
    lock_pid: str | None = None  # written by the last process that opened the store
    # The pid holding the lock as the store was read: it is in use, and
    # these are files being written, not a stopped store.
    lock_held_by: int | None = None
    checkpoint: Checkpoint | None = None
    checkpoint_problem: str | None = None


@dataclass(frozen=True)
class QueueReport:
    """One ConsumeQueue (consumequeue/<topic>/<queue id>/) as its files are.

    `units` is how many recovery would keep: the contiguous valid units
    (offset >= 0, size > 0, the record ending within the log recovery keeps)
    from the first; consumers read queue offsets [min_offset, max_offset).
    `first_bad_unit` is the first unit that is not one (None when the data
    simply ends: zero units, or the end of the files), with `reason`."""

    topic: str
    queue_id: int
    files: int
    units: int
    min_offset: int
    max_offset: int
    first_bad_unit: int | None = None
    reason: str | None = None


@dataclass(frozen=True)
class InspectReport:
    path: str
    segment_size: int | None  # inferred from the files
    records: int  # good records in the contiguous log
    first_offset: int  # the first segment's start
    end_offset: int  # == max_valid_offset: where the next record would go
    max_valid_offset: int  # just past the last good record
    last_record_offset: int | None
    first_store_timestamp_ms: int | None
    last_store_timestamp_ms: int | None
    first_bad_offset: int | None
    bad_reason: str | None  # size, magic, crc, layout, position, truncated, unreadable
    bad_detail: str | None
    bad_segment: str | None
    records_past_end: int  # good records in segments past the end of the log
    segments: list[SegmentReport]
    stray: list[str]
    problems: list[str]  # everything a user should look at, one sentence each
    recovery: RecoveryPreview
    markers: Markers
    consume_queues: list[QueueReport] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        cp = self.markers.checkpoint
        out["markers"]["checkpoint"] = (
            None if cp is None
            else {"physic_ms": cp.physic_ms, "logics_ms": cp.logics_ms, "index_ms": cp.index_ms,
                  "flushed_end": cp.flushed_end,
                  # controller mode's (store/log/checkpoint.py); None in classic mode
                  "confirm_offset": cp.confirm_offset}
        )
        return out


# ---------------------------------------------------------------- the core
def check_units(data: Buffer, log_end: int) -> tuple[int, int | None, str | None]:
    """Scan ConsumeQueue units (store.consume.consumequeue's 20-byte layout) as
    recovery does: (valid units from the first, index of the first bad one
    or None, why). All-zero units end the data without being bad."""
    n = len(data) // UNIT_SIZE
    for i, (offset, size, tag) in enumerate(UNIT.iter_unpack(data[: n * UNIT_SIZE])):
        if offset < 0 or size <= 0:
            if offset == size == tag == 0:
                if any(data[i * UNIT_SIZE:]):
                    return i, i, "a zero unit with data after it"
                return i, None, None
            return i, i, f"invalid unit (offset {offset}, size {size})"
        if offset + size > log_end:
            return i, i, f"points past the end of the log ({offset}+{size} > {log_end})"
    if len(data) % UNIT_SIZE:
        return n, n, f"{len(data) % UNIT_SIZE} trailing byte(s) of a partial unit"
    return n, None, None


def inspect_consume_queues(root: str, log_end: int) -> tuple[list[QueueReport], list[str]]:
    """Every queue under `<root>/consumequeue/`, read-only, and problems
    (misnamed files, directories that are not queues)."""
    base = os.path.join(root, CQ_DIR)
    out: list[QueueReport] = []
    problems: list[str] = []
    try:
        topics = sorted(os.listdir(base))
    except OSError:
        return out, problems
    for topic in topics:
        tdir = os.path.join(base, topic)
        if os.path.islink(tdir) or not os.path.isdir(tdir):
            continue  # a link is named by layout_problems, never followed
        for qid in sorted(os.listdir(tdir), key=lambda q: (len(q), q)):
            qdir = os.path.join(tdir, qid)
            if os.path.islink(qdir):
                continue
            if not qid.isdigit() or not os.path.isdir(qdir):
                problems.append(f"{CQ_DIR}/{topic}/{qid} is not a queue directory")
                continue
            names = sorted(n for n in os.listdir(qdir) if len(n) == NAME_DIGITS and n.isdigit()
                           and not os.path.islink(os.path.join(qdir, n)))
            data = bytearray()
            reason = None
            for name in names:
                if int(name) != len(data):
                    reason = (f"file {name} does not start where the previous one ends "
                              f"(byte {len(data)})")
                    break
                data += _read_no_link(os.path.join(qdir, name))
            units, bad, why = check_units(memoryview(data), log_end)
            if reason is not None and bad is None:
                bad, why = units, reason
            out.append(QueueReport(topic, int(qid), len(names), units, 0, units, bad, why))
    return out, problems


ZeroFrom = Callable[[int, int], bool]  # (segment start, position in it) -> all zero after?


def _zero_from(buf: Buffer, pos: int) -> bool:
    view = memoryview(buf)[pos:]
    step = 1 << 20
    for i in range(0, len(view), step):
        chunk = view[i : i + step].tobytes()
        if chunk.count(0) != len(chunk):
            return False
    return True


def _magic_hint(detail: str | None) -> str:
    if detail and f"0x{MESSAGE_MAGIC_V2:08X}" in detail:
        return " (that is RocketMQ's v2 message layout, which this lab does not read)"
    return ""


def _listing_problems(listing: SegmentListing) -> tuple[list[str], dict[str, list[str]]]:
    """The listing's problems: those of the log as a whole, and those that
    name one segment (reported with that segment)."""
    problems: list[str] = []
    by_name: dict[str, list[str]] = {}
    for msg in listing.fatal + listing.problems:
        name = msg.removeprefix("commitlog/").split(":", 1)[0]
        if len(name) == NAME_DIGITS and name.isdigit():
            by_name.setdefault(name, []).append(msg)
        else:
            problems.append(msg)
    return problems, by_name


def _segment_report(start: int, file_size: int, nominal: int, read: Callable[[int], Buffer],
                    zero_from: ZeroFrom, markers: Markers, *, in_log: bool, last: bool,
                    problems: list[str]) -> tuple[SegmentReport, int | None]:
    """One segment scanned: its report (`problems` grows with what the scan
    finds) and the store time of its first record, if it has one."""
    name = segment_name(start)
    try:
        buf = memoryview(read(start))[:nominal]
    except OSError as exc:
        problems.append(f"commitlog/{name}: unreadable ({exc.strerror or exc})")
        return SegmentReport(name, start, file_size, 0, ScanStop.UNREADABLE, start, in_log,
                             bad_offset=start, reason="unreadable",
                             detail=str(exc.strerror or exc), problems=problems), None
    scan = scan_segment(buf, start, start, seg_size=nominal)
    trailing = scan.stop == ScanStop.END and not zero_from(start, scan.end - start)
    if (scan.stop == ScanStop.END and file_size < nominal and scan.end - start >= file_size
            and not last):
        # A middle segment cut short: its data runs off the end of the file.
        # (A short last segment's missing end is never-written space, as the
        # store treats it.)
        scan = replace(scan, stop=ScanStop.DAMAGE, reason="truncated",
                       detail=f"file ends at byte {file_size} of {nominal}")
    bad_at = scan.end if scan.stop == ScanStop.DAMAGE else None
    if scan.stop == ScanStop.DAMAGE:
        problems.append(
            f"commitlog/{name}: damaged record at offset {scan.end} "
            f"({scan.reason}: {scan.detail}){_magic_hint(scan.detail)}"
        )
    elif trailing and markers.lock_held_by is not None:
        problems.append(
            f"commitlog/{name}: non-zero bytes after the end of data at {scan.end}: "
            "most likely records written while this was read (the store is in use), "
            "not damage"
        )
    elif trailing:
        problems.append(
            f"commitlog/{name}: non-zero bytes after the end of data at {scan.end} "
            "(left by a torn write or an interrupted truncation; recovery treats "
            "the zero header at the end as the end of data)"
        )
    seg = SegmentReport(
        name, start, file_size, scan.records, scan.stop, scan.end, in_log,
        scan.last_store_timestamp_ms, bad_at, scan.reason, scan.detail, problems,
    )
    first_ts = first_record_timestamp(buf, start) if scan.records else None
    return seg, first_ts


def inspect_log(
    path: str,
    listing: SegmentListing,
    read: Callable[[int], Buffer],
    markers: Markers,
    zero_from: ZeroFrom | None = None,
) -> InspectReport:
    """Scan every segment of `listing` (bytes from `read(start)`, which may
    raise OSError for an unreadable file) and decide what is valid.
    `zero_from(start, pos)` says whether a segment holds only zeros from pos
    on (default: check read(start); the IO edge passes a faster one)."""
    if zero_from is None:
        def zero_from(start: int, pos: int) -> bool:
            return _zero_from(read(start), pos)
    seg_size = listing.segment_size
    problems, fatal_by_name = _listing_problems(listing)

    segments: list[SegmentReport] = []
    in_log = True
    expect_next: int | None = None  # where the next segment must start to continue the log
    max_valid = listing.starts[0] if listing.starts else 0
    records = 0
    past_end = 0
    first_ts: int | None = None
    last_ts: int | None = None
    last_record: int | None = None
    bad: tuple[int, str, str | None, str] | None = None
    for i, start in enumerate(listing.starts):
        name = segment_name(start)
        if in_log and expect_next is not None and start != expect_next:
            in_log = False  # a missing segment (listed as a problem): the log ends at the gap
        # A file longer than the segment size is scanned only up to it (the
        # size itself is reported as a problem).
        nominal = seg_size or listing.sizes[start]
        seg, seg_first_ts = _segment_report(
            start, listing.sizes[start], nominal, read, zero_from, markers, in_log=in_log,
            last=i == len(listing.starts) - 1, problems=list(fatal_by_name.get(name, [])))
        if in_log and first_ts is None:
            first_ts = seg_first_ts
        seg_problems = seg.problems
        segments.append(seg)
        problems.extend(seg_problems)
        if in_log:
            records += seg.records
            max_valid = seg.end
            if seg.records:
                last_ts = seg.last_store_timestamp_ms
            if seg.stop in (ScanStop.DAMAGE, ScanStop.UNREADABLE):
                assert seg.bad_offset is not None and seg.reason is not None
                bad = (seg.bad_offset, seg.reason, seg.detail, name)
            if seg.stop != ScanStop.BLANK:
                in_log = False
            expect_next = start + nominal
        else:
            past_end += seg.records
    problems.extend(_end_problems(segments, past_end))
    if records:
        last_record = _last_record_offset(segments, read)
    recovery = _preview(listing, read, markers, bad[0] if bad else None, zero_from)
    problems.extend(_marker_problems(markers, last_ts, max_valid))
    problems[:0] = _in_use_problems(markers)  # first: it changes how to read the rest
    return InspectReport(
        path=path,
        segment_size=seg_size,
        records=records,
        first_offset=listing.starts[0] if listing.starts else 0,
        end_offset=max_valid,
        max_valid_offset=max_valid,
        last_record_offset=last_record,
        first_store_timestamp_ms=first_ts,
        last_store_timestamp_ms=last_ts,
        first_bad_offset=bad[0] if bad else None,
        bad_reason=bad[1] if bad else None,
        bad_detail=bad[2] if bad else None,
        bad_segment=bad[3] if bad else None,
        records_past_end=past_end,
        segments=segments,
        stray=list(listing.stray),
        problems=problems,
        recovery=recovery,
        markers=markers,
    )


def _end_problems(segments: list[SegmentReport], past_end: int) -> list[str]:
    """What lies past the end of the log, said once."""
    later = [s.name for s in segments if not s.in_log]
    if not later:
        return []
    names = ", ".join(f"commitlog/{n}" for n in later)
    ended = [s for s in segments if s.in_log][-1] if segments[0].in_log else None
    if ended is not None and ended.stop == ScanStop.END:
        if past_end:
            return [f"commitlog/{ended.name}: the log ends at {ended.end} without a blank, "
                    f"yet {past_end} good record(s) lie in later segments ({names}); they "
                    "are past the end of the log and do not count"]
        return [f"commitlog/{ended.name}: the log ends at {ended.end}; later segment(s) "
                f"{names} hold no records (created for data that never reached the disk, "
                "as after a crash under the power model): recovery removes them"]
    if past_end:
        return [f"{past_end} good record(s) in {names} lie past the end of the log "
                "(after the damage or gap) and do not count"]
    return []


def _last_record_offset(segments: list[SegmentReport], read: Callable[[int], Buffer]) -> int | None:
    holders = [s for s in segments if s.in_log and s.records]
    if not holders:
        return None
    seg = holders[-1]
    last = None
    for rec_offset, _size in _walk(read(seg.start), seg.start, seg.end):
        last = rec_offset
    return last


def _walk(buf: Buffer, start: int, end: int) -> Iterator[tuple[int, int]]:
    """(offset, size) of each message in a range the scan already verified."""
    pos = 0
    limit = end - start
    while pos < limit:
        size, magic = peek(buf, pos)
        if magic != MESSAGE_MAGIC or size <= 0:
            return
        yield start + pos, size
        pos += size


def _in_use_problems(markers: Markers) -> list[str]:
    out: list[str] = []
    if markers.lock_held_by is not None:
        out.append(
            f"the store is in use: process {markers.lock_held_by} holds its lock. This reading "
            "is of files being written: the end of data moves, bytes after it can be a write "
            "in progress, records not yet flushed are not in the files, and the abort file "
            "and checkpoint are the running node's. Stop the node (`dlab cluster stop NAME`) "
            "and inspect again for what recovery would see"
        )
    return out


def _marker_problems(markers: Markers, last_ts: int | None, data_end: int) -> list[str]:
    out: list[str] = []
    if markers.abort_present:
        out.append(
            f"abort file present (pid {markers.abort_pid or 'unknown'}): the store is open "
            "now, or its last shutdown was not clean; the next open runs abnormal recovery"
        )
    if markers.checkpoint_problem:
        out.append(markers.checkpoint_problem)
    cp = markers.checkpoint
    if cp is not None and cp.flushed_end is not None:
        # Positions decide, as recovery does (store/log/recovery.py).
        if data_end < cp.flushed_end:
            out.append(
                f"checkpoint records every byte below offset {cp.flushed_end} as flushed, but "
                f"valid data ends at {data_end}: records that were flushed are missing or "
                "damaged")
    elif cp is not None and cp.physic_ms and last_ts is not None and cp.physic_ms > last_ts:
        out.append(
            f"checkpoint names store time {cp.physic_ms}, after the last valid record "
            f"({last_ts}): records that were flushed are missing or damaged"
        )
    return out


def _preview(
    listing: SegmentListing,
    read: Callable[[int], Buffer],
    markers: Markers,
    full_scan_bad: int | None,
    zero_from: ZeroFrom,
) -> RecoveryPreview:
    mode = "abnormal" if markers.abort_present else "normal"
    if listing.fatal:
        return RecoveryPreview(mode, False, list(listing.fatal), None, None, None, None, None,
                               [], ["the store refuses to open until these are fixed; "
                                    "nothing would be changed"])
    try:
        plan = plan_recovery(
            listing.starts, read, seg_size=listing.segment_size, abnormal=markers.abort_present,
            checkpoint=markers.checkpoint, checkpoint_problem=markers.checkpoint_problem,
        )
    except OSError as exc:
        return RecoveryPreview(mode, False, [f"a segment is unreadable: {exc}"], None, None,
                               None, None, None, [], [])
    notes = list(plan.notes)
    removed = [segment_name(s) for s in plan.segments_to_drop]
    # Abnormal recovery always cuts at the end of data, which clears any
    # bytes left after it; otherwise only damage or extra segments cut.
    truncates = (
        plan.first_bad_offset is not None
        or bool(removed)
        or plan.stale_tail
        or (plan.abnormal and not _tail_is_zero(listing, zero_from, plan.max_valid_offset))
    )
    if plan.stale_tail:
        notes.append(f"non-zero bytes follow the end of data at {plan.max_valid_offset} "
                     "(an interrupted truncation): recovery clears them")
    if plan.damage is not None and plan.damage.kind is DamageKind.FLUSHED:
        notes.append(
            plan.damage.describe(segment_name) + ": with corruption policy refuse (the "
            "default) the store does not open; truncate cuts as shown; repair fetches the "
            "range from a replica")
    if full_scan_bad is not None and full_scan_bad < plan.max_valid_offset:
        notes.append(
            f"recovery would not see the damage at {full_scan_bad}: it scans only from "
            f"{segment_name(plan.start_segment or 0)}, so it would keep and serve the "
            "damaged record"
        )
    return RecoveryPreview(
        mode=mode,
        opens=True,
        refusal=[],
        scans_from=segment_name(plan.start_segment) if plan.start_segment is not None else None,
        max_valid_offset=plan.max_valid_offset,
        first_bad_offset=plan.first_bad_offset,
        bad_reason=plan.bad_reason,
        truncates_at=plan.max_valid_offset if truncates else None,
        segments_removed=removed,
        notes=notes,
    )


def _tail_is_zero(listing: SegmentListing, zero_from: ZeroFrom, offset: int) -> bool:
    """Whether every byte from `offset` to its segment's end is zero (else
    abnormal recovery's cut clears something)."""
    for start in reversed(listing.starts):
        if start <= offset:
            return zero_from(start, offset - start)
    return True


def iter_records(report: InspectReport, read: Callable[[int], Buffer]) -> Iterator[Record]:
    """Every good record of the contiguous log, in offset order (what a full
    recovery would keep)."""
    for seg in report.segments:
        if not seg.in_log:
            return
        if not seg.records:
            continue
        buf = read(seg.start)
        for offset, _size in _walk(buf, seg.start, seg.end):
            try:
                yield decode(buf, offset - seg.start, offset=offset)
            except CorruptRecordError:  # the file changed under us (a live store)
                return


# ------------------------------------------------------------------ the IO edge
class StoreFiles:
    """A store root opened read-only: the listing, the markers, and segment
    bytes through `read` (memory-mapped read-only; nothing is locked or written).
    Use as a context manager. Meant for stopped stores: on one a running
    process is truncating, a mapped file can shrink under the reader."""

    def __init__(self, path: str) -> None:
        self.path = path
        commitlog = os.path.join(path, "commitlog")
        if not os.path.exists(path):
            raise InspectError(f"{path}: no such directory; pass a store directory "
                               "(the one holding commitlog/)")
        if not os.path.isdir(path):
            raise InspectError(f"{path} is a file, not a store directory; pass the directory "
                               "holding commitlog/, checkpoint and abort")
        if os.path.islink(commitlog):
            raise InspectError(f"{commitlog} is a symbolic link; a store never follows one, "
                               "nor does inspect: put the directory itself there")
        if not os.path.isdir(commitlog):
            if _looks_like_commitlog(path):
                raise InspectError(f"{path} looks like a commitlog/ directory itself; pass its "
                                   "parent, the store root")
            raise InspectError(f"{path} is not a store directory: it has no commitlog/ "
                               "subdirectory; pass the directory holding commitlog/, checkpoint "
                               "and abort")
        try:
            self.listing = list_segments(commitlog)
        except OSError as exc:
            raise InspectError(f"cannot list {commitlog}: {exc.strerror}") from exc
        self._commitlog = commitlog
        self._maps: dict[int, mmap.mmap | bytes] = {}
        self.markers = _read_markers(path)

    def read(self, start: int) -> Buffer:
        if start not in self._maps:
            fd = os.open(os.path.join(self._commitlog, segment_name(start)),
                         os.O_RDONLY | os.O_NOFOLLOW)
            try:
                size = os.fstat(fd).st_size
                self._maps[start] = (
                    mmap.mmap(fd, size, access=mmap.ACCESS_READ) if size else b""
                )
            finally:
                os.close(fd)
        return memoryview(self._maps[start])

    def zero_from(self, start: int, pos: int) -> bool:
        """pread rather than the map (faulting in every page of a mostly
        empty 1 GiB segment costs seconds), skipping holes with SEEK_DATA
        where the filesystem has it."""
        step = 1 << 20
        zeros = bytes(step)
        fd = os.open(os.path.join(self._commitlog, segment_name(start)),
                     os.O_RDONLY | os.O_NOFOLLOW)
        try:
            while True:
                try:
                    pos = os.lseek(fd, pos, os.SEEK_DATA)
                except OSError as exc:
                    if exc.errno == errno.ENXIO:
                        return True  # nothing but holes from pos on
                    # no SEEK_DATA here: read everything
                chunk = os.pread(fd, step, pos)
                if not chunk:
                    return True
                if chunk != zeros[: len(chunk)]:
                    return False
                pos += len(chunk)
        finally:
            os.close(fd)

    def inspect(self) -> InspectReport:
        report = inspect_log(self.path, self.listing, self.read, self.markers, self.zero_from)
        # Units are judged against the log recovery would keep.
        end = report.recovery.max_valid_offset
        queues, problems = inspect_consume_queues(
            self.path, report.max_valid_offset if end is None else end)
        problems += [f"{CQ_DIR}/{q.topic}/{q.queue_id}: unit {q.first_bad_unit} {q.reason}; "
                     "recovery drops it and the units after it"
                     for q in queues if q.first_bad_unit is not None]
        # Links and misplaced entries: what makes an open refuse, and what
        # this inspection did not read (store/layout.py).
        layout = layout_problems(RealDisk(), self.path)
        recovery = report.recovery
        if layout:
            recovery = replace(recovery, opens=False, refusal=recovery.refusal + layout)
        return replace(report, consume_queues=queues, recovery=recovery,
                       problems=report.problems + problems + layout)

    def close(self) -> None:
        for m in self._maps.values():
            if isinstance(m, mmap.mmap):
                with contextlib.suppress(BufferError):  # a caller still holds a view
                    m.close()
        self._maps.clear()

    def __enter__(self) -> StoreFiles:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def inspect_store(path: str) -> InspectReport:
    """Inspect the store root at `path` (raises InspectError if it is not one)."""
    with StoreFiles(path) as files:
        return files.inspect()


def _looks_like_commitlog(path: str) -> bool:
    try:
        names = os.listdir(path)
    except OSError:
        return False
    return any(len(n) == NAME_DIGITS and n.isdigit() for n in names)


def _read_small(path: str) -> str | None:
    try:
        return _read_no_link(path, 64).decode("ascii", "replace").strip() or None
    except OSError:  # ELOOP for a link: not read
        return None


def _read_no_link(path: str, limit: int = -1) -> bytes:
    """The bytes of `path` (the first `limit`), never through a link (OSError
    with ELOOP for one)."""
    with open(os.open(path, os.O_RDONLY | os.O_NOFOLLOW), "rb") as f:
        return f.read(limit)


def _read_markers(path: str) -> Markers:
    abort = os.path.join(path, "abort")
    lock = os.path.join(path, "lock")
    cp, problem = read_checkpoint(os.path.join(path, "checkpoint"))
    return Markers(
        abort_present=os.path.lexists(abort),
        abort_pid=_read_small(abort) if os.path.lexists(abort) else None,
        lock_present=os.path.lexists(lock),
        lock_pid=_read_small(lock) if os.path.lexists(lock) else None,
        lock_held_by=lock_holder(lock) if os.path.lexists(lock) else None,
        checkpoint=cp,
        checkpoint_problem=problem,
    )
