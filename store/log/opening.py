"""Opening a store directory: what can go wrong and how a failed open is
undone, the recovery report, and where re-dispatch may start.

An open that fails leaves the directory as it found it (`undo_open`); an
OSError becomes a StoreOpenError naming the path and the fix
(`os_error_message`). store/log/corruption_policy.py decides what corruption of
flushed data does; store/store.py (MessageStore.open) runs the steps.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import pwd
from dataclasses import dataclass

from store.log.recovery import RecoveryPlan
from store.seams.disk import Disk


class StoreOpenError(RuntimeError):
    """The directory cannot be opened as a store without risking data; the
    message says what is wrong and what to do."""


@dataclass(frozen=True)
class RecoveryReport:
    abnormal: bool
    max_valid_offset: int
    records_scanned: int
    first_bad_offset: int | None
    bad_reason: str | None
    segments_dropped: list[int]
    problems: list[str]
    summary: str
    # Corruption of flushed data found at open, and what the policy did:
    # "truncated" (with the records and bytes that cost) or "repaired".
    corruption: str | None = None
    corruption_action: str | None = None
    records_lost: int = 0
    bytes_lost: int = 0
    repaired_ranges: list[tuple[int, int]] = dataclasses.field(default_factory=list)


def entries(disk: Disk, path: str) -> set[str] | None:
    """The names in `path` before an open (an empty set when it does not
    exist); None when they cannot be listed (nothing is undone then)."""
    try:
        return set(disk.listdir(path))
    except FileNotFoundError:
        return set()
    except OSError:
        return None


def undo_open(disk: Disk, path: str, found: set[str] | None, *, holding_lock: bool) -> None:
    """Remove what a failed open created in `path`: new files (`abort`,
    `lock`, `checkpoint`), new directories if empty (never a file in one),
    and `path` itself if the open made it. Best effort: the open's own error
    is what the caller reports."""
    if found is None:
        return
    try:
        names = set(disk.listdir(path))
    except OSError:
        return
    if not holding_lock:
        names &= {"commitlog"}  # made before the lock was taken
    for name in sorted(names - found):
        full = os.path.join(path, name)
        with contextlib.suppress(OSError):
            if disk.isdir(full) and not disk.islink(full):
                _remove_empty_dirs(disk, full)
            else:
                disk.unlink(full)
    with contextlib.suppress(OSError):
        if not found and not disk.listdir(path):
            disk.rmdir(path)
            return
        disk.fsync_dir(path)


def _remove_empty_dirs(disk: Disk, top: str) -> None:
    """rmdir every directory under `top` (deepest first) and `top`; a
    directory that holds a file stays, with its parents."""
    for name in disk.listdir(top):
        sub = os.path.join(top, name)
        if disk.isdir(sub) and not disk.islink(sub):
            _remove_empty_dirs(disk, sub)
    with contextlib.suppress(OSError):
        disk.rmdir(top)


def os_error_message(path: str, exc: OSError) -> str:
    """What an OSError during an open means for the user, and the fix."""
    where = exc.filename or path
    what = f"cannot open store {path}: {exc.strerror or exc} on {where}"
    if exc.errno in (errno.EACCES, errno.EPERM):
        user = _user_name()
        return (f"{what}; this process runs as {user} (uid {os.geteuid()}): make the store "
                f"directory and every file in it readable and writable by that user (e.g. "
                f"chown -R {user} {path}), or run as their owner")
    if exc.errno == errno.EROFS:
        return f"{what}; the filesystem is read-only: remount it read-write or copy the store"
    if exc.errno == errno.EISDIR:
        note = (" (without a checkpoint, recovery only scans more)"
                if os.path.basename(where) == "checkpoint" else "")
        return f"{what}; a directory stands where the store keeps a file: move it aside{note}"
    if exc.errno == errno.ELOOP:
        return (f"{what}; it is a symbolic link, which a store never follows (its writes "
                "would land in the file it points to): put the file itself there, or move "
                "the link aside")
    if exc.errno == errno.ENOTDIR:
        return f"{what}; a file stands where a directory belongs: move it aside"
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"{what}; the disk is full: free space on it and start again"
    return f"{what}; fix that path and start again"


def _user_name() -> str:
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:  # no name: chown takes the number too
        return str(os.geteuid())


def reput_floor(plan: RecoveryPlan, queues_max_end: int | None, log_min: int,
                log_end: int, *, rmq_405: bool = False) -> int:
    """The later of the safe re-dispatch starts the store knows (see
    ConsumeQueues.reput_start): after a clean shutdown, the queues' largest
    end; after a crash, the segment abnormal recovery started from (the
    checkpoint's min of physic and logics timestamps picked it)."""
    if plan.abnormal:
        floor = log_min if plan.start_segment is None else plan.start_segment
    elif rmq_405:
        # --emulate rmq-405: RocketMQ <= 4.4.0's DefaultMessageStore.start set
        # reputFromOffset to the CommitLog's max offset, and recoverNormally
        # dispatches nothing: records a clean stop left undispatched (its
        # drain gives up after 5 s: ConsumeSide._drain_dispatch) never get a
        # unit. Real fix: commits 0c69acafa9 and 03b4564d31 (first tagged in
        # 4.5.1) start reput at the consume queues' max physical offset and
        # wait until dispatch has caught up, as the line below does.
        floor = log_end
    else:
        floor = log_min if queues_max_end is None else queues_max_end
    return max(log_min, min(floor, log_end))


def recovery_report(plan: RecoveryPlan, problems: list[str]) -> RecoveryReport:
    return RecoveryReport(
        abnormal=plan.abnormal,
        max_valid_offset=plan.max_valid_offset,
        records_scanned=plan.records_scanned,
        first_bad_offset=plan.first_bad_offset,
        bad_reason=plan.bad_reason,
        segments_dropped=list(plan.segments_to_drop),
        problems=problems + plan.notes,
        summary=plan.describe(),
    )
