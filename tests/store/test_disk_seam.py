"""The disk seam (store/seams/disk.py): one contract over both implementations —
the store opens, appends, flushes, closes and reopens on MemoryDisk with the
same bytes and results as on RealDisk — and MemoryDisk's power-cut model and
faults: a crash keeps exactly what was fsynced (file bytes at the file's
fsync, directory entries at the directory's), torn writes keep a prefix, an
fsync failing with EIO leaves its bytes non-durable and fails the store's
flush, latent corruption is caught by recovery, and all of it is the same
for the same seed."""

from __future__ import annotations

import dataclasses
import errno
import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.store_helpers import SEG, message

from store.config import TESTING, CorruptionPolicy, CrashModel, FlushMode, StoreConfig
from store.log.commitlog import StoreFailedError
from store.log.record import Record
from store.log.segments import segment_name
from store.seams.disk import Disk, RealDisk
from store.seams.lock import StoreLockedError
from store.sim.manual_clock import ManualClock
from store.sim.memory_disk import DiskFaults, MemoryDisk
from store.status import PutStatus
from store.store import CorruptionRefusedError, MessageStore, RecoveryReport

ROOT = "/sim/store"
PROCESS = TESTING.with_(crash_model=CrashModel.PROCESS)


@pytest.fixture(params=["real", "memory"])
def disk_root(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Disk, str]]:
    if request.param == "real":
        yield RealDisk(), str(tmp_path / "store")
    else:
        yield MemoryDisk(random.Random(1)), ROOT


def _append(s: MessageStore, lo: int, hi: int, body_size: int = 333) -> None:
    results = s.append([message(i, body_size=body_size) for i in range(lo, hi)])
    assert all(r.status is PutStatus.PUT_OK for r in results), {r.status for r in results}


def _open(disk: Disk, root: str, config: StoreConfig = TESTING) -> MessageStore:
    return MessageStore.open(root, config, clock=ManualClock(), disk=disk)


def _records(disk: Disk, root: str, config: StoreConfig = TESTING
             ) -> tuple[list[Record], RecoveryReport]:
    s = _open(disk, root, config)
    try:
        return list(s.log.iter_records()), s.recovery
    finally:
        s.close_sync()


def _tree(disk: Disk, root: str) -> dict[str, bytes]:
    """Every file under `root` and its bytes, but the lock (its content is
    the holder's pid on a real disk)."""
    out: dict[str, bytes] = {}
    for name in disk.listdir(root):
        path = os.path.join(root, name)
        if disk.isdir(path):
            out.update({f"{name}/{k}": v for k, v in _tree(disk, path).items()})
        elif name != "lock":
            out[name] = disk.read_file(path)
    return out


def _session(disk: Disk, root: str) -> dict[str, Any]:
    """Open, append across segments, flush, consume-side state, close,
    reopen: everything a caller can observe."""
    s = _open(disk, root)
    _append(s, 0, 400)
    s.log.flush()
    s.reput()
    s.consumer_offsets.commit("g", "TopicTest", 0, 17)
    got = s.get_messages("TopicTest", 0, 5, 3)
    s.close_sync()
    assert s.close_problem is None
    after_close = _tree(disk, root)
    records, report = _records(disk, root)
    s = _open(disk, root)
    try:
        offset = s.consumer_offsets.query("g", "TopicTest", 0)
        again = s.get_messages("TopicTest", 0, 395, 10)
    finally:
        s.close_sync()
    return {
        "got": [(m.commitlog_offset, m.record.msg_id) for m in got.messages],
        "records": [(r.offset, r.msg_id, r.body, r.queue_offset) for r in records],
        "report": (report.abnormal, report.max_valid_offset, report.records_scanned,
                   report.first_bad_offset, report.problems),
        "offset": offset,
        "again": [m.record.msg_id for m in again.messages],
        "files": after_close,
    }


