"""ha/frames.py against the protobuf runtime: the master's hand-encoded
messages are byte for byte what protobuf makes of them, the slave's fast
decoder agrees with protobuf's parse on everything, and any bytes either
decode or raise FrameError — nothing else."""

from __future__ import annotations

import random

import pytest

from ha import frames
from proto import ha_pb2


def _pb_range(offset: int, data: bytes, wrote: int) -> bytes:
    return ha_pb2.MasterMessage(range=ha_pb2.Range(offset=offset, data=data,
                                                   master_wrote=wrote)).SerializeToString()


CASES = [
    (0, b"", 0),  # every field at its default: an empty Range
    (0, b"x", 0),
    (1, b"", 1),  # a heartbeat
    (127, b"a" * 127, 128),  # varint length boundaries
    (128, b"b" * 128, 16383),
    (2**31, bytes(range(256)) * 64, 2**40),
    (2**62, b"\x00" * (1 << 20), 2**63 - 1),  # a 1 MiB range, the largest offsets
]


@pytest.mark.parametrize(("offset", "data", "wrote"), CASES)
def test_encode_range_is_protobufs_encoding(offset: int, data: bytes, wrote: int) -> None:
    assert frames.encode_range(offset, data, wrote) == _pb_range(offset, data, wrote)


@pytest.mark.parametrize(("offset", "data", "wrote"), CASES)
def test_decode_range_fast_path(offset: int, data: bytes, wrote: int) -> None:
    frame = frames.decode(_pb_range(offset, data, wrote))
    assert isinstance(frame, frames.RangeFrame)
    assert (frame.offset, bytes(frame.data), frame.master_wrote) == (offset, data, wrote)
    if data:
        assert isinstance(frame.data, memoryview)  # taken without a copy


def test_other_layouts_go_through_protobuf() -> None:
    # Fields out of number order and an unknown field are valid protobuf the
    # fast path does not take; the result must still be right.
    body = (b"\x18\x05"  # master_wrote=5 first
            + b"\x12\x03abc" + b"\x08\x02"  # data, then offset=2
            + b"\x20\x07")  # unknown field 4
    buf = b"\x0a" + bytes([len(body)]) + body
    assert frames._decode_range(buf) is None
    frame = frames.decode(buf)
    assert isinstance(frame, frames.RangeFrame)
    assert (frame.offset, bytes(frame.data), frame.master_wrote) == (2, b"abc", 5)


def test_negative_offset_decodes_as_int64_both_ways() -> None:
    # A master never ships one, but a slave must see -1 (and drop the stream
    # on the offset mismatch), not 2**64 - 1.
    buf = _pb_range(-1, b"x", -5)
    fast = frames._decode_range(buf)
    assert fast is not None and (fast.offset, fast.master_wrote) == (-1, -5)
    assert ha_pb2.MasterMessage.FromString(buf).range.offset == -1


def test_truncate_round_trip() -> None:
    frame = frames.decode(frames.encode_truncate(4096, "slave ahead"))
    assert frame == frames.TruncateFrame(4096, "slave ahead")


def test_a_message_with_neither_kind_is_refused() -> None:
    with pytest.raises(frames.FrameError, match="neither a range nor a truncate"):
        frames.decode(b"")


@pytest.mark.parametrize("buf", [b"\x0a", b"\x0a\x05\x08", b"\x0a\x03\x12\x09ab",
                                 b"\x0a\x0b\x08" + b"\xff" * 10, b"\xff\xff\xff"])
def test_malformed_bytes_raise_frame_error(buf: bytes) -> None:
    with pytest.raises(frames.FrameError):
        frames.decode(buf)


def _agree(buf: bytes) -> None:
    """decode(buf) is a frame protobuf agrees with, or FrameError."""
    try:
        frame = frames.decode(buf)
    except frames.FrameError:
        return
    msg = ha_pb2.MasterMessage.FromString(buf)  # decoded: protobuf must parse it too
    if isinstance(frame, frames.RangeFrame):
        r = msg.range
        assert msg.WhichOneof("kind") == "range"
        assert (frame.offset, bytes(frame.data), frame.master_wrote) == (
            r.offset, r.data, r.master_wrote)
    else:
        assert msg.WhichOneof("kind") == "truncate"
        assert (frame.offset, frame.reason) == (msg.truncate.offset, msg.truncate.reason)


def test_fuzz_decodes_agreeing_with_protobuf_or_raises_frame_error() -> None:
    rng = random.Random(3)
    seeds = [_pb_range(o, d[:300], w) for o, d, w in CASES] + [
        frames.encode_truncate(7, "why")]
    for _ in range(3000):
        buf = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 4)):
            op = rng.random()
            if op < 0.5 and buf:
                buf[rng.randrange(len(buf))] = rng.randrange(256)
            elif op < 0.75:
                del buf[rng.randrange(len(buf) + 1):]
            else:
                buf.insert(rng.randrange(len(buf) + 1), rng.randrange(256))
        _agree(bytes(buf))


def test_every_prefix_decodes_or_raises_frame_error() -> None:
    buf = _pb_range(123456789, bytes(range(200)), 987654321)
    for n in range(len(buf) + 1):
        _agree(buf[:n])
