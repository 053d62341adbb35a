"""A CommitLog's files cut on disk, crash-safely: the cut recovery decided
(`apply_plan`), and the one a slave's truncation makes (`cut_on_disk`)."""

from __future__ import annotations

from collections.abc import Callable

from store.failpoints import DISARMED, Failpoints
from store.log.record import BLANK_SIZE
from store.log.recovery import RecoveryPlan
from store.log.segments import Segment
from store.seams.disk import Disk


def cut_on_disk(
    directory: str,
    segments: list[Segment],
    offset: int,
    seg_size: int,
    after_header: Callable[[], None] = lambda: None,
) -> None:
    """Crash-safe truncation of the files at `offset`:
    1. zero the 8-byte header at the cut and fsync — from here on a scan stops
       at the cut whatever else survives a crash;
    2. clear the rest of that segment (truncate the file to the cut and extend
       it again, which reads back as zeros) and fsync;
    3. unlink later segments, newest first, and fsync the directory.
    Segments starting exactly at the cut are removed whole (except the first)."""
    seg_start = offset - offset % seg_size
    holder = next((s for s in segments if s.start == seg_start), None)
    later = sorted((s for s in segments if s.start > seg_start), key=lambda s: -s.start)
    if holder is not None and offset - seg_start + BLANK_SIZE <= seg_size:
        pos = offset - seg_start
        holder.pwrite(pos, bytes(BLANK_SIZE))
        holder.sync()
        after_header()
        holder.file.truncate(pos)
        holder.file.truncate(seg_size)
        holder.file.fsync()
    elif later:
        first_later = later[-1]
        first_later.pwrite(0, bytes(BLANK_SIZE))
        first_later.sync()
        after_header()
    for seg in later:
        seg.close()
        seg.disk.unlink(seg.path)
    if later:
        later[0].disk.fsync_dir(directory)


def unlink_after(directory: str, segments: list[Segment], offset: int, seg_size: int
                  ) -> None:
    """Unlink the segments wholly after the one holding `offset` (newest
    first) and fsync the directory; the holder's bytes stay as they are."""
    seg_start = offset - offset % seg_size
    later = sorted((s for s in segments if s.start > seg_start), key=lambda s: -s.start)
    for seg in later:
        seg.close()
        seg.disk.unlink(seg.path)
    if later:
        later[0].disk.fsync_dir(directory)


def open_segments(disk: Disk, directory: str, starts: list[int], seg_size: int
                  ) -> list[Segment]:
    return [Segment.open(disk, directory, s, seg_size) for s in starts]


def apply_plan(
    plan: RecoveryPlan,
    directory: str,
    segments: list[Segment],
    seg_size: int,
    failpoints: Failpoints = DISARMED,
) -> list[Segment]:
    """Make the recovery decision true on disk (crash-safely); returns the
    segments that remain."""
    if (plan.first_bad_offset is not None or plan.segments_to_drop or plan.abnormal
            or plan.stale_tail):
        after = (lambda: failpoints.hit("recovery_truncate")) if (
            plan.first_bad_offset is not None or plan.segments_to_drop) else (lambda: None)
        cut_on_disk(directory, segments, plan.max_valid_offset, seg_size, after_header=after)
        seg_start = plan.max_valid_offset - plan.max_valid_offset % seg_size
        return [s for s in segments if s.start <= seg_start]
    return segments
