"""Placement (store/log/placement.py): where the records of an append go. The
planner's properties hold for any log end, segment size and record sizes,
and CommitLog.append places records exactly as the plan says, with the
native encoder and with the pure-Python loop."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from store.config import KIB, StoreConfig
from store.log import native as native_codec
from store.log.placement import end_limit, plan, segment_end
from store.log.record import BLANK_MAGIC, BLANK_SIZE, V4_FIXED_SIZE, Message, decode, encode, peek
from store.status import PutStatus
from store.store import MessageStore

KEYS = [("a", 0), ("a", 1), ("b", 0)]


@st.composite
def _logs(draw: Any) -> tuple[int, int, list[tuple[int, Any]], dict[Any, int]]:
    seg_size = draw(st.integers(4 * KIB, 64 * KIB))
    # A log ends where a record left room for a blank, or on a boundary.
    pos = draw(st.integers(0, 3)) * seg_size + draw(st.integers(0, seg_size - BLANK_SIZE))
    records = draw(st.lists(st.tuples(st.integers(V4_FIXED_SIZE, seg_size - BLANK_SIZE),
                                      st.sampled_from(KEYS)), max_size=40))
    qo = draw(st.dictionaries(st.sampled_from(KEYS), st.integers(0, 10**9)))
    return seg_size, pos, records, qo


@given(_logs())
@settings(max_examples=400, deadline=None)
def test_plan_properties(log: tuple[int, int, list[tuple[int, Any]], dict[Any, int]]) -> None:
    seg_size, pos, records, qo = log
    placed, end, next_qo = plan(pos, seg_size, records, qo)
    assert [p.size for p in placed] == [size for size, _ in records]
    at = pos
    for p in placed:
        # Contiguous: a record starts where the last one ended, or after a
        # blank that closes that segment.
        assert p.offset - p.blank == at
        if p.blank:
            assert p.offset % seg_size == 0 and p.blank >= BLANK_SIZE
            # ... and only when the record did not fit there.
            assert at + p.size > end_limit(segment_end(at, seg_size))
        # Never straddles a segment, and leaves room for the closing blank.
        assert p.offset // seg_size == (p.offset + p.size - 1) // seg_size
        assert p.offset + p.size <= end_limit(segment_end(p.offset, seg_size))
        at = p.offset + p.size
    assert end == at
    # QUEUEOFFSET: one queue's records count up from where it stood, by one.
    for key in KEYS:
        mine = [p.queue_offset for p, (_, k) in zip(placed, records, strict=True) if k == key]
        start = qo.get(key, 0)
        assert mine == list(range(start, start + len(mine)))
        assert next_qo.get(key, 0) == start + len(mine)
    assert qo == log[3], "the caller's queue offsets are left as they were"


SEG = 4 * KIB
CONFIG = StoreConfig(segment_size_bytes=SEG, max_message_size_bytes=SEG - 512,
                     write_buffer_bytes=8 * KIB, write_buffers_kept=2)
_messages = st.lists(st.lists(st.tuples(st.integers(0, SEG - 640), st.sampled_from(KEYS)),
                              min_size=1, max_size=12), min_size=1, max_size=8)


@pytest.fixture(params=["native", "python"])
def codec(request: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    if request.param == "python":
        monkeypatch.setattr(native_codec, "encode_run_into", None)
    elif native_codec.encode_run_into is None:
        pytest.skip("the native codec is not built")
    yield request.param


@given(batches=_messages)
@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_append_writes_what_the_plan_says(codec: str, batches: list[list[tuple[int, Any]]]
                                          ) -> None:
    """Batches of messages of mixed sizes and queues are appended; every
    result, record and blank is where plan() put it."""
    with tempfile.TemporaryDirectory(prefix="placement-") as path:
        store = MessageStore.open(path, CONFIG)
        try:
            log = store.log
            qo: dict[Any, int] = {}
            pos = log.wrote
            expected = []
            for b, batch in enumerate(batches):
                msgs = [Message(k[0], bytes([i % 251]) * n, {"UNIQ_KEY": f"{b}-{i}"},
                                queue_id=k[1]) for i, (n, k) in enumerate(batch)]
                sizes = [len(encode(m, offset=0, queue_offset=0, store_timestamp_ms=0,
                                    store_host=CONFIG.store_host)) for m in msgs]
                placed, pos, qo = plan(pos, SEG, zip(sizes, [k for _, k in batch],
                                                     strict=True), qo)
                results = log.append(msgs)
                assert [r.status for r in results] == [PutStatus.PUT_OK] * len(msgs)
                assert [(r.offset, r.size) for r in results] == \
                    [(p.offset, p.size) for p in placed]
                expected += placed
            assert log.wrote == pos
            log.flush()
            for p in expected:
                if p.blank:
                    blank_at = p.offset - p.blank
                    assert peek(log.read(blank_at, BLANK_SIZE), 0) == (p.blank, BLANK_MAGIC)
                rec = decode(log.read(p.offset, p.size), offset=p.offset)
                assert (rec.size, rec.queue_offset) == (p.size, p.queue_offset)
        finally:
            store.close_sync()


@pytest.mark.parametrize("past_limit", [-1, 0, 1, BLANK_SIZE - 1, BLANK_SIZE])
def test_a_record_ending_near_the_segment_end(codec: str, past_limit: int, tmp_path: Any
                                              ) -> None:
    """The second record ends `past_limit` bytes past the placement limit
    (0: exactly at it, BLANK_SIZE: exactly at the segment's end): it stays
    in the segment only when a blank still fits behind it."""

    def sized(n: int, i: int) -> Message:
        """A message whose record is `n` bytes."""
        base = len(encode(Message("a", b"", {"UNIQ_KEY": f"k{i}"}), offset=0, queue_offset=0,
                          store_timestamp_ms=0, store_host=CONFIG.store_host))
        return Message("a", b"x" * (n - base), {"UNIQ_KEY": f"k{i}"})

    fill = end_limit(SEG) + past_limit - 200  # two records end here
    msgs = [sized(fill // 2, 0), sized(fill - fill // 2, 1), sized(200, 2)]
    store = MessageStore.open(str(tmp_path), CONFIG)
    try:
        placed, _, _ = plan(0, SEG, [(fill // 2, KEYS[0]), (fill - fill // 2, KEYS[0]),
                                     (200, KEYS[0])], {})
        results = store.log.append(msgs)
        assert [(r.offset, r.size) for r in results] == [(p.offset, p.size) for p in placed]
        assert (placed[2].offset == SEG) == (past_limit > 0)
    finally:
        store.close_sync()
