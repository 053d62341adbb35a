"""The broker's epoch file (ha/autoswitch/epoch_file.py): RocketMQ's format,
its decode (whole, or EpochFileCorruptError), its crash-safe write — a crash
at each failpoint leaves the old list or the new one, never a mix: on a real
disk (a child process killed by the failpoint) and on MemoryDisk (a process
kill, and a power cut with or without torn writes) — and `--emulate
rmq-epoch-in-place`, RocketMQ's in-place rewrite, shown to leave a torn or
empty file that the count/CRC check catches, falling back to `.bak`, and,
when the backup is torn too, no epochs at all. Under the power crash model
on a real disk, the harness's power cut takes the in-place writes as the
simulated disk's crash does (store/log/durable_mark.py, "Unsynced files")."""

from __future__ import annotations

import random
import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.epoch_helpers import entries_arg, run_child, run_crashing

from ha.autoswitch.epoch_file import (
    BAK_SUFFIX,
    FILE_NAME,
    TMP_SUFFIX,
    EpochFile,
    EpochFileCorruptError,
    EpochFileError,
    decode,
    encode,
)
from ha.autoswitch.epochs import EpochEntry, EpochList, EpochOrderError
from ha.autoswitch.rejoin import RejoinKind, decide
from store.config import TESTING
from store.emulate import RMQ_EPOCH_IN_PLACE
from store.failpoints import Failpoints
from store.log.durable_mark import power_cut, read_unsynced_files
from store.seams.disk import Disk, RealDisk
from store.sim.memory_disk import MemoryDisk
from store.store import MessageStore

E = EpochList.of
OLD = E((1, 0), (2, 4096), (5, 9000))
NEW = E((1, 0), (2, 4096), (5, 9000), (7, 12000))
SAFE_POINTS = ["epoch_file_before_fsync", "epoch_file_before_rename",
               "epoch_file_before_dir_fsync"]
IN_PLACE = frozenset({RMQ_EPOCH_IN_PLACE})
ROOT = "/sim/broker"
PATH = f"{ROOT}/epochFileCheckpoint"


# ------------------------------------------------------------------ format
def test_the_format_is_rocketmqs_checkpoint_file() -> None:
    """The example of RocketMQ's CheckpointFile javadoc, byte for byte: its
    CRC (java.util.zip.CRC32 of the entry lines, masked to 31 bits) is ours."""
    assert encode(E((7, 7000), (8, 8000))) == b"2\n773307083\n7-7000\n8-8000\n"
    assert decode(b"2\n773307083\n7-7000\n8-8000\n") == E((7, 7000), (8, 8000))
    assert decode(encode(EpochList())) == EpochList()


def test_every_strict_prefix_of_a_file_is_refused() -> None:
    """A torn write keeps a prefix: each one fails the count or the CRC."""
    data = encode(NEW)
    for n in range(len(data)):
        with pytest.raises(EpochFileCorruptError):
            decode(data[:n])


def test_the_crc_catches_a_changed_offset_that_the_count_cannot() -> None:
    """The checker shown catching a planted fault: one digit of an entry
    changed, the count line intact."""
    data = encode(NEW).replace(b"9000", b"9001")
    with pytest.raises(EpochFileCorruptError, match="CRC"):
        decode(data)


def test_a_file_whose_entries_are_out_of_order_is_refused() -> None:
    body = b"2-0\n1-5\n"
    data = b"2\n" + str(zlib.crc32(body) & 0x7FFFFFFF).encode() + b"\n" + body
    with pytest.raises(EpochFileCorruptError, match="epochs must increase"):
        decode(data)


def _with_crc(lines: list[str], count: int | None) -> bytes:
    """A file whose CRC is right, whatever its lines say."""
    body = "".join(line + "\n" for line in lines).encode()
    n = len(lines) if count is None else count
    return f"{n}\n{zlib.crc32(body) & 0x7FFFFFFF}\n".encode() + body


FUZZED = (st.binary(max_size=80)
          | st.builds(lambda cut, flip: _damaged(cut, flip), st.integers(0, 60),
                      st.integers(0, 255))
          | st.builds(_with_crc, st.lists(st.text("0123456789-\r ", max_size=8), max_size=5),
                      st.none() | st.integers(0, 6)))


