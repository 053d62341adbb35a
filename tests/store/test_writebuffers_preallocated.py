"""How many write buffers a store zero-fills at open
(StoreConfig.write_buffers_preallocated, store/log/writebuffers.py): the
real backends take a few up front, a store may take none and still append
and read back everything (buffers are made as appends need them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from store.config import TESTING, ConfigError
from store.log.record import Message
from store.store import MessageStore


@pytest.mark.parametrize("preallocated", [0, 2])
def test_a_store_zero_fills_only_the_buffers_it_is_told_to_at_open(
        tmp_path: Path, preallocated: int) -> None:
    cfg = TESTING.with_(write_buffer_bytes=64 * 1024, write_buffers_kept=4,
                        write_buffers_preallocated=preallocated)
    s = MessageStore.open(str(tmp_path), cfg)
    try:
        assert s.log._buffers.allocated == 1 + preallocated  # `current` and the free ones
        results = s.append([Message("t", bytes([i]) * 2_000, {"UNIQ_KEY": f"m{i}"})
                            for i in range(100)])  # 200 KB: more buffers than preallocated
        assert [s.log.read_record(r.offset).msg_id for r in results] == [
            f"m{i}" for i in range(100)]
    finally:
        s.close_sync()
    reopened = MessageStore.open(str(tmp_path), cfg)
    try:
        assert [r.msg_id for r in reopened.log.iter_records()] == [f"m{i}" for i in range(100)]
    finally:
        reopened.close_sync()


def test_a_negative_preallocation_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match="write_buffers_preallocated must be 0 or more"):
        TESTING.with_(write_buffers_preallocated=-1)
