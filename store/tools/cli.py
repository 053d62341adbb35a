"""`dlab store ...`: commands over a store directory. `dlab store inspect`
prints what store/tools/inspect.py finds, as text or as one JSON object."""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import UTC, datetime
from typing import Any, TextIO

from store.tools.cli_args import UserError
from store.tools.inspect import InspectError, InspectReport, StoreFiles, iter_records

INSPECT_DESCRIPTION = """\
Read a store directory and report what is in it, without changing anything:
files are opened read-only, no lock is taken and nothing is written, so it is
safe on a directory a crashed node left behind (before recovery touches it)
and on a store written by a RocketMQ broker (v1 message layout).

DIR is the store root: the directory holding commitlog/ (the segment files,
named by their 20-digit start offset), checkpoint, abort and lock.

Every record of every segment is verified (size, magic code, PHYSICALOFFSET,
body CRC). The report says:
  - the segments: size, records, how each ends (blank = the 8-byte blank that
    closes a full segment; end = zeros, the normal end of data; damage);
  - records, the first offset and max_valid_offset (just past the last good
    record of the contiguous log: where the next record would go);
  - first_bad_offset: where the first damaged record starts, and why
    (size, magic, crc, layout, position, truncated), or none;
  - what opening the store would do: normal recovery (clean shutdown: checks
    the last three segments) or abnormal (abort file present: from the
    checkpoint on), and where it would truncate;
  - the abort, checkpoint and lock files, stray files, wrong-size segments and
    missing segments.
The segment size is inferred from the files."""

INSPECT_EPILOG = """\
examples:
  dlab store inspect data/node-1                 # readable summary
  dlab store inspect data/node-1 --json | jq .first_bad_offset
  dlab store inspect data/node-1 --records       # one line per record

--json prints one object. Its main keys:
  records, first_offset, max_valid_offset (= end_offset), last_record_offset,
  first_bad_offset, bad_reason, bad_detail, bad_segment, records_past_end,
  segment_size, stray, problems;
  segments: [{name, start, file_size, records, stop, end, in_log, bad_offset,
              reason, detail, problems}]  (in_log false: past the end of the log);
  recovery: {mode, opens, refusal, scans_from, max_valid_offset, first_bad_offset,
             truncates_at, segments_removed, notes};
  markers: {abort_present, abort_pid, lock_present, lock_pid, lock_held_by (the pid
            holding the lock while this was read: the store is in use), checkpoint
            ({physic_ms, logics_ms, index_ms, flushed_end}), checkpoint_problem};
  consume_queues: [{topic, queue_id, files, units, min_offset, max_offset,
                    first_bad_unit, reason}]  (units: what recovery keeps);
  with --records, record_list: [{offset, size, topic, uniq_key, body_crc,
                                 store_timestamp_ms}].

exit status: 0 when the directory was read (even if it holds damage: read the
report), 2 when DIR is missing or is not a store directory."""


