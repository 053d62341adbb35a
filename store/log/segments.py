"""Segment files: fixed size, named by their start offset (20 digits), as
RocketMQ's MappedFileQueue lays out `commitlog/`.

A segment is created at its full size (space reserved with posix_fallocate
where the filesystem supports it, so a full disk shows up when a segment is
made rather than in the middle of a flush) and made durable (file and
directory fsync) before any byte goes into it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field

from store.log.record import MESSAGE_MAGIC
from store.seams.disk import Disk, DiskFile, RealDisk

NAME_DIGITS = 20


_IOV_MAX = min(os.sysconf("SC_IOV_MAX"), 1024) if hasattr(os, "sysconf") else 16

# pwritev writes more than this in steps of it, starting the disk on each.
WRITEBACK_STEP = 4 * 1024 * 1024


def segment_name(start: int) -> str:
    return f"{start:0{NAME_DIGITS}d}"


def fsync_dir(path: str) -> None:
    """fsync a directory of the real filesystem (for callers outside the store)."""
    RealDisk().fsync_dir(path)


@dataclass(frozen=True)
class SegmentListing:
    """What a commitlog directory holds, before anything is opened.

    `problems` are facts a user must see (wrong sizes, gaps, stray files);
    `fatal` ones make the store refuse to open because going on could lose or
    misplace acknowledged data."""

    starts: list[int]
    sizes: dict[int, int]
    segment_size: int | None
    stray: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    fatal: list[str] = field(default_factory=list)


def infer_segment_size(starts: list[int], sizes: dict[int, int]) -> int | None:
    """The segment size a directory was written with. Two kinds of evidence
    vote: the sizes of all files but the last (the last may be short), and
    the distances between consecutive start offsets (the names). A damaged
    file's size and a missing segment's gap each cast one wrong vote, so the
    names keep one short file from outvoting the layout. Ties go to a size
    every start offset is a multiple of, then to the smaller one."""
    starts = sorted(starts)
    if not starts:
        return None
    gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    votes = [sizes[s] for s in starts[:-1]] + gaps
    if len(starts) > 1 and sizes[starts[-1]] >= max(sizes[s] for s in starts[:-1]):
        # A full-size last file votes too: with two files, one misnamed,
        # its gap must not outvote what both files' sizes say.
        votes.append(sizes[starts[-1]])
    votes = [v for v in votes if v > 0] or [sizes[starts[-1]]]
    if votes[0] <= 0:
        return None
    return max(
        set(votes),
        key=lambda v: (votes.count(v), all(s % v == 0 for s in starts), -v),
    )


def list_segments(commitlog_dir: str, expected_size: int | None = None,
                  disk: Disk | None = None) -> SegmentListing:
    """List and check the segments. The segment size is `expected_size`, or
    inferred from the files (see infer_segment_size)."""
    disk = disk or RealDisk()
    starts: list[int] = []
    sizes: dict[int, int] = {}
    stray: list[str] = []
    fatal: list[str] = []
    for name in disk.listdir(commitlog_dir):
        path = os.path.join(commitlog_dir, name)
        is_name = len(name) == NAME_DIGITS and name.isdigit()
        if is_name and disk.islink(path):
            # Never opened or sized through: the store's writes would land
            # in the file it points to (store/layout.py refuses it first).
            fatal.append(f"commitlog/{name}: a symbolic link, which a store never follows; "
                         "put the segment itself there, or move the link aside")
        elif is_name and disk.isfile(path):
            start = int(name)
            starts.append(start)
            sizes[start] = disk.size(path)
        else:
            stray.append(name)
    starts.sort()
    problems = [f"stray file ignored: commitlog/{n}" for n in stray]
    seg_size = expected_size
    if seg_size is None:
        seg_size = infer_segment_size(starts, sizes)
    if seg_size:
        for i, start in enumerate(starts):
            name = segment_name(start)
            if start % seg_size:
                fatal.append(
                    f"commitlog/{name}: the file name is not a multiple of the segment size "
                    f"{seg_size} (a segment is named by its start offset, so this file was "
                    "renamed or made by hand); "
                    + _rename_hint(disk, os.path.join(commitlog_dir, name), seg_size)
                )
            size = sizes[start]
            last = i == len(starts) - 1
            if size > seg_size or (size < seg_size and not last):
                fatal.append(
                    f"commitlog/{name}: {size} bytes, segments here are {seg_size}; "
                    "restore the file or move it and every later segment aside"
                )
            elif size < seg_size:
                problems.append(
                    f"commitlog/{name}: last segment is short ({size} of {seg_size} bytes); "
                    "its missing end is treated as never written"
                )
            if i and starts[i - 1] + seg_size != start and not (
                    start % seg_size or starts[i - 1] % seg_size):
                # (A misnamed neighbour is the problem to name, said above.)
                fatal.append(
                    f"commitlog/{name}: gap after {segment_name(starts[i - 1])}; "
                    "a segment is missing"
                )
    return SegmentListing(starts, sizes, seg_size, stray, problems, fatal)


def _rename_hint(disk: Disk, path: str, seg_size: int) -> str:
    """What to do with a misnamed segment: the name its first record's
    PHYSICALOFFSET gives it, where that is a segment start."""
    try:
        head = disk.read_file(path, 36)
    except OSError:
        head = b""
    if len(head) == 36 and int.from_bytes(head[4:8]) == MESSAGE_MAGIC:
        phys = int.from_bytes(head[28:36], signed=True)
        if phys >= 0 and phys % seg_size == 0:
            return (f"its first record says it starts at {phys}: rename it to "
                    f"{segment_name(phys)}")
    return "rename it to its start offset, or move it aside"


class Segment:
    """One open segment file. IO only: positions are relative to the file."""

    def __init__(self, disk: Disk, directory: str, start: int, size: int,
                 file: DiskFile) -> None:
        self.disk = disk
        self.directory = directory
        self.start = start
        self.size = size
        self.end = start + size
        self.path = os.path.join(directory, segment_name(start))
        self.file = file
        self.zeroed_to = 0  # the flush has written zeros or data below this

    @classmethod
    def open(cls, disk: Disk, directory: str, start: int, size: int) -> Segment:
        """Open an existing segment as it is: a short last segment stays
        short until `extend` (recovery decides before anything changes)."""
        f = disk.open(os.path.join(directory, segment_name(start)))
        return cls(disk, directory, start, size, f)

    def extend(self) -> bool:
        """Extend a short segment with zeros to its full size, durably (its
        missing end was never written); True if it was short."""
        if self.file.size() >= self.size:
            return False
        self.file.truncate(self.size)
        self.file.fsync()
        return True

    @classmethod
    def create(cls, disk: Disk, directory: str, start: int, size: int) -> Segment:
        path = os.path.join(directory, segment_name(start))
        f = disk.create(path)
        try:
            f.allocate(size)
            f.fsync()
            disk.fsync_dir(directory)
        except BaseException:
            f.close()
            disk.unlink(path)
            raise
        return cls(disk, directory, start, size, f)

    def pwrite(self, pos: int, data: bytes | memoryview) -> None:
        assert pos >= 0 and pos + len(data) <= self.size, (pos, len(data), self.size)
        view = memoryview(data)
        while view:
            n = self.file.pwrite(view, pos)
            view = view[n:]
            pos += n

    def pwritev(self, pos: int, chunks: Sequence[bytes | memoryview]) -> None:
        """Write contiguous chunks at `pos` with as few syscalls as the
        kernel allows and without joining them first (a join would copy, and
        fault in, every byte once more). A large write is made in steps of
        WRITEBACK_STEP, the disk starting on each step (sync_file_range)
        while the next is copied in, so the fsync after it waits for less."""
        total = sum(len(c) for c in chunks)
        assert pos >= 0 and pos + total <= self.size, (pos, total, self.size)
        f = self.file
        i = 0
        while i < len(chunks):
            group = [chunks[i]]
            want = len(chunks[i])
            i += 1
            while i < len(chunks) and len(group) < _IOV_MAX and want < WRITEBACK_STEP:
                group.append(chunks[i])
                want += len(chunks[i])
                i += 1
            n = f.pwritev(group, pos)
            if n < want:  # short write: finish this group the slow way
                self.pwrite(pos + n, b"".join(group)[n:])
            if total > WRITEBACK_STEP:
                f.start_writeback(pos, want)
            pos += want

    def pread(self, pos: int, n: int) -> bytes:
        n = max(0, min(n, self.size - pos))
        return self.file.pread(n, pos)

    def sync(self) -> None:
        self.file.fdatasync()

    def close(self) -> None:
        self.file.close()
