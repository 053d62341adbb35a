"""What a slave does with shipped ranges, on a real store in this process:
ranges cut by the master's read_range apply with append_raw and leave the
slave's log byte-identical; flushed ranges are not kept in memory."""

from __future__ import annotations

import gc
import os
import tracemalloc

from store.config import KIB, MIB, CrashModel, FlushMode, StoreConfig
from store.log.record import Message
from store.store import MessageStore

CFG = StoreConfig(segment_size_bytes=4 * MIB, max_message_size_bytes=64 * KIB,
                  flush_mode=FlushMode.ASYNC_FLUSH, crash_model=CrashModel.POWER)


def _master(path: str, total: int) -> MessageStore:
    m = MessageStore.open(path, CFG)
    body = os.urandom(4000)
    i = 0
    while m.log.wrote < total:
        m.append([Message("t", body, {"UNIQ_KEY": f"k{i + j}"}) for j in range(64)])
        i += 64
    m.log.flush()
    return m


def test_shipped_ranges_apply_byte_identically_and_flushed_ones_are_released(
        tmp_path: str) -> None:
    master = _master(os.path.join(tmp_path, "m"), 24 * MIB)
    slave = MessageStore.open(os.path.join(tmp_path, "s"), CFG)
    try:
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        offset = 0
        while offset < master.log.wrote:
            data, nxt = master.log.read_range(offset, 1 * MIB)
            assert slave.log.append_raw(offset, data) == nxt
            offset = nxt
            if offset % (4 * MIB) < MIB:
                slave.log.flush()
        slave.log.flush()
        del data
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - base
        tracemalloc.stop()
        assert slave.log.wrote == slave.log.flushed == master.log.wrote
        # 24 MiB went through; what stays referenced is at most a few ranges.
        assert held < 6 * MIB, f"{held} bytes still held after flushing everything"
        for a, b in zip(master.log.iter_records(), slave.log.iter_records(), strict=True):
            assert (a.offset, a.msg_id, a.body_crc) == (b.offset, b.msg_id, b.body_crc)
    finally:
        master.close_sync()
        slave.close_sync()
    for name in sorted(os.listdir(os.path.join(tmp_path, "m", "commitlog"))):
        with open(os.path.join(tmp_path, "m", "commitlog", name), "rb") as f:
            m_bytes = f.read()
        with open(os.path.join(tmp_path, "s", "commitlog", name), "rb") as f:
            assert f.read() == m_bytes