def test_the_store_round_trips_on_each_disk(disk_root: tuple[Disk, str]) -> None:
    disk, root = disk_root
    seen = _session(disk, root)
    assert [r[1] for r in seen["records"]] == [f"m{i:06d}" for i in range(400)]
    assert seen["report"][0] is False and seen["report"][3] is None
    assert seen["got"] and [g[1] for g in seen["got"]] == ["m000005", "m000006", "m000007"]
    assert seen["offset"] == 17 and seen["again"] == [f"m{i:06d}" for i in range(395, 400)]
    segs = sorted(k for k in seen["files"] if k.startswith("commitlog/"))
    assert len(segs) >= 3 and all(len(seen["files"][k]) == SEG for k in segs)
    assert "abort" not in seen["files"] and "checkpoint" in seen["files"]
    assert "config/consumerOffset.json" in seen["files"]


def test_memory_disk_gives_the_same_bytes_and_results_as_the_real_one(tmp_path: Path) -> None:
    real = _session(RealDisk(), str(tmp_path / "store"))
    memory = _session(MemoryDisk(random.Random(1)), ROOT)
    assert real.keys() == memory.keys()
    assert sorted(real["files"]) == sorted(memory["files"])
    for name in real["files"]:
        assert real["files"][name] == memory["files"][name], name
    for key in real:
        assert real[key] == memory[key], key


def test_the_file_operations_agree_on_each_disk(disk_root: tuple[Disk, str]) -> None:
    disk, root = disk_root
    disk.makedirs(os.path.join(root, "d"))
    f = disk.create(os.path.join(root, "d", "a"))
    with pytest.raises(FileExistsError):
        disk.create(os.path.join(root, "d", "a"))
    f.allocate(4096)
    assert f.size() == 4096 and disk.size(os.path.join(root, "d", "a")) == 4096
    assert f.pwritev([b"abc", memoryview(b"def")], 10) == 6
    assert f.pwrite(b"xyz", 4094) == 3  # past the end: the file grows
    assert f.size() == 4097 and f.pread(8, 8) == b"\0\0abcdef"
    m = f.map()
    try:
        assert bytes(memoryview(m)[10:16]) == b"abcdef" and len(m) == 4097
    finally:
        m.close()
    f.truncate(12)
    f.fsync()
    f.fdatasync()
    assert f.pread(100, 0) == bytes(10) + b"ab"
    f.close()
    f.close()  # twice: nothing
    disk.write_file(os.path.join(root, "d", "b"), b"hello")
    disk.rename(os.path.join(root, "d", "b"), os.path.join(root, "d", "c"))
    disk.fsync_dir(os.path.join(root, "d"))
    assert disk.listdir(os.path.join(root, "d")) == ["a", "c"]
    assert disk.read_file(os.path.join(root, "d", "c"), 3) == b"hel"
    assert disk.isfile(os.path.join(root, "d", "c")) and disk.isdir(os.path.join(root, "d"))
    assert not disk.exists(os.path.join(root, "d", "b"))
    with pytest.raises(FileNotFoundError):
        disk.read_file(os.path.join(root, "d", "b"))
    with pytest.raises(FileNotFoundError):
        disk.open(os.path.join(root, "d", "b"))
    with pytest.raises(OSError) as err:
        disk.rmdir(os.path.join(root, "d"))
    assert err.value.errno == errno.ENOTEMPTY
    disk.unlink(os.path.join(root, "d", "a"))
    disk.unlink(os.path.join(root, "d", "c"))
    disk.rmdir(os.path.join(root, "d"))
    assert disk.listdir(root) == [] and disk.free_bytes(root) > 0
    lock = disk.lock(os.path.join(root, "lock"))
    try:
        with pytest.raises(StoreLockedError):
            _open(disk, root)
    finally:
        lock.release()