def test_a_number_not_written_plainly_is_refused() -> None:
    for lines in (["01-0"], ["1-00"], ["+1-0"], ["1- 0"]):
        with pytest.raises(EpochFileCorruptError, match="written plainly"):
            decode(_with_crc(lines, None))


@settings(max_examples=600, deadline=None)
@given(FUZZED)
def test_decode_fuzzed_decodes_or_raises_corrupt_record_error_nothing_else(data: bytes
                                                                           ) -> None:
    try:
        epochs = decode(data)
    except EpochFileCorruptError:
        return
    assert encode(epochs) == data  # what decodes is a file this module would write


def _damaged(pos: int, flip: int) -> bytes:
    data = bytearray(encode(NEW))
    data[pos % len(data)] ^= flip
    return bytes(data)


# ------------------------------------------------------------------- reads
def _file(disk: Disk, path: str, emulate: frozenset[str] = frozenset(),
          failpoints: Failpoints | None = None) -> EpochFile:
    return EpochFile(disk, path, emulate=emulate,
                     **({"failpoints": failpoints} if failpoints else {}))


def test_no_file_is_no_epochs_and_a_torn_one_falls_back_to_its_backup(tmp_path: Path
                                                                        ) -> None:
    disk, path = RealDisk(), str(tmp_path / "epochFileCheckpoint")
    f = _file(disk, path)
    assert (f.epochs, f.loaded_from) == (EpochList(), "none")
    disk.write_file(path + BAK_SUFFIX, encode(OLD))
    disk.write_file(path, encode(NEW)[:-3])
    f = _file(disk, path)
    assert (f.epochs, f.loaded_from) == (OLD, "bak")
    assert f.note is not None and "torn or damaged" in f.note and BAK_SUFFIX in f.note


def test_both_unreadable_is_an_error_naming_them_or_under_the_switch_no_epochs(
        tmp_path: Path) -> None:
    """Safe mode refuses to guess; RocketMQ logs the IOException and starts
    with no epochs: a new replica, which truncates nothing."""
    disk, path = RealDisk(), str(tmp_path / "epochFileCheckpoint")
    disk.write_file(path, b"3\n12")
    disk.write_file(path + BAK_SUFFIX, b"")
    with pytest.raises(EpochFileError, match=r"epochFileCheckpoint is unreadable.*"
                       r"epochFileCheckpoint\.bak is unreadable.*restore the file"):
        _file(disk, path)
    f = _file(disk, path, IN_PLACE)
    assert f.epochs == EpochList() and f.note and "RocketMQ's behaviour" in f.note


def test_becoming_master_appending_and_truncating_are_each_durable_at_return() -> None:
    """Each change is written before it returns (a power cut right after
    keeps it); a refused one changes neither the list nor the file."""
    disk = MemoryDisk(random.Random(4))
    disk.makedirs(ROOT)
    f = _file(disk, PATH)
    f.begin_epoch(1, 0)
    f.append(EpochEntry(2, 4096))
    assert _file(disk.crash(), PATH).epochs == E((1, 0), (2, 4096))
    disk = disk.crash()
    f = _file(disk, PATH)
    with pytest.raises(EpochOrderError):
        f.begin_epoch(1, 9000)
    assert f.epochs == E((1, 0), (2, 4096))
    f.begin_epoch(5, 9000)
    f.truncate_from(4096)
    assert _file(disk.crash(), PATH).epochs == E((1, 0))


# -------------------------------------------- crash-safe writes, MemoryDisk
def _seeded(disk: MemoryDisk, path: str) -> None:
    disk.makedirs(ROOT)
    _file(disk, path).replace(OLD)


@pytest.mark.parametrize("failpoint", SAFE_POINTS)
@pytest.mark.parametrize("crash", ["process", "power", "power-torn-op", "power-torn-seq"])
def test_memory_disk_a_crash_at_each_failpoint_leaves_the_old_or_the_new_list(
        failpoint: str, crash: str) -> None:
    """A kill keeps what the OS holds; a power cut only what was fsynced,
    maybe with unsynced writes torn. Before the rename the old list is
    read; after it, the new one (a kill), or the old one (a power cut before
    the directory fsync: the rename is not durable yet); never anything
    else, and no temp file stays."""
    for seed in range(8):
        disk = MemoryDisk(random.Random(seed))
        _seeded(disk, PATH)
        assert run_crashing(lambda fp, d=disk: _file(d, PATH, failpoints=fp).replace(NEW),
                            failpoint)
        after = disk if crash == "process" else disk.crash(
            torn=crash.removeprefix("power-") if crash != "power" else None)
        got = _file(after, PATH)
        assert got.loaded_from == "main" and not after.exists(PATH + TMP_SUFFIX)
        renamed = crash == "process" and failpoint == "epoch_file_before_dir_fsync"
        assert got.epochs == (NEW if renamed else OLD)


