"""`dlab chaos run`, `dlab chaos matrix`, `dlab chaos scenarios`,
`dlab chaos plan`: the chaos harness from the command line."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from dataclasses import asdict, replace
from typing import Any

from chaos.check.matrix_plan import write_plan
from chaos.check.summary import fault_lines, faults_heading, outcome_line, run_outcome
from chaos.commands import compare_backends, explore, replay, selftest
from chaos.harness import scenarios
from chaos.harness.plan import load_s, plan_run
from chaos.harness.run_config import (
    CORRUPTION_POLICIES,
    FLUSHES,
    ROLES,
    Backend,
    KeepStores,
    RunConfig,
    SimDiskFaults,
)
from chaos.harness.workload import WorkloadConfig
from chaos.matrix.grid import MatrixConfig, MatrixOutcome
from chaos.matrix.launch import (
    controller_fields,
    controller_options,
    keep_stores_option,
    make_run,
    results_dir,
    scenario_list,
)
from chaos.matrix.sweep import run_in_order, run_sweep, sweep_context
from chaos.report.progress import MatrixProgress
from cluster.backends.image import CheckedImages
from cluster.node.role import Role
from ha.config import HAMode, ShipLimit, SlaveAheadPolicy
from store.config import CorruptionPolicy, CrashModel, FlushMode
from store.tools.cli_args import UserError, positive_float, positive_int


def _common(p: argparse.ArgumentParser, *, matrix: bool = False) -> None:
    p.add_argument("--backend", choices=("local", "compose", "sim"), default="local",
                   help="where nodes run: local processes (default), docker-compose, or sim "
                   "(the whole cluster in this process on simulated time, clock, network "
                   "and disk; chaos/sim/run.py)")
    p.add_argument("--sim-duration", type=positive_float, default=60.0, metavar="S",
                   help="with --backend sim: seconds of cluster time a run covers "
                   "(default 60)")
    p.add_argument("--sim-disk-faults", choices=("torn", "drawn"), default="torn",
                   help="with --backend sim: torn (default): a crash tears unsynced writes; "
                   "drawn: also fsync EIO (0-0.01 %% per fsync) and latent read corruption "
                   "(0-10 %% per read), probabilities drawn per seed (params.json sim)")
    p.add_argument("--crash-model", choices=("power", "process"), default="power",
                   help="power (default): a kill loses unflushed bytes, like a power cut; "
                   "process: a kill loses nothing the OS holds")
    p.add_argument("--slave-ahead-policy", choices=("reject", "trust", "truncate"),
                   default="reject", help="what a master does when a slave reports more "
                   "than it has (default reject, RocketMQ 4.9.3+)")
    p.add_argument("--ha-ship-limit", choices=("wrote", "flushed"), default="wrote",
                   help="ship bytes up to the master's written (default) or flushed position")
    p.add_argument("--corruption-policy", choices=CORRUPTION_POLICIES, default="refuse",
                   help="what a node does about corruption of flushed data at recovery: "
                   "refuse to start (default), truncate (RocketMQ) or repair from a replica")
    p.add_argument("--slaves", type=positive_int, default=1,
                   help="slaves per cluster (default 1)")
    p.add_argument("--producers", type=positive_int, default=4,
                   help="concurrent producers (default 4)")
    p.add_argument("--rate", type=float, default=None, metavar="PER_S",
                   help="messages per second per producer (default: as fast as acks come)")
    p.add_argument("--retries", type=int, default=0,
                   help="client retries of a failed send, same message id (default 0)")
    p.add_argument("--emulate", action="append", default=[], metavar="BUG",
                   help="every node re-introduces this known RocketMQ bug (repeatable; "
                        "see `dlab chaos bugs`; default: none)")
    controller_options(p, ha_modes=matrix)
    keep_stores_option(p)


def _run_config_fields(args: argparse.Namespace) -> dict[str, Any]:
    """RunConfig fields from the options _common adds: the words argparse
    checked (choices) become the run's enums here, at the edge."""
    return {
        "backend": Backend(args.backend), "crash_model": CrashModel(args.crash_model),
        "slave_ahead_policy": SlaveAheadPolicy(args.slave_ahead_policy),
        "ha_ship_limit": ShipLimit(args.ha_ship_limit),
        "corruption_policy": CorruptionPolicy(args.corruption_policy), "slaves": args.slaves,
        "emulate": _emulate(args.emulate), "sim_duration_s": args.sim_duration,
        "sim_disk_faults": SimDiskFaults(args.sim_disk_faults),
        "keep_stores": KeepStores(args.keep_stores),
        **controller_fields(args),
        "workload": WorkloadConfig(producers=args.producers, rate_per_s=args.rate,
                                   retries=args.retries),
    }


