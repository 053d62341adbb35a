"""The `power` crash model made exact on real processes (docs/design.md, crash models): a node
records the end of each completed fsync in its durable mark
(store/log/durable_mark.py) and the harness discards every byte past it when the
node dies, so a SIGKILL loses what a power cut would — including a flush
that had written its bytes but not finished its fsync. The same outcomes
hold on the sim backend, whose MemoryDisk loses unsynced writes by itself:

- a crash armed between a flush's write and its fsync loses exactly that
  flush's bytes (local backend here, and on compose where an engine is;
  the sim's twin is tests/chaos/test_sim_backend.py's
  test_a_crash_failpoint_between_write_and_fsync_loses_exactly_the_unsynced_bytes
  and the one below);
- a planted store bug that acknowledges after the write and before the
  fsync (`--emulate planted-ack-before-fsync`) is caught under SYNC_FLUSH:
  the checker reports lost acknowledged messages with it and none without,
  on both backends.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import random
from pathlib import Path
from typing import Any

import pytest
from support.compose_support import needs_engine, one_engine_user
from support.ha_helpers import spec, wait_until

from chaos.check.summary import run_outcome
from chaos.commands.bugs import judge_run
from chaos.commands.run import make_run
from chaos.harness import scenarios
from chaos.harness.readback import read_back
from chaos.harness.runner import RunConfig
from chaos.harness.workload import WorkloadConfig
from chaos.sim.cluster import SimCluster
from cluster.backends.interface import BackendError, NodeSpec, NodeState
from cluster.backends.registry import open_backend
from cluster.client.node_client import FAST_RECONNECT, NodeCallError, NodeClient, make_message
from cluster.node.auth import generate_token
from cluster.node.role import Role
from store.config import TESTING, CrashModel, FlushMode
from store.emulate import PLANTED_ACK_BEFORE_FSYNC
from store.log.checkpoint import read_checkpoint
from store.log.durable_mark import MARK_FILE, power_cut, read_mark
from store.log.record import UNIQ_KEY, Message
from store.sim import loop as sim_loop
from store.sim.loop import VirtualTimeLoop
from store.sim.memory_disk import DiskFaults
from store.status import PutStatus
from store.store import MessageStore

BACKENDS = ["local", pytest.param("compose", marks=[needs_engine, one_engine_user])]
# The second flush with data crashes after writing, before its fsync.
CRASH_IN_SECOND_FLUSH = "before_flush_sync=crash@2"
# The master crashes at a failpoint after an append, before its flush: with
# the plant, the flush before it was acknowledged and is still unsynced.
SCENARIO = "master-crash-unflushed"


def _ids(data_dir: str) -> list[str]:
    return [r["msg_id"] for r in read_back(data_dir).records]


# ------------------------------------------- a crash between write and fsync
@pytest.mark.parametrize("backend_name", BACKENDS)
def test_a_crash_between_a_flushs_write_and_its_fsync_loses_that_flush(
        tmp_path: Path, backend_name: str) -> None:
    """SYNC_FLUSH: m0's flush completes (acked); m1's flush writes and the
    node dies before the fsync. The SIGKILL leaves m1's bytes in the page
    cache (read back before the restart: they are there); the restart cuts
    them, as a power cut would: the store holds m0 only, and the node log
    says what was discarded."""
    directory = str(tmp_path / "c")
    backend = open_backend(backend_name, directory)
    token = generate_token()
    cs = spec(directory, role=Role.ASYNC_MASTER, flush="SYNC_FLUSH", slaves=0)
    cs = dataclasses.replace(cs, master=dataclasses.replace(
        cs.master, failpoints=CRASH_IN_SECOND_FLUSH))
    backend.up(cs, token=token, timeout_s=90)
    try:
        info = backend.node("master")
        with NodeClient(info.address, token=token, timeout_s=10,
                        channel_options=FAST_RECONNECT) as c:
            first = c.send(make_message("t", b"a" * 300))
            assert first.status == "PUT_OK", first
            with contextlib.suppress(NodeCallError):
                second = c.send(make_message("t", b"b" * 300))
                assert second.status != "PUT_OK", second  # it never got its fsync
        wait_until(lambda: backend.node("master").state == NodeState.STOPPED, 20)
        written = _ids(info.data_dir)
        assert len(written) == 2, written  # the unsynced flush is in the page cache
        backend.start("master")
        assert _ids(info.data_dir) == written[:1]
        with NodeClient(info.address, token=token, timeout_s=10) as c:
            st = c.status_dict()
        assert st["wrote"] == st["flushed"] == read_back(info.data_dir).end_offset
        log = Path(info.log_path).read_text(errors="replace")
        assert "power cut: CommitLog cut at offset" in log, log[-2000:]
    finally:
        with contextlib.suppress(BackendError):
            backend.down()


def test_the_sim_loses_the_same_flush_at_the_same_failpoint() -> None:
    """The sim backend's twin of the test above, with the same steps and
    the same outcome: m0 is kept, m1 (written, never fsynced) is gone."""

    async def main(loop: VirtualTimeLoop) -> tuple[list[str], list[str]]:
        master = NodeSpec(name="master", role=Role.ASYNC_MASTER, flush="SYNC_FLUSH",
                          segment_size_bytes=8 << 20, failpoints=CRASH_IN_SECOND_FLUSH)
        c = SimCluster(loop, random.Random(1), master, (), DiskFaults(), on_crash=lambda _n: None)
        await c.start("master")
        node = c.nodes["master"].node
        assert node is not None
        statuses = []
        for i in range(2):
            done: asyncio.Future[Any] = loop.create_future()
            node.submit([Message("t", b"ab"[i:i + 1] * 300, {UNIQ_KEY: f"m{i}"})],
                        lambda rs, d=done: d.done() or d.set_result(rs[0]))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(2):
                    statuses.append((await done).status)
        assert c.nodes["master"].state is not NodeState.RUNNING
        assert await c.start("master")
        restarted = c.nodes["master"].node
        assert restarted is not None and restarted.store is not None
        kept = [r.msg_id for r in restarted.store.log.iter_records()]
        await c.stop("master")
        return [str(s) for s in statuses], kept

    statuses, kept = sim_loop.run(main)
    assert statuses[0] == str(PutStatus.PUT_OK) and len(statuses) == 1, statuses
    assert kept == ["m0"]


# ------------------------------------------------ the planted ack-before-fsync
def _run(tmp: Path, backend: str, emulate: tuple[str, ...], seed: int) -> str:
    cfg = RunConfig(scenario=scenarios.get(SCENARIO), role="ASYNC_MASTER",
                    flush="SYNC_FLUSH", seed=seed, out_dir=str(tmp / backend / str(emulate)),
                    backend=backend, emulate=emulate,
                    workload=WorkloadConfig(producers=4, rate_per_s=None if backend == "local"
                                            else 25.0)).validate()
    return make_run(cfg).execute()


# The plant leaves its fsyncs until 1 MiB of acknowledged bytes waits, so
# any crash after the first flush finds some acknowledged and unsynced
# (docs/findings.md: sim seeds 1-20 and local seeds 1-5 each caught). With
# a one-flush lag a busy flusher often synced them before their acks left,
# and a CI run on a loaded machine missed the plant on the local backend.
@pytest.mark.parametrize(("backend", "seed"), [("local", 1), ("sim", 6)])
def test_the_planted_ack_before_fsync_is_caught_under_sync_flush(
        tmp_path: Path, backend: str, seed: int) -> None:
    """The master is SIGKILLed (local: a real SIGKILL, then the power cut;
    sim: its disk's crash) under SYNC_FLUSH load. With the plant the last
    flush was acknowledged and never fsynced: the checker finds acknowledged
    messages missing from the recovered master and counts them as broken
    promises. Without it, none."""
    with_plant = _run(tmp_path, backend, (PLANTED_ACK_BEFORE_FSYNC,), seed)
    figures = judge_run(with_plant)
    outcome = run_outcome(with_plant)
    assert (figures["acked"] or 0) > 50, figures
    assert outcome.acked_lost_master > 0, (figures, outcome)
    assert (figures["promise_violations"] or 0) > 0, figures
    without = _run(tmp_path, backend, (), seed)
    figures = judge_run(without)
    outcome = run_outcome(without)
    assert (figures["acked"] or 0) > 50, figures
    assert outcome.acked_lost_master == 0 and figures["promise_violations"] == 0, figures


# ------------------------------------------------------- the mark on its own
def test_the_mark_follows_completed_fsyncs_and_the_cut_restores_the_checkpoint(
        tmp_path: Path) -> None:
    """Store level, no processes: the mark names `flushed` after each flush,
    the checkpoint's synced bytes after each checkpoint sync; a power cut of
    the open (unclosed) store zeroes the log past the mark and puts the
    checkpoint back; a cleanly closed store is left alone."""
    path = str(tmp_path / "s")
    cfg = TESTING.with_(flush_mode=FlushMode.ASYNC_FLUSH)
    store = MessageStore.open(path, cfg)
    store.append([Message("t", b"x" * 100, {UNIQ_KEY: "a"})])
    flushed = store.log.flush()
    mark = read_mark(path)
    assert mark is not None and mark[0] == flushed and mark[1] is None
    store.log.sync_checkpoint()
    mark = read_mark(path)
    assert mark is not None and mark[1] is not None
    synced_checkpoint = read_checkpoint(os.path.join(path, "checkpoint"))[0]
    # Written, not fsynced: a record appended and pwritten by hand at the
    # log's end (as a flush killed before its fsync), and a newer checkpoint.
    store.append([Message("t", b"y" * 100, {UNIQ_KEY: "b"})])
    seg = store.log.segments[0]
    pending = store.log.read(flushed, store.log.wrote - flushed)
    seg.pwrite(flushed - seg.start, pending)
    store.log.checkpoint.update(synced_checkpoint.physic_ms + 10_000 if synced_checkpoint
                                else 10_000, flushed)
    # The process is gone (nothing more from it); the harness cuts.
    cut = power_cut(path)
    assert cut.applied and cut.commitlog_mark == flushed
    assert cut.data_end == flushed + len(pending.rstrip(b"\0")), cut
    assert cut.checkpoint_restored
    assert read_checkpoint(os.path.join(path, "checkpoint"))[0] == synced_checkpoint
    assert _ids(path) == ["a"]
    # Applied once: a write after the cut (the harness damaging the stopped
    # node's disk, say) is not taken by a second cut.
    assert not os.path.exists(os.path.join(path, MARK_FILE))
    assert not power_cut(path).applied
    # The "dead process" lets go of its files without a word more.
    store.log.close()
    store.queues.close()
    store._lock.release()
    store = MessageStore.open(path, cfg)  # recovers what the cut left, a new mark
    assert store.recovery.abnormal and [r.msg_id for r in store.log.iter_records()] == ["a"]
    assert read_mark(path) == (store.log.wrote, None)
    store.close_sync()
    assert not power_cut(path).applied  # closed cleanly: left alone
    # Under the process crash model there is no mark, and no cut.
    store = MessageStore.open(path, cfg.with_(crash_model=CrashModel.PROCESS))
    assert not os.path.exists(os.path.join(path, MARK_FILE))
    store.close_sync()
