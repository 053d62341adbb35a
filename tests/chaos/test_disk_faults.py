"""Torn tail and bit flip change real store files so that recovery finds
exactly the damage they report, and read-back agrees with the store."""

from __future__ import annotations

import os
import random

import pytest

from chaos.harness.disk_faults import DiskFaultError, bit_flip, torn_tail
from chaos.harness.readback import read_back
from store.config import TESTING, CorruptionPolicy
from store.log.record import Message
from store.store import CorruptionRefusedError, MessageStore


def _store(path: str, n: int = 120) -> list[tuple[int, str]]:
    s = MessageStore.open(path, TESTING)
    out = []
    for i in range(n):
        (r,) = s.append([Message("t", os.urandom(700 + i), {"UNIQ_KEY": f"m{i}"})])
        out.append((r.offset, f"m{i}"))
    s.close_sync()
    return out


def test_read_back_lists_every_record(tmp_path: str) -> None:
    written = _store(str(tmp_path))
    rb = read_back(str(tmp_path))
    assert [(r["offset"], r["msg_id"]) for r in rb.records] == written
    assert rb.first_bad_offset is None
    assert len(os.listdir(os.path.join(tmp_path, "commitlog"))) > 1  # crossed segments


def test_torn_tail_is_found_and_dropped_by_recovery(tmp_path: str) -> None:
    written = _store(str(tmp_path))
    end_before = read_back(str(tmp_path)).end_offset
    detail = torn_tail(str(tmp_path), random.Random(3))
    assert f"torn record at {end_before}" in detail
    rb = read_back(str(tmp_path))
    assert rb.first_bad_offset == end_before
    open(os.path.join(tmp_path, "abort"), "wb").close()  # as after the kill
    s = MessageStore.open(str(tmp_path), TESTING)
    try:
        assert s.recovery.first_bad_offset == end_before
        assert s.log.wrote == end_before
        assert [r.msg_id for r in s.log.iter_records()] == [m for _, m in written]
    finally:
        s.close_sync()
    assert read_back(str(tmp_path)).first_bad_offset is None


def test_bit_flip_is_found_at_the_record_it_names(tmp_path: str) -> None:
    written = _store(str(tmp_path))
    detail = bit_flip(str(tmp_path), random.Random(5))
    flipped = int(detail.rsplit(" ", 1)[1])
    assert flipped in {o for o, _ in written}
    rb = read_back(str(tmp_path))
    assert rb.first_bad_offset == flipped and rb.bad_reason == "crc"
    # Clean shutdown, so the record was flushed: refused by default ...
    with pytest.raises(CorruptionRefusedError, match=f"at offset {flipped} "):
        MessageStore.open(str(tmp_path), TESTING)
    # ... and cut, as RocketMQ does, under truncate.
    s = MessageStore.open(str(tmp_path),
                          TESTING.with_(corruption_policy=CorruptionPolicy.TRUNCATE))
    try:
        kept = [r.msg_id for r in s.log.iter_records()]
    finally:
        s.close_sync()
    assert kept == [m for o, m in written if o < flipped]


def test_disk_faults_on_an_empty_store_say_why(tmp_path: str) -> None:
    MessageStore.open(str(tmp_path), TESTING).close_sync()
    with pytest.raises(DiskFaultError, match="no records"):
        torn_tail(str(tmp_path), random.Random(1))
    with pytest.raises(DiskFaultError, match="no records"):
        bit_flip(str(tmp_path), random.Random(1))
