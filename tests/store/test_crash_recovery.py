"""Crash tests: a real child process (tests/support/store_child.py) writes at full
speed with many concurrent producers and prints every acknowledgement; the
parent kills it with a real SIGKILL at a seeded random point, reopens the
store (recovery runs) and compares what is on disk with what was acknowledged.

What each mode promises, and what is checked:
- SYNC_FLUSH (both crash models): every PUT_OK is on disk at its offset.
- ASYNC_FLUSH, process model: nothing appended is lost (PUT_OK = appended).
- ASYNC_FLUSH, power model: what survives is a prefix of the log — every
  acknowledged record below the recovered end is there, nothing at or below
  the last offset the child saw flushed is lost, and the loss is only the
  tail after it; across seeds some tail is lost (the model really drops
  unflushed bytes).
- Always: the log is contiguous, has no duplicate ids, and each producer's
  ids appear in sequence order with no hole (each producer awaits each put,
  so its messages reach the log in order; a hole would show as a gap).
- SIGTERM (clean close): nothing lost, and the next open ran normal recovery.
- A crash inside recovery's truncation never brings the truncated tail back.

Not checked here: replication (ha/), and real power loss (the power model
emulates it by keeping unflushed bytes in process memory)."""

from __future__ import annotations

import random
import signal
from pathlib import Path

import pytest
from support.crash_writer import ChildRun, config_for, run_writer
from support.store_helpers import (
    SEG,
    fill,
    flip_bit,
    ids,
    mark_abnormal,
    read_at,
    reopen,
    run_child,
)

from store.config import TESTING, CorruptionPolicy, CrashModel, FlushMode
from store.log.record import Record

TRUNCATING = TESTING.with_(corruption_policy=CorruptionPolicy.TRUNCATE)

def check_log_shape(records: list[Record], run: ChildRun) -> dict[str, Record]:
    """The invariants every mode keeps; returns id -> record."""
    by_id: dict[str, Record] = {}
    prev_end = None
    for r in records:
        assert r.msg_id is not None and r.msg_id not in by_id, f"duplicate {r.msg_id}"
        by_id[r.msg_id] = r
        if prev_end is not None and r.offset != prev_end:
            # contiguous, except for the blank that closes a full segment
            assert r.offset % SEG == 0 and r.offset - prev_end < SEG, (prev_end, r.offset)
        prev_end = r.offset + r.size
        if r.msg_id in run.acks:
            assert run.acks[r.msg_id] == (r.offset, r.size), f"{r.msg_id} moved"
    per_producer: dict[str, list[int]] = {}
    for r in records:
        assert r.msg_id is not None
        producer, seq = r.msg_id.split("-")
        per_producer.setdefault(producer, []).append(int(seq))
    for producer, seqs in per_producer.items():
        assert seqs == list(range(len(seqs))), f"hole or reorder in {producer}'s sequence"
    return by_id


SEEDS = {
    (FlushMode.SYNC_FLUSH, CrashModel.POWER): [1, 2, 3],
    (FlushMode.SYNC_FLUSH, CrashModel.PROCESS): [4, 5],
    (FlushMode.ASYNC_FLUSH, CrashModel.PROCESS): [6, 7],
}


@pytest.mark.parametrize(
    ("flush", "model", "seed"),
    [(f, m, s) for (f, m), seeds in SEEDS.items() for s in seeds],
    ids=lambda v: getattr(v, "value", str(v)),
)
def test_sigkill_loses_no_acknowledged_put(
    tmp_path: Path, flush: FlushMode, model: CrashModel, seed: int
) -> None:
    rng = random.Random(seed)
    run = run_writer(tmp_path, seed=seed, flush=flush, model=model,
                     stop_after_acks=rng.randint(200, 6000))
    assert run.returncode == -signal.SIGKILL, run.stderr[-2000:]
    records, report = reopen(tmp_path, config_for(flush, model))
    by_id = check_log_shape(records, run)
    missing = sorted(set(run.acks) - set(by_id))
    assert not missing, f"{len(missing)} acknowledged puts lost, first {missing[:5]}"
    assert report.abnormal and report.first_bad_offset is None, report.summary
    assert len(records) >= len(run.acks) > 0


