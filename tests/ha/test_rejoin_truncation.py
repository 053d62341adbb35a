"""A rejoining replica's truncation (ha/autoswitch/rejoin.py) carried out on
a real store and epoch file, crashed at every failpoint on its way: on a
real disk (a child process SIGKILLed by the failpoint) and on MemoryDisk (a
process kill, and a power cut). After the crash and the next open, the log
is the old one or cut exactly at the point, never cut elsewhere; every
record below the point is still there, byte for byte; the epoch file names
no record wrongly; and the retried handshake ends in the state a run
without the crash reaches. Plus rmq-10666 (memory-only truncation), left as
the known bug: after a crash the cut tail comes back beside an epoch file
that no longer names its epoch."""

from __future__ import annotations

import dataclasses
import os
import random
from pathlib import Path

import pytest
from support.epoch_helpers import entries_arg, run_child, run_crashing

from ha.autoswitch.epoch_file import FILE_NAME, EpochFile
from ha.autoswitch.epochs import EpochList
from ha.autoswitch.rejoin import RejoinKind, decide, recover, rejoin
from store.config import TESTING, StoreConfig
from store.emulate import RMQ_10666
from store.failpoints import Failpoints
from store.log.record import UNIQ_KEY, Message
from store.seams.disk import Disk, RealDisk
from store.sim.manual_clock import ManualClock
from store.sim.memory_disk import MemoryDisk
from store.store import MessageStore

E = EpochList.of
ROOT = "/sim/replica"
# Every failpoint the truncation passes, in order: the CommitLog's cut
# (header zeroed and synced, the rest not yet cleared), the consume queues'
# cut, between the store and the epoch file, and the epoch file's write.
POINTS = ["recovery_truncate", "consume_queue_truncate", "rejoin_after_log_cut",
          "epoch_file_before_fsync", "epoch_file_before_rename",
          "epoch_file_before_dir_fsync"]
EPOCH_1_RECORDS, EPOCH_2_RECORDS, MASTER_EPOCH_1_RECORDS = 120, 80, 90


@dataclasses.dataclass(frozen=True)
class Replica:
    """A replica that was master in epoch 2 (records the master never got)
    rejoining a master whose epoch 1 ended earlier, at `point`."""

    records: list[tuple[int, str | None, bytes]]  # (offset, msg id, body), all of them
    wrote: int
    epochs: EpochList
    master: EpochList
    master_end: int
    point: int


def _messages(prefix: str, n: int) -> list[Message]:
    return [Message("Rejoin", f"{prefix}{i:04d};".encode() * 150, {UNIQ_KEY: f"{prefix}{i:04d}"},
                    queue_id=i % 3) for i in range(n)]


def _open(disk: Disk, root: str, failpoints: Failpoints | None = None,
          config: StoreConfig = TESTING) -> MessageStore:
    return MessageStore.open(root, config, clock=ManualClock(), disk=disk,
                             failpoints=failpoints)


def _records(store: MessageStore) -> list[tuple[int, str | None, bytes]]:
    return [(r.offset, r.msg_id, bytes(r.body)) for r in store.log.iter_records()]


def _queues(store: MessageStore) -> dict[tuple[str, int], list[tuple[int, int, int]]]:
    store.reput()
    out = {}
    for (topic, qid), q in sorted(store.queues.queues.items()):
        out[(topic, qid)] = [q.unit(i) for i in range(q.count)]
    return out


def make_replica(disk: Disk, root: str) -> Replica:
    """Write the replica: epoch 1's records, then epoch 2's (over several
    segments), dispatched and closed cleanly; its epoch file [1@0, 2@x]."""
    disk.makedirs(root)
    store = _open(disk, root)
    try:
        first = store.log.append(_messages("a", EPOCH_1_RECORDS))
        second = store.log.append(_messages("b", EPOCH_2_RECORDS))
        store.log.flush()
        store.reput()
        records, wrote = _records(store), store.log.wrote
        assert len(store.log.segments) >= 3
    finally:
        store.close_sync()
    epochs = E((1, 0), (2, second[0].offset))
    EpochFile(disk, os.path.join(root, FILE_NAME)).replace(epochs)
    point = first[MASTER_EPOCH_1_RECORDS].offset  # the master's epoch 1 ended here
    master = E((1, 0), (3, point))
    return Replica(records, wrote, epochs, master, point + 50_000, point)


