"""The read-back after a run (chaos/harness/readback.py) lists every record
through record.summarize, the verify path, not a full decode: decode built
a Record (hosts, body, topic copies) per record and was most of the
read-back's cost (docs/performance-notes.md, "The simulated cluster"). What
it lists is still what decode says of each record."""

from __future__ import annotations

from pathlib import Path

import pytest

from chaos.harness import readback
from store.config import TESTING
from store.log.record import UNIQ_KEY, Message, decode
from store.store import MessageStore


def test_read_back_lists_every_record_without_a_full_decode(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = MessageStore.open(str(tmp_path), TESTING)
    try:
        s.append([Message("chaos", bytes([i]) * (50 + i), {UNIQ_KEY: f"m{i}"})
                  for i in range(40)])
    finally:
        s.close_sync()
    data = (tmp_path / "commitlog" / f"{0:020d}").read_bytes()
    want, pos = [], 0
    for _ in range(40):
        rec = decode(data, pos, offset=pos)
        want.append((rec.offset, rec.size, rec.msg_id, rec.body_crc, rec.store_timestamp_ms))
        pos += rec.size

    def no_decode(*args: object, **kwargs: object) -> None:
        raise AssertionError("read_back decoded a whole record")

    monkeypatch.setattr(readback, "decode", no_decode, raising=False)
    monkeypatch.setattr("store.log.record.decode", no_decode)
    rb = readback.read_back(str(tmp_path))
    assert rb.first_bad_offset is None and rb.end_offset == pos
    assert [(r["offset"], r["size"], r["msg_id"], r["body_crc"], r["store_timestamp_ms"])
            for r in rb.records] == want
