"""Segment files written with holes, so a kept store costs the disk its
data, not its segments' size.

A segment is created at its full size (store/log/segments.py: preallocated,
zeros written ahead of the data), and a run's store is mostly those zeros.
A file written up to the end of its data and then extended to its size
(truncate) reads the same bytes, the zeros past the data as a hole that
holds no blocks (README, "Kept stores"). Only zeros past the last
non-zero byte become a hole: what precedes them is written as it is.

Used where a store is written for keeping: the sim's export of a node's
disk (chaos/sim/cluster.py) and, after the run, a local or compose node's
segments rewritten in place (chaos/check/keep_decision.py).
"""

from __future__ import annotations

import os

# Read and copied in steps of this: a segment is never held whole in memory.
STEP_BYTES = 1024 * 1024
# A file whose allocation exceeds its data by less than this is left alone.
SLACK_BYTES = 64 * 1024


_ZEROS = bytes(64 * 1024)


def data_end(data: bytes | bytearray) -> int:
    """The length of `data` without its trailing zeros. Scanned from the end
    a block at a time, each compared with zeros (a memcmp): `rstrip` tests
    byte by byte and copies what it keeps, about 30 times slower over an
    8 MiB segment (docs/performance-notes.md, "The simulated cluster")."""
    end = len(data)
    while end:
        start = max(0, end - len(_ZEROS))
        block = data[start:end]
        if block != _ZEROS[:end - start]:
            return start + len(block.rstrip(b"\0"))
        end = start
    return 0


def write_sparse(path: str, data: bytes, size: int | None = None) -> None:
    """`data` into a new file at `path`: the bytes up to the end of data
    written, the trailing zeros left as a hole of the same length; `size`
    (at least len(data)) makes the file that long, zeros past `data`."""
    end = data_end(data)
    size = len(data) if size is None else size
    assert size >= len(data), (size, len(data))
    with open(path, "wb") as f:
        f.write(memoryview(data)[:end])
        if end < size:
            f.truncate(size)


def file_data_end(path: str) -> int:
    """The offset past the last non-zero byte of the file at `path`, found
    from its end backwards, a step at a time."""
    with open(path, "rb") as f:
        pos = os.fstat(f.fileno()).st_size
        while pos > 0:
            start = max(0, pos - STEP_BYTES)
            f.seek(start)
            end = data_end(f.read(pos - start))
            if end:
                return start + end
            pos = start
    return 0


def allocated_bytes(path: str) -> int:
    """What the file holds on disk (st_blocks counts 512-byte units)."""
    return os.stat(path).st_blocks * 512


def sparsify(path: str) -> int:
    """Rewrite the file at `path` with a hole past its data, when its
    allocation exceeds its data; the bytes read the same. Crash-safe: the
    copy is written and synced beside it, then renamed over it, so the
    original stays whole until the copy replaces it. Returns the bytes
    freed (0 when it was left alone)."""
    size = os.path.getsize(path)
    end = file_data_end(path)
    before = allocated_bytes(path)
    if before <= end + SLACK_BYTES:
        return 0
    tmp = path + ".sparse"
    try:
        with open(path, "rb") as src, open(tmp, "wb") as dst:
            left = end
            while left:
                chunk = src.read(min(STEP_BYTES, left))
                assert chunk, f"{path} shrank while it was copied"
                dst.write(chunk)
                left -= len(chunk)
            dst.truncate(size)
            dst.flush()
            os.fsync(dst.fileno())
        os.chmod(tmp, os.stat(path).st_mode & 0o7777)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return max(0, before - allocated_bytes(path))


def sparsify_store(data_dir: str) -> int:
    """Every segment of the store at `data_dir` (its commitlog/) rewritten
    with holes where it has them to give; the bytes freed."""
    commitlog = os.path.join(data_dir, "commitlog")
    if not os.path.isdir(commitlog):
        return 0
    freed = 0
    for name in sorted(os.listdir(commitlog)):
        path = os.path.join(commitlog, name)
        if os.path.isfile(path) and not os.path.islink(path) and name.isdigit():
            freed += sparsify(path)
    return freed
