"""`dlab chaos selftest` and the defects it plants (store/emulate.py,
planted-*): the list names every planted switch; each switch really changes
what a node does, shown at the store or HA level on the disk (a MemoryDisk
crashed at the bad moment, a flipped byte under tmp_path) or in the
decision a put waits for; and a small selftest on the sim produces the
catch table and catches planted-ack-before-fsync."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

import pytest
from support.ha_helpers import running_cluster, send_n, slave_link, status, wait_until
from support.store_helpers import message

from chaos.cli import main
from cluster.node.role import Role
from ha.config import HAConfig
from ha.frames import RangeFrame
from ha.session import SlaveSession
from ha.slave import HASlave, StreamEnded
from ha.sync_master import SyncMasterRules, plan_replica_wait
from store.config import TESTING, CrashModel, FlushMode, StoreConfig
from store.emulate import (
    PLANTED,
    PLANTED_ACK_BEFORE_FSYNC,
    PLANTED_CHECKPOINT_BEFORE_FLUSH,
    PLANTED_DISPATCH_BEFORE_DURABLE,
    PLANTED_RECOVERY_SKIPS_CRC,
    PLANTED_SLAVE_WRONG_OFFSET,
    PLANTED_STALE_ACK,
)
from store.failpoints import DISARMED
from store.log.commitlog import StoreFailedError
from store.log.opening import StoreOpenError
from store.log.record import V4_FIXED_SIZE, CorruptRecordError, decode
from store.seams.disk import Disk, RealDisk
from store.sim.manual_clock import ManualClock
from store.sim.memory_disk import MemoryDisk
from store.status import PutResult, PutStatus
from store.store import MessageStore

ROOT = "/sim/store"
SYNC = TESTING.with_(flush_mode=FlushMode.SYNC_FLUSH, crash_model=CrashModel.POWER)
ASYNC = TESTING.with_(flush_mode=FlushMode.ASYNC_FLUSH)


def _open(disk: Disk, root: str, config: StoreConfig) -> MessageStore:
    return MessageStore.open(root, config, clock=ManualClock(), disk=disk)


def _with(config: StoreConfig, switch: str | None) -> StoreConfig:
    return config.with_(emulate=frozenset({switch} if switch else ()))


def _append(s: MessageStore, lo: int, hi: int) -> None:
    results = s.append([message(i) for i in range(lo, hi)])
    assert all(r.status is PutStatus.PUT_OK for r in results)


def _ids(s: MessageStore) -> list[str | None]:
    return [r.msg_id for r in s.log.iter_records()]


class _AtFsync:
    """Failpoints stand-in: at the first pass through `name`, run `act`
    (the flush's own hook points, store/log/commitlog.py flush)."""

    def __init__(self, name: str, act: Any) -> None:
        self.name, self.act, self.done = name, act, False

    def hit(self, name: str, **_: Any) -> None:
        if name == self.name and not self.done:
            self.done = True
            self.act()


# ------------------------------------------------------------ --list --json
def test_list_json_names_every_planted_defect(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["chaos", "selftest", "--list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert {d["id"] for d in listed} == set(PLANTED)
    for d in listed:
        assert d["breaks"] and d["modes"] and d["switch"] == PLANTED[d["id"]]


def test_help_documents_the_exit_status(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["chaos", "selftest", "--help"])
    assert exc.value.code == 0
    assert "exit status:" in capsys.readouterr().out


def test_bad_input_is_a_usage_error_naming_the_fix(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["chaos", "selftest", "--defect", "planted-nothing", "--out", "x"]) == 2
    assert "planted-nothing" in capsys.readouterr().err
    assert main(["chaos", "selftest", "--scenarios", "bit-flip", "--out", "x"]) == 2
    assert "main job's default scenarios" in capsys.readouterr().err
    assert main(["chaos", "selftest"]) == 2
    assert "--out" in capsys.readouterr().err


# ------------------------------------------------ each switch changes the node
@pytest.mark.parametrize("switch", [None, PLANTED_ACK_BEFORE_FSYNC])
def test_ack_before_fsync_counts_flushed_what_a_crash_takes(switch: str | None) -> None:
    disk = MemoryDisk(random.Random(1))
    s = _open(disk, ROOT, _with(SYNC, switch))
    _append(s, 0, 50)
    flushed = s.log.flush()
    assert flushed == s.log.wrote  # what SYNC_FLUSH acknowledges
    after = _open(disk.crash(), ROOT, SYNC)
    survived = len(_ids(after))
    after.close_sync()
    assert survived == (0 if switch else 50)


@pytest.mark.parametrize("switch", [None, PLANTED_CHECKPOINT_BEFORE_FLUSH])
def test_checkpoint_before_flush_vouches_for_bytes_a_crash_took(switch: str | None) -> None:
    """A crash just before the commit log's fsync: the fixed store recovers
    the 20 records of its first life; with the switch the durable checkpoint
    names the next 30 as flushed, and recovery refuses the store as holding
    corrupted flushed data."""
    disk = MemoryDisk(random.Random(2))
    # A store's first life: its checkpoint file's directory entry is made
    # durable by the clean close (before it, a crash loses the file).
    first = _open(disk, ROOT, SYNC)
    _append(first, 0, 20)
    first.close_sync()
    s = _open(disk, ROOT, _with(SYNC, switch))
    _append(s, 20, 50)
    crashed: list[MemoryDisk] = []
    s.log.failpoints = _AtFsync("before_flush_sync",  # type: ignore[assignment]
                                lambda: crashed.append(disk.crash()))
    with pytest.raises(StoreFailedError, match="disk crashed"):  # the process is gone
        s.log.flush()
    if switch is None:
        after = _open(crashed[0], ROOT, SYNC)
        assert len(_ids(after)) == 20
        after.close_sync()
    else:
        with pytest.raises(StoreOpenError, match="flushed"):
            _open(crashed[0], ROOT, SYNC)


@pytest.mark.parametrize("switch", [None, PLANTED_DISPATCH_BEFORE_DURABLE])
def test_dispatch_before_durable_serves_what_the_flush_has_not_synced(
        switch: str | None) -> None:
    """During a flush's fsync, under SYNC_FLUSH: the fixed store serves
    consumers the 20 records flushed before; with the switch also the 30
    that fsync has not made durable."""
    disk = MemoryDisk(random.Random(3))
    s = _open(disk, ROOT, _with(SYNC, switch))
    _append(s, 0, 20)
    s.log.flush()
    _append(s, 20, 50)
    served: list[int] = []

    def consume() -> None:
        r = s.get_messages("TopicTest", 0, 0, max_count=100)
        served.append(len(r.messages))

    s.log.failpoints = _AtFsync("before_flush_sync", consume)  # type: ignore[assignment]
    s.log.flush()
    s.close_sync()
    assert served == [50 if switch else 20]


def _flip_body_byte(root: str, record_offset: int) -> None:
    path = os.path.join(root, "commitlog", f"{0:020d}")
    with open(path, "r+b") as f:
        at = record_offset + V4_FIXED_SIZE + 10  # inside the body (200 bytes)
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0x01]))


