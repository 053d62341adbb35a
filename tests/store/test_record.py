"""The v1 record codec (store/log/record.py): round trip, the byte layout RocketMQ
readers depend on, the CRC, and the invariant every decoder must keep — any
bytes decode or raise CorruptRecordError, nothing else — fed whole and byte
at a time. Also that the fast twins (record.verify and the scan inlined in
store.log.recovery.scan_segment) accept exactly what the full decode accepts."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import crcmod.predefined
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from store.config import TESTING
from store.log import native as native_codec
from store.log.record import (
    BLANK_MAGIC,
    BLANK_SIZE,
    MESSAGE_MAGIC,
    UNIQ_KEY,
    CorruptRecordError,
    Message,
    body_crc,
    decode,
    decode_properties,
    encode,
    encode_blank,
    encode_properties,
    peek,
    verify,
)
from store.log.recovery import scan_segment
from store.status import PutStatus
from store.store import MessageStore

# database=None: no .hypothesis/ directory in the working tree; a failure
# prints its example, which is what reproduces it.
FUZZ = settings(max_examples=300, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow])

topics = st.text(
    st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=20
).filter(lambda t: 0 < len(t.encode()) <= 127)
prop_text = st.text(
    st.characters(codec="utf-8", exclude_categories=["Cs"], exclude_characters="\x01\x02"),
    max_size=12,
)
messages = st.builds(
    Message,
    topic=topics,
    body=st.binary(max_size=300),
    properties=st.dictionaries(prop_text.filter(bool), prop_text, max_size=4).map(
        lambda d: {**d, UNIQ_KEY: "id-" + str(len(d))}
    ),
    queue_id=st.integers(0, 2**31 - 1),
    flag=st.integers(-(2**31), 2**31 - 1),
    born_timestamp_ms=st.integers(0, 2**62),
    born_host=st.tuples(st.ip_addresses(v=4).map(str), st.integers(0, 65535)),
)
offsets = st.integers(0, 2**40)


def _encode(msg: Message, offset: int = 4096, ts: int = 1_700_000_000_123) -> bytes:
    return encode(msg, offset=offset, queue_offset=7, store_timestamp_ms=ts,
                  store_host=("10.0.0.2", 10911))


# ------------------------------------------------------------ round trip, layout
def test_round_trip_keeps_every_field() -> None:
    msg = Message("orders", b"hello world", {UNIQ_KEY: "7F0000010001", "KEYS": "k1 k2"},
                  queue_id=3, flag=5, born_timestamp_ms=1_699_999_999_000,
                  born_host=("10.0.0.1", 4321))
    raw = _encode(msg, offset=4096)
    rec = decode(raw, 0, offset=4096)
    assert (rec.offset, rec.size, rec.queue_id, rec.flag, rec.queue_offset) == (
        4096, len(raw), 3, 5, 7)
    assert rec.body == b"hello world" and rec.topic == "orders"
    assert rec.properties == {UNIQ_KEY: "7F0000010001", "KEYS": "k1 k2"}
    assert rec.msg_id == "7F0000010001"
    assert rec.born_timestamp_ms == 1_699_999_999_000
    assert rec.born_host == ("10.0.0.1", 4321)
    assert rec.store_timestamp_ms == 1_700_000_000_123
    assert rec.store_host == ("10.0.0.2", 10911)
    assert rec.sys_flag == 0 and rec.reconsume_times == 0
    assert rec.prepared_transaction_offset == 0
    assert rec.body_crc == zlib.crc32(b"hello world") & 0x7FFFFFFF


def test_byte_layout_matches_rocketmq_v1() -> None:
    body, topic = b"0123456789", "TopicTest"
    msg = Message(topic, body, {UNIQ_KEY: "abc"}, queue_id=2, flag=9,
                  born_timestamp_ms=111, born_host=("192.168.1.7", 5555))
    raw = _encode(msg, offset=123_456_789, ts=222)
    props = b"UNIQ_KEY\x01abc\x02"
    # 91 = 88 fixed bytes (body length included) + topic length byte + properties length
    assert len(raw) == 91 + len(body) + len(topic) + len(props)
    u32 = lambda at: struct.unpack_from(">I", raw, at)[0]  # noqa: E731
    i32 = lambda at: struct.unpack_from(">i", raw, at)[0]  # noqa: E731
    i64 = lambda at: struct.unpack_from(">q", raw, at)[0]  # noqa: E731
    assert i32(0) == len(raw)  # TOTALSIZE
    assert raw[4:8] == bytes.fromhex("DAA320A7") and u32(4) == MESSAGE_MAGIC
    assert i32(8) == zlib.crc32(body) & 0x7FFFFFFF  # BODYCRC
    assert i32(12) == 2 and i32(16) == 9  # QUEUEID, FLAG
    assert i64(20) == 7  # QUEUEOFFSET
    assert i64(28) == 123_456_789  # PHYSICALOFFSET
    assert i32(36) == 0  # SYSFLAG: both hosts IPv4
    assert i64(40) == 111  # BORNTIMESTAMP
    assert raw[48:52] == bytes([192, 168, 1, 7]) and i32(52) == 5555  # BORNHOST
    assert i64(56) == 222  # STORETIMESTAMP
    assert raw[64:68] == bytes([10, 0, 0, 2]) and i32(68) == 10911  # STOREHOSTADDRESS
    assert i32(72) == 0 and i64(76) == 0  # RECONSUMETIMES, PREPARED TRANSACTION OFFSET
    assert i32(84) == len(body) and raw[88:98] == body  # BODY
    assert raw[98] == len(topic) and raw[99:108] == topic.encode()  # TOPIC
    assert struct.unpack_from(">h", raw, 108)[0] == len(props)  # PROPERTIES
    assert raw[110:] == props


def test_properties_are_name_soh_value_stx() -> None:
    raw = encode_properties({UNIQ_KEY: "id1", "TAGS": "a"})
    assert raw == b"UNIQ_KEY\x01id1\x02TAGS\x01a\x02"
    assert decode_properties(raw) == {UNIQ_KEY: "id1", "TAGS": "a"}
    with pytest.raises(ValueError, match="separator"):
        encode_properties({"bad\x01name": "v"})
    with pytest.raises(ValueError, match="separator"):
        encode_properties({"name": "bad\x02value"})


def test_encode_rejects_what_the_layout_cannot_hold() -> None:
    with pytest.raises(ValueError, match="topic"):
        _encode(Message("", b"x"))
    with pytest.raises(ValueError, match="topic"):
        _encode(Message("t" * 128, b"x"))
    with pytest.raises(ValueError, match="properties"):
        _encode(Message("t", b"x", {"k": "v" * 40_000}))


def test_blank_is_size_and_blank_magic() -> None:
    blank = encode_blank(1000)
    assert len(blank) == BLANK_SIZE == 8
    assert blank == struct.pack(">iI", 1000, 0xCBD43194)
    assert peek(blank, 0) == (1000, BLANK_MAGIC)
    assert peek(blank, 1) == (0, 0)  # fewer than 8 bytes left


# ------------------------------------------------------------------------ CRC
def test_body_crc_is_rocketmq_crc32_with_sign_bit_cleared() -> None:
    assert zlib.crc32(b"123456789") == 0xCBF43926  # the standard CRC-32 check value
    assert body_crc(b"123456789") == 0xCBF43926 & 0x7FFFFFFF == 0x4BF43926
    raw = _encode(Message("t", b"123456789"))
    assert struct.unpack_from(">i", raw, 8)[0] == 0x4BF43926  # stored non-negative


@given(st.binary(max_size=2000))
@settings(max_examples=200, deadline=None, database=None)
def test_crcmod_crc32_equals_zlib(data: bytes) -> None:
    crcmod_crc32 = crcmod.predefined.mkCrcFun("crc-32")
    assert crcmod_crc32(data) == zlib.crc32(data)
    assert body_crc(data) == crcmod_crc32(data) & 0x7FFFFFFF


# --------------------------------------------------------- property round trip
@given(messages, offsets)
@FUZZ
def test_any_message_round_trips_and_twins_agree(msg: Message, offset: int) -> None:
    raw = _encode(msg, offset=offset)
    rec = decode(raw, 0, offset=offset)
    assert (rec.topic, rec.body, rec.properties) == (msg.topic, msg.body, dict(msg.properties))
    assert (rec.queue_id, rec.flag, rec.born_timestamp_ms) == (
        msg.queue_id, msg.flag, msg.born_timestamp_ms)
    assert rec.size == len(raw)
    assert verify(raw, 0, offset) == (rec.size, rec.store_timestamp_ms)
    # Inside a segment: the recovery scan finds exactly this one record.
    seg = raw + bytes(64)
    scan = scan_segment(seg, offset, offset)
    assert (scan.stop, scan.records, scan.end) == ("end", 1, offset + len(raw))


# -------------------------------------------------------------------- fuzzing
def _decode_outcome(buf: bytes, pos: int = 0, offset: int | None = None) -> str:
    """'ok' or the CorruptRecordError reason; anything else propagates (and fails)."""
    try:
        decode(buf, pos, offset=offset)
    except CorruptRecordError as exc:
        assert exc.reason in {"size", "magic", "crc", "layout", "position", "truncated"}
        return exc.reason
    return "ok"


def _verify_outcome(buf: bytes, offset: int) -> str:
    try:
        verify(buf, 0, offset)
    except CorruptRecordError as exc:
        assert exc.reason in {"size", "magic", "crc", "layout", "position", "truncated"}
        return exc.reason
    return "ok"


_VALID = _encode(Message("fuzz", b"payload" * 5, {UNIQ_KEY: "u1", "a": "b"}), offset=0)


@given(st.binary(max_size=400))
@example(_VALID)
@example(_VALID[:50])
@example(struct.pack(">iI", 200, MESSAGE_MAGIC) + bytes(192))
@example(struct.pack(">iI", -5, MESSAGE_MAGIC) + bytes(120))
@example(struct.pack(">iIiiiqqi", 150, MESSAGE_MAGIC, 0, 0, 0, 0, 0, 0x30) + bytes(130))
@FUZZ
def test_any_bytes_decode_or_raise_corrupt_record_error(data: bytes) -> None:
    _decode_outcome(data)
    _decode_outcome(data, offset=0)
    _verify_outcome(data, 0)
    for pos in (1, 7, len(data) // 2):
        _decode_outcome(data, pos)


@given(st.binary(min_size=1, max_size=300))
@example(_VALID)
@FUZZ
def test_byte_at_a_time_every_prefix_decodes_or_raises(data: bytes) -> None:
    for n in range(len(data) + 1):
        _decode_outcome(data[:n], offset=0)
        _verify_outcome(data[:n], 0)


def test_a_valid_record_decodes_only_whole() -> None:
    outcomes = [_decode_outcome(_VALID[:n], offset=0) for n in range(len(_VALID))]
    assert "ok" not in outcomes
    assert set(outcomes) == {"truncated"}
    assert _decode_outcome(_VALID, offset=0) == "ok"
    assert _decode_outcome(_VALID + b"trailing", offset=0) == "ok"  # size says where it ends


@given(st.data())
@FUZZ
def test_mutated_records_are_caught_alike_by_decode_verify_and_scan(data: st.DataObject) -> None:
    msg = data.draw(messages)
    offset = data.draw(offsets)
    raw = bytearray(_encode(msg, offset=offset))
    n = data.draw(st.integers(1, 4))
    for _ in range(n):
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] ^= data.draw(st.integers(1, 255))
    buf = bytes(raw)
    full = _decode_outcome(buf, offset=offset)
    fast = _verify_outcome(buf, offset)
    assert (full == "ok") == (fast == "ok"), (full, fast)
    scan = scan_segment(buf + bytes(64), offset, offset)
    if full == "ok":
        assert scan.records == 1 and scan.stop == "end"
    else:
        assert scan.records == 0
        assert scan.stop in ("damage", "end", "blank")  # a flip can forge a blank or zeros


def _with_properties(msg: Message, props: bytes, offset: int) -> bytes:
    """`msg` encoded at `offset` with PROPERTIES `props`, whatever their
    length: encode() refuses more than 32,767 bytes (RocketMQ's cap), so
    this is what another writer, or damage, could leave."""
    base = _encode(msg._replace(properties={}), offset=offset)
    raw = bytearray(base[:-2] + struct.pack(">H", len(props)) + props)
    struct.pack_into(">i", raw, 0, len(raw))
    return bytes(raw)


@given(st.data())
@FUZZ
def test_properties_of_any_length_are_judged_alike_by_decode_verify_and_scan(
        data: st.DataObject) -> None:
    """PROPERTIES length is a signed short (RocketMQ reads getShort): 32,768
    bytes or more is a corrupt record to every reader — decode, verify, the
    recovery scan with and without the native walk — never valid to one and
    corrupt to another."""
    msg = data.draw(messages)
    offset = data.draw(offsets)
    n = data.draw(st.one_of(st.integers(0, 200), st.integers(32_760, 32_800),
                            st.integers(65_500, 65_535), st.sampled_from([32_767, 32_768])))
    props = b"" if n < 3 else b"k\x01" + b"v" * (n - 3) + b"\x02"
    raw = _with_properties(msg, props, offset)
    expect = "ok" if n <= 32_767 else "layout"
    assert _decode_outcome(raw, offset=offset) == expect
    assert _verify_outcome(raw, offset) == expect
    for codec in ("native", "python"):
        with pytest.MonkeyPatch.context() as m:
            if codec == "python":
                m.setattr(native_codec, "scan", None)
            scan = scan_segment(raw + bytes(64), offset, offset)
        assert scan.records == (1 if expect == "ok" else 0), codec
        assert scan.stop == ("end" if expect == "ok" else "damage"), codec


def test_a_put_with_more_than_32767_bytes_of_properties_is_message_illegal(
        tmp_path: Path) -> None:
    s = MessageStore.open(str(tmp_path), TESTING)
    try:
        ok, big = s.append([Message("t", b"x", {"k": "v" * (32_767 - 3)}),
                            Message("t", b"x", {"k": "v" * (32_768 - 3)})])
        assert ok.status is PutStatus.PUT_OK
        assert big.status is PutStatus.MESSAGE_ILLEGAL and "32767" in big.detail
        assert s.log.wrote == ok.size
    finally:
        s.close_sync()


def test_flip_in_body_is_a_crc_error_and_in_offset_a_position_error() -> None:
    raw = bytearray(_VALID)
    raw[90] ^= 0x01  # inside the body
    with pytest.raises(CorruptRecordError) as err:
        decode(bytes(raw), 0, offset=0)
    assert err.value.reason == "crc"
    with pytest.raises(CorruptRecordError) as err:
        verify(bytes(raw), 0, 0)
    assert err.value.reason == "crc"
    assert decode(bytes(raw), 0, offset=0, check_crc=False).body != b"payload" * 5
    for check in (lambda: decode(_VALID, 0, offset=64), lambda: verify(_VALID, 0, 64)):
        with pytest.raises(CorruptRecordError) as err:
            check()
        assert err.value.reason == "position"
        # Said so a user can act on it: where, what it claims, what that means.
        assert str(err.value) == ("position: the record at offset 64 names offset 0 in its "
                                  "PHYSICALOFFSET field: its header is damaged, or it is not "
                                  "where the log wrote it")


def test_ipv6_hosts_decode_through_both_paths() -> None:
    """A RocketMQ broker may store IPv6 hosts (SYSFLAG bits 4 and 5): 16-byte
    addresses. Build one by hand and check decode and verify read it."""
    body, topic, props = b"v6body", b"T6", b"UNIQ_KEY\x01six\x02"
    addr = bytes.fromhex("20010db8000000000000000000000001")
    fields = (
        struct.pack(">iiiqqiq", body_crc(body), 1, 0, 0, 8192, 0x30, 5)
        + addr + struct.pack(">i", 80) + struct.pack(">q", 6) + addr + struct.pack(">i", 81)
        + struct.pack(">iqi", 0, 0, len(body)) + body
        + bytes([len(topic)]) + topic + struct.pack(">h", len(props)) + props
    )
    raw = struct.pack(">iI", 8 + len(fields), MESSAGE_MAGIC) + fields
    rec = decode(raw, 0, offset=8192)
    assert rec.born_host == ("2001:db8::1", 80) and rec.store_host == ("2001:db8::1", 81)
    assert rec.msg_id == "six" and rec.store_timestamp_ms == 6
    assert verify(raw, 0, 8192) == (len(raw), 6)
    assert scan_segment(raw + bytes(16), 8192, 8192).records == 1
