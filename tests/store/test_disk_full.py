"""A full disk and a failing write, on real filesystems and real syscalls.

- A 2 MiB tmpfs filled by the store: creating the next segment fails with
  ENOSPC. The put gets SERVICE_NOT_AVAILABLE, the store accepts no more
  writes while the disk is full, and after a reopen every acknowledged
  record is there and no refused one is.
- An 8 MiB tmpfs, with the default segment size (a fresh store cannot make
  its first segment) and with 1 MiB segments (the third does not fit): puts
  are refused at once, naming the full disk, the store says so in state()
  and in its log, and puts succeed again once space is freed, no restart.
  The same through `dlab cluster up` / `dlab send` / `dlab cluster status`.
  These need permission to mount (root or CAP_SYS_ADMIN); skipped with that
  reason otherwise.
- A child process under RLIMIT_FSIZE (SIGXFSZ ignored): a write past the
  limit fails with EFBIG in the middle of a segment. Runs everywhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.store_helpers import CHILD, fill, ids, message, reopen

from store.config import KIB, MIB, PRODUCTION, TESTING, CrashModel, FlushMode, StoreConfig
from store.log.commitlog import SEGMENT_RETRY_S
from store.status import PutResult, PutStatus
from store.store import MessageStore

MAX_PUTS = 20_000  # 2 MiB holds about 6,400 of these; the loop is bounded anyway


@contextlib.contextmanager
def tmpfs(mnt: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` mounted at `mnt` (created), unmounted afterwards;
    skips the test where this user may not mount."""
    mnt.mkdir(exist_ok=True)
    try:
        res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)],
                             capture_output=True, text=True, timeout=30, check=False)
    except FileNotFoundError:
        pytest.skip("no `mount` command on this machine: cannot make a small filesystem")
    if res.returncode != 0:
        pytest.skip(f"cannot mount a {size} tmpfs ({res.stderr.strip()}): needs root or "
                    "CAP_SYS_ADMIN; test_write_past_file_size_limit still covers write errors")
    try:
        yield mnt
    finally:
        if subprocess.run(["umount", str(mnt)], capture_output=True, check=False).returncode:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True, check=False)


def grow(mnt: Path, size: str) -> None:
    subprocess.run(["mount", "-o", f"remount,size={size}", str(mnt)], check=True,
                   capture_output=True, timeout=30)


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    with tmpfs(tmp_path / "small", "2m") as mnt:
        yield mnt / "store"


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
            assert "disk full" in s.state()["cannot_grow"]
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


# The 1 MiB case leaves this much of the 8 MiB for the store: two segments
# and the small files beside them; the third segment does not fit.
BALLAST_BYTES = 8 * MIB - 2 * MIB - 512 * KIB