# ------------------------------------------------------- MemoryDisk's model
def test_a_crash_keeps_only_fsynced_bytes_and_recovery_finds_exactly_the_flushed_records(
) -> None:
    """Under PROCESS every append reaches the page cache at once; only the
    flush's fdatasync makes it durable. The page cache holds 250 records
    at the cut, the durable state the 150 flushed ones, and recovery on the
    crashed disk finds exactly those."""
    disk = MemoryDisk(random.Random(3))
    s = _open(disk, ROOT, PROCESS)
    _append(s, 0, 150)
    flushed = s.log.flush()
    _append(s, 150, 250)
    wrote = s.log.wrote
    seg = os.path.join(ROOT, "commitlog", segment_name(wrote - wrote % SEG))
    assert s.log.read_record(flushed).msg_id == "m000150"  # readable from the cache
    assert disk.durable_bytes(seg) != disk.read_file(seg)
    after = disk.crash()
    with pytest.raises(StoreFailedError, match="disk crashed"):  # a dead process's disk
        s.log.flush()
    records, report = _records(after, ROOT, PROCESS)
    assert [r.msg_id for r in records] == [f"m{i:06d}" for i in range(150)]
    assert report.abnormal and report.max_valid_offset == flushed
    assert after.faults == []


def test_a_segment_whose_directory_was_not_fsynced_vanishes_in_a_crash() -> None:
    """The directory-entry rule: a file created (and its bytes fsynced) is
    gone after a crash unless its directory was fsynced; a rename or unlink
    not followed by a directory fsync is undone."""
    disk = MemoryDisk(random.Random(4))
    d = os.path.join(ROOT, "commitlog")
    disk.makedirs(d)
    kept = disk.create(os.path.join(d, segment_name(0)))
    kept.pwrite(b"kept", 0)
    kept.fsync()
    disk.fsync_dir(d)
    disk.write_file(os.path.join(d, "old"), b"x")
    disk.fsync_dir(d)
    lost = disk.create(os.path.join(d, segment_name(SEG)))
    lost.pwrite(b"lost", 0)
    lost.fsync()
    disk.rename(os.path.join(d, "old"), os.path.join(d, "new"))
    disk.unlink(os.path.join(d, segment_name(0)))
    assert disk.listdir(d) == [segment_name(SEG), "new"]
    after = disk.crash()
    assert after.listdir(d) == [segment_name(0), "old"]
    assert after.read_file(os.path.join(d, segment_name(0))) == b"kept"


def test_a_store_that_skipped_the_directory_fsync_would_lose_flushed_records() -> None:
    """The rule bites the store where it should: with the directory fsync of
    a segment roll dropped (a planted bug), records flushed into the new
    segment are gone after a crash; with it (the store as it is) they stay."""

    class NoCommitlogDirSync(MemoryDisk):
        def fsync_dir(self, path: str) -> None:
            if not path.endswith("commitlog"):
                super().fsync_dir(path)

    found = {}
    for disk in (MemoryDisk(random.Random(5)), NoCommitlogDirSync(random.Random(5))):
        s = _open(disk, ROOT)
        _append(s, 0, 400)
        s.log.flush()
        assert len(s.log.segments) >= 3
        records, _ = _records(disk.crash(), ROOT)
        found[type(disk).__name__] = len(records)
    assert found["MemoryDisk"] == 400
    assert found["NoCommitlogDirSync"] == 0