@pytest.mark.parametrize("switch", [None, PLANTED_RECOVERY_SKIPS_CRC])
def test_recovery_skipping_the_crc_keeps_a_damaged_body(tmp_path: Path,
                                                        switch: str | None) -> None:
    """A byte flipped inside a flushed record's body (a scratch store under
    tmp_path): the fixed recovery refuses the store; with the switch it
    opens and serves the damaged body as valid."""
    root = str(tmp_path / "store")
    config = _with(ASYNC, switch)
    s = _open(RealDisk(), root, config)
    _append(s, 0, 20)
    s.log.flush()
    victim = list(s.log.iter_records())[10]
    s.close_sync()
    _flip_body_byte(root, victim.offset)
    if switch is None:
        with pytest.raises(StoreOpenError, match="crc"):
            _open(RealDisk(), root, config)
        return
    after = _open(RealDisk(), root, config)
    try:
        assert after.log.wrote == s.log.wrote  # every record kept, the damaged one too
        kept = decode(after.log.read(victim.offset, victim.size), 0, check_crc=False)
        assert kept.msg_id == victim.msg_id and kept.body != victim.body
        with pytest.raises(CorruptRecordError, match="crc"):  # served as valid, is not
            after.log.read_record(victim.offset)
    finally:
        after.close_sync()