def test_async_flush_power_crash_loses_only_the_unflushed_tail(tmp_path: Path) -> None:
    """Four seeded kills. Each: no hole, everything reported flushed survives,
    every lost put lies after it. Together: some tail was lost (if none ever
    is, the power model is writing unflushed bytes to the file)."""
    losses = []
    for seed in (11, 12, 13, 14):
        rng = random.Random(seed)
        path = tmp_path / f"seed{seed}"
        run = run_writer(path, seed=seed, flush=FlushMode.ASYNC_FLUSH, model=CrashModel.POWER,
                         stop_after_acks=rng.randint(500, 8000))
        assert run.returncode == -signal.SIGKILL, run.stderr[-2000:]
        records, report = reopen(path, config_for(FlushMode.ASYNC_FLUSH, CrashModel.POWER))
        by_id = check_log_shape(records, run)
        end = report.max_valid_offset
        assert end >= run.flushed, f"seed {seed}: flushed {run.flushed}, only {end} survived"
        lost = {i: a for i, a in run.acks.items() if i not in by_id}
        for msg_id, (offset, _size) in lost.items():
            assert offset >= end, f"seed {seed}: {msg_id} at {offset} lost below {end}: a hole"
            assert offset >= run.flushed, f"seed {seed}: {msg_id} at {offset} was flushed"
        kept = [a for i, a in run.acks.items() if i in by_id]
        assert all(off + size <= end for off, size in kept)
        assert report.abnormal
        losses.append(len(lost))
    assert sum(losses) > 0, f"no seed lost its unflushed tail: {losses}"


@pytest.mark.parametrize(
    ("flush", "model", "seed"),
    [(FlushMode.ASYNC_FLUSH, CrashModel.POWER, 21), (FlushMode.SYNC_FLUSH, CrashModel.POWER, 22)],
    ids=lambda v: getattr(v, "value", str(v)),
)
def test_sigterm_clean_close_loses_nothing_and_recovers_normally(
    tmp_path: Path, flush: FlushMode, model: CrashModel, seed: int
) -> None:
    rng = random.Random(seed)
    run = run_writer(tmp_path, seed=seed, flush=flush, model=model,
                     stop_after_acks=rng.randint(300, 2000), sig=signal.SIGTERM,
                     flush_interval_ms=500)
    assert run.returncode == 0, run.stderr[-2000:]
    closed = [line for line in run.lines if line.startswith("CLOSED ")]
    assert closed, run.lines[-5:]
    wrote = int(closed[0].split()[1])
    assert not (tmp_path / "abort").exists()
    records, report = reopen(tmp_path, config_for(flush, model))
    by_id = check_log_shape(records, run)
    assert set(run.acks) <= set(by_id)
    assert report.max_valid_offset == wrote  # even appended-but-unacknowledged puts stayed
    assert report.abnormal is False and report.summary.startswith("normal recovery")


@pytest.mark.parametrize("after", ["clean", "crash"])
def test_crash_during_recovery_truncation_never_resurrects_the_tail(
    tmp_path: Path, after: str
) -> None:
    """Damage a record in the middle of the last segment, let a child open the
    store with recovery_truncate=crash@1 (SIGKILL between zeroing the cut's
    header and clearing the tail), then recover again and append records of
    the same size: the old tail must stay gone, whatever the new records'
    ends line up with."""
    results = fill(tmp_path, 100, body_size=300)
    size = results[0].size
    assert {r.size for r in results} == {size}
    cut = results[50].offset
    if after == "crash":
        mark_abnormal(tmp_path)
    flip_bit(tmp_path, cut + 120)  # inside record 50's body
    child = run_child(["open", "--dir", str(tmp_path), "--failpoints", "recovery_truncate=crash@1",
                       "--corruption-policy", "truncate"])
    assert child.returncode == -signal.SIGKILL, child.stderr
    assert "failpoint recovery_truncate fired" in child.stderr
    # The crash hit the window: header zeroed, the old tail still behind it.
    assert read_at(tmp_path, cut, 8) == bytes(8)
    assert read_at(tmp_path, cut + size, 8) != bytes(8)

    # Under the default policy: the cut lowered the checkpoint before it
    # zeroed the header, so the interrupted cut is not taken for a hole.
    records, report = reopen(tmp_path)
    assert ids(records) == [f"m{i:06d}" for i in range(50)]
    assert report.max_valid_offset == cut
    tail = read_at(tmp_path, cut, SEG - cut % SEG)
    assert tail == bytes(len(tail)), "recovery left bytes of the truncated tail"

    fill(tmp_path, 10, body_size=300, prefix="n")
    records, report = reopen(tmp_path, TRUNCATING)
    assert ids(records) == [f"m{i:06d}" for i in range(50)] + [f"n{i:06d}" for i in range(10)]
    assert report.max_valid_offset == cut + 10 * size