def test_torn_writes_keep_a_prefix_of_one_write_or_some_writes_in_order() -> None:
    path = os.path.join(ROOT, "f")
    for seed in range(20):
        disk = MemoryDisk(random.Random(seed))
        disk.makedirs(ROOT)
        f = disk.create(path)
        f.pwrite(b"A" * 100, 0)
        f.fsync()
        disk.fsync_dir(ROOT)
        f.pwrite(b"B" * 1000, 100)
        after = disk.crash(torn="torn-op")
        got = after.read_file(path)
        assert got.startswith(b"A" * 100) and got[100:] == b"B" * (len(got) - 100)
        assert len(got) < 1100
        assert after.faults == [{"fault": "torn-op", "path": path, "pos": 100,
                                 "kept": len(got) - 100, "of": 1000}]

        disk = MemoryDisk(random.Random(seed))
        disk.makedirs(ROOT)
        f = disk.create(path)
        f.allocate(30)
        f.fsync()
        disk.fsync_dir(ROOT)
        for i, byte in enumerate(b"xyz"):
            f.pwrite(bytes([byte]) * 10, 10 * i)
        after = disk.crash(torn="torn-seq")
        got = after.read_file(path)
        (fault,) = after.faults
        assert fault["fault"] == "torn-seq" and fault["of"] == 3
        want = bytearray(30)
        for i in fault["kept"]:
            want[10 * i:10 * i + 10] = bytes([b"xyz"[i]]) * 10
        assert got == bytes(want)


def test_a_preallocated_file_holds_its_written_bytes_only_and_reads_its_zeros() -> None:
    """MemoryDisk is sparse: the zeros of an 8 MiB allocation are a size,
    through writes, fsync, a crash (torn or not) and a truncation, and every
    read, map and export sees them."""
    path = os.path.join(ROOT, "seg")
    size = 8 * 1024 * 1024
    for torn in (None, "torn-op", "torn-seq"):
        disk = MemoryDisk(random.Random(3))
        disk.makedirs(ROOT)
        f = disk.create(path)
        f.allocate(size)
        f.pwrite(b"a" * 100, 0)
        f.fsync()
        disk.fsync_dir(ROOT)
        f.pwrite(b"b" * 50, 100)
        held, durable_size = disk.durable_extent(path)
        assert (held, durable_size) == (b"a" * 100, size)
        assert disk.durable_bytes(path) == b"a" * 100 + bytes(size - 100)
        assert disk.cached_bytes(path) == b"a" * 100 + b"b" * 50 + bytes(size - 150)
        after = disk.crash(torn=torn)
        got = after.read_file(path)
        assert len(got) == size and after.size(path) == size
        rest = got[100:]
        kept = len(rest) - len(rest.lstrip(b"b"))  # what a tear kept of the unsynced write
        assert got[:100] == b"a" * 100 and kept <= 50 and rest[kept:] == bytes(size - 100 - kept)
        held, _ = after.durable_extent(path)
        assert len(held) <= 150  # the zeros were never made
        g = after.open(path)
        m = g.map()
        try:
            assert len(m) == size and bytes(memoryview(m)[:100]) == b"a" * 100
            assert bytes(memoryview(m)[-10:]) == bytes(10)
        finally:
            m.close()
        assert g.pread(10, size - 5) == bytes(5)
        g.truncate(size + 10)
        assert g.pread(20, size) == bytes(10)
        g.truncate(60)
        assert g.pread(100, 0) == b"a" * 60


def test_a_torn_commitlog_write_is_cut_by_recovery_to_its_last_whole_record() -> None:
    """A crash between a flush's write and its fsync tears the write: what
    recovery keeps is the flushed records and the whole records of the kept
    prefix, never a part of one."""
    for seed in range(6):
        disk = MemoryDisk(random.Random(seed))
        s = _open(disk, ROOT)  # POWER: a flush writes, then fsyncs
        _append(s, 0, 40)
        flushed = s.log.flush()
        ends = [r.end for r in s.append([message(i, body_size=333) for i in range(40, 60)])]
        seg = s.log.segments[-1]
        assert seg.start < flushed < ends[-1] <= seg.end
        seg.pwritev(flushed - seg.start, [s.log.read(flushed, s.log.wrote - flushed)])
        after = disk.crash(torn="torn-op")
        torn = next(f for f in after.faults if f["path"] == seg.path)
        records, report = _records(after, ROOT)
        whole = [e for e in ends if e <= flushed + torn["kept"]]
        assert [r.msg_id for r in records] == [f"m{i:06d}" for i in range(40 + len(whole))]
        assert report.max_valid_offset == (whole[-1] if whole else flushed)


