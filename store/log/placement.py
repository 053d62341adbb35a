"""Placement: where the records of an append go in the CommitLog. Pure:
positions and sizes in, positions out; CommitLog.append (the Python loop
and the native encoder, store/log/native.py) places records by these rules.

- A record never straddles segments: it goes at the log's end if, after
  it, a blank still fits in its segment (`end_limit`); else a blank fills
  the rest of the segment (RocketMQ's BLANK_MAGIC record, at least
  BLANK_SIZE bytes) and the record starts the next segment. So every
  segment but the last ends with a blank.
- Records follow each other with no gap but a blank's.
- QUEUEOFFSET counts the records of one (topic, queue id) from 0 up, one
  apart, in append order.

The native encoder is given `end_limit(segment end)` and stops at the
first record that would end past it; the Python loop then rolls with
`place`. A record must fit an empty segment with a blank behind it
(StoreConfig.validate keeps max_message_size_bytes that far below the
segment size).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass

from store.log.record import BLANK_SIZE


def segment_end(pos: int, seg_size: int) -> int:
    """The end of the segment a record starting at `pos` would go in (a
    position on a boundary starts the next segment)."""
    return (pos // seg_size + 1) * seg_size


def end_limit(seg_end: int) -> int:
    """The furthest a record may end in the segment ending at `seg_end`: a
    blank must still fit behind it, so the segment can be closed."""
    return seg_end - BLANK_SIZE


def place(pos: int, size: int, seg_size: int) -> tuple[int, int]:
    """Where a record of `size` bytes goes when the log ends at `pos`:
    (its offset, the bytes of blank written before it; 0: no roll)."""
    seg_end = segment_end(pos, seg_size)
    if pos + size <= end_limit(seg_end):
        return pos, 0
    assert seg_end + size <= end_limit(seg_end + seg_size), (size, seg_size)
    return seg_end, seg_end - pos


@dataclass(frozen=True, slots=True)
class Placement:
    offset: int  # where the record starts
    size: int
    queue_offset: int
    blank: int  # bytes of blank before it, closing the previous segment (0: none)


def plan(pos: int, seg_size: int, records: Iterable[tuple[int, Hashable]],
         queue_offsets: Mapping[Hashable, int]) -> tuple[list[Placement], int, dict[Hashable, int]]:
    """Place `records` ((size, queue key) each, in append order) after a
    log ending at `pos` whose queues continue at `queue_offsets`. Returns
    the placements, the log's new end, and the queues' next offsets (the
    given mapping is not changed)."""
    next_qo = dict(queue_offsets)
    out = []
    for size, key in records:
        offset, blank = place(pos, size, seg_size)
        q = next_qo.get(key, 0)
        next_qo[key] = q + 1
        out.append(Placement(offset, size, q, blank))
        pos = offset + size
    return out, pos, next_qo
