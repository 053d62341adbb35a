"""An fsync that fails (EIO) is a disk fault in its own right
(docs/design.md, flushing), injected by the `flush_fsync=eio@N` failpoint: the N-th flush's fsync
raises EIO after the bytes that flush was to make durable are discarded (as
Linux drops dirty pages after a failed writeback: a later fsync does not
write them again).

What the store does then (the fix of apache/rocketmq#2706 and #9708, and
PostgreSQL's choice: stop rather than pretend): `flushed` and the checkpoint
stay where they were, the waiting SYNC_FLUSH puts get SERVICE_NOT_AVAILABLE,
the log is marked failed (state()["failed"], shown as `failed` in node
status) and refuses every later put, and the close keeps `abort` so the next
open runs the full recovery. Nothing acknowledged is lost. With
`emulate={"rmq-2706"}` the store behaves as RocketMQ did before #9714: the
error is logged, `flushed` advances and the put is PUT_OK, for bytes that
are not on disk."""

from __future__ import annotations

import asyncio
import os

import pytest

from store.config import TESTING, CorruptionPolicy, CrashModel, FlushMode, StoreConfig
from store.emulate import RMQ_2706
from store.failpoints import Failpoints, FailpointSpecError
from store.log.record import Message
from store.log.segments import segment_name
from store.status import PutStatus
from store.store import CorruptionRefusedError, MessageStore


def _msg(i: int) -> Message:
    return Message("t", f"body-{i}-".encode() * 20, {"UNIQ_KEY": f"m{i}"})


def _run(path: str, cfg: StoreConfig, n: int) -> tuple[list[PutStatus], list[tuple[int, int]],
                                                        dict[str, object], PutStatus]:
    """n puts, one flush each (the failpoint fires on the 3rd); then one more
    put. Returns the statuses, (flushed before, after) per put, the state
    after the n puts, the status of the last put."""

    async def go() -> tuple[list[PutStatus], list[tuple[int, int]], dict[str, object],
                            PutStatus]:
        store = MessageStore.open(path, cfg, failpoints=Failpoints("flush_fsync=eio@3"))
        await store.start()
        statuses, flushed = [], []
        for i in range(n):
            # No pause between puts: the checkpoint vouches for flushed data
            # by position (its flushed end, store/log/checkpoint.py), so a hole
            # is found whichever store millisecond each put falls in.
            before = store.log.flushed
            r = await store.put(_msg(i))
            statuses.append(r.status)
            flushed.append((before, store.log.flushed))
        state = store.state()
        last = (await store.put(_msg(99))).status
        await store.close()
        return statuses, flushed, state, last

    return asyncio.run(go())


def _file_bytes(path: str, start: int, end: int) -> bytes:
    with open(os.path.join(path, "commitlog", segment_name(0)), "rb") as f:
        f.seek(start)
        return f.read(end - start)


def _ids_after_reopen(path: str, cfg: StoreConfig) -> tuple[list[str | None], int, bool]:
    s = MessageStore.open(path, cfg)
    try:
        return [r.msg_id for r in s.log.iter_records()], s.log.wrote, s.recovery.abnormal
    finally:
        s.close_sync()


@pytest.mark.parametrize("crash_model", [CrashModel.POWER, CrashModel.PROCESS])
def test_a_failed_fsync_is_not_counted_flushed_and_not_acknowledged(
        tmp_path: str, crash_model: CrashModel) -> None:
    path = str(tmp_path)
    cfg = TESTING.with_(flush_mode=FlushMode.SYNC_FLUSH, crash_model=crash_model)
    statuses, flushed, state, last = _run(path, cfg, 4)
    assert statuses[:2] == [PutStatus.PUT_OK, PutStatus.PUT_OK]
    # The third flush's fsync failed: its put is not PUT_OK, `flushed` did
    # not move, and the log refuses every put after it.
    assert statuses[2] == PutStatus.SERVICE_NOT_AVAILABLE
    before, after = flushed[2]
    assert after == before > 0
    assert statuses[3] == last == PutStatus.SERVICE_NOT_AVAILABLE
    assert flushed[3][1] == before
    assert "flush failed" in str(state["failed"]) and "errno 5" in str(state["failed"])
    # The bytes of the failed flush are not durable: on disk they read as
    # never written.
    assert _file_bytes(path, before, before + 400) == bytes(400)
    # The close could not flush: `abort` stays, the next open is abnormal and
    # ends where the last good fsync did; the acknowledged messages are there.
    assert os.path.exists(os.path.join(path, "abort"))
    ids, wrote, abnormal = _ids_after_reopen(path, cfg)
    assert abnormal and wrote == before
    assert ids == ["m0", "m1"]


def test_with_rmq_2706_a_failed_fsync_counts_as_flushed_and_loses_an_ack(
        tmp_path: str) -> None:
    """The switch re-introduces the bug: the same fault now acknowledges a
    message that is not on disk, and a reopen does not find it."""
    path = str(tmp_path)
    cfg = TESTING.with_(flush_mode=FlushMode.SYNC_FLUSH, emulate=frozenset({RMQ_2706}))
    statuses, flushed, state, last = _run(path, cfg, 4)
    assert statuses == [PutStatus.PUT_OK] * 4 and last == PutStatus.PUT_OK
    before, after = flushed[2]
    assert after > before  # counted flushed although the fsync failed
    assert state["failed"] is None
    assert _file_bytes(path, before, after) == bytes(after - before)
    # The checkpoint's flushed end lies past the zeroed range, so recovery
    # sees a hole in flushed data: the default policy refuses to open and
    # names it; truncate (RocketMQ's behaviour) cuts there.
    with pytest.raises(CorruptionRefusedError) as refused:
        _ids_after_reopen(path, cfg)
    assert refused.value.damage.offset == before
    ids, wrote, _ = _ids_after_reopen(path, cfg.with_(corruption_policy=CorruptionPolicy.TRUNCATE))
    assert "m2" not in ids  # acknowledged under SYNC_FLUSH, gone
    assert ids == ["m0", "m1"] and wrote == before  # recovery stops at the hole


def test_eio_is_only_for_the_fsync_failpoint() -> None:
    with pytest.raises(FailpointSpecError, match="eio is a fault of an fsync"):
        Failpoints("before_flush_sync=eio@1")
    Failpoints("flush_fsync=eio@2")
