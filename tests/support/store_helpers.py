"""Helpers the store tests share: build a store with real files, read it back
through a real open (which runs recovery), damage it at a chosen offset, and
fingerprint a directory to prove something left it unchanged.

Imported by the test modules as `store_helpers` (pytest puts tests/ on the
path: the directory has no __init__.py)."""

from __future__ import annotations

import asyncio
import hashlib
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from store.config import TESTING, CorruptionPolicy, StoreConfig
from store.log.record import BLANK_MAGIC, MESSAGE_MAGIC, UNIQ_KEY, Message, Record, peek
from store.log.segments import segment_name
from store.seams.clock import Clock
from store.status import PutResult, PutStatus
from store.store import MessageStore, RecoveryReport, RepairUnavailableError

SEG = TESTING.segment_size_bytes
CHILD = Path(__file__).with_name("store_child.py")


def message(
    i: int, *, body_size: int = 200, prefix: str = "m", topic: str = "TopicTest"
) -> Message:
    """A deterministic message: the body says which one it is."""
    stamp = f"{prefix}{i:06d};".encode()
    body = (stamp * (body_size // len(stamp) + 1))[:body_size]
    return Message(topic, body, {UNIQ_KEY: f"{prefix}{i:06d}"})


def fill(
    path: str | Path,
    n: int,
    config: StoreConfig = TESTING,
    *,
    body_size: int = 200,
    prefix: str = "m",
    first: int = 0,
    clock: Clock | None = None,
) -> list[PutResult]:
    """Open the store, put n messages (batches of 64), close it cleanly."""

    async def run() -> list[PutResult]:
        s = MessageStore.open(str(path), config, clock=clock)
        await s.start()
        out: list[PutResult] = []
        try:
            for lo in range(first, first + n, 64):
                batch = [message(i, body_size=body_size, prefix=prefix)
                         for i in range(lo, min(first + n, lo + 64))]
                out.extend(await s.put_batch(batch))
        finally:
            await s.close()
        assert all(r.status is PutStatus.PUT_OK for r in out), {r.status for r in out}
        return out

    return asyncio.run(run())


def reopen(path: str | Path, config: StoreConfig = TESTING) -> tuple[list[Record], RecoveryReport]:
    """Open the store (running recovery), read every record, close cleanly."""
    s = MessageStore.open(str(path), config)
    try:
        return list(s.log.iter_records()), s.recovery
    finally:
        s.close_sync()


def replica_files_source(replica: str | Path, seg_size: int = SEG) -> Callable[[int, int], bytes]:
    """A RepairSource (store.store) reading another store directory's files,
    as a replica holding the same log would serve them: whole records from
    `offset`, at most to `end`, a closing blank included."""

    def fetch(offset: int, end: int) -> bytes:
        start = offset - offset % seg_size
        path = Path(replica, "commitlog", segment_name(start))
        if not path.exists():
            raise RepairUnavailableError(f"{replica} holds no segment for offset {offset}")
        with open(path, "rb") as f:
            f.seek(offset - start)
            data = f.read(min(end, start + seg_size) - offset)
        pos = 0
        while pos + 8 <= len(data):
            size, magic = peek(data, pos)
            if magic == BLANK_MAGIC:
                return data[: pos + 8]
            if magic != MESSAGE_MAGIC or size <= 0 or pos + size > len(data):
                break
            pos += size
        return data[:pos]

    return fetch


def mark_abnormal(path: str | Path) -> None:
    """Leave the `abort` file as a crash would (the pid of a process gone)."""
    Path(path, "abort").write_bytes(b"999999")


def locate(path: str | Path, offset: int, seg_size: int = SEG) -> tuple[Path, int]:
    start = offset - offset % seg_size
    return Path(path, "commitlog", segment_name(start)), offset - start


def patch(path: str | Path, offset: int, data: bytes, seg_size: int = SEG) -> None:
    """Overwrite bytes at a log offset, in place, durably."""
    file, pos = locate(path, offset, seg_size)
    fd = os.open(file, os.O_RDWR)
    try:
        os.pwrite(fd, data, pos)
        os.fsync(fd)
    finally:
        os.close(fd)


def read_at(path: str | Path, offset: int, n: int, seg_size: int = SEG) -> bytes:
    file, pos = locate(path, offset, seg_size)
    with open(file, "rb") as f:
        f.seek(pos)
        return f.read(n)


def flip_bit(path: str | Path, offset: int, bit: int = 0, seg_size: int = SEG) -> None:
    old = read_at(path, offset, 1, seg_size)[0]
    patch(path, offset, bytes([old ^ (1 << bit)]), seg_size)


def snapshot(path: str | Path) -> dict[str, str]:
    """Every file under path -> sha256 of its bytes (plus its size)."""
    out: dict[str, str] = {}
    root = Path(path)
    for p in sorted(root.rglob("*")):
        if p.is_file():
            out[str(p.relative_to(root))] = f"{p.stat().st_size}:" + hashlib.sha256(
                p.read_bytes()).hexdigest()
    return out


def ids(records: Sequence[Record]) -> list[str | None]:
    return [r.msg_id for r in records]


def run_child(args: Sequence[str], timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    """Run store_child.py to completion (for the short one-shot modes)."""
    return subprocess.run([sys.executable, str(CHILD), *args], capture_output=True, text=True,
                          timeout=timeout_s, check=False)


TRUNCATE = TESTING.with_(corruption_policy=CorruptionPolicy.TRUNCATE)
REPAIR = TESTING.with_(corruption_policy=CorruptionPolicy.REPAIR)


def names(lo: int, hi: int) -> list[str | None]:
    """The message ids fill() gives messages lo..hi-1."""
    return [f"m{i:06d}" for i in range(lo, hi)]


def without_lock_pid(snap: dict[str, str]) -> dict[str, str]:
    """A snapshot without `lock`: an open writes its pid there; every other
    byte of the directory must be as it was."""
    return {k: v for k, v in snap.items() if k != "lock"}
