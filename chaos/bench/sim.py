"""`dlab bench sim`: the first four quick scenarios on the sim backend (chaos/sim/run.py),
as runs per minute and simulated seconds per wall second, against the local
backend's runs per minute (measured here with --measure-local: the same
cells, one run each; or given).

A sim run is CPU-bound and a local run mostly waits, so a busy machine
lowers the first and hardly the second: the figures include the sim's CPU
seconds per run and the load average, and `ratio_cpu`, the ratio a sim with
a core to itself would reach. --jobs N runs the sim cells N at a time in
worker processes, as a sweep on N cores does (the local runs stay one at a
time).

`dlab bench sweep`: the throughput of a sim sweep as Spark tasks
(chaos/matrix/sweep.py) on 2 local cores over 1, the same runs each time."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

from chaos.harness import scenarios
from chaos.harness.run_config import MASTER_ROLES, Backend, RunConfig
from chaos.harness.workload import WorkloadConfig
from chaos.schema import load_json_file
from cluster.node.role import Role
from store.config import FlushMode
from store.tools.cli_args import positive_float, positive_int

GOAL_RATIO = 100.0


@dataclass(frozen=True)
class BackendFigures:
    runs: int
    wall_s: float
    simulated_s: float
    puts: int
    cpu_s: float = 0.0  # this process's CPU (or its workers'): the sim's own

    @property
    def runs_per_min(self) -> float:
        return 60.0 * self.runs / self.wall_s if self.wall_s else 0.0

    @property
    def simulated_per_wall(self) -> float:
        return self.simulated_s / self.wall_s if self.wall_s else 0.0


Cell = tuple[str, Role, FlushMode, int]  # scenario, role, flush, seed
# The four quick scenarios the bench has always run: master-crash-mid-flush
# joined the quick matrix on 2026-11-27 and stays out, so the figures per run
# compare with those measured before.
BENCH_SCENARIOS = scenarios.QUICK_MATRIX[:4]


def _cells(runs: int, base_seed: int) -> list[Cell]:
    return [(sc, role, flush, base_seed + k) for sc in BENCH_SCENARIOS
            for role in MASTER_ROLES for flush in FlushMode for k in range(runs)]


def _configs(runs: int, base_seed: int, out_dir: str, rate: float | None, duration_s: float,
             backend: Backend = Backend.SIM) -> list[RunConfig]:
    return [RunConfig(scenario=scenarios.get(sc), role=role, flush=flush, seed=seed,
                      out_dir=out_dir, backend=backend, sim_duration_s=duration_s,
                      workload=WorkloadConfig(rate_per_s=rate), keep_cluster_dir=False)
            for sc, role, flush, seed in _cells(runs, base_seed)]


def _one_run(backend: Backend, cell: Cell, out_dir: str, rate: float | None,
             duration_s: float) -> tuple[float, float, int, float]:
    """One run: (wall s, simulated s, puts, CPU s of this process)."""
    from chaos.matrix.launch import make_run

    sc, role, flush, seed = cell
    cfg = RunConfig(scenario=scenarios.get(sc), role=role, flush=flush, seed=seed,
                    out_dir=out_dir, backend=backend, sim_duration_s=duration_s,
                    workload=WorkloadConfig(rate_per_s=rate), keep_cluster_dir=False)
    t0, c0 = time.perf_counter(), time.process_time()
    run_dir = make_run(cfg).execute()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    params = load_json_file(os.path.join(run_dir, "params.json"))
    simulated = (params["sim"]["simulated_s"] if backend == "sim"
                 else (params["ended_ms"] - params["started_ms"]) / 1000)
    with open(os.path.join(run_dir, "history.jsonl"), "rb") as f:
        puts = sum(1 for _ in f)
    return wall, simulated, puts, cpu


def _measure(backend: Backend, runs: int, base_seed: int, out_dir: str, rate: float | None,
             duration_s: float, jobs: int = 1) -> BackendFigures:
    cells = _cells(runs, base_seed)
    if jobs > 1:
        t0 = time.perf_counter()
        with ProcessPoolExecutor(jobs) as pool:
            results = list(pool.map(_one_run, [backend] * len(cells), cells,
                                    [out_dir] * len(cells), [rate] * len(cells),
                                    [duration_s] * len(cells)))
        wall = time.perf_counter() - t0
    else:
        results = [_one_run(backend, cell, out_dir, rate, duration_s) for cell in cells]
        wall = sum(r[0] for r in results)
    return BackendFigures(len(results), wall, sum(r[1] for r in results),
                          sum(r[2] for r in results), sum(r[3] for r in results))


def cmd_bench_sim(args: argparse.Namespace) -> int:
    from chaos.sim.run import DEFAULT_RATE_PER_S

    rate = args.rate or DEFAULT_RATE_PER_S
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="dlab-bench-sim-") as d:
        sim = _measure(Backend.SIM, args.runs, args.seed, os.path.join(d, "sim"), rate,
                       args.duration, args.jobs)
        local = (_measure(Backend.LOCAL, 1, args.seed, os.path.join(d, "local"), None,
                          args.duration) if args.measure_local else None)
    local_rpm = local.runs_per_min if local is not None else args.local_runs_per_min
    cpu_per_run = sim.cpu_s / sim.runs
    figures = {
        "sim_runs": sim.runs, "sim_runs_per_min": round(sim.runs_per_min, 1),
        "sim_wall_s_per_run": round(sim.wall_s / sim.runs, 3),
        "sim_simulated_s_per_wall_s": round(sim.simulated_per_wall, 1),
        "sim_simulated_s_per_run": round(sim.simulated_s / sim.runs, 1),
        "sim_puts_per_run": round(sim.puts / sim.runs),
        "sim_rate_per_producer": rate,
        "sim_jobs": args.jobs,
        "sim_cpu_s_per_run": round(cpu_per_run, 3),
        "load_avg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "local_runs_per_min": round(local_rpm, 2),
        "local_measured": local is not None,
        "local_simulated_s_per_wall_s": (round(local.simulated_per_wall, 2)
                                         if local is not None else None),
        "ratio": round(sim.runs_per_min / local_rpm, 1) if local_rpm else None,
        "ratio_cpu": (round(60.0 / cpu_per_run / local_rpm, 1)
                      if local_rpm and cpu_per_run else None),
        "goal": GOAL_RATIO,
        # CPU per run moves with the interpreter's build as much as with the
        # code (docs/performance-notes.md, "The simulated cluster").
        "python": " ".join(sys.version.split()),
    }
    if not args.json:
        print(f"sim: {sim.runs} runs of the first four quick scenarios, "
              f"{figures['sim_wall_s_per_run']} s "
              f"each ({figures['sim_runs_per_min']} runs/min), "
              f"{figures['sim_simulated_s_per_wall_s']} simulated s per wall s, "
              f"{figures['sim_puts_per_run']} puts per run at {rate:g}/s per producer, "
              f"{figures['sim_cpu_s_per_run']} CPU s per run, {args.jobs} at a time")
        source = "measured" if local is not None else "given (--local-runs-per-min)"
        print(f"local: {figures['local_runs_per_min']} runs/min ({source})")
        print(f"python: {figures['python']}")
        print(f"ratio sim/local runs per minute: {figures['ratio']} (goal {GOAL_RATIO:g}); "
              f"{figures['ratio_cpu']} with a core per sim run (CPU time); "
              f"load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after")
    print(json.dumps(figures, sort_keys=True))
    return 0


SWEEP_GOAL = 1.6


def _warm(n: int) -> int:
    """A task's body for the warm-up: the imports a sim run needs."""
    import chaos.sim  # noqa: F401
    import chaos.summary  # noqa: F401

    return n


