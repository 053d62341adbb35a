"""Read a node's store back from disk after a run, read-only: every record
(offset, size, UNIQ_KEY, body CRC, store timestamp, a hash of its whole
bytes) up to the end of valid data, and where that end is and why. Nothing
is written to the directory. The harness calls it at the end of a run
(records.jsonl), and `dlab report` again on a kept store (chaos/check/kept_stores.py)."""

from __future__ import annotations

import hashlib
import mmap
import os
from dataclasses import dataclass, field
from typing import Any

from store.log.record import BLANK_MAGIC, MESSAGE_MAGIC, CorruptRecordError, peek, summarize
from store.log.recovery import ScanStop, scan_segment
from store.log.segments import list_segments, segment_name


def record_hash(raw: bytes | memoryview) -> int:
    """A record's whole bytes (header, body, topic, properties) as a signed
    64-bit integer, so that two records that differ only in, say, the store
    timestamp or the queue offset do not compare equal (BODYCRC covers the
    body only). Signed: a JSON integer Spark reads as a long."""
    return int.from_bytes(hashlib.blake2b(raw, digest_size=8).digest(), "big", signed=True)


@dataclass
class ReadBack:
    records: list[dict[str, Any]] = field(default_factory=list)
    min_offset: int = 0
    end_offset: int = 0
    first_bad_offset: int | None = None
    bad_reason: str | None = None


def read_back(data_dir: str) -> ReadBack:
    commitlog = os.path.join(data_dir, "commitlog")
    out = ReadBack()
    if not os.path.isdir(commitlog):
        return out
    listing = list_segments(commitlog)
    if not listing.starts or not listing.segment_size:
        return out
    seg_size = listing.segment_size
    out.min_offset = out.end_offset = listing.starts[0]
    for start in listing.starts:
        path = os.path.join(commitlog, segment_name(start))
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size == 0:
                break
            with mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
                view = memoryview(m)
                try:
                    scan = scan_segment(view, start, start, seg_size=seg_size)
                    pos = 0
                    limit = scan.end - start
                    while pos < limit:
                        size, magic = peek(view, pos)
                        if magic == BLANK_MAGIC:
                            break
                        assert magic == MESSAGE_MAGIC
                        # The verify path, not a full decode: the fields
                        # listed are all it needs (docs/performance-notes.md).
                        rec = summarize(view, pos, start + pos)
                        out.records.append({
                            "offset": start + pos, "size": rec.size, "msg_id": rec.msg_id,
                            "body_crc": rec.body_crc,
                            "store_timestamp_ms": rec.store_timestamp_ms,
                            "record_hash": record_hash(view[pos:pos + size]),
                        })
                        pos += size
                except CorruptRecordError as exc:  # cannot happen after a clean scan
                    out.first_bad_offset, out.bad_reason = start + pos, exc.reason
                    return out
                finally:
                    view.release()
        out.end_offset = scan.end
        if scan.stop == ScanStop.DAMAGE:
            out.first_bad_offset, out.bad_reason = scan.end, scan.reason
            return out
        if scan.stop != "blank":
            return out
    return out