def _emulate(values: list[str]) -> tuple[str, ...]:
    from store.emulate import EmulateError, parse

    try:
        return tuple(sorted(parse(values)))
    except EmulateError as exc:
        raise UserError(str(exc)) from None


def _check_sim(args: argparse.Namespace) -> None:
    """--backend sim: refuse what it cannot run before any run starts."""
    if args.backend != "sim":
        return
    from chaos.sim.run import SimUnsupportedError, check_supported

    try:
        check_supported(args.crash_model)
    except SimUnsupportedError as exc:
        raise UserError(str(exc)) from None


def cmd_run(args: argparse.Namespace) -> int:
    try:
        cfg = RunConfig(scenario=scenarios.get(args.scenario), role=Role(args.role),
                        flush=FlushMode(args.flush), seed=args.seed, out_dir=args.out,
                        **_run_config_fields(args))
        if cfg.ha_mode is HAMode.CONTROLLER and cfg.role is not cfg.controller_role:
            print(f"controller mode: the ack settings make the master a "
                  f"{cfg.controller_role.value} (its promise is judged as one), not "
                  f"{cfg.role.value}", file=sys.stderr)
            cfg = replace(cfg, role=cfg.controller_role)
        cfg = cfg.validate()
    except (KeyError, ValueError) as exc:
        raise UserError(str(exc).strip("'\"")) from None
    _check_sim(args)
    results_dir(args.out)
    # With --json stdout holds the one JSON object; the run's log goes to stderr.
    log = sys.stderr if args.json else sys.stdout
    print(f"run {cfg.run_id}: {cfg.scenario.description}", file=log, flush=True)
    run_dir = make_run(cfg, log=lambda s: print(s, file=log, flush=True)).execute()
    outcome = run_outcome(run_dir)
    if args.json:
        print(json.dumps(outcome.to_json(), sort_keys=True))
    else:
        print(faults_heading(outcome))
        print("\n".join(fault_lines(outcome.faults)) or "  none")
        print(f"outcome: {outcome_line(outcome)}")
        if outcome.evidence_first:
            print("PUT_OKs their evidence does not cover (first "
                  f"{len(outcome.evidence_first)}, seconds since the run started):")
            print("\n".join(f"  {line}" for line in outcome.evidence_first))
        print(f"results: {run_dir}")
    return 1 if outcome.broke_a_promise else 0


def cmd_matrix(args: argparse.Namespace) -> int:
    if args.quick and args.scenarios:
        raise UserError("--quick and --scenarios both choose the scenarios: give one of them "
                        f"(--quick is --scenarios {','.join(scenarios.QUICK_MATRIX)})")
    names = args.scenarios or list(
        scenarios.QUICK_MATRIX if args.quick else scenarios.DEFAULT_MATRIX)
    runs = args.runs or 1
    _check_sim(args)
    for value, allowed, what in ((args.roles, ROLES, "role"), (args.flushes, FLUSHES, "flush")):
        bad = [v for v in value if v not in allowed]
        if bad:
            raise UserError(f"unknown {what} {', '.join(bad)}; choose from {', '.join(allowed)}")
    results_dir(args.out)
    template = _run_config_fields(args)
    policies = args.corruption_policies or [template.pop("corruption_policy")]
    template.pop("corruption_policy", None)
    bad = [v for v in policies if v not in CORRUPTION_POLICIES]
    if bad:
        raise UserError(f"unknown corruption policy {', '.join(bad)}; choose from "
                        f"{', '.join(CORRUPTION_POLICIES)}")
    if args.quick:
        template["workload"] = WorkloadConfig(producers=args.producers, rate_per_s=args.rate,
                                              retries=args.retries)
    ha_modes = args.ha_modes or [args.ha_mode]
    cfg = MatrixConfig(out_dir=args.out, scenarios=names, runs=runs, base_seed=args.seed,
                       roles=args.roles, flushes=args.flushes, template=template,
                       corruption_policies=policies, ha_modes=ha_modes)
    cells = cfg.cells()
    configs = cfg.run_configs()
    # Before the first run: a report over an interrupted matrix names what
    # is missing (chaos/check/matrix_plan.py).
    write_plan(args.out, [c.run_id for c in configs])
    modes = (len(cfg.roles) * ("classic" in ha_modes) + ("controller" in ha_modes))
    print(f"matrix: {modes} mode(s) ({' and '.join(ha_modes)}) x {len(cfg.flushes)} flush "
          f"modes x {len(names)} scenarios x {len(policies)} corruption polic"
          f"{'y' if len(policies) == 1 else 'ies'} x {runs} run(s) = {len(cells)} runs on "
          f"{args.backend}; results in {args.out}", flush=True)
    with contextlib.ExitStack() as stack:
        sc = None
        if args.backend == "sim":
            # The report that follows runs in the same session.
            sc = stack.enter_context(sweep_context(args.spark_master, args.out))
        with MatrixProgress(len(cells)) as progress:
            if sc is not None:
                outcome, results = run_sweep(sc, configs, on_done=progress.done)
            else:
                outcome, results = run_in_order(configs, on_done=progress.done)
        return _matrix_end(args, outcome, [r.run_id for r in results if r.violated])