def test_an_eio_fsync_fails_the_flush_and_leaves_its_bytes_non_durable() -> None:
    """Linux drops the failed write-back: the bytes still read back, a later
    fsync succeeds, and they are still not durable. The store sees
    OSError(EIO) under its StoreFailedError and does not advance `flushed`."""
    disk = MemoryDisk(random.Random(7))
    s = _open(disk, ROOT)
    _append(s, 0, 30)
    flushed = s.log.flush()
    _append(s, 30, 60)
    seg = s.log.segments[-1]
    disk.fail_next_fsync(seg.path)
    with pytest.raises(StoreFailedError) as err:
        s.log.flush()
    cause = err.value.__cause__
    assert isinstance(cause, OSError) and cause.errno == errno.EIO
    assert s.log.flushed == flushed and s.log.failed and "errno 5" in s.log.failed
    assert s.append([message(99)])[0].status is PutStatus.SERVICE_NOT_AVAILABLE
    assert seg.pread(flushed - seg.start, 8) != bytes(8)  # in the page cache
    seg.sync()  # succeeds now, and makes nothing durable
    durable = disk.durable_bytes(seg.path)
    assert durable[flushed - seg.start:] == bytes(len(durable) - (flushed - seg.start))
    assert disk.faults == [{"fault": "fsync-eio", "path": seg.path, "lost_writes": 1,
                            "lost_bytes": s.log.wrote - flushed}]
    records, _ = _records(disk.crash(), ROOT)
    assert len(records) == 30


def test_latent_read_corruption_is_found_by_recovery() -> None:
    disk = MemoryDisk(random.Random(8))
    s = _open(disk, ROOT)
    _append(s, 0, 20)
    s.log.flush()
    at = s.log.read_record(0).size * 12 + 150  # inside record 12's body (CRC-covered)
    path = s.log.segments[0].path
    s.close_sync()
    disk.corrupt(path, at, at + 4)
    # Flushed records follow the damage: the default policy refuses to open
    # and names where; truncate (RocketMQ's) cuts there.
    with pytest.raises(CorruptionRefusedError) as refused:
        _open(disk, ROOT)
    assert refused.value.damage.offset == s.log.segments[0].start + at - 150
    records, report = _records(disk, ROOT, dataclasses.replace(
        TESTING, corruption_policy=CorruptionPolicy.TRUNCATE))
    assert len(records) == 12 and report.first_bad_offset is not None
    assert disk.faults[0] == {"fault": "read-corruption", "path": path,
                              "start": at, "end": at + 4}


def _faulty_run(seed: int) -> tuple[list[dict[str, Any]], dict[str, bytes]]:
    rates = DiskFaults(fsync_eio=0.05, read_corruption=0.02, torn_write=1.0)
    disk = MemoryDisk(random.Random(seed), rates)
    for round_ in range(4):
        try:
            s = _open(disk, ROOT, PROCESS)
        except Exception:
            break
        try:
            _append(s, 100 * round_, 100 * round_ + 100)
            s.log.flush()
            _append(s, 100 * round_ + 100, 100 * round_ + 130)
        except (StoreFailedError, AssertionError):
            pass
        disk = disk.crash()
    return disk.faults, _tree(disk, ROOT)


def test_the_same_seed_injects_the_same_faults_and_leaves_the_same_bytes() -> None:
    a, b, c = _faulty_run(11), _faulty_run(11), _faulty_run(12)
    assert a == b
    assert {f["fault"] for f in a[0]} & {"torn-op", "torn-seq"}
    assert a != c


def test_the_memory_lock_is_held_until_release_and_a_crash_drops_it() -> None:
    disk = MemoryDisk(random.Random(9))
    _open(disk, ROOT)  # never closed: the crash ends its holder
    with pytest.raises(StoreLockedError, match="in use"):
        _open(disk, ROOT)
    after = disk.crash()
    s2 = _open(after, ROOT)
    s2.close_sync()
    _open(after, ROOT).close_sync()  # released by the close


