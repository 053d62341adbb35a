"""`dlab chaos compare-backends`: the same experiment on the local backend
(real processes, real time, real fsync) and the sim backend (the same node
code on simulated time, network and disk), and whether they agree on what
the lab is for:

1. which modes lose acknowledged messages from the recovered master;
2. which modes can leave a slave ahead of the recovered master;
3. that the SYNC_FLUSH modes lose nothing acknowledged.

The same experiment: both sides run the same workload (--producers, each
sending --rate puts a second, the same body sizes), for the same time (the
scenario's load_s), with the same fault schedule per seed. The sim side is
given this machine's timings (chaos/harness/timings.py): the fsync latency
measured on the results directory's disk before the runs, and the node's
time per put and a node's start time from the local runs, so that an fsync
is in flight in a sim run as often as in a local one and a restarted node
is down as long.

Per question and mode, each backend's rate is k of n runs (pooled over the
scenarios; the 95 % Wilson interval of chaos/check/rates.py), and the two
rates are compared by Fisher's exact test at a 5 % chance of a false alarm
over all the comparisons made (Bonferroni): a mode's verdict is

- `agree`: both saw it, or neither, or rates no test tells apart;
- `differ`: the rates differ beyond chance: the lab's self-check failed;
- `open`: one side saw it and the other, with few runs, did not, and that
  is within chance; the verdict says how many runs of the silent side
  would decide. An open question is not a finding and not a failure.

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

from chaos.check.rates import fisher_exact_p, rate_cell, runs_to_decide, wilson_interval
from chaos.harness import scenarios
from chaos.harness.run_config import FLUSHES, ROLES, KeepStores, RunConfig
from chaos.harness.timings import (
    LOOPBACK_NET_US,
    MachineTimings,
    measure_fsync_us,
    put_us_from_history,
    start_us_from_faults,
)
from chaos.harness.workload import WorkloadConfig
from chaos.matrix.grid import MatrixConfig
from chaos.matrix.launch import (
    controller_fields,
    controller_options,
    keep_stores_option,
    results_dir,
    scenario_list,
)
from chaos.matrix.sweep import SweepRun, run_in_order, run_sweep, sweep_context
from chaos.report.progress import MatrixProgress
from chaos.schema import read_jsonl
from ha.config import HAMode
from store.tools.cli_args import positive_float, positive_int

BACKENDS = ("sim", "local")
# (key, question, the per-run figure that shows it)
QUESTIONS = (
    ("lost_master", "which modes lose acknowledged messages from the recovered master",
     "acked_lost_master"),
    ("slave_ahead", "which modes can leave a slave ahead of the recovered master",
     "slave_ahead_bytes"),
)
# The chance of calling any of a comparison's rate pairs different when
# every pair is the same (shared among the pairs tested: Bonferroni).
FALSE_ALARM = 0.05
# The offered load both sides run by default: producers x puts/s each.
DEFAULT_PRODUCERS = 4
DEFAULT_RATE_PER_S = 50.0


@dataclass(frozen=True)
class Tally:
    k: int
    n: int

    def cell(self) -> str:
        if not self.n:
            return "no runs"
        return rate_cell(self.k, self.n, *wilson_interval(self.k, self.n))


def mode_of(cfg: RunConfig) -> str:
    """A mode's name in the comparison: role and flush, and in controller
    mode its settings (the role is the one they make)."""
    mode = f"{cfg.role} + {cfg.flush}"
    return mode if cfg.ha_mode is HAMode.CLASSIC else f"{mode} ({cfg.ha_label})"


def _mode_order(runs: Sequence[RunConfig]) -> list[str]:
    """Each mode once: classic first, in ROLES x FLUSHES order."""
    def key(c: RunConfig) -> tuple[int, int, int, str]:
        return (c.ha_mode is not HAMode.CLASSIC, ROLES.index(c.role), FLUSHES.index(c.flush),
                c.ha_label)
    out: list[str] = []
    for c in sorted(runs, key=key):
        if mode_of(c) not in out:
            out.append(mode_of(c))
    return out


def _tally(runs: Sequence[tuple[RunConfig, SweepRun]], figure: str) -> Tally:
    judged = [getattr(r, figure) for _, r in runs if getattr(r, figure) is not None]
    return Tally(sum(1 for v in judged if v > 0), len(judged))


def mode_verdict(sim: Tally, local: Tally, alpha: float, cells: int) -> dict[str, Any]:
    """One mode's verdict on one question (module doc): agree, differ or
    open, with Fisher's p and, when open, what would decide it. `cells`:
    the scenarios the mode's runs are pooled over (runs per cell = n/cells)."""
    out: dict[str, Any] = {"sim": {"k": sim.k, "n": sim.n, "cell": sim.cell()},
                           "local": {"k": local.k, "n": local.n, "cell": local.cell()}}
    if not sim.n or not local.n:
        return {**out, "verdict": "agree", "p": 1.0, "why": "one side has no runs"}
    p = fisher_exact_p(sim.k, sim.n, local.k, local.n)
    out["p"] = round(p, 6)
    if p < alpha:
        return {**out, "verdict": "differ",
                "why": f"sim {sim.cell()} vs local {local.cell()}: a difference this large "
                       f"has a chance of {p:.2g} if the rates were the same"}
    if (sim.k == 0) != (local.k == 0):
        seen, silent = ("sim", "local") if sim.k else ("local", "sim")
        t = sim if sim.k else local
        need = runs_to_decide(t.k, t.n)
        have = (local if sim.k else sim).n
        per_cell = -(-max(need - have, 1) // max(cells, 1))
        return {**out, "verdict": "open",
                "why": f"{seen} saw it in {t.k} of {t.n} runs, {silent} in none of {have}: "
                       f"within chance; about {per_cell} more {silent} run(s) per cell "
                       f"({need} in all) would decide"}
    return {**out, "verdict": "agree", "why": ""}


def compare(results: dict[str, list[tuple[RunConfig, SweepRun]]]) -> dict[str, Any]:
    """The agreement, as JSON: per question each backend's modes, the
    verdict per mode and overall, and the rates per mode (and per mode x
    scenario)."""
    modes = _mode_order([c for runs in results.values() for c, _ in runs])
    names = sorted({c.scenario.name for runs in results.values() for c, _ in runs})
    alpha = FALSE_ALARM / max(1, len(modes) * len(QUESTIONS))

    def runs_of(backend: str, mode: str, scenario: str | None = None
                ) -> list[tuple[RunConfig, SweepRun]]:
        return [(c, r) for c, r in results.get(backend, [])
                if mode_of(c) == mode and scenario in (None, c.scenario.name)]

    out: dict[str, Any] = {"modes": modes, "scenarios": names, "questions": {},
                           "alpha_per_test": alpha}
    for key, question, figure in QUESTIONS:
        per_mode = {m: mode_verdict(_tally(runs_of("sim", m), figure),
                                    _tally(runs_of("local", m), figure), alpha, len(names))
                    for m in modes}
        shown = {b: [m for m in modes if per_mode[m][b]["k"]] for b in BACKENDS}
        verdicts = {v["verdict"] for v in per_mode.values()}
        verdict = "differ" if "differ" in verdicts else "open" if "open" in verdicts else "agree"
        out["questions"][key] = {
            "question": question, "verdict": verdict, **{b: shown[b] for b in BACKENDS},
            "rates": per_mode,
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
        w = max([28, *(len(m) for m in q["rates"])])
        print(f"   {'mode':{w}} {'sim':24} {'local':24} verdict")
        for mode, v in q["rates"].items():
            print(f"   {mode:{w}} {v['sim']['cell']:24} {v['local']['cell']:24} {v['verdict']}")
            if v["why"] and v["verdict"] != "agree":
                print(f"      {v['why']}")
        w = max([55, *(len(r) for r in q["rates_by_scenario"])])
        print(f"   {'mode | scenario':{w}} {'sim':22} local")
        for row, cells in q["rates_by_scenario"].items():
            print(f"   {row:{w}} {cells['sim']:22} {cells['local']}")
    q = cmp["questions"]["sync_flush_keeps"]
    print(f"3. {q['question']}: {q['verdict'].upper()}")
    for b in BACKENDS:
        print(f"   {b:6} {'holds' if q[b]['holds'] else 'DOES NOT HOLD'}: "
              f"{q[b]['runs_losing']} of {q[b]['runs']} SYNC_FLUSH runs lost an "
              "acknowledged message from the master")
    opened = [k for k, q in cmp["questions"].items() if q["verdict"] == "open"]
    if not cmp["agree"]:
        print("the backends DISAGREE on what matters (a 'differ' above)")
    elif opened:
        print("the backends AGREE on what these runs decide; open (not a finding either "
              f"way): {', '.join(opened)}")
    else:
        print("the backends AGREE on what matters")


def _configs(args: argparse.Namespace, backend: str, runs: int,
             timings: MachineTimings | None = None) -> list[RunConfig]:
    """The runs of one side: the same scenarios, seeds, workload and load
    duration on both (the sim's load lasts the scenario's load_s, as a
    local run's does)."""
    template: dict[str, Any] = {
        "backend": backend, "sim_duration_s": None, "sim_timings": timings,
        "keep_stores": KeepStores(args.keep_stores),
        "workload": WorkloadConfig(producers=args.producers, rate_per_s=args.rate),
        "slaves": args.slaves, **controller_fields(args)}
    matrix = MatrixConfig(out_dir=os.path.join(args.out, backend), scenarios=args.scenarios,
                          runs=runs, base_seed=args.seed, template=template,
                          ha_modes=args.ha_modes or [args.ha_mode])
    return [replace(c, out_dir=os.path.abspath(c.out_dir)) for c in matrix.run_configs()]


def measured_put_us(local: Sequence[tuple[RunConfig, SweepRun]], net_us: tuple[float, float]
                    ) -> float | None:
    """The node's time per put, from the local runs: the median round trip
    of a put nothing waited on (ASYNC_MASTER + ASYNC_FLUSH, before the
    run's first fault; any mode's runs if there are none), less the two
    network hops the sim adds around it."""
    def medians(modes: set[str]) -> list[float]:
        out = []
        for cfg, run in local:
            if run.run_dir is None or mode_of(cfg) not in modes:
                continue
            faults = read_jsonl(os.path.join(run.run_dir, "faults.jsonl"))
            first = min((f["start_ms"] for f in faults), default=None)
            m = put_us_from_history(read_jsonl(os.path.join(run.run_dir, "history.jsonl")),
                                    first)
            if m is not None:
                out.append(m)
        return out

    found = (medians({"ASYNC_MASTER + ASYNC_FLUSH"})
             or medians({mode_of(c) for c, _ in local}))
    if not found:
        return None
    found.sort()
    return round(max(0.0, found[len(found) // 2] - (net_us[0] + net_us[1])), 1)


def measured_start_us(local: Sequence[tuple[RunConfig, SweepRun]]) -> float:
    """The median time a node took to start in the local runs' `start`
    steps, or where none started a node their `promote` steps (0 when
    neither ran)."""
    faults = [read_jsonl(os.path.join(run.run_dir, "faults.jsonl"))
              for _, run in local if run.run_dir is not None]
    for kind in ("start", "promote"):
        found = sorted(us for rows in faults for us in start_us_from_faults(rows, kind))
        if found:
            return found[len(found) // 2]
    return 0.0


def cmd_compare_backends(args: argparse.Namespace) -> int:
    names = args.scenarios or list(scenarios.QUICK_MATRIX)
    args.scenarios = names
    results_dir(args.out)
    local_configs = _configs(args, "local", args.local_runs)
    sim_runs = len(local_configs) // args.local_runs * args.runs
    modes = len({mode_of(c) for c in local_configs})
    print(f"compare-backends: {', '.join(names)} x {modes} modes; "
          f"{args.local_runs} local run(s) and {args.runs} sim run(s) per cell "
          f"({len(local_configs)} + {sim_runs} runs); results in {args.out}", flush=True)
    print(f"workload on both sides: {args.producers} producers x {args.rate:g} puts/s "
          f"({args.producers * args.rate:g} puts/s offered), for each scenario's load time, "
          f"{args.slaves} slave(s)", flush=True)
    fsync_us = measure_fsync_us(args.out)
    results: dict[str, list[tuple[RunConfig, SweepRun]]] = {}
    with MatrixProgress(len(local_configs)) as progress:
        outcome, runs = run_in_order(local_configs, on_done=progress.done)
    results["local"] = list(zip(local_configs, runs, strict=True))
    print(f"local: {len(outcome.run_dirs)} runs in {outcome.seconds:.1f} s "
          f"({outcome.runs_per_minute:.2f} runs/min), {len(outcome.failed)} failed", flush=True)
    failed = len(outcome.failed)
    put_us = measured_put_us(results["local"], LOOPBACK_NET_US)
    timings = MachineTimings(fsync_us=fsync_us, put_us=put_us or 0.0,
                             start_us=measured_start_us(results["local"]))
    print(f"this machine, for the sim side: {timings.describe()}"
          + ("" if put_us is not None else " (no local PUT_OK to measure the put time from)"),
          flush=True)
    sim_configs = _configs(args, "sim", args.runs, timings)
    with sweep_context(args.spark_master, args.out) as sc:
        with MatrixProgress(len(sim_configs)) as progress:
            outcome, runs = run_sweep(sc, sim_configs, on_done=progress.done)
        results["sim"] = list(zip(sim_configs, runs, strict=True))
        print(f"sim: {len(outcome.run_dirs)} runs in {outcome.seconds:.1f} s "
              f"({outcome.runs_per_minute:.2f} runs/min), {len(outcome.failed)} failed",
              flush=True)
        failed += len(outcome.failed)
        code = conclude(args.out, results, failed, {
            "producers": args.producers, "rate_per_s": args.rate, "slaves": args.slaves,
            "offered_puts_per_s": args.producers * args.rate,
            "timings": timings.as_record()})
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
             failed: int, experiment: dict[str, Any] | None = None) -> int:
    """Compare the judged runs of both backends, write OUT/agreement.json
    (with `experiment`: the workload and timings both sides ran), print the
    comparison and return the exit status."""
    cmp = compare(results)
    cmp["failed_runs"] = failed
    cmp["experiment"] = experiment or {}
    broken = {b: sorted(r.run_id for _, r in results.get(b, []) if r.violated) for b in BACKENDS}
    cmp["violation_runs"] = {b: ids for b, ids in broken.items() if ids}
    with open(os.path.join(out, "agreement.json"), "w", encoding="utf-8") as f:
        json.dump(cmp, f, indent=1, sort_keys=True)
    print_comparison(cmp)
    for b, ids in cmp["violation_runs"].items():
        print(f"{b}: {len(ids)} run(s) broke a promise: {', '.join(ids)}")
    return exit_code(cmp)


EXIT = """exit status: 0 when the backends agree on the three questions (a question
the runs leave open, one side having seen an outcome the other's few runs did
not, within chance, counts as agreeing and is printed as open), every run
finished and no acknowledged message broke its mode's promise; 1 when one did (a broken
promise); 2 for bad input; 3 when the lab's self-check failed: the backends
disagree or a run did not finish (checked first)."""


def register(csub: Any) -> None:
    p = csub.add_parser(
        "compare-backends", help="the quick scenarios on both backends: do they agree?",
        description="Runs the same experiment (the scenarios, default the quick matrix, in "
        "the four modes, and with --ha-modes classic,controller one controller mode beside "
        "them; the same producers at the same offered load for the same time, "
        "the same fault schedule per seed) on the local backend (--local-runs per cell) and "
        "the sim backend (--runs per cell, as Spark tasks, given this machine's measured "
        "fsync and per-put times), then says whether they agree on which modes lose "
        "acknowledged messages from the recovered master, which can leave a slave ahead, "
        "and that the SYNC_FLUSH modes lose nothing acknowledged, with each side's rates "
        "(k/n, 95 % interval) and, per mode, agree / differ / open. Then one report over "
        "both. Writes OUT/local, OUT/sim, OUT/agreement.json, OUT/report.",
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
    p.add_argument("--producers", type=positive_int, default=DEFAULT_PRODUCERS,
                   help="producers on both sides (default %(default)s)")
    p.add_argument("--rate", type=positive_float, default=DEFAULT_RATE_PER_S, metavar="R",
                   help="puts a second per producer, on both sides (default %(default)g: a "
                   "load both backends run; the answer is for this load)")
    p.add_argument("--slaves", type=positive_int, default=1,
                   help="slaves per cluster, on both sides (default %(default)s)")
    p.add_argument("--spark-master", default=None,
                   help="Spark master URL for the sim sweep and the report (default local[*])")
    p.add_argument("--no-report", action="store_true", help="skip the Spark report")
    controller_options(p, ha_modes=True)
    keep_stores_option(p)
    p.set_defaults(handler=cmd_compare_backends)
