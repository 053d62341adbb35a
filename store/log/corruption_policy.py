"""The corruption policy at open: corruption of flushed data found by
recovery is refused, truncated or repaired from a replica (REFUSE,
TRUNCATE, REPAIR: store/config.py CorruptionPolicy).

`recover` plans recovery over the segments (store/log/recovery.py decides) and
applies the policy; the caller (MessageStore.open) applies the plan.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
from collections.abc import Callable
from typing import Any

from store.config import CorruptionPolicy, StoreConfig
from store.emulate import PLANTED_RECOVERY_SKIPS_CRC
from store.failpoints import DISARMED, Failpoints
from store.log.checkpoint import Checkpoint, lower_checkpoint
from store.log.opening import StoreOpenError
from store.log.record import CorruptRecordError
from store.log.recovery import Damage, DamageKind, RecoveryPlan, plan_recovery, verify_range
from store.log.segments import Segment, segment_name
from store.seams.disk import Disk

_log = logging.getLogger("dlab.store")


class CorruptionRefusedError(StoreOpenError):
    """Recovery found corruption of flushed data and the corruption policy
    (or a failed repair) refuses to open; nothing in the directory was
    changed. `damage` holds the figures."""

    def __init__(self, message: str, damage: Damage) -> None:
        super().__init__(message)
        self.damage = damage


class RepairUnavailableError(RuntimeError):
    """No replica could provide a damaged range (the message says why)."""


# Fetches [offset, end) of the CommitLog from a replica: whole records from
# `offset`, at most up to `end` (fewer when the replica holds less). Raises
# RepairUnavailableError. The node implements it over gRPC (cluster/repair.py).
RepairSource = Callable[[int, int], bytes]
# Repairs one open may make before it gives up (each fixes one damaged range).
MAX_REPAIRS = 64


def _plan(starts: list[int], segments: list[Segment], seg_size: int, *, abnormal: bool,
          checkpoint: Checkpoint | None, checkpoint_problem: str | None,
          check_crc: bool = True) -> RecoveryPlan:
    """plan_recovery over the segments' files, mapped read-only."""
    maps: dict[int, mmap.mmap] = {}

    def read(start: int) -> memoryview:
        if start not in maps:
            seg = next(s for s in segments if s.start == start)
            if seg.file.size() == 0:  # a short last segment, not yet extended
                return memoryview(b"")
            maps[start] = seg.file.map()
        return memoryview(maps[start])

    try:
        return plan_recovery(starts, read, seg_size=seg_size, abnormal=abnormal,
                             checkpoint=checkpoint, checkpoint_problem=checkpoint_problem,
                             check_crc=check_crc)
    finally:
        for m in maps.values():
            with contextlib.suppress(BufferError):
                m.close()


def recover(
    path: str,
    starts: list[int],
    segments: list[Segment],
    config: StoreConfig,
    *,
    abnormal: bool,
    checkpoint: Checkpoint | None,
    checkpoint_problem: str | None,
    repair_source: RepairSource | None,
    failpoints: Failpoints = DISARMED,
    disk: Disk,
) -> tuple[RecoveryPlan, Checkpoint | None, dict[str, Any]]:
    """Plan recovery and apply the corruption policy to corruption of flushed
    data. Returns the plan to apply (a torn tail, or the damage TRUNCATE
    accepts to cut), the checkpoint to continue from, and the recovery
    report's corruption fields.

    Ordering: REFUSE raises before any byte changes. REPAIR writes only
    ranges a replica returned and that verified (CRC, PHYSICALOFFSET, whole
    records ending where valid data resumes), fsyncs each BEFORE planning
    again; a crash mid-write leaves a range that fails its CRC, found and
    repaired again on the next open. TRUNCATE lowers the checkpoint to the
    last good record durably BEFORE the cut, so that no later recovery takes
    the (stale) checkpoint as a claim that data past the cut was flushed."""
    seg_size = config.segment_size_bytes
    policy = config.corruption_policy
    repaired: list[tuple[int, int]] = []
    for _ in range(MAX_REPAIRS + 1):
        plan = _plan(starts, segments, seg_size, abnormal=abnormal, checkpoint=checkpoint,
                     checkpoint_problem=checkpoint_problem,
                     check_crc=PLANTED_RECOVERY_SKIPS_CRC not in config.emulate)
        damage = plan.damage
        if damage is None or damage.kind is DamageKind.TAIL:
            fields: dict[str, Any] = {}
            if repaired:
                fields = {"corruption_action": "repaired", "repaired_ranges": repaired,
                          "corruption": f"{len(repaired)} damaged range(s) of flushed data "
                          "repaired from a replica: " + ", ".join(
                              f"[{a}, {b})" for a, b in repaired)}
            return plan, checkpoint, fields
        what = damage.describe(segment_name)
        if policy is CorruptionPolicy.TRUNCATE:
            _log.error("store %s: %s; corruption policy truncate: cutting at %d, %d valid "
                       "record(s) (%d bytes) past it are lost", path, what, damage.offset,
                       damage.records_past, damage.bytes_lost)
            if checkpoint is not None:
                checkpoint = lower_checkpoint(disk, os.path.join(path, "checkpoint"),
                                              checkpoint, plan.last_store_timestamp_ms or 0,
                                              end=plan.max_valid_offset)
            return plan, checkpoint, {
                "corruption": what, "corruption_action": "truncated",
                "records_lost": damage.records_past, "bytes_lost": damage.bytes_lost,
                "repaired_ranges": repaired}
        if policy is CorruptionPolicy.REFUSE:
            raise CorruptionRefusedError(_refusal(path, what, damage, repaired), damage)
        if repair_source is None:
            raise CorruptionRefusedError(
                _refusal(path, what, damage, repaired, "no replica is configured to repair "
                         "from"), damage)
        try:
            _repair(damage, segments, seg_size, repair_source, failpoints)
        except (RepairUnavailableError, CorruptRecordError) as exc:
            raise CorruptionRefusedError(
                _refusal(path, what, damage, repaired, f"repair failed: {exc}"), damage) from None
        except OSError as exc:
            raise CorruptionRefusedError(
                _refusal(path, what, damage, repaired, f"writing the repaired range failed: "
                         f"{exc.strerror or exc}"), damage) from None
        end = damage.resume_offset if damage.resume_offset is not None else damage.offset
        _log.warning("store %s: %s; repaired [%d, %d) from a replica (CRC-verified)",
                     path, what, damage.offset, end)
        if repaired and repaired[-1][0] == damage.offset:
            raise CorruptionRefusedError(
                _refusal(path, what, damage, repaired, "the range was repaired once and is "
                         "still damaged"), damage)
        repaired.append((damage.offset, end))
    assert damage is not None
    raise CorruptionRefusedError(
        _refusal(path, what, damage, repaired, f"more than {MAX_REPAIRS} damaged ranges"), damage)


