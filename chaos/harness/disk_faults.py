"""Disk faults on a stopped node's store: a torn tail and a bit flip.

Both act on the real files the node will recover from, and return a line
saying exactly what they changed (the fault's `detail`). The node must be
stopped: these are what a crash mid-write or a bad sector leave behind.
"""

from __future__ import annotations

import os
import random

from chaos.harness.readback import read_back
from store.log.segments import list_segments, segment_name


class DiskFaultError(RuntimeError):
    pass


def _segment_path(data_dir: str, offset: int) -> tuple[str, int]:
    commitlog = os.path.join(data_dir, "commitlog")
    listing = list_segments(commitlog)
    if not listing.segment_size:
        raise DiskFaultError(f"{commitlog}: no segments")
    start = offset - offset % listing.segment_size
    return os.path.join(commitlog, segment_name(start)), offset - start


def torn_tail(data_dir: str, rng: random.Random) -> str:
    """Write the first part of a plausible record after the last valid one:
    a copy of the last record's header (PHYSICALOFFSET set to where it now
    stands), then fewer bytes than its size claims."""
    rb = read_back(data_dir)
    if not rb.records:
        raise DiskFaultError(f"{data_dir}: no records to tear after")
    last = rb.records[-1]
    path, pos = _segment_path(data_dir, rb.end_offset)
    if rb.end_offset != last["offset"] + last["size"]:
        raise DiskFaultError(f"{data_dir}: the log ends in a blank; nothing to tear")
    size = int(last["size"])
    room = os.path.getsize(path) - pos
    keep = min(rng.randint(16, max(17, size - 1)), room)
    with open(path, "r+b") as f:
        f.seek(pos - size)
        torn = bytearray(f.read(size)[:keep])
        torn[28:36] = rb.end_offset.to_bytes(8, "big")
        f.seek(pos)
        f.write(torn)
        f.flush()
        os.fsync(f.fileno())
    return f"torn record at {rb.end_offset}: {keep} of {size} bytes written"


def bit_flip(data_dir: str, rng: random.Random) -> str:
    """Flip one bit inside the body of a record chosen among the last 64."""
    rb = read_back(data_dir)
    candidates = rb.records[-64:]
    if not candidates:
        raise DiskFaultError(f"{data_dir}: no records to damage")
    rng.shuffle(candidates)
    for rec in candidates:
        path, pos = _segment_path(data_dir, rec["offset"])
        with open(path, "r+b") as f:
            f.seek(pos + 84)
            body_len = int.from_bytes(f.read(4), "big", signed=True)
            if body_len <= 0:
                continue
            at = pos + 88 + rng.randrange(body_len)
            bit = rng.randrange(8)
            f.seek(at)
            byte = f.read(1)[0]
            f.seek(at)
            f.write(bytes([byte ^ (1 << bit)]))
            f.flush()
            os.fsync(f.fileno())
        return f"flipped bit {bit} of body byte {at - pos - 88} in record {rec['offset']}"
    raise DiskFaultError(f"{data_dir}: no record with a body to damage")
