"""`dlab chaos matrix --backend sim`: the runs of a matrix as Spark tasks.

A sim run (chaos/sim/run.py) is one process's CPU for a second or so and a pure
function of its RunConfig, so a sweep of many seeds is embarrassingly
parallel: each run is one Spark task that executes the run in a Python
worker, writes its run directory exactly as a run in the driver would (the
directory depends on the seed and parameters only, not on where it ran),
judges it from its read-back (chaos/check/summary.py) and sends back one short
line. Spark is the engine the report already runs on: `local[*]` by default
(every core of this machine), any master URL for a cluster, where the
results directory must be at the same path on every executor and the
project installed in the executors' Python.

Progress: the runs go in jobs of a few tasks each (a few jobs in flight, so
no core waits between them); as each job ends, its runs' lines are handed
to `on_done` in order, as `run_matrix` does for a run done in the driver.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from chaos.harness.runner import RunConfig
from chaos.matrix.grid import MatrixOutcome
from chaos.matrix.launch import KeepingStores, make_run
from cluster.backends.image import CheckedImages
from cluster.cli import interrupt

if TYPE_CHECKING:
    from pyspark import SparkContext

    from chaos.check.summary import RunOutcome

# Jobs in flight at once: while one job's last runs finish, the next one's
# tasks already fill the free cores.
JOBS_IN_FLIGHT = 3


@dataclass(frozen=True)
class SweepRun:
    """What a task sends back: where the run is, or why it failed; its
    outcome line and whether its read-back shows a promise broken."""

    run_id: str
    run_dir: str | None
    error: str | None
    line: str
    violated: bool
    wall_s: float
    cpu_s: float = 0.0  # the worker's CPU time for the run (process_time)


    # The figures compare-backends needs (chaos/check/summary.py's RunOutcome);
    # None when the run failed or its outcome could not be read.
    acked_lost_master: int | None = None
    slave_ahead_bytes: int | None = None
    promise_violations: int | None = None


def judge(run_id: str, run_dir: str | None, error: str | None, wall_s: float,
          outcome: RunOutcome | None = None) -> SweepRun:
    """A finished (or failed) run as a SweepRun, from its read-back (or from
    `outcome`, the one its keep decision already judged from it)."""
    from chaos.check.summary import outcome_line, run_outcome

    if error is not None or run_dir is None:
        return SweepRun(run_id, None, error, f"FAILED {error}", False, wall_s)
    try:
        o = outcome if outcome is not None else run_outcome(run_dir)
    except (ValueError, OSError) as exc:  # the report names a malformed run
        return SweepRun(run_id, run_dir, None, f"outcome unreadable ({exc})", False, wall_s)
    return SweepRun(run_id, run_dir, None, outcome_line(o), o.broke_a_promise, wall_s,
                    acked_lost_master=o.acked_lost_master,
                    slave_ahead_bytes=o.slave_ahead_bytes,
                    promise_violations=o.promise_violations)


def run_one(cfg: RunConfig, images: CheckedImages | None = None) -> SweepRun:
    """One run, in whichever process calls it (a Spark worker), judged;
    `images`: the node images already brought up to date (compose)."""
    t0, c0 = time.perf_counter(), time.process_time()
    outcome = None
    try:
        run = make_run(cfg, images=images)
        run_dir = run.execute()
        outcome = run.outcome if isinstance(run, KeepingStores) else None
        error = None
    except Exception as exc:
        run_dir, error = None, f"{type(exc).__name__}: {exc}"
    r = judge(cfg.run_id, run_dir, error, time.perf_counter() - t0, outcome)
    return replace(r, cpu_s=time.process_time() - c0)


def run_in_order(configs: Sequence[RunConfig], *,
                 on_done: Callable[[int, int, SweepRun], None] = lambda i, n, r: None
                 ) -> tuple[MatrixOutcome, list[SweepRun]]:
    """Every config in this process, one after the other (the local and
    compose backends: their runs are real processes on real time, which
    runs side by side would disturb)."""
    results: list[SweepRun] = []
    t0 = time.monotonic()
    # One image check for the whole sequence (compose): every run runs the
    # same node code, even if the sources change meanwhile.
    images = CheckedImages()
    for i, cfg in enumerate(configs, 1):
        r = run_one(cfg, images)
        results.append(r)
        on_done(i, len(configs), r)
        interrupt.check()  # a Ctrl-C a run's own code swallowed ends the sequence here
    return _outcome(results, time.monotonic() - t0), results


def _outcome(results: Sequence[SweepRun], seconds: float) -> MatrixOutcome:
    return MatrixOutcome(
        run_dirs=[r.run_dir for r in results if r.run_dir is not None],
        failed=[(r.run_id, r.error) for r in results if r.error is not None],
        seconds=seconds)


def _chunks(items: Sequence[RunConfig], size: int) -> Iterator[list[RunConfig]]:
    for i in range(0, len(items), size):
        yield list(items[i:i + size])


@contextmanager
def sweep_context(spark_master: str | None, out_dir: str) -> Iterator[SparkContext]:
    """The Spark session of a sweep (and of the report after it, which
    finds it active), its JVM's stderr in OUT/spark.log. Local Spark starts
    its Python workers with `python3` from PATH unless told otherwise: they
    get this interpreter, the one with the project installed (a cluster's
    executors bring their own)."""
    from chaos.spark_session import spark_session

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    print(f"starting Spark ({spark_master or 'local[*]'}) for the sweep", flush=True)
    with spark_session(spark_master, app_name="dlab sweep",
                       log_path=os.path.join(out_dir, "spark.log")) as spark:
        sc = spark.sparkContext
        print(f"sweep: runs as Spark tasks on {sc.master}, {sc.defaultParallelism} at a time",
              flush=True)
        yield sc


def run_sweep(sc: SparkContext, configs: Sequence[RunConfig], *,
              on_done: Callable[[int, int, SweepRun], None] = lambda i, n, r: None,
              chunk: int | None = None) -> tuple[MatrixOutcome, list[SweepRun]]:
    """Run every config as a Spark task on `sc`; a run that fails is kept
    with its error and the sweep goes on. `on_done(i, n, run)` is called
    in the driver for every run, in config order within each job. Ctrl-C
    cancels the jobs in flight."""
    # On a cluster an executor's working directory is not the driver's: the
    # driver's absolute paths, which every executor must see (module doc).
    configs = [replace(c, out_dir=os.path.abspath(c.out_dir)) for c in configs]
    for d in {c.out_dir for c in configs}:
        os.makedirs(d, exist_ok=True)
    size = chunk or max(1, sc.defaultParallelism)
    n = len(configs)
    results: list[SweepRun] = []
    t0 = time.monotonic()

    def job(part: list[RunConfig]) -> list[SweepRun]:
        try:
            return sc.parallelize(part, len(part)).map(run_one).collect()
        except Exception as exc:  # a worker died: its job's runs count as failed
            error = f"Spark job failed: {type(exc).__name__}: {str(exc)[:300]}"
            return [judge(c.run_id, None, error, 0.0) for c in part]

    parts = _chunks(configs, size)
    with ThreadPoolExecutor(max_workers=JOBS_IN_FLIGHT, thread_name_prefix="dlab-sweep") as pool:
        pending: list[Future[list[SweepRun]]] = []
        for part in parts:
            pending.append(pool.submit(job, part))
            if len(pending) == JOBS_IN_FLIGHT:
                break
        try:
            while pending:
                # Jobs are reported in submission order: lines come in config order.
                for r in pending.pop(0).result():
                    results.append(r)
                    on_done(len(results), n, r)
                nxt = next(parts, None)
                if nxt is not None:
                    pending.append(pool.submit(job, nxt))
        except BaseException:
            sc.cancelAllJobs()  # else the pool waits for every job in flight
            raise
    return _outcome(results, time.monotonic() - t0), results
