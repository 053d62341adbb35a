"""A full disk and a failing write, on real filesystems and real syscalls.

- A 2 MiB tmpfs filled by the store: creating the next segment fails with
  ENOSPC. The put gets SERVICE_NOT_AVAILABLE, the store accepts no more
  writes, and after a reopen every acknowledged record is there and no
  refused one is. Needs permission to mount (root or CAP_SYS_ADMIN); skipped
  with that reason otherwise.
- A child process under RLIMIT_FSIZE (SIGXFSZ ignored): a write past the
  limit fails with EFBIG in the middle of a segment. Runs everywhere.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from store_helpers import CHILD, fill, ids, message, reopen

from store.config import TESTING, CrashModel, FlushMode
from store.status import PutResult, PutStatus
from store.store import MessageStore

MAX_PUTS = 20_000  # 2 MiB holds about 6,400 of these; the loop is bounded anyway


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "small"
    mnt.mkdir()
    try:
        res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)],
                             capture_output=True, text=True, timeout=30, check=False)
    except FileNotFoundError:
        pytest.skip("no `mount` command on this machine: cannot make a small filesystem")
    if res.returncode != 0:
        pytest.skip(f"cannot mount a 2 MiB tmpfs ({res.stderr.strip()}): needs root or "
                    "CAP_SYS_ADMIN; test_write_past_file_size_limit still covers write errors")
    try:
        yield mnt / "store"
    finally:
        if subprocess.run(["umount", str(mnt)], capture_output=True, check=False).returncode:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True, check=False)


@pytest.mark.parametrize("flush", [FlushMode.SYNC_FLUSH, FlushMode.ASYNC_FLUSH])
@pytest.mark.parametrize("model", [CrashModel.POWER, CrashModel.PROCESS])
def test_full_disk_refuses_puts_and_keeps_every_acknowledged_record(
    small_fs: Path, flush: FlushMode, model: CrashModel
) -> None:
    config = TESTING.with_(flush_mode=flush, crash_model=model)

    async def run() -> tuple[list[PutResult], list[PutResult], PutResult]:
        s = MessageStore.open(str(small_fs), config)
        await s.start()
        acked: list[PutResult] = []
        refused: list[PutResult] = []
        try:
            for lo in range(0, MAX_PUTS, 64):
                results = await asyncio.gather(*(s.put(message(i)) for i in range(lo, lo + 64)))
                for r in results:
                    (acked if r.status is PutStatus.PUT_OK else refused).append(r)
                if refused:
                    break
            assert refused, f"{MAX_PUTS} puts fit in a 2 MiB filesystem?"
            assert s.state()["failed"] is not None
            later = await s.put(message(MAX_PUTS))  # the store stays closed to writes
        finally:
            await s.close()
        return acked, refused, later

    acked, refused, later = asyncio.run(run())
    assert {r.status for r in refused} == {PutStatus.SERVICE_NOT_AVAILABLE}
    assert all("No space left on device" in r.detail for r in refused), refused[0].detail
    assert later.status is PutStatus.SERVICE_NOT_AVAILABLE
    assert len(acked) > 1000

    records, report = reopen(small_fs, config)
    by_id = {r.msg_id: r for r in records}
    for a in acked:
        assert a.msg_id in by_id, f"acknowledged {a.msg_id} lost"
        assert by_id[a.msg_id].offset == a.offset
    assert not {r.msg_id for r in refused} & set(by_id), "a refused put was stored"
    assert report.first_bad_offset is None, report.summary
    assert ids(records) == [f"m{i:06d}" for i in range(len(records))]  # in order, no hole


@pytest.mark.parametrize("model", [CrashModel.POWER, CrashModel.PROCESS])
def test_write_past_file_size_limit_fails_puts_and_damages_nothing(
    tmp_path: Path, model: CrashModel
) -> None:
    """The store already holds 100 records (about 32 KiB of the first
    segment); a child reopens it with RLIMIT_FSIZE = 40,000 bytes and writes
    until a write fails with EFBIG halfway through the segment."""
    earlier = fill(tmp_path, 100)
    assert earlier[-1].end < 40_000
    child = subprocess.run(
        [sys.executable, str(CHILD), "write", "--dir", str(tmp_path), "--flush", "SYNC_FLUSH",
         "--crash-model", model.value, "--producers", "4", "--per-producer", "2000",
         "--fsize-limit", "40000", "--max-seconds", "30"],
        capture_output=True, text=True, timeout=90, check=False,
    )
    assert child.returncode == 0, child.stderr[-2000:]
    lines = child.stdout.splitlines()
    acked = {parts[1]: int(parts[2]) for parts in (ln.split() for ln in lines)
             if parts[0] == "OK"}
    failed = [ln.split() for ln in lines if ln.startswith("FAIL ")]
    assert failed and {f[2] for f in failed} == {"SERVICE_NOT_AVAILABLE"}
    assert acked and max(acked.values()) < 40_000

    records, report = reopen(tmp_path)
    by_id = {r.msg_id: r for r in records}
    assert ids(records)[:100] == [f"m{i:06d}" for i in range(100)]  # earlier records intact
    for r in earlier:
        assert by_id[r.msg_id].offset == r.offset
    for msg_id, offset in acked.items():
        assert msg_id in by_id and by_id[msg_id].offset == offset
    assert report.max_valid_offset <= 40_000