def _rejoin(disk: Disk, root: str, r: Replica, failpoints: Failpoints,
            opened: list[MessageStore], config: StoreConfig = TESTING) -> None:
    """What the replica does at open and handshake (the child's `rejoin`)."""
    store = _open(disk, root, failpoints, config)
    opened.append(store)
    epochs = EpochFile(disk, os.path.join(root, FILE_NAME), failpoints=failpoints,
                       emulate=config.emulate)
    recover(store, epochs)
    rejoin(store, epochs, r.master, r.master_end)
    store.close_sync()


def _killed(store: MessageStore) -> None:
    """What a SIGKILL leaves of an open store in this process: files closed
    without a flush or a close; `abort` stays."""
    store.log.close()
    store.queues.close()
    store._executor.shutdown()
    store._lock.release()


WRITTEN_IN = {"a": 1, "b": 2}


def _epoch_at(epochs: EpochList, offset: int) -> int | None:
    """The epoch the file says wrote the record at `offset`."""
    return max((e.epoch for e in epochs.entries if e.start_offset <= offset), default=None)


def check_recovered(disk: Disk, root: str, r: Replica) -> tuple[int, EpochList]:
    """Open after the crash: the log is whole or cut exactly at the point,
    every record below the point is there byte for byte, the consume queues
    hold a unit for each record and none past the log, and the epoch file
    (recovered to the log) names for each record the epoch that wrote it.
    Returns the log's end and the epochs."""
    store = _open(disk, root)
    try:
        epochs = EpochFile(disk, os.path.join(root, FILE_NAME))
        recover(store, epochs)
        got = _records(store)
        wrote = store.log.wrote
        queues = _queues(store)
    finally:
        store.close_sync()
    assert wrote in (r.wrote, r.point), (wrote, r.wrote, r.point)
    below = [rec for rec in r.records if rec[0] < r.point]
    assert got[:len(below)] == below  # no record below the point lost
    assert got == (r.records if wrote == r.wrote else below)  # a tail whole or gone
    assert epochs.epochs in (r.epochs, r.epochs.truncate_from(r.point)), epochs.epochs
    assert all(e.start_offset <= wrote for e in epochs.epochs.entries)
    for offset, msg_id, _ in got:  # each record in the epoch that wrote it ("a": 1, "b": 2)
        assert msg_id is not None
        assert _epoch_at(epochs.epochs, offset) == WRITTEN_IN[msg_id[0]], (offset, msg_id)
    units = sum(len(u) for u in queues.values())
    assert units == len(got), (units, len(got))  # a unit per record, none past the log
    assert all(off < wrote for u in queues.values() for off, _size, _tag in u)
    return wrote, epochs.epochs


def finish_and_compare(disk: Disk, root: str, r: Replica, expected: dict[str, object]) -> None:
    """The retried handshake decides the same point and ends where a run
    without the crash ends."""
    store = _open(disk, root)
    try:
        epochs = EpochFile(disk, os.path.join(root, FILE_NAME))
        recover(store, epochs)
        decision = rejoin(store, epochs, r.master, r.master_end)
        assert (decision.kind, decision.truncate_to) == (RejoinKind.TRUNCATE, r.point)
        state = {"wrote": store.log.wrote, "records": _records(store),
                 "queues": _queues(store), "epochs": epochs.epochs}
    finally:
        store.close_sync()
    assert state == expected


def clean_result(disk: Disk, root: str, r: Replica) -> dict[str, object]:
    opened: list[MessageStore] = []
    _rejoin(disk, root, r, Failpoints(), opened)
    store = _open(disk, root)
    try:
        epochs = EpochFile(disk, os.path.join(root, FILE_NAME))
        return {"wrote": store.log.wrote, "records": _records(store),
                "queues": _queues(store), "epochs": epochs.epochs}
    finally:
        store.close_sync()


# ----------------------------------------------------------------- the rule
def test_the_setup_decides_a_cut_inside_the_replicas_epoch_1() -> None:
    """The rule on this setup: epoch 2 is not the master's; epoch 1 is, with
    the same start; it ends earlier on the master: cut there."""
    r = make_replica(MemoryDisk(random.Random(1)), ROOT)
    d = decide(r.epochs, r.wrote, r.master, r.master_end)
    assert (d.kind, d.truncate_to, d.epochs_after) == (RejoinKind.TRUNCATE, r.point, E((1, 0)))
    assert r.epochs.last is not None and r.point < r.epochs.last.start_offset < r.wrote