def test_fault_probabilities_are_validated() -> None:
    from store.config import ConfigError

    with pytest.raises(ConfigError, match="fsync_eio"):
        MemoryDisk(faults=DiskFaults(fsync_eio=1.5))
    with pytest.raises(ValueError, match="torn"):
        MemoryDisk().crash(torn="half")


def test_every_open_put_and_flush_mode_runs_on_memory() -> None:
    """SYNC_FLUSH group commit, ASYNC_FLUSH and the event loop on MemoryDisk."""
    import asyncio

    async def run() -> None:
        s = MessageStore.open(ROOT, TESTING.with_(flush_mode=FlushMode.SYNC_FLUSH),
                              disk=disk)
        await s.start()
        try:
            results = await asyncio.gather(*(s.put(message(i)) for i in range(50)))
            assert all(r.status is PutStatus.PUT_OK for r in results)
            assert s.log.flushed >= results[-1].end
        finally:
            await s.close()

    disk = MemoryDisk(random.Random(10))
    asyncio.run(run())
    records, report = _records(disk.crash(), ROOT)
    assert len(records) == 50 and not report.abnormal


def test_the_store_modules_make_no_file_call_but_through_the_disk() -> None:
    """The seam holds only if nothing goes around it: no os file call, no
    builtin open, no mmap in the modules that do the store's IO (store/seams/disk.py
    is the one place that talks to the operating system)."""
    import ast

    pure = {"path.join", "path.dirname", "path.basename", "getpid", "geteuid", "sysconf"}
    root = Path(__file__).resolve().parents[2] / "store"
    found = []
    for name in ("log/segments", "log/commitlog", "log/checkpoint", "consume/consumequeue",
                 "consume/consumer_offsets", "store"):
        tree = ast.parse((root / f"{name}.py").read_text())
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            call = ast.unparse(node.func)
            if call == "open" or call.startswith(("mmap.", "fcntl.")) or (
                    call.startswith("os.") and call.removeprefix("os.") not in pure):
                found.append(f"store/{name}.py:{node.lineno}: {call}")
    # segments.fsync_dir stays for callers outside the store (the consumer).
    assert found == [], found


def test_each_fault_is_stamped_with_the_simulated_time() -> None:
    clock = ManualClock(wall_ms=5_000)
    disk = MemoryDisk(random.Random(12), clock=clock)
    disk.makedirs(ROOT)
    f = disk.create(os.path.join(ROOT, "f"))
    f.pwrite(b"abc", 0)
    clock.advance(2.5)
    disk.fail_next_fsync(os.path.join(ROOT, "f"))
    with pytest.raises(OSError):
        f.fsync()
    assert [(x["fault"], x["at_ms"]) for x in disk.faults] == [("fsync-eio", 7_500)]


def test_a_new_stores_checkpoint_survives_a_crash_of_its_first_life() -> None:
    """The checkpoint's directory entry is made durable when the store
    creates it: after a crash in the store's first life, recovery reads the
    flushed end it recorded instead of finding no checkpoint (which would
    leave it unable to tell a torn tail from damaged flushed data)."""
    disk = MemoryDisk(random.Random(5))
    s = _open(disk, ROOT, PROCESS)
    _append(s, 0, 50)
    flushed = s.log.flush()
    s.log.checkpoint.sync()
    after = disk.crash()
    assert after.exists(os.path.join(ROOT, "checkpoint"))
    records, report = _records(after, ROOT, PROCESS)
    assert len(records) == 50 and report.abnormal
    assert not any("checkpoint" in p and "missing" in p for p in report.problems), \
        report.problems
    s2 = _open(after, ROOT, PROCESS)
    try:
        assert s2.log.checkpoint.flushed_end >= flushed
    finally:
        s2.close_sync()