def _matrix_end(args: argparse.Namespace, outcome: MatrixOutcome, violated: list[str]) -> int:
    """The matrix's summary line, matrix.json, the report (in the sweep's
    Spark session when there is one)."""
    summary = {"runs": len(outcome.run_dirs), "failed": len(outcome.failed),
               "seconds": round(outcome.seconds, 1),
               "runs_per_minute": round(outcome.runs_per_minute, 2)}
    print(f"{summary['runs']} runs in {summary['seconds']} s "
          f"({summary['runs_per_minute']} runs/min), {summary['failed']} failed", flush=True)
    with open(os.path.join(args.out, "matrix.json"), "w", encoding="utf-8") as f:
        json.dump({**summary, "failed_runs": outcome.failed, "backend": args.backend}, f,
                  indent=1)
    n_violated = len(violated)
    if not args.no_report and outcome.run_dirs:
        from chaos.report.pipeline import build_report
        from chaos.report.progress import ConsoleProgress

        report_dir = os.path.join(args.out, "report")
        report = build_report(outcome.run_dirs, report_dir, spark_master=args.spark_master,
                              progress=ConsoleProgress(sys.stdout))
        # The report's verdict (from the kept stores) is the one of record.
        n_violated = int((report.verdicts["verdict"] == "violation").sum())
        print(f"report: {os.path.join(report_dir, 'report.html')} "
              f"(and report.md, comparison.csv, verdicts.csv)", flush=True)
    print(f"{n_violated} run{'' if n_violated == 1 else 's'} with promise violations",
          flush=True)
    return 1 if n_violated or outcome.failed else 0


def _checkable_bugs(chosen: list[Any], args: argparse.Namespace) -> list[Any]:
    """The bugs of `chosen` the backend can check: one named with --bug
    that it cannot is refused (exit 2) with the reason; checking the whole
    corpus, such a bug is skipped with the reason printed."""
    from chaos.commands.bugs import backend_refusal, sim_refusal

    runnable = []
    for b in chosen:
        why = backend_refusal(b, args.backend) or (
            sim_refusal(b, args.crash_model) if args.backend == "sim" else None)
        if why is None:
            runnable.append(b)
        elif args.bug:
            raise UserError(f"{b.name} cannot be checked on the {args.backend} backend: {why}")
        else:
            print(f"{b.name}: skipped on the {args.backend} backend: {why}", flush=True)
    return runnable


