"""`dlab store inspect` and store/tools/inspect.py: a read-only report of any store
directory — ours or one laid out by a RocketMQ broker — that agrees with what
recovery would do, names damage by offset and reason, never changes a byte,
and never answers bad input with a traceback."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from support.store_helpers import (
    SEG,
    fill,
    flip_bit,
    locate,
    mark_abnormal,
    message,
    patch,
    reopen,
    snapshot,
)

from cluster.cli.main import main
from store.config import TESTING, CorruptionPolicy
from store.log.checkpoint import lower_checkpoint, read_checkpoint
from store.log.record import MESSAGE_MAGIC, body_crc, encode, encode_blank
from store.log.segments import segment_name
from store.seams.disk import RealDisk
from store.store import MessageStore
from store.tools.inspect import InspectError, StoreFiles, inspect_store, iter_records

# What the `dlab` console script runs.
DLAB = [sys.executable, "-c", "import sys; from chaos.cli import main; sys.exit(main())"]


def dlab(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["store", "inspect", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_clean_store_report_and_nothing_changes(tmp_path: Path) -> None:
    results = fill(tmp_path, 700)
    before = snapshot(tmp_path)
    mtimes = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")}
    r = inspect_store(str(tmp_path))
    assert r.records == 700 and r.segment_size == SEG
    assert r.first_offset == 0 and r.max_valid_offset == r.end_offset == results[-1].end
    assert r.last_record_offset == results[-1].offset
    assert r.first_bad_offset is None and r.bad_reason is None and r.records_past_end == 0
    assert [s.name for s in r.segments] == [segment_name(i * SEG) for i in range(4)]
    assert [s.stop for s in r.segments] == ["blank", "blank", "blank", "end"]
    assert sum(s.records for s in r.segments) == 700 and all(s.in_log for s in r.segments)
    assert r.recovery.mode == "normal" and r.recovery.opens
    assert r.recovery.truncates_at is None and r.recovery.segments_removed == []
    assert r.recovery.scans_from == segment_name(SEG)  # the third-last segment
    assert not r.markers.abort_present and r.markers.checkpoint is not None
    assert r.markers.checkpoint.physic_ms == results[-1].store_timestamp_ms
    assert r.problems == []
    assert snapshot(tmp_path) == before  # not even the lock file was touched
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")} == mtimes


def test_damaged_store_report_matches_what_recovery_then_does(tmp_path: Path) -> None:
    results = fill(tmp_path, 1000)
    victim = next(i for i, r in enumerate(results) if r.offset >= 2 * SEG + 3000)
    bad = results[victim].offset
    flip_bit(tmp_path, bad + 100)
    mark_abnormal(tmp_path)
    before = snapshot(tmp_path)
    r = inspect_store(str(tmp_path))
    assert snapshot(tmp_path) == before
    assert r.records == victim and r.max_valid_offset == bad
    assert (r.first_bad_offset, r.bad_reason, r.bad_segment) == (bad, "crc", segment_name(2 * SEG))
    assert r.last_record_offset == results[victim - 1].offset
    assert [s.in_log for s in r.segments] == [True, True, True, False, False]
    assert r.records_past_end == sum(1 for x in results if x.offset >= 3 * SEG)
    assert r.recovery.mode == "abnormal" and r.recovery.truncates_at == bad
    assert r.recovery.segments_removed == [segment_name(3 * SEG), segment_name(4 * SEG)]
    assert any("abort file present" in p for p in r.problems)
    assert any(f"damaged record at offset {bad} (crc" in p for p in r.problems)
    assert any(n.startswith(f"corruption of flushed data in commitlog/{segment_name(2 * SEG)} "
                            f"at offset {bad}") and "does not open" in n for n in r.recovery.notes)

    records, report = reopen(tmp_path, TESTING.with_(corruption_policy=CorruptionPolicy.TRUNCATE))
    assert len(records) == r.records and report.max_valid_offset == r.max_valid_offset
    assert report.first_bad_offset == r.first_bad_offset
    assert [segment_name(s) for s in report.segments_dropped] == r.recovery.segments_removed


def test_normal_recovery_blind_spot_is_reported(tmp_path: Path) -> None:
    """After a clean shutdown recovery checks only the last three segments
    (as RocketMQ's recoverNormally): damage older than that stays. Inspect's
    full scan finds it and says recovery would not."""
    results = fill(tmp_path, 1000)
    flip_bit(tmp_path, results[10].offset + 100)
    r = inspect_store(str(tmp_path))
    assert r.first_bad_offset == results[10].offset and r.records == 10
    assert r.recovery.mode == "normal" and r.recovery.max_valid_offset == results[-1].end
    assert r.recovery.truncates_at is None
    assert any("would not see the damage" in n for n in r.recovery.notes)
    s = MessageStore.open(str(tmp_path), TESTING)
    try:
        assert s.recovery.max_valid_offset == r.recovery.max_valid_offset
    finally:
        s.close_sync()


def test_zero_tail_is_no_damage_but_stale_bytes_after_it_are_reported(tmp_path: Path) -> None:
    results = fill(tmp_path, 100, body_size=300)
    r = inspect_store(str(tmp_path))
    assert r.first_bad_offset is None and r.problems == []
    # What a crash inside a cut leaves: the checkpoint lowered to the last
    # record kept (a cut does that durably first, store/log/checkpoint.py
    # lower_checkpoint), the header at the cut zeroed, the rest not.
    cut = results[60].offset
    cp_path = str(tmp_path / "checkpoint")
    checkpoint, _ = read_checkpoint(cp_path)
    assert checkpoint is not None
    lower_checkpoint(RealDisk(), cp_path, checkpoint, results[59].store_timestamp_ms,
                     end=cut)
    patch(tmp_path, cut, bytes(8))
    r = inspect_store(str(tmp_path))
    assert r.records == 60 and r.max_valid_offset == cut and r.first_bad_offset is None
    assert any(f"non-zero bytes after the end of data at {cut}" in p for p in r.problems)
    assert r.recovery.truncates_at == cut
    assert any("interrupted truncation" in n for n in r.recovery.notes)


def test_torn_tail_and_a_file_cut_short(tmp_path: Path) -> None:
    results = fill(tmp_path, 300)
    end = results[-1].end
    patch(tmp_path, end, encode(message(300), offset=end, queue_offset=0,
                                store_timestamp_ms=1)[:70])
    r = inspect_store(str(tmp_path))
    assert r.first_bad_offset == end and r.records == 300
    assert r.bad_reason in {"layout", "crc"}
    file, pos = locate(tmp_path, results[-1].offset)
    os.truncate(file, pos + 30)
    r = inspect_store(str(tmp_path))
    assert r.first_bad_offset == results[-1].offset and r.records == 299
    assert r.bad_reason == "truncated"
    assert any("last segment is short" in p for p in r.problems)
    assert r.segments[-1].file_size == pos + 30


def test_layout_problems_are_reported_not_raised(tmp_path: Path) -> None:
    fill(tmp_path, 900)  # 5 segments
    log = tmp_path / "commitlog"
    files = sorted(log.iterdir())
    (log / "README").write_text("not a segment")
    os.truncate(files[1], 1234)  # a short segment in the middle
    files[3].unlink()  # a missing one
    r = inspect_store(str(tmp_path))
    assert r.segment_size == SEG and r.stray == ["README"]
    assert "stray file ignored: commitlog/README" in r.problems
    assert any(f"commitlog/{files[1].name}: 1234 bytes, segments here are {SEG}" in p
               for p in r.problems)
    assert any(f"commitlog/{files[4].name}: gap after {files[2].name}; a segment is missing"
               in p for p in r.problems)
    assert not r.recovery.opens
    assert any("a segment is missing" in x for x in r.recovery.refusal)
    assert r.segments[1].stop == "damage" and r.segments[1].reason == "truncated"
    assert r.max_valid_offset < 2 * SEG


@pytest.mark.parametrize("garbage", ["random_full", "random_short", "empty", "text"])
def test_garbage_in_place_of_a_segment_gives_a_report_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], garbage: str
) -> None:
    fill(tmp_path, 500)
    victim = tmp_path / "commitlog" / segment_name(SEG)
    victim.write_bytes({
        "random_full": os.urandom(SEG),
        "random_short": os.urandom(777),
        "empty": b"",
        "text": b"hello, I am not a segment\n" * 10,
    }[garbage])
    code, out, err = dlab(capsys, str(tmp_path), "--json")
    assert code == 0 and err == ""
    obj = json.loads(out)
    assert obj["first_bad_offset"] == SEG
    assert obj["segments"][1]["stop"] == "damage"
    assert obj["records"] == obj["segments"][0]["records"] > 0
    code, out, _ = dlab(capsys, str(tmp_path))
    assert code == 0 and f"first bad offset  {SEG} in commitlog/{segment_name(SEG)}" in out


def test_cli_json_and_records_on_a_damaged_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results = fill(tmp_path, 400)
    bad = results[250].offset
    flip_bit(tmp_path, bad + 95)
    code, out, err = dlab(capsys, str(tmp_path), "--json", "--records")
    assert code == 0 and err == ""
    assert out.count("\n") == 1  # ONE object, one line
    obj = json.loads(out)
    assert obj["records"] == 250 and obj["max_valid_offset"] == bad
    assert obj["first_bad_offset"] == bad and obj["bad_reason"] == "crc"
    assert len(obj["segments"]) == 2
    rows = obj["record_list"]
    assert len(rows) == 250
    for row, res in zip(rows, results, strict=False):
        assert res.msg_id is not None
        msg = message(int(res.msg_id[1:]))
        assert row == {"offset": res.offset, "size": res.size, "topic": "TopicTest",
                       "uniq_key": res.msg_id, "body_crc": body_crc(msg.body),
                       "store_timestamp_ms": res.store_timestamp_ms}
    code, out, _ = dlab(capsys, str(tmp_path), "--records")
    assert code == 0
    assert f"first bad offset  {bad} in commitlog/{segment_name(bad - bad % SEG)}: crc" in out
    assert f"max valid offset  {bad}" in out
    lines = [ln for ln in out.splitlines() if ln.strip().endswith(" TopicTest  m000249")]
    assert len(lines) == 1 and str(results[249].offset) in lines[0]


@pytest.mark.parametrize("case", ["missing", "file", "no_commitlog", "commitlog_itself"])
def test_not_a_store_dir_is_one_clear_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    fill(tmp_path / "store", 3)
    target, expect = {
        "missing": (tmp_path / "nope", "no such directory"),
        "file": (tmp_path / "store" / "checkpoint", "is a file, not a store directory"),
        "no_commitlog": (tmp_path, "is not a store directory: it has no commitlog/"),
        "commitlog_itself": (tmp_path / "store" / "commitlog", "pass its parent"),
    }[case]
    code, out, err = dlab(capsys, str(target))
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("dlab: error: ") and expect in err
    with pytest.raises(InspectError):
        inspect_store(str(target))


def test_real_cli_process_never_prints_a_traceback(tmp_path: Path) -> None:
    fill(tmp_path, 300)
    for f in (tmp_path / "commitlog").iterdir():
        f.write_bytes(os.urandom(f.stat().st_size // 3))  # every segment garbage, short
    (tmp_path / "checkpoint").write_bytes(b"\xff")
    mark_abnormal(tmp_path)
    for args in ([str(tmp_path)], [str(tmp_path), "--json", "--records"],
                 [str(tmp_path / "missing")]):
        res = subprocess.run([*DLAB, "store", "inspect", *args],
                             capture_output=True, text=True, timeout=60, check=False)
        assert "Traceback" not in res.stderr and res.returncode in (0, 2), res.stderr
        if "--json" in args:
            obj = json.loads(res.stdout)
            assert obj["first_bad_offset"] == 0 and obj["records"] == 0
            assert obj["record_list"] == []
            assert obj["markers"]["checkpoint_problem"] == "checkpoint is 1 bytes, needs 24"


def test_help_teaches(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["store", "inspect", "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    for phrase in ("read-only", "max_valid_offset", "first_bad_offset", "commitlog/",
                   "--json", "--records", "exit status", "blank", "recovery"):
        assert phrase in text, phrase


# --------------------------------------------- a store laid out by a RocketMQ broker
GIB = 1 << 30


def _rocketmq_record(offset: int, i: int, *, v6: bool) -> bytes:
    """A v1 record as a RocketMQ broker writes it, built by hand (not with
    store.log.record.encode): IPv6 hosts when v6, broker-style properties."""
    body = f"rocketmq body {i}".encode()
    topic = b"TopicTest"
    props = (f"UNIQ_KEY\x01AC11000100002A9F0000000{i:08X}\x02KEYS\x01k{i}\x02TAGS\x01TagA\x02"
             "WAIT\x01true\x02").encode()
    host = (bytes.fromhex("fe800000000000000000000000000001") if v6 else bytes([10, 0, 0, 9]))
    sys_flag = 0x30 if v6 else 0
    fields = (
        struct.pack(">iiiqqiq", body_crc(body), i % 4, 0, i // 4, offset, sys_flag,
                    1_690_000_000_000 + i)
        + host + struct.pack(">i", 50_000)
        + struct.pack(">q", 1_690_000_000_500 + i)
        + host + struct.pack(">i", 10_911)
        + struct.pack(">iqi", 0, 0, len(body)) + body
        + bytes([len(topic)]) + topic + struct.pack(">h", len(props)) + props
    )
    return struct.pack(">iI", 8 + len(fields), MESSAGE_MAGIC) + fields


def test_a_rocketmq_broker_store_with_1_gib_segments(tmp_path: Path) -> None:
    """Sparse 1 GiB segments (no real disk used), RocketMQ's other store
    directories next to commitlog/, IPv4 and IPv6 records, a blank closing
    the first segment far from its start."""
    for d in ("consumequeue/TopicTest/0", "index", "config"):
        (tmp_path / d).mkdir(parents=True)
    (tmp_path / "config" / "topics.json").write_text("{}")
    log = tmp_path / "commitlog"
    log.mkdir()
    total = 0
    for seg, count in ((0, 40), (GIB, 25)):
        path = log / segment_name(seg)
        with open(path, "wb") as f:
            f.truncate(GIB)
            pos = 0
            for i in range(count):
                raw = _rocketmq_record(seg + pos, total + i, v6=i % 3 == 0)
                f.seek(pos)
                f.write(raw)
                pos += len(raw)
            if seg == 0:
                f.seek(pos)
                f.write(encode_blank(GIB - pos))
        total += count
    before = snapshot(tmp_path / "config")
    with StoreFiles(str(tmp_path)) as files:
        r = files.inspect()
        recs = list(iter_records(r, files.read))
    assert r.segment_size == GIB and r.records == 65 and r.first_bad_offset is None
    assert [s.stop for s in r.segments] == ["blank", "end"]
    assert r.stray == [] and r.problems == ["checkpoint file is missing"]
    assert r.last_store_timestamp_ms == 1_690_000_000_500 + 64
    assert r.recovery.mode == "normal" and r.recovery.truncates_at is None
    assert len(recs) == 65 and recs[0].born_host == ("fe80::1", 50_000)
    assert recs[1].store_host == ("10.0.0.9", 10_911)
    assert recs[5].properties["TAGS"] == "TagA" and recs[5].msg_id is not None
    assert recs[40].offset == GIB
    assert snapshot(tmp_path / "config") == before
