"""The native record codec (native/) against the Python reference.

The native functions only take the common case and stop where the Python
path must decide, so the store's observable behaviour must be identical with
and without them: the same bytes on disk, the same PutResults, the same
recovery verdict on any damage. Each test runs the same input both ways.
"""

from __future__ import annotations

import os
import shutil
import struct
import tempfile
from pathlib import Path
from types import MappingProxyType

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from store.config import CrashModel, FlushMode, StoreConfig
from store.log import native
from store.log.commitlog import RangeRejectedError
from store.log.record import MESSAGE_MAGIC, Message, body_crc, encode
from store.log.recovery import SegmentScan, scan_segment
from store.sim.manual_clock import ManualClock
from store.status import PutResult
from store.store import MessageStore

pytestmark = pytest.mark.skipif(
    native.encode_run_into is None,
    reason="native codec not built (no Rust toolchain, or DLAB_PURE_PYTHON set): "
    "nothing to cross-check",
)

SEG = 64 * 1024
CONFIG = StoreConfig(segment_size_bytes=SEG, max_message_size_bytes=16 * 1024,
                     flush_mode=FlushMode.ASYNC_FLUSH, crash_model=CrashModel.POWER)


def test_native_codec_is_built_where_a_rust_toolchain_exists() -> None:
    """scripts/venv.sh builds it when cargo is on PATH; a silent fallback
    would make every store figure in docs/benchmarks.md wrong."""
    if os.environ.get("DLAB_PURE_PYTHON"):
        pytest.skip("DLAB_PURE_PYTHON is set")
    if shutil.which("cargo"):
        assert native.codec() == "native"


def _append_both(batches: list[list[Message]], monkeypatch: pytest.MonkeyPatch
                 ) -> tuple[list[list[PutResult]], bytes, list[list[PutResult]], bytes]:
    out = []
    for use_native in (True, False):
        with monkeypatch.context() as m:
            if not use_native:
                m.setattr(native, "encode_run_into", None)
            d = tempfile.mkdtemp(prefix="native-xcheck-")
            try:
                store = MessageStore.open(d, CONFIG, clock=ManualClock())
                results = [store.log.append(b) for b in batches]
                store.log.flush()
                wrote = store.log.wrote
                store.close_sync()
                data = b"".join(p.read_bytes() for p in sorted(Path(d, "commitlog").iterdir()))
                out.append((results, data[:wrote]))
            finally:
                shutil.rmtree(d)
    (rn, dn), (rp, dp) = out
    return rn, dn, rp, dp


_topics = st.sampled_from(["t", "orders", "é-topic", "x" * 127, "x" * 128, ""])
_hosts = st.sampled_from([("127.0.0.1", 0), ("10.1.2.3", 65535), ("::1", 9), ("localhost", 1),
                          ("010.0.0.1", 2), ("1.2.3.4", 2**31)])
_props = st.one_of(
    st.dictionaries(st.sampled_from(["UNIQ_KEY", "TAGS", "KEYS", "a\x01b", "é"]),
                    st.text(max_size=12), max_size=3),
    st.just(MappingProxyType({})),
    st.just(MappingProxyType({"UNIQ_KEY": "from-a-proxy"})),
)
_messages = st.builds(
    Message,
    topic=_topics,
    body=st.one_of(st.binary(max_size=64), st.sampled_from([b"z" * 9000, b"y" * 17000])),
    properties=_props,
    queue_id=st.sampled_from([0, 3, -1, 2**31]),
    flag=st.integers(0, 7),
    born_timestamp_ms=st.integers(0, 2**40),
    born_host=_hosts,
)


_FIXTURE_OK = [HealthCheck.function_scoped_fixture]


@settings(max_examples=60, deadline=None, suppress_health_check=_FIXTURE_OK)
@given(batches=st.lists(st.lists(_messages, max_size=40), min_size=1, max_size=6))
def test_append_is_identical_with_and_without_the_native_encoder(
    batches: list[list[Message]], monkeypatch: pytest.MonkeyPatch
) -> None:
    try:
        native_results, native_bytes, py_results, py_bytes = _append_both(batches, monkeypatch)
    except struct.error:
        # The Python path raises for a field the layout cannot hold
        # (queue id beyond int32); the native path must not hide that.
        with pytest.raises(struct.error), monkeypatch.context() as m:
            m.setattr(native, "encode_run_into", None)
            d = tempfile.mkdtemp()
            try:
                s = MessageStore.open(d, CONFIG, clock=ManualClock())
                for b in batches:
                    s.log.append(b)
            finally:
                shutil.rmtree(d)
        return
    assert native_results == py_results
    assert all(type(r) is PutResult for rs in native_results for r in rs)
    assert native_bytes == py_bytes


def test_append_crosses_segments_with_the_same_blanks(monkeypatch: pytest.MonkeyPatch) -> None:
    batch = [Message("t", bytes([i % 251]) * 700, {"UNIQ_KEY": f"m{i}"}) for i in range(300)]
    rn, dn, rp, dp = _append_both([batch[:150], batch[150:]], monkeypatch)
    assert rn == rp and dn == dp
    assert len(dn) > 3 * SEG  # several rolls happened


# ------------------------------------------------------------------ scan
def _stored(n: int, *, seg_start: int = 0) -> bytes:
    out = b""
    for i in range(n):
        out += encode(Message("t", os.urandom(i % 50), {"UNIQ_KEY": f"k{i}"}),
                      offset=seg_start + len(out), queue_offset=i, store_timestamp_ms=1000 + i)
    return out