def cmd_bugs(args: argparse.Namespace) -> int:
    """List the known-bug corpus; with --check, run each bug's scenario with
    and without its switch and report the catch rate and false positives."""
    from chaos.commands import bugs

    try:
        chosen = [bugs.get(b) for b in args.bug] if args.bug else list(bugs.CORPUS)
    except KeyError as exc:
        raise UserError(str(exc).strip("'\"")) from None
    if not args.check:
        if args.json:
            print(json.dumps([b.as_dict() for b in chosen], indent=1))
            return 0
        for b in chosen:
            print(f"{b.name}  {b.thread}: {b.title}")
            if b.shape:
                print(f"  switch:        --emulate {b.id} (its {b.shape} shape)")
            print(f"  re-introduces: {b.reintroduces}")
            print(f"  real fix:      {b.real_fix}")
            tuning = (f", slave-ahead policy {b.slave_ahead_policy}"
                      if b.slave_ahead_policy != "reject" else "")
            tuning += f", master {' '.join(b.master_args)}" if b.master_args else ""
            tuning += f", slaves {' '.join(b.slave_args)}" if b.slave_args else ""
            mode = ", controller mode" if b.ha_mode == "controller" else ""
            print(f"  scenario:      {b.scenario} ({b.role} + {b.flush}{mode}, ship limit "
                  f"{b.ha_ship_limit}{tuning})")
            print(f"  expected:      {b.verdict} ({b.expected} > 0 with the switch, 0 without)")
        return 0
    if not args.out:
        raise UserError("--check needs --out DIR (where the runs go)")
    chosen = _checkable_bugs(chosen, args)
    results_dir(args.out)
    seeds = [args.seed + k for k in range(args.runs)]
    base = {"backend": args.backend, "crash_model": args.crash_model,
            "sim_duration_s": args.sim_duration}

    images = CheckedImages()  # one image check for every run of the command (compose)

    def run(fields: dict[str, Any]) -> str:
        return make_run(RunConfig(**base, **fields).validate(), images=images).execute()

    def on_run(r: bugs.CheckRun) -> None:
        side = "with   " if r.emulated else "without"
        what = r.error or ", ".join(f"{k}={v}" for k, v in r.figures.items())
        print(f"  {r.bug} {side} seed {r.seed}: {what}", flush=True)

    checks = []
    for b in chosen:
        print(f"{b.name}: {b.scenario}, {len(seeds)} seeds with and without the switch",
              flush=True)
        checks.append(bugs.check_bug(b, seeds, args.out, run, on_run))
    rows = [{"bug": c.bug.name, "switch": c.bug.id, "scenario": c.bug.scenario,
             "expected": c.bug.expected,
             "caught": c.caught, "with_switch": c.with_switch,
             "false_positives": c.false_positives, "without_switch": c.without_switch,
             "failed_runs": c.failed_runs, "holds": c.holds, "seeds": seeds,
             "runs": [asdict(r) for r in c.runs]} for c in checks]
    with open(os.path.join(args.out, "bugs-check.json"), "w", encoding="utf-8") as f:
        json.dump(rows, f, indent=1)
    print(f"{'BUG':18} {'SCENARIO':32} {'CAUGHT':>10} {'FALSE POS':>10} {'FAILED':>7}")
    for c in checks:
        print(f"{c.bug.name:18} {c.bug.scenario:32} {c.caught:>4}/{c.with_switch:<5} "
              f"{c.false_positives:>4}/{c.without_switch:<5} {c.failed_runs:>7}"
              f"{'' if c.holds else '  DOES NOT HOLD'}")
    return 0 if all(c.holds for c in checks) else 1


def cmd_scenarios(args: argparse.Namespace) -> int:
    if args.json:
        print(json.dumps([{**asdict(s), "in_default_matrix": s.name in scenarios.DEFAULT_MATRIX,
                           "in_quick_matrix": s.name in scenarios.QUICK_MATRIX}
                          for s in scenarios.SCENARIOS.values()], sort_keys=True))
        return 0
    for s in scenarios.SCENARIOS.values():
        steps = ", ".join(f"{st.action}({st.target})" for st in s.steps)
        fps = "; ".join(f"{fp.name}@{fp.hits[0]}-{fp.hits[1]} on {fp.target}"
                        for fp in s.failpoints)
        print(f"{s.name:24} {s.description}")
        print(f"{'':24} steps: {steps}" + (f"; failpoints: {fps}" if fps else ""))
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    try:
        scenario = scenarios.get(args.scenario)
    except KeyError as exc:
        raise UserError(str(exc).strip("'\"")) from None
    plan = plan_run(scenario, args.seed)
    steps: list[dict[str, Any]] = [
        {"step": i + 1, "action": st.action, "target": st.target, "after_s": d,
         "at_s": round(sum(plan.step_delays_s[:i + 1]), 3), "window_s": list(st.after_s)}
        for i, (st, d) in enumerate(zip(scenario.steps, plan.step_delays_s, strict=True))]
    if args.json:
        print(json.dumps({**asdict(plan), "steps": steps}, sort_keys=True))
        return 0
    print(f"scenario {plan.scenario}, seed {plan.seed}: {scenario.description}")
    local_s = load_s(scenario, "local", args.sim_duration)
    sim_s = load_s(scenario, "sim", args.sim_duration)
    print(f"load runs {local_s:g} s on the local and compose backends, {sim_s:g} simulated s "
          f"on the sim backend (--sim-duration {args.sim_duration:g}), or until "
          f"{scenario.settle_s:g} s after the last step if that is later; AT is seconds after "
          "the load starts (each step waits AFTER from the end of the one before, so it may "
          "come a little later)")
    print(f"{'STEP':<6}{'AT (s)':>8}{'AFTER (s)':>11}{'WINDOW (s)':>14}  ACTION         TARGET")
    for st_ in steps:
        lo, hi = st_["window_s"]
        window = f"{lo:g}..{hi:g}"
        print(f"{st_['step']:<6}{st_['at_s']:>8.3f}{st_['after_s']:>11.3f}{window:>14}  "
              f"{st_['action']:<14} {st_['target']}")
    for target, spec in sorted(plan.failpoints.items()):
        print(f"failpoint on {target}: {spec} (name=action@hit: fires on that hit)")
    print(f"workload seed {plan.workload_seed}, disk fault seed {plan.disk_fault_seed}")
    return 0


