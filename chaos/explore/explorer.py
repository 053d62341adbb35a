"""An exploration: the reference run, then one crash run per crash point,
target and disk state (chaos/explore/run.py), each judged by the checkers
every run is judged by (chaos/check/), the findings written as replayable
cases.

Runs go to a process pool (`workers`; 1: in this process) or, with a Spark
master, run as Spark tasks like the sim sweeps'. Each run is deterministic,
so where it ran changes nothing it writes. A run that broke
a promise, left a slave ahead of its master, diverged, lost an acknowledged
message its mode allows to lose, or (with a consumer) lost a message the
consumer had got is moved to OUT/cases/ (its
directory replays with `dlab chaos replay`); the others are deleted once
judged. OUT/explore.json holds the counts and every finding.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from chaos.check import divergence
from chaos.check.run_dirs import load_run
from chaos.check.summary import run_outcome
from chaos.explore import disk_states
from chaos.explore.disk_states import CrashState
from chaos.explore.run import CrashPlan, Event, ExploreRun
from chaos.explore.workload import ExploreOptions
from chaos.schema import read_jsonl

# What a finding is, in the order a run's kinds are listed.
VIOLATION = "violation"  # a PUT_OK its mode's promise or its own evidence does not hold
SLAVE_AHEAD = "slave-ahead"  # a slave held bytes past its recovered master's end
DIVERGENCE = "divergence"  # a slave holds other records than its master at one offset
ALLOWED_LOSS = "allowed-loss"  # an acknowledged message lost, as the mode allows
# With --consumer: a message the consumer got that no node holds at the end
# (chaos/check/consumption.py's delivered_then_lost).
DELIVERED_THEN_LOST = "delivered-then-lost"
# With --consumer: a message the recovered master holds, consumable, that
# the consumer never got though it drained the queues (consumption.py's
# stored_never_delivered: two records sharing a consume-queue offset).
STORED_NEVER_DELIVERED = "stored-never-delivered"
KINDS = (VIOLATION, SLAVE_AHEAD, DIVERGENCE, ALLOWED_LOSS, DELIVERED_THEN_LOST,
         STORED_NEVER_DELIVERED)
SPARK_TASK_RUNS = 8  # runs per Spark task: a run is a few hundredths of a CPU second


@dataclass(frozen=True)
class Task:
    """One crash run: at event `event`, crash `target`, leaving disk state
    `index`; then `promote` takes over (ExploreOptions.promotions: "" for
    a restart in place)."""

    event: int
    target: str
    index: int
    nodes: tuple[str, ...]
    state: CrashState
    expect: str
    promote: str = ""

    @property
    def name(self) -> str:
        over = f"-to-{self.promote}" if self.promote else ""
        return f"explore-e{self.event:04d}-{self.target}-d{self.index:03d}{over}"

    def record(self, opts: ExploreOptions) -> dict[str, Any]:
        """What the run's params.json says of it (`explore`): enough to run it again."""
        rec = {"options": opts.to_json(), "event": self.event, "target": self.target,
               "nodes": list(self.nodes), "state_index": self.index,
               "state": disk_states.to_json(self.state), "expect": self.expect}
        return {**rec, "promote": self.promote} if self.promote else rec

    @classmethod
    def from_record(cls, rec: dict[str, Any]) -> Task:
        return cls(int(rec["event"]), str(rec["target"]), int(rec["state_index"]),
                   tuple(rec["nodes"]), disk_states.from_json(rec["state"]),
                   str(rec["expect"]), str(rec.get("promote", "")))


@dataclass
class Counts:
    crash_points: int = 0
    states: int = 0  # distinct disk states explored (one run each, or one per promotion)
    pruned: int = 0  # disk states dropped as equivalent to one explored
    cut: int = 0  # distinct states past --max-disk-states, not explored
    runs: int = 0
    seconds: float = 0.0
    findings: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))


def crash_run(opts: ExploreOptions, task: Task, out_dir: str) -> ExploreRun:
    """The run of `task` (not yet executed), writing under `out_dir`."""
    plan = CrashPlan(task.event, task.target, task.nodes, task.state, task.expect,
                     task.promote)
    return ExploreRun(opts.run_config(task.name, out_dir), plan=plan,
                      limit=opts.max_disk_states, sector_bytes=opts.sector_bytes,
                      fsync_s=opts.fsync_ms / 1000, explore_record=task.record(opts),
                      after=opts.after_load())