@pytest.mark.parametrize("switch", [None, PLANTED_SLAVE_WRONG_OFFSET])
def test_slave_applies_a_range_at_a_wrong_offset(switch: str | None) -> None:
    """A slave holding records 0-9 gets the master's range that starts at
    record 12. The fixed slave ends the stream and appends nothing; with
    the switch its log holds record 12 where the master holds record 10."""
    master = _open(MemoryDisk(random.Random(4)), ROOT, ASYNC)
    _append(master, 0, 20)
    recs = list(master.log.iter_records())
    slave_store = _open(MemoryDisk(random.Random(5)), ROOT, ASYNC)
    data, _ = master.log.read_range(0, recs[10].offset)
    slave_store.log.append_raw(0, data)
    ha = HAConfig(emulate=frozenset({switch} if switch else ()))
    slave = HASlave(slave_store, name="s1", master_address="127.0.0.1:1", token="t",
                    config=ha, clock=ManualClock(), failpoints=DISARMED)
    session = SlaveSession(slave_store.log.wrote, ha, now_s=0.0)
    shipped, _ = master.log.read_range(recs[12].offset, recs[13].offset - recs[12].offset)
    frame = RangeFrame(offset=recs[12].offset, data=shipped, master_wrote=master.log.wrote)
    if switch is None:
        with pytest.raises(StreamEnded, match="max offset"):
            slave._on_range(session, frame, 0.0)
        assert slave_store.log.wrote == recs[10].offset
    else:
        slave._on_range(session, frame, 0.0)
        # On the slave's disk: record 12's bytes (PHYSICALOFFSET and all)
        # where the master holds record 10.
        landed = decode(slave_store.log.read(recs[10].offset, recs[12].size), 0)
        assert landed.msg_id == recs[12].msg_id != recs[10].msg_id
        assert landed.offset == recs[12].offset  # its PHYSICALOFFSET field
    master.close_sync()
    slave_store.close_sync()


@pytest.mark.parametrize("switch", [None, PLANTED_STALE_ACK])
def test_stale_ack_answers_a_put_from_an_ack_that_predates_it(switch: str | None) -> None:
    """Three puts appended at [1000, 1300): the slave has acked 1000 (the
    log's end before them). The fixed master waits for an ack of 1300;
    with the switch the wait is for 1000, which the stale ack meets."""
    rules = SyncMasterRules.of(HAConfig(emulate=frozenset({switch} if switch else ())),
                               sync_master=True)
    results = [PutResult(PutStatus.PUT_OK, offset=1000 + 100 * i, size=100, msg_id=f"m{i}")
               for i in range(3)]
    plan = plan_replica_wait(results, best_acked=1000, rules=rules)
    assert plan.wait_end == (1000 if switch else 1300)
    assert (plan.wait_end <= 1000) is (switch is not None)  # met by the ack already in