def test_memory_disk_a_write_that_finishes_is_durable_at_once() -> None:
    disk = MemoryDisk(random.Random(1))
    path = f"{ROOT}/epochFileCheckpoint"
    _seeded(disk, path)
    _file(disk, path).replace(NEW)
    assert _file(disk.crash(torn="torn-op"), path).epochs == NEW


# ------------------------------------------------ crash-safe writes, real disk
@pytest.mark.parametrize("failpoint", SAFE_POINTS)
def test_real_disk_a_process_killed_at_each_failpoint_leaves_the_old_or_the_new_list(
        tmp_path: Path, failpoint: str) -> None:
    path = str(tmp_path / "epochFileCheckpoint")
    _file(RealDisk(), path).replace(OLD)
    run_child("save", "--path", path, "--entries", entries_arg(NEW), failpoint=failpoint)
    got = _file(RealDisk(), path)
    # A kill keeps the OS's state: the rename happened at the last point.
    assert got.epochs == (NEW if failpoint == "epoch_file_before_dir_fsync" else OLD)
    assert got.loaded_from == "main" and not (tmp_path / f"epochFileCheckpoint{TMP_SUFFIX}"
                                              ).exists()
    run_child("save", "--path", path, "--entries", entries_arg(NEW))
    assert _file(RealDisk(), path).epochs == NEW


# ------------------------------------ --emulate rmq-epoch-in-place (the bug)
def test_emulated_a_kill_during_the_in_place_rewrite_leaves_an_empty_file_caught_by_the_count(
        tmp_path: Path) -> None:
    """RocketMQ's string2File truncates the file, then writes it: a kill in
    between leaves it empty on a real disk; the read falls back to .bak."""
    path = str(tmp_path / "epochFileCheckpoint")
    _file(RealDisk(), path, IN_PLACE).replace(OLD)
    assert not (tmp_path / f"epochFileCheckpoint{BAK_SUFFIX}").exists()  # first write: none
    run_child("save", "--path", path, "--entries", entries_arg(NEW), "--emulate",
              RMQ_EPOCH_IN_PLACE, failpoint="epoch_file_mid_overwrite")
    assert (tmp_path / "epochFileCheckpoint").read_bytes() == b""
    got = _file(RealDisk(), path, IN_PLACE)
    assert (got.epochs, got.loaded_from) == (OLD, "bak")
    assert got.note is not None and "cut short" in got.note


def test_emulated_a_kill_after_the_backup_copy_leaves_the_old_file_whole(tmp_path: Path
                                                                         ) -> None:
    """Killed between the .bak copy and the overwrite: the file is the old
    one, read as it is; the backup holds the same bytes."""
    path = str(tmp_path / "epochFileCheckpoint")
    _file(RealDisk(), path, IN_PLACE).replace(OLD)
    run_child("save", "--path", path, "--entries", entries_arg(NEW), "--emulate",
              RMQ_EPOCH_IN_PLACE, failpoint="epoch_file_before_overwrite")
    assert (tmp_path / f"epochFileCheckpoint{BAK_SUFFIX}").read_bytes() == encode(OLD)
    got = _file(RealDisk(), path, IN_PLACE)
    assert (got.epochs, got.loaded_from) == (OLD, "main")


@pytest.mark.parametrize("failpoint", ["epoch_file_before_overwrite",
                                       "epoch_file_mid_overwrite"])