def reference(opts: ExploreOptions, out_dir: str) -> ExploreRun:
    """The reference run (executed): every event, and the states a crash there leaves."""
    run = ExploreRun(opts.run_config("explore-reference", out_dir), plan=None,
                     limit=opts.max_disk_states, sector_bytes=opts.sector_bytes,
                     fsync_s=opts.fsync_ms / 1000,
                     explore_record={"options": opts.to_json(), "reference": True},
                     after=opts.after_load())
    run.execute()
    return run


class ExploreError(ValueError):
    """An exploration that cannot be run as asked; the message says why."""


def tasks_of(opts: ExploreOptions, ref: ExploreRun, counts: Counts) -> list[Task]:
    """Every crash run of the exploration (counts the crash points and states)."""
    out = []
    wanted = set(opts.events)
    beyond = sorted(wanted - {e.index for e in ref.probe.events})
    if beyond:
        raise ExploreError(f"--events {','.join(map(str, beyond))}: the reference run has "
                           f"{len(ref.probe.events)} crash points, numbered from 0 (see "
                           "explore.json `events`)")
    for event, states in zip(ref.probe.events, ref.states, strict=True):
        if wanted and event.index not in wanted:
            continue
        counts.crash_points += 1
        for target in opts.targets:
            found = states[target]
            counts.pruned += found.pruned
            counts.cut += found.cut
            nodes = ref.target_nodes(target)
            counts.states += len(found.states)
            out += [Task(event.index, target, i, nodes, state, event.label(), promote)
                    for i, state in enumerate(found.states)
                    for promote in opts.promotions(nodes, ref.initial_slaves)]
    return out


def judge(run_dir: str) -> dict[str, Any]:
    """The verdict of one finished run: the figures of chaos/check/summary.py
    (every PUT_OK judged against its mode's promises and its evidence) and
    the divergence rule (chaos/check/divergence.py); and the finding kinds."""
    outcome = run_outcome(run_dir)
    run = load_run(run_dir, 0)
    divergent, _ = divergence.divergence([read_jsonl(n.records_path) for n in run.nodes])
    kinds = []
    if outcome.broke_a_promise:
        kinds.append(VIOLATION)
    if outcome.slave_ahead_bytes > 0:
        kinds.append(SLAVE_AHEAD)
    if divergent:
        kinds.append(DIVERGENCE)
    if (outcome.acked_lost_master or outcome.acked_lost_everywhere) and not outcome.broke_a_promise:
        kinds.append(ALLOWED_LOSS)
    delivered_then_lost = (outcome.consumer or {}).get("delivered_then_lost") or 0
    if delivered_then_lost:
        kinds.append(DELIVERED_THEN_LOST)
    stored_never_delivered = (outcome.consumer or {}).get("stored_never_delivered") or 0
    if stored_never_delivered:
        kinds.append(STORED_NEVER_DELIVERED)
    return {"acked": outcome.acked, "puts": outcome.puts,
            "promise_violations": outcome.promise_violations,
            "evidence_breaches": outcome.evidence_breaches,
            "acked_lost_master": outcome.acked_lost_master,
            "acked_lost_everywhere": outcome.acked_lost_everywhere,
            "slave_ahead_bytes": outcome.slave_ahead_bytes, "divergent_records": divergent,
            "delivered_then_lost": delivered_then_lost,
            "stored_never_delivered": stored_never_delivered,
            "replication": outcome.replication, "kinds": kinds}


def run_task(opts: ExploreOptions, task: Task, out: str) -> dict[str, Any]:
    """Run and judge one task; keep its directory under OUT/cases/ if it found
    something, else delete it. Returns its row of explore.json."""
    run = crash_run(opts, task, os.path.join(out, "work"))
    run_dir = run.execute()
    verdict = judge(run_dir)
    row: dict[str, Any] = {"event": task.event, "label": task.expect, "target": task.target,
                           "state_index": task.index, "state": disk_states.to_json(task.state),
                           "promote": task.promote, "promoted": run.promoted, **verdict}
    if verdict["kinds"]:
        case = os.path.join(out, "cases", os.path.basename(run_dir))
        shutil.rmtree(case, ignore_errors=True)
        os.replace(run_dir, case)
        row["case"] = os.path.relpath(case, out)
    else:
        shutil.rmtree(run_dir)
    return row