RUN_EXIT = """exit status: 0 when the run finished and no acknowledged message broke its
mode's promise; 1 when some did (promise violations in the outcome line) or
was answered PUT_OK on evidence that did not cover it (docs/design.md);
2 for bad input (unknown scenario, --out not a writable directory)."""

MATRIX_EXIT = """exit status: 0 when every run finished and none broke a promise; 1 when
some run broke a promise (by the report's verdicts; by each run's read-back
with --no-report) or failed to run; 2 for bad input."""


def register(sub: Any, bench_sub: Any) -> None:
    chaos = sub.add_parser(
        "chaos", help="run chaos scenarios against a cluster and record what survived",
        description="Chaos runs: a master and slaves under load while a scenario injects "
        "faults (kills, pauses, partitions, disk damage, failpoints); every run ends with "
        "all nodes recovered and stopped cleanly, and their stores read back from disk. "
        "Each run writes a result directory the report reads.")
    csub = chaos.add_subparsers(dest="chaos_command", metavar="SUBCOMMAND", required=True)
    _register_run(csub)
    _register_matrix(csub)
    _register_bugs(csub)
    _register_listings(csub)
    replay.register(csub)
    explore.register(csub)
    compare_backends.register(csub)
    selftest.register(csub)


def _register_run(csub: Any) -> None:
    p = csub.add_parser("run", help="one run: a scenario, a mode, a seed",
                        description="Run one scenario in one mode. The same --seed replays "
                        "the same fault schedule, failpoint hits and workload. It ends with "
                        "the faults (seconds since the run started) and one outcome line: "
                        "acknowledged messages lost on the master, lost everywhere, "
                        "stranded on rejected slaves, promise violations, how far a slave "
                        "got ahead, the share of failed puts and whether replication "
                        "settled. This judges from the run's read-back; `dlab report` is "
                        "the verdict of record.",
                        epilog=RUN_EXIT)
    p.add_argument("--scenario", required=True, help="scenario name (see `dlab chaos scenarios`)")
    p.add_argument("--role", required=True, choices=ROLES, help="the master's role")
    p.add_argument("--flush", required=True, choices=FLUSHES, help="every node's flush mode")
    p.add_argument("--seed", type=int, default=1,
                   help="seed of every random choice (default 1)")
    p.add_argument("--out", required=True, help="directory for the run's result directory")
    p.add_argument("--json", action="store_true",
                   help="print the outcome as one JSON object and nothing else on stdout "
                        "(the run's log goes to stderr)")
    _common(p)
    p.set_defaults(handler=cmd_run)