def test_a_clean_rejoin_cuts_the_log_its_queues_and_its_epoch_file(tmp_path: Path) -> None:
    disk, root = RealDisk(), str(tmp_path / "replica")
    r = make_replica(disk, root)
    result = clean_result(disk, root, r)
    assert result["wrote"] == r.point
    assert result["records"] == [rec for rec in r.records if rec[0] < r.point]
    assert result["epochs"] == E((1, 0))
    assert sum(len(u) for u in result["queues"].values()) == MASTER_EPOCH_1_RECORDS  # type: ignore[attr-defined]


# ------------------------------------------------------------ on MemoryDisk
@pytest.mark.parametrize("failpoint", POINTS)
@pytest.mark.parametrize("crash", ["process", "power"])
def test_memory_disk_a_crash_at_each_failpoint_of_the_truncation_recovers_and_finishes(
        failpoint: str, crash: str) -> None:
    disk, root = _fresh()
    r = make_replica(disk, root)
    expected = clean_result(*_fresh_copy(r), r)
    opened: list[MessageStore] = []
    assert run_crashing(lambda fp: _rejoin(disk, root, r, fp, opened), failpoint)
    if crash == "process":
        _killed(opened[-1])
        after = disk
    else:
        opened[-1]._executor.shutdown()
        after = disk.crash()
    wrote, _ = check_recovered(after, root, r)
    # Every failpoint lies past the store's first durable step (the header
    # at the cut, zeroed and fsynced): the log is cut at the point.
    assert wrote == r.point
    finish_and_compare(after, root, r, expected)


def _fresh() -> tuple[MemoryDisk, str]:
    return MemoryDisk(random.Random(7)), ROOT


def _fresh_copy(r: Replica) -> tuple[MemoryDisk, str]:
    disk, root = _fresh()
    assert make_replica(disk, root) == r  # deterministic: the same replica
    return disk, root


# ------------------------------------------------------------ on a real disk
@pytest.mark.parametrize("failpoint", POINTS)
def test_real_disk_a_process_killed_at_each_failpoint_of_the_truncation_recovers_and_finishes(
        tmp_path: Path, failpoint: str) -> None:
    disk, root = RealDisk(), str(tmp_path / "replica")
    r = make_replica(disk, root)
    clean_root = str(tmp_path / "clean")
    assert make_replica(RealDisk(), clean_root).records == r.records
    expected = clean_result(RealDisk(), clean_root, r)
    run_child("rejoin", "--dir", root, "--master", entries_arg(r.master),
              "--master-end", str(r.master_end), failpoint=failpoint)
    wrote, _ = check_recovered(disk, root, r)
    assert wrote == r.point
    finish_and_compare(disk, root, r, expected)


# ------------------------------------------- rmq-10666: the known bug stays
@pytest.mark.parametrize("emulate", [frozenset(), frozenset({RMQ_10666})])
def test_rmq_10666_a_crash_after_the_rejoin_brings_the_cut_tail_back_as_epoch_1s(
        emulate: frozenset[str]) -> None:
    """The master kept writing epoch 1 past where the replica's epoch 2
    began, so the rule cuts the replica at its epoch 2's start. A kill after
    the rejoin (before anything overwrote the cut tail): the fixed store
    reopens cut there; with rmq-10666 epoch 2's records come back, beside an
    epoch file that no longer names epoch 2, so they pass for epoch 1's and
    the next handshake keeps records the master never had."""
    disk, root = _fresh()
    r = make_replica(disk, root)
    assert r.epochs.last is not None
    epoch_2_start = r.epochs.last.start_offset
    master, master_end = E((1, 0), (3, r.wrote + 9000)), r.wrote + 20_000
    config = TESTING.with_(emulate=emulate)
    store = _open(disk, root, config=config)
    epochs = EpochFile(disk, os.path.join(root, FILE_NAME))
    assert rejoin(store, epochs, master, master_end).truncate_to == epoch_2_start
    _killed(store)
    store = _open(disk, root, config=config)
    try:
        epochs = EpochFile(disk, os.path.join(root, FILE_NAME))
        recover(store, epochs)
        wrote = store.log.wrote
        again = decide(epochs.epochs, wrote, master, master_end)
    finally:
        store.close_sync()
    assert epochs.epochs == E((1, 0))
    if emulate:
        # The cut tail is back (the segment holding the cut; later ones were
        # removed), CRCs and all, and the next handshake keeps it.
        assert epoch_2_start < wrote < r.wrote
        assert again.truncate_to == wrote
    else:
        assert wrote == epoch_2_start and again.truncate_to == epoch_2_start