def _run_chunk(opts: ExploreOptions, tasks: Sequence[Task], out: str) -> list[dict[str, Any]]:
    return [run_task(opts, t, out) for t in tasks]


def run_all(opts: ExploreOptions, tasks: Sequence[Task], out: str, workers: int,
            progress: Callable[[int], None],
            spark_master: str | None = None) -> Iterator[dict[str, Any]]:
    """Every task's row, in task order: as Spark tasks when `spark_master`
    is given, else on `workers` processes (1: here)."""
    os.makedirs(os.path.join(out, "cases"), exist_ok=True)
    if spark_master is not None:
        yield from _run_spark(opts, tasks, out, spark_master, progress)
        return
    if workers <= 1:
        for i, task in enumerate(tasks):
            yield run_task(opts, task, out)
            progress(i + 1)
        return
    size = max(1, min(16, len(tasks) // (workers * 8) or 1))
    chunks = [tasks[i:i + size] for i in range(0, len(tasks), size)]
    done = 0
    with ProcessPoolExecutor(max_workers=workers) as pool:
        for rows in pool.map(_run_chunk, [opts] * len(chunks), chunks, [out] * len(chunks)):
            yield from rows
            done += len(rows)
            progress(done)


def _run_spark(opts: ExploreOptions, tasks: Sequence[Task], out: str, spark_master: str,
               progress: Callable[[int], None]) -> Iterator[dict[str, Any]]:
    """The tasks as Spark tasks, as the sim sweeps run theirs
    (chaos/matrix/sweep.py): a few runs a task, a few tasks per core in each
    job; on a cluster OUT must be at the same path on every executor."""
    from chaos.spark_session import spark_session

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # the interpreter with dlab
    where = os.path.abspath(out)
    with spark_session(spark_master, app_name="dlab explore",
                       log_path=os.path.join(where, "spark.log")) as spark:
        sc = spark.sparkContext
        chunks = [list(tasks[i:i + SPARK_TASK_RUNS])
                  for i in range(0, len(tasks), SPARK_TASK_RUNS)]
        per_job = max(1, sc.defaultParallelism * 4)
        done = 0
        for i in range(0, len(chunks), per_job):
            part = chunks[i:i + per_job]
            for rows in sc.parallelize(part, len(part)).map(
                    lambda chunk: _run_chunk(opts, chunk, where)).collect():
                yield from rows
                done += len(rows)
                progress(done)


def explore(opts: ExploreOptions, out: str, *, workers: int,
            log: Callable[[str], None] = print,
            spark_master: str | None = None) -> tuple[Counts, list[dict[str, Any]]]:
    """The whole exploration into `out`; its counts and its findings' rows."""
    started = time.monotonic()
    os.makedirs(out, exist_ok=True)
    ref = reference(opts, os.path.join(out, "reference"))
    counts = Counts()
    tasks = tasks_of(opts, ref, counts)
    log(f"{opts.mode}: {counts.crash_points} crash points x {', '.join(opts.targets)}: "
        f"{counts.states} disk states, {len(tasks)} runs ({counts.pruned} pruned as "
        f"equivalent, {counts.cut} past --max-disk-states {opts.max_disk_states})")
    shown = [0]

    def progress(done: int) -> None:
        if done - shown[0] >= max(1, len(tasks) // 10) or done == len(tasks):
            shown[0] = done
            log(f"  {done}/{len(tasks)} runs, {time.monotonic() - started:.0f} s")

    findings = []
    for row in run_all(opts, tasks, out, workers, progress, spark_master):
        counts.runs += 1
        for kind in row["kinds"]:
            counts.findings[kind] += 1
        if row["kinds"]:
            findings.append(row)
    shutil.rmtree(os.path.join(out, "work"), ignore_errors=True)
    counts.seconds = round(time.monotonic() - started, 1)
    _write_summary(opts, out, counts, ref.probe.events, findings)
    return counts, findings


def _write_summary(opts: ExploreOptions, out: str, counts: Counts, events: Sequence[Event],
                   findings: list[dict[str, Any]]) -> None:
    doc = {"options": opts.to_json(),
           "counts": {"crash_points": counts.crash_points, "disk_states": counts.states,
                      "pruned": counts.pruned, "cut_by_bound": counts.cut,
                      "runs": counts.runs, "seconds": counts.seconds,
                      "findings": counts.findings},
           "events": [e.to_json() for e in events],
           "findings": findings}
    with open(os.path.join(out, "explore.json"), "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.write("\n")