def _register_matrix(csub: Any) -> None:
    p = csub.add_parser("matrix", help="the four modes x scenarios x runs, then the report",
                        description="Runs every role/flush mode against each scenario "
                        "--runs times (run k of every cell uses seed --seed+k, so modes face "
                        "the same chaos), then builds the durability report. With --backend "
                        "sim the runs go as Spark tasks, in parallel on every core "
                        "(local[*]) or a cluster (--spark-master), and the report runs in the "
                        "same Spark session.",
                        epilog=MATRIX_EXIT)
    p.add_argument("--out", required=True, help="results directory (plan.json, runs/ and "
                   "report/ inside)")
    p.add_argument("--quick", action="store_true",
                   help=f"a first look: {len(ROLES) * len(FLUSHES)} modes x the "
                   f"{len(scenarios.QUICK_MATRIX)} scenarios {', '.join(scenarios.QUICK_MATRIX)}"
                   ", one run per cell unless --runs says more (not with --scenarios)")
    p.add_argument("--scenarios", type=scenario_list, default=None,
                   help="comma-separated scenario names (default: the "
                   f"{len(scenarios.DEFAULT_MATRIX)} of the default matrix, "
                   "see `dlab chaos scenarios`)")
    p.add_argument("--runs", type=positive_int, default=None,
                   help="runs per cell (default 1)")
    p.add_argument("--seed", type=int, default=1,
                   help="base seed: run k of every cell uses seed+k (default 1)")
    p.add_argument("--roles", type=lambda t: t.split(","), default=list(ROLES),
                   help=f"comma-separated roles (default {','.join(ROLES)})")
    p.add_argument("--flushes", type=lambda t: t.split(","), default=list(FLUSHES),
                   help=f"comma-separated flush modes (default {','.join(FLUSHES)})")
    p.add_argument("--corruption-policies", type=lambda t: t.split(","), default=None,
                   help="comma-separated corruption policies to run every cell under (e.g. "
                   "refuse,truncate,repair; default: --corruption-policy)")
    p.add_argument("--no-report", action="store_true", help="skip the Spark report")
    p.add_argument("--spark-master", default=None,
                   help="Spark master URL for the report and, with --backend sim, the runs "
                   "themselves as Spark tasks (default: local[*], every core)")
    _common(p, matrix=True)
    p.set_defaults(handler=cmd_matrix)


def _register_bugs(csub: Any) -> None:
    p = csub.add_parser("bugs", help="the known RocketMQ bugs a node can re-introduce",
                        description="Lists the known-bug corpus (--emulate BUG on nodes, runs "
                        "and matrices): each bug's thread, what the switch re-introduces, the "
                        "real fix, the scenario that exposes it and the expected verdict. "
                        "With --check, runs each scenario --runs times with and without the "
                        "switch and reports how often the checker caught it.")
    p.add_argument("--json", action="store_true", help="the corpus as JSON")
    p.add_argument("--bug", action="append", default=[],
                   help="only this bug, by its name in the list: a switch, or SWITCH/SHAPE "
                        "for another shape of it (repeatable; default: every bug)")
    p.add_argument("--check", action="store_true",
                   help="run every bug's scenario with and without its switch")
    p.add_argument("--runs", type=positive_int, default=5, help="seeds per side (default 5)")
    p.add_argument("--seed", type=int, default=1, help="first seed (default 1)")
    p.add_argument("--out", help="results directory for --check (required with it)")
    p.add_argument("--backend", choices=("local", "compose", "sim"), default="local",
                   help="where the nodes run (default local; sim: the bugs whose scenario "
                   "the sim runs, chaos/commands/bugs.py sim_refusal)")
    p.add_argument("--sim-duration", type=positive_float, default=60.0, metavar="S",
                   help="with --backend sim: seconds of cluster time a run covers "
                   "(default 60)")
    p.add_argument("--crash-model", choices=("power", "process"), default="power",
                   help="what a kill loses (default power)")
    p.set_defaults(handler=cmd_bugs)


def _register_listings(csub: Any) -> None:
    """`dlab chaos scenarios` and `dlab chaos plan`: what runs would do."""
    p = csub.add_parser("scenarios", help="list the shipped scenarios",
                        description="List every shipped scenario: its steps and failpoints.",
                        epilog="exit status: 0.")
    p.add_argument("--json", action="store_true",
                   help="print one JSON array of the scenarios and nothing else")
    p.set_defaults(handler=cmd_scenarios)

    p = csub.add_parser("plan", help="print the fault schedule a seed gives a scenario",
                        description="Prints the run plan (step delays, failpoint hits, "
                        "workload seed) a seed derives, without running anything: a "
                        "table of the steps, or --json.",
                        epilog="exit status: 0; 2 for an unknown scenario.")
    p.add_argument("--scenario", required=True, help="scenario name (see `dlab chaos scenarios`)")
    p.add_argument("--seed", type=int, required=True, help="the seed a run would be given")
    p.add_argument("--json", action="store_true",
                   help="print the plan as one JSON object and nothing else")
    p.add_argument("--sim-duration", type=positive_float, default=60.0, metavar="S",
                   help="the sim backend's seconds of load, as for `chaos run` (default 60)")
    p.set_defaults(handler=cmd_plan)
