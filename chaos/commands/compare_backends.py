"""`dlab chaos compare-backends`: the same scenarios on the local backend
(real processes, real time, real fsync) and the sim backend (the same node
code on simulated time, network and disk), and whether they agree on what
the lab is for:

1. which modes lose acknowledged messages from the recovered master;
2. which modes can leave a slave ahead of the recovered master;
3. that the SYNC_FLUSH modes lose nothing acknowledged.

Each backend's answer to 1 and 2 is the set of modes that showed the
outcome in at least one run. The rates behind them (k of n runs, with the
95 % Wilson interval of chaos/check/rates.py) are printed per mode and scenario,
so a difference in rate is seen even where the sets agree. A difference in
the sets is called "within chance" when the side that never saw the
outcome had few enough runs that seeing it in none of them has a chance
over 5 % at the lowest rate the other side's runs are consistent with (the
low end of their 95 % Wilson interval): one local run cannot contradict a
rate the sim measured, twenty can.

The sim side runs as a Spark sweep (chaos/matrix/sweep.py); the local runs go
first, one at a time, before Spark starts, so the JVM does not share the
cores with their timing. One report over both (grouped by backend) follows
unless --no-report.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from chaos.check.rates import rate_cell, wilson_interval
from chaos.harness import scenarios
from chaos.harness.run_config import FLUSHES, ROLES, KeepStores, RunConfig
from chaos.matrix.grid import MatrixConfig
from chaos.matrix.launch import keep_stores_option, results_dir, scenario_list
from chaos.matrix.sweep import SweepRun, run_in_order, run_sweep, sweep_context
from chaos.report.progress import MatrixProgress
from store.tools.cli_args import positive_float, positive_int

BACKENDS = ("sim", "local")
# (key, question, the per-run figure that shows it)
QUESTIONS = (
    ("lost_master", "which modes lose acknowledged messages from the recovered master",
     "acked_lost_master"),
    ("slave_ahead", "which modes can leave a slave ahead of the recovered master",
     "slave_ahead_bytes"),
)
# Seeing an outcome in none of n runs at rate p has probability (1 - p)^n;
# above this, a zero is "within chance".
CHANCE = 0.05


@dataclass(frozen=True)
class Tally:
    k: int
    n: int

    def cell(self) -> str:
        if not self.n:
            return "no runs"
        return rate_cell(self.k, self.n, *wilson_interval(self.k, self.n))


def none_seen_chance(seen: Tally, n: int) -> float:
    """How likely n runs show an outcome in none of them, at the lowest
    rate the side that saw it (k of its runs) is consistent with: the low
    end of its 95 % Wilson interval."""
    low, _ = wilson_interval(seen.k, seen.n)
    return float((1 - low) ** n)


def mode_of(cfg: RunConfig) -> str:
    return f"{cfg.role} + {cfg.flush}"


def _tally(runs: Sequence[tuple[RunConfig, SweepRun]], figure: str) -> Tally:
    judged = [getattr(r, figure) for _, r in runs if getattr(r, figure) is not None]
    return Tally(sum(1 for v in judged if v > 0), len(judged))


def compare(results: dict[str, list[tuple[RunConfig, SweepRun]]]) -> dict[str, Any]:
    """The agreement, as JSON: per question each backend's modes, the
    verdict, and the rates per mode (and per mode x scenario)."""
    modes = sorted({mode_of(c) for runs in results.values() for c, _ in runs},
                   key=lambda m: [f"{r} + {f}" for r in ROLES for f in FLUSHES].index(m))
    names = sorted({c.scenario.name for runs in results.values() for c, _ in runs})

    def runs_of(backend: str, mode: str, scenario: str | None = None
                ) -> list[tuple[RunConfig, SweepRun]]:
        return [(c, r) for c, r in results.get(backend, [])
                if mode_of(c) == mode and scenario in (None, c.scenario.name)]

    out: dict[str, Any] = {"modes": modes, "scenarios": names, "questions": {}}
    for key, question, figure in QUESTIONS:
        per_mode = {m: {b: _tally(runs_of(b, m), figure) for b in BACKENDS} for m in modes}
        shown = {b: [m for m in modes if per_mode[m][b].k] for b in BACKENDS}
        chance = []
        for m in modes:
            t = per_mode[m]
            seen = [b for b in BACKENDS if t[b].k]
            if len(seen) == 1:
                other = next(b for b in BACKENDS if b != seen[0])
                chance.append(none_seen_chance(t[seen[0]], t[other].n) > CHANCE)
        verdict = ("agree" if shown["sim"] == shown["local"]
                   else "differ, within chance at these n" if all(chance) else "differ")
        out["questions"][key] = {
            "question": question, "verdict": verdict, **{b: shown[b] for b in BACKENDS},
            "rates": {m: {b: {"k": per_mode[m][b].k, "n": per_mode[m][b].n,
                              "cell": per_mode[m][b].cell()} for b in BACKENDS}
                      for m in modes},
            "rates_by_scenario": {f"{m} | {s}": {b: _tally(runs_of(b, m, s), figure).cell()
                                                 for b in BACKENDS}
                                  for m in modes for s in names},
        }
    sync = {b: _tally([(c, r) for c, r in results.get(b, []) if c.flush == "SYNC_FLUSH"],
                      "acked_lost_master") for b in BACKENDS}
    holds = {b: sync[b].k == 0 for b in BACKENDS}
    out["questions"]["sync_flush_keeps"] = {
        "question": "the SYNC_FLUSH modes lose nothing acknowledged",
        # Both failing it is an agreement, on a broken promise (exit 1).
        "verdict": "agree" if holds["sim"] == holds["local"] else "differ",
        **{b: {"holds": holds[b], "runs_losing": sync[b].k, "runs": sync[b].n}
           for b in BACKENDS},
    }
    out["agree"] = all(q["verdict"] != "differ" for q in out["questions"].values())
    return out


def print_comparison(cmp: dict[str, Any]) -> None:
    for i, (key, _, _) in enumerate(QUESTIONS, 1):
        q = cmp["questions"][key]
        print(f"{i}. {q['question']}: {q['verdict'].upper()}")
        for b in BACKENDS:
            print(f"   {b:6} {', '.join(q[b]) or 'none'}")
        print(f"   {'mode | scenario':55} {'sim':22} local")
        for row, cells in q["rates_by_scenario"].items():
            print(f"   {row:55} {cells['sim']:22} {cells['local']}")
    q = cmp["questions"]["sync_flush_keeps"]
    print(f"3. {q['question']}: {q['verdict'].upper()}")
    for b in BACKENDS:
        print(f"   {b:6} {'holds' if q[b]['holds'] else 'DOES NOT HOLD'}: "
              f"{q[b]['runs_losing']} of {q[b]['runs']} SYNC_FLUSH runs lost an "
              "acknowledged message from the master")
    print(f"the backends {'agree' if cmp['agree'] else 'DISAGREE'} on what matters")


def _configs(args: argparse.Namespace, backend: str, runs: int) -> list[RunConfig]:
    template: dict[str, Any] = {"backend": backend, "sim_duration_s": args.sim_duration,
                                "keep_stores": KeepStores(args.keep_stores)}
    matrix = MatrixConfig(out_dir=os.path.join(args.out, backend), scenarios=args.scenarios,
                          runs=runs, base_seed=args.seed, template=template)
    return [replace(c, out_dir=os.path.abspath(c.out_dir)) for c in matrix.run_configs()]


def cmd_compare_backends(args: argparse.Namespace) -> int:
    names = args.scenarios or list(scenarios.QUICK_MATRIX)
    args.scenarios = names
    results_dir(args.out)
    configs = {"local": _configs(args, "local", args.local_runs),
               "sim": _configs(args, "sim", args.runs)}
    print(f"compare-backends: {', '.join(names)} x {len(ROLES) * len(FLUSHES)} modes; "
          f"{args.local_runs} local run(s) and {args.runs} sim run(s) per cell "
          f"({len(configs['local'])} + {len(configs['sim'])} runs); results in {args.out}",
          flush=True)
    results: dict[str, list[tuple[RunConfig, SweepRun]]] = {}
    with MatrixProgress(len(configs["local"])) as progress:
        outcome, runs = run_in_order(configs["local"], on_done=progress.done)
    results["local"] = list(zip(configs["local"], runs, strict=True))
    print(f"local: {len(outcome.run_dirs)} runs in {outcome.seconds:.1f} s "
          f"({outcome.runs_per_minute:.2f} runs/min), {len(outcome.failed)} failed", flush=True)
    failed = len(outcome.failed)
    with sweep_context(args.spark_master, args.out) as sc:
        with MatrixProgress(len(configs["sim"])) as progress:
            outcome, runs = run_sweep(sc, configs["sim"], on_done=progress.done)
        results["sim"] = list(zip(configs["sim"], runs, strict=True))
        print(f"sim: {len(outcome.run_dirs)} runs in {outcome.seconds:.1f} s "
              f"({outcome.runs_per_minute:.2f} runs/min), {len(outcome.failed)} failed",
              flush=True)
        failed += len(outcome.failed)
        code = conclude(args.out, results, failed)
        run_dirs = [r.run_dir for b in BACKENDS for _, r in results[b] if r.run_dir]
        if not args.no_report and run_dirs:
            from chaos.report.pipeline import build_report
            from chaos.report.progress import ConsoleProgress

            report_dir = os.path.join(args.out, "report")
            build_report(run_dirs, report_dir, spark_master=args.spark_master,
                         progress=ConsoleProgress(sys.stdout))
            print(f"report: {os.path.join(report_dir, 'report.html')} (both backends, rates "
                  "per cell with their intervals)", flush=True)
    print(f"agreement: {os.path.join(args.out, 'agreement.json')}")
    print(EXIT_MEANING[code])
    return code


# One meaning per exit status (docs: README, "Exit status"). The lab's own
# check failing (its backends disagree, or a run did not finish) is 3, not
# 1: a broken promise is a finding about the modes; a failed self-check says
# the lab's answer is not to be trusted, which is checked first.
EXIT_OK, EXIT_BROKEN_PROMISE, EXIT_USAGE, EXIT_SELF_CHECK = 0, 1, 2, 3
EXIT_MEANING = {
    EXIT_OK: "exit 0: the backends agree and no acknowledged message broke its mode's promise",
    EXIT_BROKEN_PROMISE: "exit 1: an acknowledged message broke its mode's promise (the runs "
                         "with promise violations are in agreement.json)",
    EXIT_SELF_CHECK: "exit 3: the lab's self-check failed: its backends disagree, or a run "
                     "did not finish; its answer is not to be trusted",
}


def exit_code(cmp: dict[str, Any]) -> int:
    """The exit status for a comparison: 3 for a failed self-check, else 1
    for a broken promise, else 0."""
    if not cmp["agree"] or cmp["failed_runs"]:
        return EXIT_SELF_CHECK
    return EXIT_BROKEN_PROMISE if cmp["violation_runs"] else EXIT_OK


def conclude(out: str, results: dict[str, list[tuple[RunConfig, SweepRun]]],
             failed: int) -> int:
    """Compare the judged runs of both backends, write OUT/agreement.json,
    print the comparison and return the exit status."""
    cmp = compare(results)
    cmp["failed_runs"] = failed
    broken = {b: sorted(r.run_id for _, r in results.get(b, []) if r.violated) for b in BACKENDS}
    cmp["violation_runs"] = {b: ids for b, ids in broken.items() if ids}
    with open(os.path.join(out, "agreement.json"), "w", encoding="utf-8") as f:
        json.dump(cmp, f, indent=1, sort_keys=True)
    print_comparison(cmp)
    for b, ids in cmp["violation_runs"].items():
        print(f"{b}: {len(ids)} run(s) broke a promise: {', '.join(ids)}")
    return exit_code(cmp)


EXIT = """exit status: 0 when the backends agree on the three questions (a difference
within chance at the runs given counts as agreeing), every run finished and no
acknowledged message broke its mode's promise; 1 when one did (a broken
promise); 2 for bad input; 3 when the lab's self-check failed: the backends
disagree or a run did not finish (checked first)."""


def register(csub: Any) -> None:
    p = csub.add_parser(
        "compare-backends", help="the quick scenarios on both backends: do they agree?",
        description="Runs scenarios (default: the quick ones the sim runs) in the four modes "
        "on the local backend (--local-runs per cell) and the sim backend (--runs per cell, "
        "as Spark tasks), then says whether they agree on which modes lose acknowledged "
        "messages from the recovered master, which can leave a slave ahead, and that the "
        "SYNC_FLUSH modes lose nothing acknowledged, with each side's rates. Then one "
        "report over both. Writes OUT/local, OUT/sim, OUT/agreement.json, OUT/report.",
        epilog=EXIT)
    p.add_argument("--out", required=True, help="results directory")
    p.add_argument("--runs", type=positive_int, default=10,
                   help="sim runs per cell (default %(default)s)")
    p.add_argument("--local-runs", type=positive_int, default=1,
                   help="local runs per cell (default %(default)s; about 7 a minute)")
    p.add_argument("--scenarios", type=scenario_list, default=None,
                   help="comma-separated scenarios (default: the quick matrix's that the sim "
                   "runs)")
    p.add_argument("--seed", type=int, default=1,
                   help="base seed: run k of every cell uses seed+k on both backends (default 1)")
    p.add_argument("--sim-duration", type=positive_float, default=60.0, metavar="S",
                   help="seconds of cluster time per sim run (default 60)")
    p.add_argument("--spark-master", default=None,
                   help="Spark master URL for the sim sweep and the report (default local[*])")
    p.add_argument("--no-report", action="store_true", help="skip the Spark report")
    keep_stores_option(p)
    p.set_defaults(handler=cmd_compare_backends)