def _sweep_round(cores: int, runs: int, base_seed: int, out_dir: str, rate: float,
                 duration_s: float) -> tuple[float, int, float]:
    """(wall seconds, runs done, the runs' CPU seconds) of one sweep on
    local[cores], after its session has started and every worker has
    imported the sim."""
    from chaos.matrix.sweep import run_sweep
    from chaos.spark_session import spark_session

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    configs = _configs(runs, base_seed, out_dir, rate, duration_s)
    with spark_session(f"local[{cores}]", app_name="dlab bench sweep",
                       log_path=out_dir + ".spark.log") as spark:
        sc = spark.sparkContext
        sc.parallelize(range(cores), cores).map(_warm).collect()
        t0 = time.perf_counter()
        outcome, results = run_sweep(sc, configs)
        wall = time.perf_counter() - t0
    if outcome.failed:
        raise RuntimeError(f"{len(outcome.failed)} runs failed, e.g. {outcome.failed[0]}")
    return wall, len(outcome.run_dirs), sum(r.cpu_s for r in results)


def cmd_bench_sweep(args: argparse.Namespace) -> int:
    from chaos.sim.run import DEFAULT_RATE_PER_S

    rate = args.rate or DEFAULT_RATE_PER_S
    walls: dict[int, list[float]] = {1: [], 2: []}
    busy: dict[int, list[float]] = {1: [], 2: []}  # the runs' CPU s per wall s
    n = 0
    with tempfile.TemporaryDirectory(prefix="dlab-bench-sweep-") as d:
        for r in range(args.rounds):
            for cores in (1, 2):
                wall, n, cpu = _sweep_round(cores, args.runs, args.seed,
                                            os.path.join(d, f"r{r}-c{cores}"), rate,
                                            args.duration)
                walls[cores].append(wall)
                busy[cores].append(cpu / wall)
                if not args.json:
                    print(f"round {r + 1}: local[{cores}] {n} runs in {wall:.1f} s "
                          f"({60 * n / wall:.1f} runs/min); the runs had {cpu / wall:.2f} "
                          "CPU s per wall s", flush=True)
    med = {c: statistics.median(w) for c, w in walls.items()}
    figures = {
        "runs": n, "rounds": args.rounds, "sim_duration_s": args.duration,
        "rate_per_producer": rate,
        "runs_per_min_1_core": round(60 * n / med[1], 1),
        "runs_per_min_2_cores": round(60 * n / med[2], 1),
        "ratio": round(med[1] / med[2], 2), "goal": SWEEP_GOAL,
        # How many cores the runs got (CPU s per wall s): near 1 and 2 on an
        # idle machine; less when other work shares the cores.
        "cpu_per_wall_1_core": round(statistics.median(busy[1]), 2),
        "cpu_per_wall_2_cores": round(statistics.median(busy[2]), 2),
        "cpus": os.cpu_count(), "load_avg_1min": round(os.getloadavg()[0], 2),
    }
    if not args.json:
        print(f"ratio 2 cores over 1 (runs per minute, median of {args.rounds} round(s)): "
              f"{figures['ratio']} (goal {SWEEP_GOAL:g}); load average now "
              f"{figures['load_avg_1min']} on {figures['cpus']} CPUs")
    print(json.dumps(figures, sort_keys=True))
    return 0


