"""record.summarize, the read-back's twin of decode (store/log/record.py): for
any bytes it gives decode's answers (size, body CRC, store timestamp,
UNIQ_KEY), or refuses the record as decode does (tests/chaos/test_readback_summary.py
checks the read-back uses it)."""

from __future__ import annotations

import struct

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from store.log.record import (
    MESSAGE_MAGIC,
    UNIQ_KEY,
    CorruptRecordError,
    Message,
    RecordSummary,
    body_crc,
    decode,
    encode,
    summarize,
)

FUZZ = settings(max_examples=300, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow])

texts = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"],
                              exclude_characters="\x01\x02"), max_size=12)
messages = st.builds(
    Message,
    topic=st.sampled_from(["t", "chaos", "ü-topic"]),
    body=st.binary(max_size=200),
    properties=st.one_of(
        st.dictionaries(texts.filter(bool), texts, max_size=3),
        st.dictionaries(texts.filter(bool), texts, max_size=3).map(
            lambda d: {**d, UNIQ_KEY: "id-" + str(len(d))})),
    queue_id=st.integers(0, 2**31 - 1),
    flag=st.integers(-(2**31), 2**31 - 1),
    born_timestamp_ms=st.integers(0, 2**62),
    born_host=st.tuples(st.sampled_from(["127.0.0.1", "10.1.2.3"]), st.integers(0, 65535)),
)


def _outcome(fn: object, buf: bytes, offset: int) -> object:
    try:
        return fn(buf, 0, offset)  # type: ignore[operator]
    except CorruptRecordError as exc:
        return exc.reason


def _from_decode(buf: bytes, pos: int, offset: int) -> RecordSummary:
    rec = decode(buf, pos, offset=offset)
    return RecordSummary(rec.size, rec.body_crc, rec.store_timestamp_ms, rec.msg_id)


@given(messages, st.integers(0, 2**40), st.lists(st.tuples(st.integers(0, 10_000),
                                                         st.integers(1, 255)), max_size=3))
@FUZZ
def test_summarize_answers_as_decode_does_for_whole_and_damaged_records(
        msg: Message, offset: int, flips: list[tuple[int, int]]) -> None:
    raw = bytearray(encode(msg, offset=offset, queue_offset=3, store_timestamp_ms=1_700_000_000_555,
                           store_host=("10.0.0.2", 10911)))
    for i, x in flips:
        raw[i % len(raw)] ^= x
    buf = bytes(raw)
    full, fast = _outcome(_from_decode, buf, offset), _outcome(summarize, buf, offset)
    if isinstance(full, RecordSummary) and isinstance(fast, RecordSummary):
        assert fast == full
    else:  # both refuse the record (the reason may differ: verify checks in its own order)
        assert isinstance(full, str) and isinstance(fast, str), (full, fast)


def test_summarize_reads_properties_leniently_as_decode_does() -> None:
    """Bad UTF-8 and items without a separator, as another writer could
    leave them: the msg id is what decode says."""
    for props in (b"UNIQ_KEY\x01a\xffb\x02", b"junk\x02UNIQ_KEY\x01x\x02", b"UNIQ_KEY\x01one\x02"
                  b"UNIQ_KEY\x01two\x02", b"nothing-here"):
        base = encode(Message("t", b"body"), offset=64, queue_offset=0, store_timestamp_ms=9)
        raw = bytearray(base[:-2] + struct.pack(">h", len(props)) + props)
        struct.pack_into(">i", raw, 0, len(raw))
        assert summarize(bytes(raw), 0, 64) == _from_decode(bytes(raw), 0, 64), props


def test_summarize_reads_ipv6_hosts() -> None:
    body, topic, props = b"v6body", b"T6", b"UNIQ_KEY\x01six\x02"
    addr = bytes.fromhex("20010db8000000000000000000000001")
    fields = (
        struct.pack(">iiiqqiq", body_crc(body), 1, 0, 0, 8192, 0x30, 5)
        + addr + struct.pack(">i", 80) + struct.pack(">q", 6) + addr + struct.pack(">i", 81)
        + struct.pack(">iqi", 0, 0, len(body)) + body
        + bytes([len(topic)]) + topic + struct.pack(">h", len(props)) + props
    )
    raw = struct.pack(">iI", 8 + len(fields), MESSAGE_MAGIC) + fields
    assert summarize(raw, 0, 8192) == RecordSummary(len(raw), body_crc(body), 6, "six")