def _scan_both(buf: bytes, monkeypatch: pytest.MonkeyPatch) -> tuple[SegmentScan, SegmentScan]:
    fast = scan_segment(buf, 4096, 4096, seg_size=len(buf))
    with monkeypatch.context() as m:
        m.setattr(native, "scan", None)
        slow = scan_segment(buf, 4096, 4096, seg_size=len(buf))
    return fast, slow


_frac = st.floats(0, 1, exclude_max=True)


@settings(max_examples=200, deadline=None, suppress_health_check=_FIXTURE_OK)
@given(n=st.integers(1, 20), keep=st.one_of(st.just(1.0), _frac),
       flips=st.lists(st.tuples(_frac, st.integers(0, 7)), max_size=3), tail=st.integers(0, 64))
def test_recovery_scan_gives_the_same_verdict_on_damaged_bytes(
    n: int, keep: float, flips: list[tuple[float, int]], tail: int,
    monkeypatch: pytest.MonkeyPatch
) -> None:
    buf = bytearray(_stored(n, seg_start=4096))
    del buf[int(len(buf) * keep):]
    for at, bit in flips:
        if buf:
            buf[int(len(buf) * at)] ^= 1 << bit
    buf += bytes(tail)
    fast, slow = _scan_both(bytes(buf), monkeypatch)
    assert fast == slow


def test_recovery_scan_hands_an_ipv6_record_to_the_python_path(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    head = _stored(3, seg_start=4096)
    body, topic, props = b"v6", b"T6", b""
    addr = bytes(15) + b"\x01"
    fields = (struct.pack(">iiiqqiq", body_crc(body), 0, 0, 0, 4096 + len(head), 0x30, 5)
              + addr + struct.pack(">i", 80) + struct.pack(">q", 6) + addr + struct.pack(">i", 81)
              + struct.pack(">iqi", 0, 0, len(body)) + body + bytes([len(topic)]) + topic
              + struct.pack(">h", len(props)) + props)
    v6 = struct.pack(">iI", 8 + len(fields), MESSAGE_MAGIC) + fields
    tail_start = 4096 + len(head) + len(v6)
    tail = encode(Message("t", b"after"), offset=tail_start, queue_offset=9,
                  store_timestamp_ms=7)
    tail += encode(Message("t", b"more"), offset=tail_start + len(tail), queue_offset=10,
                   store_timestamp_ms=8)
    fast, slow = _scan_both(head + v6 + tail + bytes(100), monkeypatch)
    assert fast == slow
    assert fast.records == 6


def test_slave_append_raw_rejects_the_same_ranges(monkeypatch: pytest.MonkeyPatch) -> None:
    """A shipped range with a bad record in the middle is refused whole, by
    both paths, with the same reason; a good one is accepted by both."""
    good = _stored(30)
    bad = bytearray(good)
    at = 0
    for _ in range(15):  # to the 16th record
        at += struct.unpack_from(">i", good, at)[0]
    bad[at + 88 + 2] ^= 0x40  # a byte of its body: the CRC must catch it
    verdicts = []
    for use_native in (True, False):
        with monkeypatch.context() as m:
            if not use_native:
                m.setattr(native, "scan", None)
            d = tempfile.mkdtemp()
            try:
                s = MessageStore.open(d, CONFIG, clock=ManualClock())
                with pytest.raises(RangeRejectedError) as err:
                    s.log.append_raw(0, bytes(bad))
                assert s.log.wrote == 0
                assert s.log.append_raw(0, good) == len(good)
                s.close_sync()
                verdicts.append(str(err.value))
            finally:
                shutil.rmtree(d)
    assert verdicts[0] == verdicts[1]


BIG = StoreConfig(segment_size_bytes=4 * 1024 * 1024, max_message_size_bytes=512 * 1024,
                  flush_mode=FlushMode.ASYNC_FLUSH, crash_model=CrashModel.POWER)


@pytest.mark.parametrize(("config", "body_bytes"), [(CONFIG, 200), (BIG, 300 * 1024)],
                         ids=["small-records", "records-cut-by-1MiB-reads"])
def test_reput_builds_the_same_queues_natively(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               config: StoreConfig, body_bytes: int) -> None:
    """Topics, queues, tags (none, ASCII, non-ASCII, empty), segment rolls,
    IPv6-born records among them (the native gathering stops there and the
    Python walk takes over), records cut by the reput's 1 MiB reads: the
    native per-queue gathering gives the units the Python walk gives."""
    n = 600 if body_bytes < 1024 else 40
    msgs = [Message(f"t{i % 3}", bytes(body_bytes - i % 200), {"UNIQ_KEY": f"k{i}",
                                                         **({"TAGS": ["a", "標籤", ""][i % 3]}
                                                            if i % 4 else {})},
                    queue_id=i % 5,
                    born_host=("::1", 9) if i % 37 == 5 else ("127.0.0.1", 9))
            for i in range(n)]
    built = []
    for use_native in (True, False):
        with monkeypatch.context() as m:
            if not use_native:
                m.setattr(native, "reput_groups", None)
            d = tmp_path / ("n" if use_native else "p")
            s = MessageStore.open(str(d), config, clock=ManualClock())
            for i in range(0, n, 10):
                s.log.append(msgs[i:i + 10])
            s.reput()
            built.append({k: (list(q.offsets), list(q.sizes), list(q.tags))
                          for k, q in s.queues.queues.items()})
            built.append(s.queues.last_ts)
            s.close_sync()
    assert built[0] == built[2] and built[1] == built[3]
    assert sum(len(offsets) for offsets, _, _ in built[0].values()) == n
    assert len(built[0]) == 15 and any(t for _, _, tags in built[0].values() for t in tags)