def register(sub: Any, bench_sub: Any) -> None:
    store = sub.add_parser(
        "store",
        help="inspect a store directory",
        description="Commands over one store directory (a node's CommitLog).",
    )
    store_sub = store.add_subparsers(dest="store_command", metavar="COMMAND", required=True)
    p = store_sub.add_parser(
        "inspect",
        help="report segments, records, damage and what recovery would do (read-only)",
        description=INSPECT_DESCRIPTION,
        epilog=INSPECT_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("dir", metavar="DIR", help="the store root (holds commitlog/)")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object instead of text (with --records: a "
                   "'record_list' array of the records)")
    p.add_argument("--records", action="store_true",
                   help="also list every good record: offset, size, topic, UNIQ_KEY, "
                   "body CRC, store timestamp")
    p.set_defaults(handler=run_inspect)


def run_inspect(args: argparse.Namespace, out: TextIO | None = None) -> int:
    try:
        files = StoreFiles(args.dir)
    except InspectError as exc:
        raise UserError(str(exc)) from None
    try:
        with files:
            _print_inspect(files, args, out or sys.stdout)
    except BrokenPipeError:
        # The reader went away (`| head`): not an error. Point stdout at
        # /dev/null so the interpreter's final flush does not complain.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    return 0


def _print_inspect(files: StoreFiles, args: argparse.Namespace, out: TextIO) -> None:
    report = files.inspect()
    rows = (
        ({"offset": r.offset, "size": r.size, "topic": r.topic, "uniq_key": r.msg_id,
          "body_crc": r.body_crc, "store_timestamp_ms": r.store_timestamp_ms}
         for r in iter_records(report, files.read))
        if args.records else None
    )
    if args.json:
        obj = report.to_json()
        if rows is not None:
            obj["record_list"] = list(rows)
        json.dump(obj, out, sort_keys=True)
        out.write("\n")
    else:
        out.write(format_report(report))
        if rows is not None:
            out.write(f"\nrecords ({report.records}):\n")
            out.write(f"  {'offset':>14} {'size':>7}  {'body_crc':>10}  "
                      f"{'store_timestamp_ms':>18}  topic  UNIQ_KEY\n")
            for r in rows:
                out.write(f"  {r['offset']:>14} {r['size']:>7}  {r['body_crc']:>10}  "
                          f"{r['store_timestamp_ms']:>18}  {r['topic']}  "
                          f"{r['uniq_key'] or '-'}\n")


def _when(ms: int | None) -> str:
    if not ms:
        return "-"
    try:
        stamp = datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    except (OverflowError, OSError, ValueError):
        return str(ms)
    return f"{ms} ({stamp} UTC)"


def format_report(r: InspectReport) -> str:
    lines = [f"store {r.path}"]
    size = f"{r.segment_size} bytes" if r.segment_size else "unknown"
    lines.append(f"  segment size      {size} (inferred from the files), "
                 f"{len(r.segments)} segment(s)")
    lines.append(f"  records           {r.records}")
    lines.append(f"  first offset      {r.first_offset}")
    lines.append(f"  max valid offset  {r.max_valid_offset} (just past the last good record)")
    if r.last_record_offset is not None:
        lines.append(f"  last record at    {r.last_record_offset}")
    lines.append(f"  store times       {_when(r.first_store_timestamp_ms)} .. "
                 f"{_when(r.last_store_timestamp_ms)}")
    if r.first_bad_offset is None:
        lines.append("  first bad offset  none: no damaged record")
    else:
        lines.append(f"  first bad offset  {r.first_bad_offset} in commitlog/{r.bad_segment}: "
                     f"{r.bad_reason} ({r.bad_detail})")
    if r.records_past_end:
        lines.append(f"  past the end      {r.records_past_end} record(s) in segments after "
                     "the end of the log")
    m = r.markers
    lines.append("  abort             " + (f"present (pid {m.abort_pid or '?'}): open now, or "
                                           "not shut down cleanly" if m.abort_present
                                           else "absent: last shutdown was clean"))
    if m.checkpoint is not None:
        lines.append(f"  checkpoint        physic {_when(m.checkpoint.physic_ms)}")
        lines.append(f"                    logics {_when(m.checkpoint.logics_ms)}")
        end = m.checkpoint.flushed_end
        lines.append("                    flushed end " + (
            f"{end}" if end is not None else "not recorded (an older checkpoint)"))
    else:
        lines.append(f"  checkpoint        unusable: {m.checkpoint_problem}")
    lines.append("  lock              " + (
        f"held now by pid {m.lock_held_by}: the store is in use (see problems)"
        if m.lock_held_by is not None
        else f"last opened by pid {m.lock_pid or '?'}" if m.lock_present else "no lock file"))
    rec = r.recovery
    lines.append("")
    lines.append(f"opening it would run {rec.mode} recovery:")
    if not rec.opens:
        lines.append("  the store refuses to open:")
        lines.extend(f"    {x}" for x in rec.refusal)
    else:
        lines.append(f"  scans from commitlog/{rec.scans_from}, keeps up to offset "
                     f"{rec.max_valid_offset}")
        if rec.first_bad_offset is not None:
            lines.append(f"  stops at damage at {rec.first_bad_offset} ({rec.bad_reason})")
        if rec.truncates_at is not None:
            lines.append(f"  truncates everything from offset {rec.truncates_at}")
        else:
            lines.append("  truncates nothing")
        if rec.segments_removed:
            lines.append("  removes " + ", ".join(f"commitlog/{n}" for n in rec.segments_removed))
    lines.extend(f"  note: {n}" for n in rec.notes)
    if r.segments:
        lines.append("")
        lines.append("segments:")
        lines.append(f"  {'name':<20} {'file size':>10} {'records':>8}  {'ends':<10} "
                     f"{'at offset':>14}")
        for s in r.segments:
            ends = s.stop if s.in_log else f"{s.stop}*"
            lines.append(f"  {s.name:<20} {s.file_size:>10} {s.records:>8}  {ends:<10} "
                         f"{s.end:>14}")
        if any(not s.in_log for s in r.segments):
            lines.append("  * past the end of the log: its records do not count")
    if r.consume_queues:
        lines.append("")
        lines.append("consume queues:")
        lines.append(f"  {'topic/queue':<24} {'files':>5} {'units':>9} {'min':>9} {'max':>9}  "
                     "first bad unit")
        for q in r.consume_queues:
            bad = "-" if q.first_bad_unit is None else f"{q.first_bad_unit}: {q.reason}"
            lines.append(f"  {q.topic + '/' + str(q.queue_id):<24} {q.files:>5} {q.units:>9} "
                         f"{q.min_offset:>9} {q.max_offset:>9}  {bad}")
    if r.problems:
        lines.append("")
        lines.append("problems:")
        lines.extend(f"  - {p}" for p in r.problems)
    return "\n".join(lines) + "\n"
