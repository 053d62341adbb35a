"""The controller's state file and the core that writes it, on MemoryDisk
(a power cut keeps only what was fsynced) and a clock moved by hand: every
change is durable before `handle` returns, a crash leaves the old or the new
state, a failed write is not adopted, heartbeats (not persisted) write
nothing, and the liveness scan judges time by the clock it is given."""

from __future__ import annotations

import random

import pytest

from cluster.controller.core import ControllerCore, ControllerPersistError
from cluster.controller.state_file import (
    STATE_FILE,
    TMP_SUFFIX,
    ControllerStateFile,
    ControllerStateFileError,
)
from ha.controller.config import ControllerConfig
from ha.controller.messages import (
    AlterSyncStateSet,
    ElectMaster,
    Heartbeat,
    MasterDown,
    MasterElected,
    Register,
)
from ha.controller.persist import from_json
from ha.controller.state import ControllerState, Member
from store.sim.manual_clock import ManualClock
from store.sim.memory_disk import MemoryDisk

DIR = "/ctl"
PATH = f"{DIR}/{STATE_FILE}"
CONFIG = ControllerConfig(heartbeat_timeout_ms=1_000)


def _core(disk: MemoryDisk, clock: ManualClock) -> ControllerCore:
    f = ControllerStateFile(DIR, disk=disk)
    return ControllerCore(CONFIG, f, f.open(), clock=clock)


def _elected(disk: MemoryDisk, clock: ManualClock) -> ControllerCore:
    core = _core(disk, clock)
    for name in ("b1", "b2"):
        core.handle(Register(name))
    for b in (1, 2):
        core.handle(Heartbeat(broker_id=b, epoch=0, max_offset=0, confirmed_offset=0))
    core.handle(ElectMaster(requester=1))
    core.handle(AlterSyncStateSet(master=1, master_epoch=1, sync_state_set_epoch=1,
                                  new_set=frozenset({1, 2})))
    return core


def _reopened(disk: MemoryDisk) -> ControllerState:
    return ControllerStateFile(DIR, disk=disk).open()


def test_every_change_is_durable_when_handle_returns() -> None:
    disk, clock = MemoryDisk(random.Random(1)), ManualClock()
    core = _elected(disk, clock)
    after = _reopened(disk.crash())  # a power cut right after the last answer
    assert (after.master, after.master_epoch, after.sync_state_set,
            after.sync_state_set_epoch) == (1, 1, frozenset({1, 2}), 2)
    assert [m.name for m in after.members] == ["b1", "b2"]
    assert after == ControllerState(members=tuple(
        type(m)(m.name, m.broker_id) for m in core.state.members), next_id=3, master=1,
        master_epoch=1, sync_state_set=frozenset({1, 2}), sync_state_set_epoch=2)


def test_a_heartbeat_writes_nothing() -> None:
    disk, clock = MemoryDisk(random.Random(2)), ManualClock()
    core = _elected(disk, clock)
    before = disk.read_file(PATH)
    disk.fail_next_fsync(f"{PATH}{TMP_SUFFIX}")  # would fail any write
    core.handle(Heartbeat(broker_id=1, epoch=1, max_offset=10, confirmed_offset=10))
    assert disk.read_file(PATH) == before
    assert core.state.member(1).live.max_offset == 10  # type: ignore[union-attr]


def test_a_failed_write_is_not_adopted_and_the_file_keeps_the_old_state() -> None:
    disk, clock = MemoryDisk(random.Random(3)), ManualClock()
    core = _elected(disk, clock)
    old = core.state
    disk.fail_next_fsync(f"{PATH}{TMP_SUFFIX}")
    with pytest.raises(ControllerPersistError, match="cannot write its state file"):
        core.handle(Register("b3"))
    assert core.state == old
    assert from_json(disk.read_file(PATH).decode()).next_id == 3
    assert core.handle(Register("b3")).state.member_named("b3") is not None
    assert _reopened(disk.crash()).member_named("b3") is not None


@pytest.mark.parametrize("torn", [None, "torn-op", "torn-seq"])
@pytest.mark.parametrize("seed", range(4))
def test_a_crash_before_the_rename_leaves_the_old_state(seed: int, torn: str | None) -> None:
    """A power cut with a temp file written but not renamed (torn or not):
    the old state is read back whole and the temp file is removed."""
    disk, clock = MemoryDisk(random.Random(seed)), ManualClock()
    old = _elected(disk, clock).state
    tmp = disk.create(PATH + TMP_SUFFIX)
    tmp.pwrite(b'{"format": "dlab-controller-state", "vers', 0)
    tmp.close()
    after = disk.crash(torn=torn)
    got = _reopened(after)
    assert (got.master, got.master_epoch, got.sync_state_set_epoch, got.next_id) == (
        old.master, old.master_epoch, old.sync_state_set_epoch, old.next_id)
    assert not after.exists(PATH + TMP_SUFFIX)


def test_a_second_open_of_the_same_directory_is_refused() -> None:
    disk = MemoryDisk(random.Random(4))
    first = ControllerStateFile(DIR, disk=disk)
    first.open()
    with pytest.raises(ControllerStateFileError, match="another controller holds /ctl/lock"):
        ControllerStateFile(DIR, disk=disk).open()
    first.close()
    ControllerStateFile(DIR, disk=disk).open()


def test_the_liveness_scan_runs_on_the_given_clock() -> None:
    disk, clock = MemoryDisk(random.Random(5)), ManualClock()
    core = _elected(disk, clock)
    clock.advance(0.9)
    core.handle(Heartbeat(broker_id=2, epoch=1, max_offset=0, confirmed_offset=0))
    assert core.scan().decisions == ()  # the master's heartbeat is 0.9 s old
    clock.advance(0.2)
    decisions = core.scan().decisions
    assert isinstance(decisions[0], MasterDown) and decisions[0].broker_id == 1
    assert isinstance(decisions[1], MasterElected) and decisions[1].master == 2
    assert _reopened(disk.crash()).master == 2  # and it was written


def test_a_state_too_large_to_read_back_is_never_written() -> None:
    disk = MemoryDisk(random.Random(6))
    f = ControllerStateFile(DIR, disk=disk)
    f.open()
    n = 12_000
    big = ControllerState(members=tuple(Member(f"{i:064d}", i) for i in range(1, n + 1)),
                          next_id=n + 1)
    with pytest.raises(OSError, match="over the 1048576 a start reads"):
        f.save(big)
    assert not disk.exists(PATH)