def register(subparsers: argparse._SubParsersAction, bench_subparsers: argparse._SubParsersAction
             ) -> None:
    p = bench_subparsers.add_parser(
        "sim", help="the sim backend's runs per minute against the local backend's",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        epilog="The last line of output is one JSON object with the figures. Exit status 0.")
    p.add_argument("--runs", type=positive_int, default=3,
                   help="sim runs per cell (default %(default)s)")
    p.add_argument("--seed", type=int, default=1, help="base seed (default %(default)s)")
    p.add_argument("--rate", type=positive_float, default=None, metavar="PER_S",
                   help="messages per second per producer in the sim runs (default: the sim "
                        "backend's default)")
    p.add_argument("--jobs", type=positive_int, default=1,
                   help="sim runs at a time, in worker processes (default %(default)s)")
    p.add_argument("--duration", type=positive_float, default=60.0, metavar="S",
                   help="simulated seconds per sim run (default %(default)s)")
    p.add_argument("--measure-local", action="store_true",
                   help="also run every cell once on the local backend (minutes) instead of "
                        "taking --local-runs-per-min")
    p.add_argument("--local-runs-per-min", type=positive_float, default=7.0,
                   help="the local backend's quick-matrix runs per minute when not measured "
                        "(default %(default)s, docs/simulation.md)")
    p.add_argument("--json", action="store_true", help="print only the JSON line")
    p.set_defaults(handler=cmd_bench_sim)

    p = bench_subparsers.add_parser(
        "sweep", help="a sim sweep as Spark tasks: 2 cores over 1",
        description="Runs the same sim runs (the first four quick scenarios x 4 modes x --runs "
        "seeds) as a Spark sweep on local[1], then local[2], --rounds times, each after its "
        "session started and its workers imported the sim; prints runs per minute and ratio = "
        "2-core over 1-core throughput (median rounds).",
        epilog="The last line of output is one JSON object with the figures. Exit status 0.")
    p.add_argument("--runs", type=positive_int, default=2,
                   help="runs per cell (default %(default)s: 24 runs per sweep)")
    p.add_argument("--rounds", type=positive_int, default=1,
                   help="alternating 1-core/2-core rounds (default %(default)s)")
    p.add_argument("--seed", type=int, default=1, help="base seed (default %(default)s)")
    p.add_argument("--rate", type=positive_float, default=None, metavar="PER_S",
                   help="messages per second per producer (default: the sim backend's)")
    p.add_argument("--duration", type=positive_float, default=60.0, metavar="S",
                   help="simulated seconds per run (default %(default)s)")
    p.add_argument("--json", action="store_true", help="print only the JSON line")
    p.set_defaults(handler=cmd_bench_sweep)
