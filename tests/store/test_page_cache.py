"""drop_flushed_pages (a slave's store): after a flush, the pages the
consume-queue reput has read leave the page cache, the rest stay, and every
record reads back. Residency is read with mincore(2) on a fresh mapping of
the segment file, which itself faults nothing in."""

from __future__ import annotations

import ctypes
import mmap
import os
from pathlib import Path

import pytest
from support.store_helpers import message, reopen

from store.config import KIB, MIB, TESTING, CrashModel
from store.log.commitlog import DROP_PAGES_STEP
from store.log.segments import segment_name
from store.store import MessageStore

PAGE = mmap.PAGESIZE

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]


def resident(path: Path) -> list[bool]:
    """Whether each page of the file is in the page cache."""
    size = os.path.getsize(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap failed")
        try:
            vec = (ctypes.c_ubyte * ((size + PAGE - 1) // PAGE))()
            if _libc.mincore(addr, size, vec) != 0:
                raise OSError(ctypes.get_errno(), "mincore failed")
            return [bool(b & 1) for b in vec]
        finally:
            _libc.munmap(addr, size)
    finally:
        os.close(fd)


CONFIG = TESTING.with_(segment_size_bytes=16 * MIB, max_message_size_bytes=64 * KIB)


def _cached_share(path: Path, start: int, end: int) -> float:
    """The share of the pages wholly inside [start, end) that are cached."""
    pages = resident(path / "commitlog" / segment_name(0))[-(-start // PAGE):end // PAGE]
    return sum(pages) / len(pages)


def _append(store: MessageStore, first: int, n: int) -> None:
    store.append([message(i, body_size=4000) for i in range(first, first + n)])


@pytest.mark.parametrize("crash_model", [CrashModel.POWER, CrashModel.PROCESS])
def test_flushed_pages_leave_the_page_cache_and_records_read_back(
        tmp_path: Path, crash_model: CrashModel) -> None:
    """The store drops whole 2 MiB steps (DROP_PAGES_STEP), so the check is
    on the share of pages cached: all of them in the control, at most half
    when dropped (the part past the last whole step stays)."""
    shares = {}
    for drop in (False, True):
        path = tmp_path / str(drop)
        store = MessageStore.open(str(path), CONFIG.with_(crash_model=crash_model,
                                                          drop_flushed_pages=drop))
        try:
            for k in range(4):  # 4 x 512 records of ~4 KiB, each reput and flushed
                _append(store, 512 * k, 512)
                store.reput()  # the consume queues read every record once first
                store.log.flush()
            shares[drop] = _cached_share(path, 0, store.log.flushed)
        finally:
            store.close_sync()
        records, _ = reopen(path, CONFIG)
        assert [r.properties["UNIQ_KEY"] for r in records] == \
            [f"m{i:06d}" for i in range(2048)]
    assert shares[False] == 1.0, "control: a store that keeps its pages has them cached"
    assert shares[True] <= 0.5, f"{shares[True]:.0%} still cached after the flushes"


def test_pages_reput_has_not_read_stay_cached(tmp_path: Path) -> None:
    store = MessageStore.open(str(tmp_path), CONFIG.with_(drop_flushed_pages=True))
    try:
        _append(store, 0, 1024)  # ~4.2 MB: two whole 2 MiB steps
        store.log.flush()  # the reput has not read these records yet
        assert _cached_share(tmp_path, 0, store.log.flushed) == 1.0
        store.reput()
        _append(store, 1024, 1)
        store.log.flush()  # now it has
        assert _cached_share(tmp_path, 0, 2 * DROP_PAGES_STEP) == 0.0
        assert _cached_share(tmp_path, 2 * DROP_PAGES_STEP, store.log.flushed) == 1.0, \
            "the part past the last whole step stays cached"
    finally:
        store.close_sync()