@pytest.mark.slow
@pytest.mark.parametrize("switch", [None, PLANTED_STALE_ACK])
def test_stale_ack_on_the_wire_a_paused_slave_and_a_put_ok(tmp_path: Path,
                                                          switch: str | None) -> None:
    """Real processes: a SYNC_MASTER whose only slave is paused (SIGSTOP).
    The fixed master answers the next put FLUSH_SLAVE_TIMEOUT after the
    slave timeout; with the switch it answers PUT_OK at once, from the
    ack the slave sent before the put, which its acked offset shows."""
    extra = ("--ha-housekeeping-ms", "30000", "--slave-timeout-ms", "3000")
    extra += ("--emulate", switch) if switch else ()
    with running_cluster(str(tmp_path), role=Role.SYNC_MASTER, extra=extra,
                         connected=True) as (b, tok):
        assert {o.status for o in send_n(b, tok, 3, timeout_s=30)} == {"PUT_OK"}
        wait_until(lambda: slave_link(b, tok).get("acked", 0) >= _master_end(b, tok), 30,
                   "the slave acks the first puts")
        b.pause("slave1")
        try:
            (out,) = send_n(b, tok, 1, prefix="paused", timeout_s=30)
            acked = slave_link(b, tok)["acked"]
        finally:
            b.resume("slave1")
    if switch is None:
        assert out.status == "FLUSH_SLAVE_TIMEOUT"
    else:
        assert out.status == "PUT_OK"
        assert acked < (out.offset or 0) + (out.size or 0)  # no slave held it


def _master_end(b: Any, tok: str) -> int:
    """The master's written end, from its status."""
    return int(status(b, tok, "master")["wrote"])


# ------------------------------------------------------- a small selftest run
@pytest.mark.slow
@pytest.mark.timeout(900)  # 8 sim runs of 60 s of cluster time: 1-4 min on a loaded machine
def test_a_small_selftest_on_the_sim_catches_ack_before_fsync(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "st"
    rc = main(["chaos", "selftest", "--out", str(out), "--runs", "2",
               "--defect", PLANTED_ACK_BEFORE_FSYNC, "--scenarios", "master-crash"])
    text = capsys.readouterr().out
    assert "[1/8]" in text and "[8/8]" in text  # progress: 2 modes x 2 seeds, and baselines
    table = json.loads((out / "selftest.json").read_text())
    (row,) = table["rows"]
    assert row["defect"] == PLANTED_ACK_BEFORE_FSYNC
    assert row["caught"] >= 1 and row["with_switch"] == 4
    assert row["false_positives"] == 0 and row["without_switch"] == 4
    assert row["best"].startswith("master-crash @ ")
    assert rc == 0
    assert "planted-ack-before-fsync" in text and "CAUGHT" in text


@pytest.mark.slow
@pytest.mark.timeout(600)  # 4 sim runs of 15 s of cluster time
def test_the_mid_flush_crash_catches_checkpoint_before_flush(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The main job's crash inside a flush (master-crash-mid-flush): with the
    switch the restarted master finds its checkpoint vouching for bytes the
    crash took and refuses its store; without it every run is clean."""
    out = tmp_path / "st"
    rc = main(["chaos", "selftest", "--out", str(out), "--runs", "1",
               "--defect", PLANTED_CHECKPOINT_BEFORE_FLUSH,
               "--scenarios", "master-crash-mid-flush"])
    capsys.readouterr()
    table = json.loads((out / "selftest.json").read_text())
    (row,) = table["rows"]
    assert row["known_miss"] is None
    assert row["caught"] >= 1 and row["with_switch"] == 2
    assert row["false_positives"] == 0 and row["without_switch"] == 2
    assert row["best"].startswith("master-crash-mid-flush @ ")
    assert rc == 0
    caught = [r for r in table["runs"] if r["defect"] and any(r["signals"].values())]
    for r in caught:  # on disk: the refusal names the checkpoint's flushed end
        faults = [json.loads(line) for line in
                  (Path(r["run_dir"]) / "faults.jsonl").read_text().splitlines()]
        (refused,) = [f for f in faults if f["kind"] == "refused"]
        assert refused["node"] == "master"
        assert "the checkpoint records every byte below offset" in refused["detail"]