def _refusal(path: str, what: str, damage: Damage, repaired: list[tuple[int, int]],
             why: str | None = None) -> str:
    text = f"store {path} refused to open: {what}."
    if why:
        text += f" Repair was not possible: {why}."
    # Say exactly what changed: only ranges repaired from a replica (whole
    # records that verified) were written.
    unchanged = " Nothing was changed."
    if repaired:
        unchanged = (f" {len(repaired)} earlier damaged range(s) were repaired in place from "
                     "a replica (CRC-verified records): " + ", ".join(
                         f"[{a}, {b})" for a, b in repaired) + "; nothing else was changed.")
    repair = ("repair the range from a replica that holds it (start again with "
              "--corruption-policy repair: `dlab cluster start NODE --corruption-policy "
              "repair`; `dlab node` repairs a master from its --repair-from replicas, a slave "
              "from its master)")
    if damage.note is not None and damage.records_past == 0:
        # Nothing valid lies past it: the damage may be no loss at all (a
        # clock that stepped back), and truncating then costs nothing.
        return text + (
            f"{unchanged} No valid record lies past it on this disk. If the clock "
            "stepped back, nothing is lost: start again with --corruption-policy truncate, "
            f"which cuts at {damage.offset} (the end of the records found) and drops "
            f"nothing found on this disk. If records were lost, {repair}.")
    return text + (
        f"{unchanged} Two ways on: {repair}, or accept the loss and start again "
        "with --corruption-policy truncate (RocketMQ's behaviour: cuts at "
        f"{damage.offset}, losing {damage.bytes_lost} bytes, with the {damage.records_past} "
        "valid record(s) still among them).")


def _repair(damage: Damage, segments: list[Segment], seg_size: int,
            source: RepairSource, failpoints: Failpoints = DISARMED) -> None:
    """Fetch the damaged range from a replica, verify it, write it in place
    and fsync. Raises RepairUnavailableError, CorruptRecordError (what the
    replica sent does not verify) or OSError; nothing is written unless the
    whole range verified.

    The first record's 8-byte header is written last, after the rest is
    durable: a crash in between (failpoint recovery_repair) leaves a range
    that is either whole or still fails its CRC, never a record that
    verifies with bytes of both."""
    seg_end = damage.segment + seg_size
    end = damage.resume_offset if damage.resume_offset is not None else seg_end
    data = source(damage.offset, end)
    if not data:
        raise RepairUnavailableError(f"no replica holds offset {damage.offset}")
    # With no valid record past the damage, whatever whole records the
    # replica holds from the damage on are taken (the checkpoint says some
    # of them were flushed here).
    verify_range(data, damage.offset,
                 end if damage.resume_offset is not None else damage.offset + len(data), seg_end)
    seg = next(s for s in segments if s.start == damage.segment)
    pos = damage.offset - seg.start
    seg.pwrite(pos + 8, memoryview(data)[8:])
    seg.sync()
    failpoints.hit("recovery_repair")
    seg.pwrite(pos, memoryview(data)[:8])
    seg.sync()