@pytest.mark.parametrize("flush", [FlushMode.ASYNC_FLUSH, FlushMode.SYNC_FLUSH])
@pytest.mark.parametrize("segment", ["default", "1MiB"])
def test_full_disk_refuses_puts_at_once_and_they_resume_once_space_is_freed(
    tmp_path: Path, segment: str, flush: FlushMode, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 15 §3: with the default (1 GiB) segment a fresh store on an
    8 MiB disk cannot make its first segment: the put raised inside the
    append and was never answered. With 1 MiB segments the third segment
    does not fit, and puts stayed refused after space was freed."""
    if segment == "default":
        config = PRODUCTION.with_(flush_mode=flush)
    else:
        config = StoreConfig(segment_size_bytes=MIB, max_message_size_bytes=64 * KIB,
                             flush_mode=flush).validate()
    caplog.set_level(logging.WARNING, logger="dlab.store")

    async def put(s: MessageStore, msgs: list[str]) -> tuple[list[PutResult], float]:
        t0 = time.monotonic()
        results = await asyncio.wait_for(asyncio.gather(*(
            s.put(message(int(m[1:]), prefix=m[0])) for m in msgs)), timeout=30)
        return list(results), time.monotonic() - t0

    with tmpfs(tmp_path / "small", "8m") as mnt:
        ballast = mnt / "ballast"
        if segment == "1MiB":
            with open(ballast, "wb") as f:
                os.posix_fallocate(f.fileno(), 0, BALLAST_BYTES)
        path = mnt / "store"

        async def run() -> tuple[list[PutResult], set[str]]:
            s = MessageStore.open(str(path), config)
            await s.start()
            acked: list[PutResult] = []
            refused: set[str] = set()
            try:
                for lo in range(0, MAX_PUTS, 64):
                    results, took = await put(s, [f"m{i:06d}" for i in range(lo, lo + 64)])
                    acked += [r for r in results if r.status is PutStatus.PUT_OK]
                    bad = [r for r in results if r.status is not PutStatus.PUT_OK]
                    if bad:
                        assert {r.status for r in bad} == {PutStatus.SERVICE_NOT_AVAILABLE}
                        assert all(r.detail.startswith("disk full: ") and
                                   "No space left on device" in r.detail for r in bad), bad[0]
                        refused |= {r.msg_id for r in bad if r.msg_id}
                        break
                assert refused, f"{MAX_PUTS} puts fit in an 8 MiB filesystem?"
                assert (segment == "default") == (not acked)
                # Refused at once while the disk stays full, and it says so.
                results, took = await put(s, ["x000000"])
                assert results[0].status is PutStatus.SERVICE_NOT_AVAILABLE
                assert "disk full" in results[0].detail
                assert took < 3.0, f"a refusal took {took:.1f} s"
                refused.add("x000000")
                state = s.state()
                assert state["failed"] is None
                assert "disk full" in state["cannot_grow"], state
                assert any(r.levelno == logging.ERROR and "disk full" in r.getMessage()
                           for r in caplog.records), caplog.text
                # Free space: puts succeed again, without a restart.
                if segment == "1MiB":
                    ballast.unlink()
                else:
                    grow(mnt, f"{config.segment_size_bytes + 64 * MIB}")
                deadline = time.monotonic() + 10 * SEGMENT_RETRY_S + 10
                n = 0
                while True:
                    results, _ = await put(s, [f"r{n:06d}"])
                    n += 1
                    if results[0].status is PutStatus.PUT_OK:
                        acked += results
                        break
                    assert results[0].status is PutStatus.SERVICE_NOT_AVAILABLE, results[0]
                    refused.add(f"r{n - 1:06d}")
                    assert time.monotonic() < deadline, "puts still refused after space was freed"
                    await asyncio.sleep(0.2)
                for lo in range(n, n + 640, 64):
                    results, _ = await put(s, [f"r{i:06d}" for i in range(lo, lo + 64)])
                    assert {r.status for r in results} == {PutStatus.PUT_OK}, results[0]
                    acked += results
                assert s.state()["cannot_grow"] is None
            finally:
                await s.close()
            return acked, refused

        acked, refused = asyncio.run(run())
        records, report = reopen(path, config)
    by_id = {r.msg_id: r for r in records}
    for a in acked:
        assert a.msg_id in by_id, f"acknowledged {a.msg_id} lost"
        assert by_id[a.msg_id].offset == a.offset
    assert set(by_id) == {a.msg_id for a in acked}, "a refused put was stored"
    assert not refused & set(by_id)
    assert report.first_bad_offset is None, report.summary


def _dlab(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cluster.cli", *args], capture_output=True,
                          text=True, timeout=timeout, check=False)


def test_cluster_on_a_full_disk_answers_names_it_and_recovers(tmp_path: Path) -> None:
    """The issue's reproduction: `dlab cluster up` on an 8 MiB tmpfs (64 MiB
    segments), `dlab send`. Clients saw INDETERMINATE after 5 s, the node
    logged nothing and its status said nothing."""
    with tmpfs(tmp_path / "small", "8m") as mnt:
        d = str(mnt / "c")
        up = _dlab("cluster", "up", "--dir", d, "--slaves", "0", "--role", "ASYNC_MASTER")
        assert up.returncode == 0, up.stderr
        try:
            sent = _dlab("send", "--dir", d, "--count", "20", "--concurrency", "4",
                         "--timeout", "20")
            # No message stored: exit status 1, the reason on stderr.
            assert sent.returncode == 1, sent.stderr
            assert "no message was stored" in sent.stderr, sent.stderr
            assert "SERVICE_NOT_AVAILABLE x20 (disk full: " in sent.stderr, sent.stderr
            assert "SERVICE_NOT_AVAILABLE       20" in sent.stdout, sent.stdout
            assert "INDETERMINATE" not in sent.stdout, sent.stdout
            assert "SERVICE_NOT_AVAILABLE: disk full: " in sent.stdout, sent.stdout
            log = (mnt / "c" / "nodes" / "master" / "node.log").read_text()
            assert "ERROR" in log and "disk full" in log, log
            st = _dlab("cluster", "status", "--dir", d, "--json")
            (row,) = json.loads(st.stdout)
            assert row["status"]["failed"].startswith("disk full: "), row
            text = _dlab("cluster", "status", "--dir", d).stdout
            assert "WRITES REFUSED: disk full" in text, text

            grow(mnt, "200m")
            deadline = time.monotonic() + 10 * SEGMENT_RETRY_S + 20
            while True:
                sent = _dlab("send", "--dir", d, "--count", "20", "--concurrency", "4")
                if "PUT_OK                      20" in sent.stdout:
                    break
                assert time.monotonic() < deadline, sent.stdout
                time.sleep(0.5)
            (row,) = json.loads(_dlab("cluster", "status", "--dir", d, "--json").stdout)
            assert row["status"]["failed"] == "" and row["status"]["wrote"] > 0, row
        finally:
            _dlab("cluster", "down", "--dir", d)