def test_emulated_memory_disk_a_kill_at_each_failpoint_reads_the_old_list(failpoint: str
                                                                          ) -> None:
    """A kill keeps the page cache: at either point of the in-place
    rewrite the read finds the old list (from the file, or from .bak when
    the file was already emptied)."""
    disk = MemoryDisk(random.Random(2))
    disk.makedirs(ROOT)
    _file(disk, PATH, IN_PLACE).replace(OLD)
    assert run_crashing(lambda fp: _file(disk, PATH, IN_PLACE, fp).replace(NEW), failpoint)
    got = _file(disk, PATH, IN_PLACE)
    assert (got.epochs, got.loaded_from) == (
        OLD, "main" if failpoint == "epoch_file_before_overwrite" else "bak")


def _in_place_history(disk: MemoryDisk, path: str, write_back_bak: bool) -> None:
    """[1@0], then OLD, both written back by the kernel (a stand-in for its
    periodic write-back, which MemoryDisk does not model); then NEW in place,
    with the `.bak` copy written back before the overwrite when asked (the
    failpoint's stall seam runs the write-back there)."""
    disk.makedirs(ROOT)
    f = _file(disk, path, IN_PLACE)
    f.replace(E((1, 0)))
    f.replace(OLD)  # main: OLD, .bak: [1@0]
    _write_back(disk, path, path + BAK_SUFFIX)
    fp = Failpoints("epoch_file_before_overwrite=delay:0@1",
                    stall=lambda _s: _write_back(disk, path + BAK_SUFFIX)
                    if write_back_bak else None)
    _file(disk, path, IN_PLACE, fp).replace(NEW)  # no fsync: NEW is in the page cache only


def test_emulated_a_power_cut_tears_the_file_the_crc_catches_it_and_bak_answers() -> None:
    """No fsync anywhere: a power cut tears the rewrite in place. The torn
    file fails its count/CRC check, and the backup (written back before the
    overwrite) answers with the list before: the old one, never a mix."""
    for seed in range(10):
        disk = MemoryDisk(random.Random(seed))
        path = f"{ROOT}/epochFileCheckpoint"
        _in_place_history(disk, path, write_back_bak=True)
        after = disk.crash(torn="torn-op")
        with pytest.raises(EpochFileCorruptError):
            decode(after.read_file(path))
        got = _file(after, path, IN_PLACE)
        assert (got.epochs, got.loaded_from) == (OLD, "bak")
        # The same history, crash-safe: no torn file to catch.
        disk = MemoryDisk(random.Random(seed))
        disk.makedirs(ROOT)
        _file(disk, path).replace(OLD)
        _file(disk, path).replace(NEW)
        assert _file(disk.crash(torn="torn-op"), path).epochs == NEW


def test_emulated_a_power_cut_tearing_the_file_and_its_backup_leaves_no_epochs() -> None:
    """The backup rewritten in the same window tears too: both fail their
    checks, and RocketMQ's broker starts with no epochs (a new replica)."""
    disk = MemoryDisk(random.Random(5))
    path = f"{ROOT}/epochFileCheckpoint"
    _in_place_history(disk, path, write_back_bak=False)
    after = disk.crash(torn="torn-op")
    for p in (path, path + BAK_SUFFIX):
        with pytest.raises(EpochFileCorruptError):
            decode(after.read_file(p))
    got = _file(after, path, IN_PLACE)
    assert (got.epochs, got.loaded_from) == (EpochList(), "none")
    with pytest.raises(EpochFileError):
        _file(after, path)  # the safe reader refuses to guess


def test_emulated_with_nothing_written_back_a_power_cut_loses_the_file_a_new_replica() -> None:
    """Never fsynced, never the directory: a power cut leaves no epoch file
    and no backup; RocketMQ's broker then rejoins as a new replica and
    truncates nothing, keeping a tail the master never had."""
    disk = MemoryDisk(random.Random(3))
    path = f"{ROOT}/epochFileCheckpoint"
    disk.makedirs(ROOT)
    f = _file(disk, path, IN_PLACE)
    f.replace(OLD)
    f.replace(NEW)
    got = _file(disk.crash(), path, IN_PLACE)
    assert (got.epochs, got.loaded_from) == (EpochList(), "none")
    assert decide(got.epochs, 15000, E((1, 0), (2, 4096), (6, 8000)), 20000).kind \
        is RejoinKind.NEW_REPLICA
    # The same history, crash-safe: the list survives and the rule cuts at 8000.
    disk = MemoryDisk(random.Random(3))
    disk.makedirs(ROOT)
    _file(disk, path).replace(NEW)
    kept = _file(disk.crash(), path).epochs
    assert decide(kept, 15000, E((1, 0), (2, 4096), (6, 8000)), 20000).truncate_to == 8000


