"""`dlab bench sim`: the quick scenarios on the sim backend (chaos/sim.py),
as runs per minute and simulated seconds per wall second, against the local
backend's runs per minute (measured here with --measure-local: the same
cells, one run each; or given)."""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from dataclasses import dataclass

from chaos import scenarios
from chaos.runner import FLUSHES, ROLES, RunConfig
from chaos.schema import load_json_file
from chaos.workload import WorkloadConfig
from store.cli_args import positive_float, positive_int

GOAL_RATIO = 100.0


@dataclass(frozen=True)
class BackendFigures:
    runs: int
    wall_s: float
    simulated_s: float
    puts: int

    @property
    def runs_per_min(self) -> float:
        return 60.0 * self.runs / self.wall_s if self.wall_s else 0.0

    @property
    def simulated_per_wall(self) -> float:
        return self.simulated_s / self.wall_s if self.wall_s else 0.0


def _cells(runs: int, base_seed: int) -> list[tuple[str, str, str, int]]:
    from chaos.sim import SUPPORTED_SCENARIOS

    quick = [s for s in scenarios.QUICK_MATRIX if s in SUPPORTED_SCENARIOS]
    return [(sc, role, flush, base_seed + k) for sc in quick for role in ROLES
            for flush in FLUSHES for k in range(runs)]


def _measure(backend: str, runs: int, base_seed: int, out_dir: str, rate: float | None,
             duration_s: float) -> BackendFigures:
    from chaos.run_commands import make_run

    wall = simulated = 0.0
    puts = n = 0
    for sc, role, flush, seed in _cells(runs, base_seed):
        cfg = RunConfig(scenario=scenarios.get(sc), role=role, flush=flush, seed=seed,
                        out_dir=out_dir, backend=backend, sim_duration_s=duration_s,
                        workload=WorkloadConfig(rate_per_s=rate), keep_cluster_dir=False)
        t0 = time.perf_counter()
        run_dir = make_run(cfg).execute()
        wall += time.perf_counter() - t0
        params = load_json_file(os.path.join(run_dir, "params.json"))
        simulated += (params["sim"]["simulated_s"] if backend == "sim"
                      else (params["ended_ms"] - params["started_ms"]) / 1000)
        with open(os.path.join(run_dir, "history.jsonl"), "rb") as f:
            puts += sum(1 for _ in f)
        n += 1
    return BackendFigures(n, wall, simulated, puts)


def cmd_bench_sim(args: argparse.Namespace) -> int:
    from chaos.sim import DEFAULT_RATE_PER_S

    rate = args.rate or DEFAULT_RATE_PER_S
    with tempfile.TemporaryDirectory(prefix="dlab-bench-sim-") as d:
        sim = _measure("sim", args.runs, args.seed, os.path.join(d, "sim"), rate, args.duration)
        local = (_measure("local", 1, args.seed, os.path.join(d, "local"), None, args.duration)
                 if args.measure_local else None)
    local_rpm = local.runs_per_min if local is not None else args.local_runs_per_min
    figures = {
        "sim_runs": sim.runs, "sim_runs_per_min": round(sim.runs_per_min, 1),
        "sim_wall_s_per_run": round(sim.wall_s / sim.runs, 3),
        "sim_simulated_s_per_wall_s": round(sim.simulated_per_wall, 1),
        "sim_simulated_s_per_run": round(sim.simulated_s / sim.runs, 1),
        "sim_puts_per_run": round(sim.puts / sim.runs),
        "sim_rate_per_producer": rate,
        "local_runs_per_min": round(local_rpm, 2),
        "local_measured": local is not None,
        "local_simulated_s_per_wall_s": (round(local.simulated_per_wall, 2)
                                         if local is not None else None),
        "ratio": round(sim.runs_per_min / local_rpm, 1) if local_rpm else None,
        "goal": GOAL_RATIO,
    }
    if not args.json:
        print(f"sim: {sim.runs} runs of the quick scenarios, {figures['sim_wall_s_per_run']} s "
              f"each ({figures['sim_runs_per_min']} runs/min), "
              f"{figures['sim_simulated_s_per_wall_s']} simulated s per wall s, "
              f"{figures['sim_puts_per_run']} puts per run at {rate:g}/s per producer")
        source = "measured" if local is not None else "given (--local-runs-per-min)"
        print(f"local: {figures['local_runs_per_min']} runs/min ({source})")
        print(f"ratio sim/local runs per minute: {figures['ratio']} (goal {GOAL_RATIO:g})")
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
