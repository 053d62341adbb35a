"""`dlab bench pipeline`: the report pipeline over synthetic results of
RUNS runs x OPS operations (default 1,000 x 10,000) against a plain Spark
scan of the same files — every history and records file parsed with the
declared schema and every column materialised (the `noop` sink) — in the
same Spark session. The ratio is pipeline time over scan time (lower is
better; goal <= 3). The scan runs before and after the pipeline and the
faster of the two is the baseline, so a cold first read cannot flatter
the ratio.

The synthetic runs follow chaos/schema.py exactly (a test validates them
with chaos.schema.validate_run_dir) and exercise every part of the checker:
the four modes, a clean and a master-crash scenario per mode with its
unflushed tail lost, a slave ahead of the restarted master, reused offsets
(divergence), failed and indeterminate puts, retries stored twice. They are
written by a process per core with %-formatted lines (json.dumps per row
would take minutes at this size).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import shutil
import tempfile
import time
import zlib
from typing import Any

from chaos.schema import SCHEMA_VERSION, write_json, write_jsonl

MODES = [("SYNC_MASTER", "SYNC_FLUSH"), ("SYNC_MASTER", "ASYNC_FLUSH"),
         ("ASYNC_MASTER", "SYNC_FLUSH"), ("ASYNC_MASTER", "ASYNC_FLUSH")]
SCENARIOS = ("clean-restart", "master-crash")
T0 = 1_700_000_000_000
OP_SPACING_MS = 6  # 10,000 operations make a one-minute run
LOST_TAIL = 25  # records a power crash takes from an ASYNC_FLUSH master

# Keys in sorted order, as chaos.schema.write_jsonl writes them.
_HISTORY = ('{"attempt": %d, "complete_ms": %d, "complete_us": %d, "detail": %s, '
            '"invoke_ms": %d, "invoke_us": %d, "msg_id": "%s", "node": "m", "offset": %s, '
            '"op_id": %d, "producer": %d, '
            '"size": %s, "status": "%s"}\n')
_RECORD = ('{"body_crc": %d, "msg_id": "%s", "offset": %d, "size": %d, '
           '"store_timestamp_ms": %d}\n')


def run_params(index: int, ops: int) -> dict[str, Any]:
    role, flush = MODES[index % len(MODES)]
    scenario = SCENARIOS[(index // len(MODES)) % len(SCENARIOS)]
    started = T0 + index * 100_000
    return {
        "schema_version": SCHEMA_VERSION, "run_id": f"{scenario}-{role}-{flush}-{index:05d}",
        "role": role, "flush": flush, "scenario": scenario, "seed": index,
        "backend": "local", "crash_model": "power", "slave_ahead_policy": "reject",
        "ha_ship_limit": "wrote",
        "nodes": [{"name": "m", "role": role}, {"name": "s", "role": "SLAVE"}],
        "failpoints": {}, "versions": {"dlab": "bench"},
        "started_ms": started, "ended_ms": started + ops * OP_SPACING_MS + 5_000,
    }


def write_run(root: str, index: int, ops: int) -> str:
    """Write one synthetic run; returns its directory."""
    p = run_params(index, ops)
    rng = random.Random(index)
    run_dir = os.path.join(root, p["run_id"])
    for node in ("m", "s"):
        os.makedirs(os.path.join(run_dir, "nodes", node), exist_ok=True)
    sync_master = p["role"] == "SYNC_MASTER"
    crash = p["scenario"] == "master-crash"
    crash_op = ops // 2 if crash else ops + 1
    down_until = p["started_ms"] + crash_op * OP_SPACING_MS + 1_500

    history: list[str] = []
    master: list[tuple[int, str, int, int]] = []  # offset, msg_id, size, crc
    slave: list[tuple[int, str, int, int]] = []
    offset = 0
    slave_follows = True
    ahead: tuple[int, int] | None = None

    def store(msg: str, size: int, crc: int) -> int:
        nonlocal offset
        at = offset
        master.append((at, msg, size, crc))
        if slave_follows:
            slave.append((at, msg, size, crc))
        offset += size
        return at

    op_id = 0
    while op_id < ops:
        invoke = p["started_ms"] + op_id * OP_SPACING_MS
        if op_id == crash_op and p["flush"] == "ASYNC_FLUSH":
            # Power loss: the unflushed tail is gone from the master; the slave
            # had received it and is now ahead. Under `reject` it stops
            # following the restarted master, which reuses the offsets.
            offset = master[-LOST_TAIL][0]
            del master[-LOST_TAIL:]
            ahead = (offset, slave[-1][0] + slave[-1][2])
            slave_follows = False
        msg = f"r{index}-{op_id}"
        latency = 1 + int(rng.expovariate(0.25)) + (8 if sync_master else 0)
        size = 180 + (op_id % 64)
        producer = op_id % 8
        crc = zlib.crc32(msg.encode()) & 0x7FFFFFFF
        r = rng.random()
        if crash_op <= op_id and invoke < down_until:  # the master is down
            status, stored = ("INDETERMINATE" if r < 0.3 else "SERVICE_NOT_AVAILABLE"), False
        elif sync_master and not slave_follows:
            status, stored = "SLAVE_NOT_AVAILABLE", True
        elif r < 0.005:
            status, stored = "INDETERMINATE", r < 0.0025
        elif r < 0.015:
            status, stored = ("FLUSH_SLAVE_TIMEOUT" if sync_master else "FLUSH_DISK_TIMEOUT"), True
        else:
            status, stored = "PUT_OK", True
        if status == "INDETERMINATE":
            latency = 3_000
        at = store(msg, size, crc) if stored else None
        reported = at is not None and status != "INDETERMINATE"
        history.append(_HISTORY % (
            1, invoke + latency, (invoke + latency) * 1000,
            "null" if status == "PUT_OK" else '"synthetic"', invoke, invoke * 1000, msg,
            at if reported else "null", op_id, producer, size if reported else "null", status))
        op_id += 1
        if status == "INDETERMINATE" and op_id < ops:
            # The client retries the same message; if the first attempt was
            # stored, the message is now stored twice.
            invoke += latency
            at = store(msg, size, crc)
            retry = "SLAVE_NOT_AVAILABLE" if sync_master and not slave_follows else "PUT_OK"
            history.append(_HISTORY % (2, invoke + 2, (invoke + 2) * 1000,
                                       "null" if retry == "PUT_OK" else '"synthetic"', invoke,
                                       invoke * 1000, msg, at, op_id, producer, size, retry))
            op_id += 1

    with open(os.path.join(run_dir, "history.jsonl"), "w", encoding="utf-8") as f:
        f.write("".join(history))
    for node, recs in (("m", master), ("s", slave)):
        with open(os.path.join(run_dir, "nodes", node, "records.jsonl"), "w",
                  encoding="utf-8") as f:
            f.write("".join(_RECORD % (crc, m, off, size, T0 + off)
                            for off, m, size, crc in recs))
        end = recs[-1][0] + recs[-1][2] if recs else 0
        write_json(os.path.join(run_dir, "nodes", node, "final.json"), {
            "name": node, "role": p["role"] if node == "m" else "SLAVE", "min_offset": 0,
            "flushed": end, "wrote": end, "first_bad_offset": None, "recoveries": [],
            "disk_damaged": False, "killed": crash and node == "m",
        })
    crash_ms = p["started_ms"] + crash_op * OP_SPACING_MS
    write_jsonl(os.path.join(run_dir, "faults.jsonl"), [
        {"fault_id": 1, "kind": "kill", "node": "m", "peer": None, "start_ms": crash_ms,
         "end_ms": down_until, "damages_disk": False, "detail": None}] if crash else [])
    write_jsonl(os.path.join(run_dir, "observations.jsonl"), [
        {"time_ms": down_until, "kind": "slave_ahead", "master": "m", "slave": "s",
         "master_offset": ahead[0], "slave_offset": ahead[1], "detail": None}] if ahead else [])
    write_json(os.path.join(run_dir, "params.json"), p)
    return run_dir


def _write_run_star(args: tuple[str, int, int]) -> str:
    return write_run(*args)


def generate(root: str, runs: int, ops: int, processes: int | None = None) -> list[str]:
    jobs = [(root, i, ops) for i in range(runs)]
    # fork: the workers need nothing but this module, and generation runs
    # before Spark starts.
    with multiprocessing.get_context("fork").Pool(processes or os.cpu_count() or 1) as pool:
        return pool.map(_write_run_star, jobs, chunksize=max(1, runs // 64))


def scan(spark: Any, run_dirs: list[str]) -> float:
    """Seconds to parse every large file with the declared schema and
    materialise every column."""
    from chaos.report.inputs import spark_schema
    from chaos.schema import HISTORY, RECORDS

    t0 = time.perf_counter()
    history = [os.path.join(d, "history.jsonl") for d in run_dirs]
    records = [os.path.join(d, "nodes", n, "records.jsonl") for d in run_dirs for n in "ms"]
    for paths, fields in ((history, HISTORY), (records, RECORDS)):
        (spark.read.schema(spark_schema(fields)).json(paths)
         .write.format("noop").mode("overwrite").save())
    return time.perf_counter() - t0


_COMPLETE = "complete"  # written last into a reusable results directory


def reusable_results(workdir: str | None, runs: int, ops: int) -> tuple[str, list[str], float]:
    """(directory, run directories, seconds generating) of the synthetic
    results kept in `workdir` for this size: generated the first time, read
    again later. Generation is deterministic (seeded by run index), so a
    reused set is the one a fresh run would write."""
    data = os.path.join(workdir or tempfile.gettempdir(), f"dlab-bench-pipeline-{runs}x{ops}")
    runs_dir = os.path.join(data, "runs")
    if os.path.exists(os.path.join(data, _COMPLETE)):
        return data, sorted(os.path.join(runs_dir, d) for d in os.listdir(runs_dir)), 0.0
    shutil.rmtree(data, ignore_errors=True)  # an interrupted generation
    t0 = time.perf_counter()
    dirs = generate(runs_dir, runs, ops)
    generate_s = time.perf_counter() - t0
    with open(os.path.join(data, _COMPLETE), "w", encoding="utf-8"):
        pass
    return data, dirs, generate_s


def bench_pipeline(runs: int, ops: int, workdir: str | None, spark_master: str | None,
                   keep: bool, reuse: bool = False) -> dict[str, Any]:
    from chaos.report.pipeline import build_report
    from chaos.report.progress import ConsoleProgress
    from chaos.spark_session import spark_session

    root = tempfile.mkdtemp(prefix="dlab-bench-pipeline-", dir=workdir)
    try:
        if reuse:
            data, dirs, generate_s = reusable_results(workdir, runs, ops)
            runs_root = os.path.join(data, "runs")
        else:
            t0 = time.perf_counter()
            runs_root = os.path.join(root, "runs")
            dirs = generate(runs_root, runs, ops)
            generate_s = time.perf_counter() - t0
        size = sum(os.path.getsize(os.path.join(r, f)) for d in dirs
                   for r, _, fs in os.walk(d) for f in fs)
        with spark_session(spark_master) as spark:
            scan_before = scan(spark, dirs)
            t0 = time.perf_counter()
            summary = build_report([runs_root], os.path.join(root, "report"),
                                   spark_master, progress=ConsoleProgress())
            pipeline_s = time.perf_counter() - t0
            scan_after = scan(spark, dirs)
            master = spark.sparkContext.master
    finally:
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
    baseline = min(scan_before, scan_after)
    v = summary.verdicts
    return {
        "bench": "pipeline", "runs": runs, "ops_per_run": ops, "spark_master": master,
        "input_bytes": size, "history_rows": int(v["puts"].sum()),
        "generate_s": round(generate_s, 2), "scan_s": round(baseline, 2),
        "scan_before_s": round(scan_before, 2), "scan_after_s": round(scan_after, 2),
        "pipeline_s": round(pipeline_s, 2), "ratio": round(pipeline_s / baseline, 3),
        "goal": "<= 3", "violations": summary.violations,
        "kept": root if keep else None, "reused": reuse and generate_s == 0.0,
    }


def cmd_pipeline(args: argparse.Namespace) -> int:
    from store.tools.cli_args import UserError

    if args.runs < 1 or args.ops < 10:
        raise UserError("--runs must be at least 1 and --ops at least 10")
    figures = bench_pipeline(args.runs, args.ops, args.workdir, args.spark_master, args.keep,
                             args.reuse)
    print(f"pipeline: {figures['runs']:,} runs x {figures['ops_per_run']:,} operations "
          f"({figures['input_bytes'] / 2**20:,.0f} MiB of JSON Lines)")
    rows = [("generate", "reused" if figures["reused"] else f"{figures['generate_s']:.1f} s"),
            ("plain Spark scan (baseline)", f"{figures['scan_s']:.1f} s  (before "
             f"{figures['scan_before_s']:.1f} s, after {figures['scan_after_s']:.1f} s)"),
            ("report pipeline", f"{figures['pipeline_s']:.1f} s"),
            ("ratio pipeline / scan", f"{figures['ratio']:.2f}  (goal {figures['goal']})")]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"  {k:<{width}}  {v}")
    print(json.dumps(figures, sort_keys=True))
    return 0


def register(subparsers: argparse._SubParsersAction, bench_subparsers: argparse._SubParsersAction
             ) -> None:
    from store.tools.cli_args import writable_dir

    p = bench_subparsers.add_parser(
        "pipeline",
        help="the report pipeline over synthetic results vs a plain Spark scan of them",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    p.add_argument("--runs", type=int, default=1000, help="runs (default: %(default)s)")
    p.add_argument("--ops", type=int, default=10_000,
                   help="operations per run (default: %(default)s)")
    p.add_argument("--workdir", type=writable_dir, default=None,
                   help="where the synthetic results go (default: the system temp dir)")
    p.add_argument("--spark-master", metavar="URL", default=None,
                   help="Spark master URL (default: local Spark on every core)")
    p.add_argument("--keep", action="store_true", help="keep the results and the report")
    p.add_argument("--reuse", action="store_true",
                   help="keep the synthetic results in WORKDIR/dlab-bench-pipeline-RUNSxOPS and "
                        "reuse them in later runs of the same size (delete that directory "
                        "when done)")
    p.set_defaults(handler=cmd_pipeline)