def _write_back(disk: MemoryDisk, *paths: str) -> None:
    for p in paths:
        f = disk.open(p)
        f.fsync()
        f.close()
    disk.fsync_dir(ROOT)


# ------------------- --emulate rmq-epoch-in-place under the power model, real disk
def _store_and_file(root: Path, emulate: frozenset[str]) -> tuple[MessageStore, EpochFile]:
    """A store under the power crash model (the default) with its epoch
    file in its root, as a controller-mode node keeps them."""
    store = MessageStore.open(str(root), TESTING)
    assert store.log.mark is not None
    return store, EpochFile(RealDisk(), str(root / FILE_NAME), emulate=emulate,
                            mark=store.log.mark)


def _die(store: MessageStore) -> None:
    """What a SIGKILL leaves of an open store in this process: its files
    closed without a flush or a close (`abort` and the mark stay), every
    write it made still in the page cache."""
    store.log.close()
    store.queues.close()
    store._executor.shutdown()
    store._lock.release()


@pytest.mark.parametrize("emulate", [frozenset(), IN_PLACE])
def test_real_disk_a_power_cut_takes_the_in_place_rewrites_and_keeps_the_safe_ones(
        tmp_path: Path, emulate: frozenset[str]) -> None:
    """The file created and rewritten, then the process dies and the
    harness cuts the power (store/log/durable_mark.py). A SIGKILL alone
    leaves both writes in the page cache; the cut takes what no fsync
    covered: in place, the file and its backup, so the next open has no
    epochs (a new replica). Written crash-safely, the list stands."""
    root = tmp_path / "s"
    store, f = _store_and_file(root, emulate)
    f.replace(OLD)
    f.replace(NEW)
    _die(store)
    main, bak = root / FILE_NAME, root / f"{FILE_NAME}{BAK_SUFFIX}"
    assert main.read_bytes() == encode(NEW)  # the page cache's copy, before the cut
    assert bak.exists() == bool(emulate)
    cut = power_cut(str(root))
    assert cut.applied
    got = _file(RealDisk(), str(main), emulate)
    if emulate:
        assert cut.files_removed == (FILE_NAME, f"{FILE_NAME}{BAK_SUFFIX}")
        assert cut.describe().endswith(f"{FILE_NAME}, {FILE_NAME}{BAK_SUFFIX} removed "
                                       "(created by writes without an fsync)")
        assert not main.exists() and not bak.exists()
        assert (got.epochs, got.loaded_from) == (EpochList(), "none")
    else:
        assert cut.files_restored == cut.files_removed == ()
        assert (got.epochs, got.loaded_from) == (NEW, "main")


def test_real_disk_a_power_cut_puts_the_in_place_files_back_as_the_open_found_them(
        tmp_path: Path) -> None:
    """What the node recorded before its first unsynced write of this life
    is what the cut restores, byte for byte: here the previous life's files,
    left by a clean close. The next open starts a fresh record."""
    root = tmp_path / "s"
    store, f = _store_and_file(root, IN_PLACE)
    f.replace(E((1, 0)))
    f.replace(OLD)  # the file OLD, its backup [1@0]
    store.close_sync()
    store, f = _store_and_file(root, IN_PLACE)
    assert f.epochs == OLD and read_unsynced_files(str(root)) is None  # nothing written yet
    f.replace(NEW)  # the file NEW, its backup OLD, neither fsynced
    assert read_unsynced_files(str(root)) == {FILE_NAME: encode(OLD),
                                              f"{FILE_NAME}{BAK_SUFFIX}": encode(E((1, 0)))}
    _die(store)
    assert power_cut(str(root)).files_restored == (FILE_NAME, f"{FILE_NAME}{BAK_SUFFIX}")
    assert (root / FILE_NAME).read_bytes() == encode(OLD)
    assert (root / f"{FILE_NAME}{BAK_SUFFIX}").read_bytes() == encode(E((1, 0)))
    store, f = _store_and_file(root, IN_PLACE)
    assert (f.epochs, f.loaded_from) == (OLD, "main")
    assert read_unsynced_files(str(root)) is None
    store.close_sync()
