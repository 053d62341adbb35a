"""`dlab chaos replay RUN_DIR`: run a recorded run again from its seed and
parameters (params.json's `config`, written by chaos/harness/runner.py and
chaos/sim/run.py from RunConfig.to_record).

On the sim backend a run is a pure function of its config and the code, so
a sim run replayed on sim must give a byte-identical directory: the
command compares every file's hash with the original's and says which
differ. `--backend local` runs the same fault schedule (the same seed gives
the same step delays, failpoint hits and workload seed: chaos/harness/plan.py) on
real processes and real time; the outcome is then compared, not the bytes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from dataclasses import replace
from typing import Any

from chaos.check.summary import fault_lines, faults_heading, outcome_line, run_outcome
from chaos.harness import scenarios
from chaos.harness.plan import plan_run
from chaos.harness.run_config import RunConfig
from chaos.harness.timings import MachineTimings
from chaos.harness.workload import WorkloadConfig
from chaos.matrix.launch import make_run, results_dir
from store.tools.cli_args import UserError

BACKENDS = ("local", "sim")


def _params(run_dir: str) -> dict[str, Any]:
    if not os.path.isdir(run_dir):
        raise UserError(f"{run_dir} is not a directory: give a run directory (the "
                        "RUN_ID directory `dlab chaos run --out` or `matrix` wrote, e.g. "
                        "OUT/runs/RUN_ID)")
    path = os.path.join(run_dir, "params.json")
    if not os.path.exists(path):
        raise UserError(f"{run_dir} is not a run directory (no params.json): give the RUN_ID "
                        "directory a chaos run wrote (e.g. OUT/runs/RUN_ID)")
    try:
        with open(path, encoding="utf-8") as f:
            params = json.load(f)
    except (OSError, ValueError) as exc:
        raise UserError(f"{path} cannot be read as JSON ({exc}): the run's parameters are "
                        "corrupt, so it cannot be replayed") from None
    if not isinstance(params, dict):
        raise UserError(f"{path} is not a JSON object: the run's parameters are corrupt")
    return params


def recorded_config(params: dict[str, Any], where: str) -> RunConfig:
    """The RunConfig a run recorded (out_dir empty), or a UserError that
    says what is missing or wrong."""
    rec = params.get("config")
    if rec is None:
        hint = ""
        if all(k in params for k in ("scenario", "role", "flush", "seed")):
            hint = (f"; its scenario and seed can be run again with `dlab chaos run --scenario "
                    f"{params['scenario']} --role {params['role']} --flush {params['flush']} "
                    f"--seed {params['seed']} --backend {params.get('backend', 'local')} "
                    "--out DIR` (other options at their defaults)")
        raise UserError(f"{where} has no `config` (it was written by a dlab older than "
                        f"`dlab chaos replay`), so its run cannot be replayed exactly{hint}")
    try:
        if not isinstance(rec, dict):
            raise TypeError("not a JSON object")
        fields = dict(rec)
        fields["scenario"] = scenarios.get(str(fields["scenario"]))
        fields["workload"] = WorkloadConfig(**fields["workload"])
        if fields.get("sim_timings") is not None:
            fields["sim_timings"] = MachineTimings.from_record(fields["sim_timings"])
        for name in ("master_args", "slave_args", "emulate"):
            fields[name] = tuple(fields[name])
        return RunConfig(**fields, out_dir="").validate()
    except KeyError as exc:
        if "unknown scenario" in str(exc):
            raise UserError(f"{where}: {str(exc).strip(chr(34) + chr(39))}; this dlab cannot "
                            "replay it") from None
        raise UserError(f"{where}: `config` lacks {exc}: the run's parameters are corrupt"
                        ) from None
    except (TypeError, ValueError) as exc:
        raise UserError(f"{where}: `config` is not a run configuration this dlab reads "
                        f"({exc}): the run's parameters are corrupt or from another version"
                        ) from None


def tree_hashes(root: str) -> dict[str, str]:
    """Every file under `root` (relative path -> SHA-256 of its bytes)."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(dirpath, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, root)] = hashlib.sha256(f.read()).hexdigest()
    return out


def differing_files(a: str, b: str) -> list[str]:
    """Relative paths present in one tree only or with other bytes."""
    ha, hb = tree_hashes(a), tree_hashes(b)
    return sorted(p for p in ha.keys() | hb.keys() if ha.get(p) != hb.get(p))


def cmd_replay(args: argparse.Namespace) -> int:
    original = os.path.abspath(args.run_dir)
    params = _params(original)
    if "explore" in params:
        return _replay_case(args, original, params["explore"])
    cfg = recorded_config(params, os.path.join(args.run_dir, "params.json"))
    recorded_backend = cfg.backend
    backend = args.backend or recorded_backend
    if backend not in BACKENDS:
        raise UserError(f"the run was on the {recorded_backend} backend; replay runs on "
                        f"{' or '.join(BACKENDS)}: give --backend")
    if backend == "sim":
        from chaos.sim.run import SimUnsupportedError, check_supported

        try:
            check_supported(cfg.crash_model)
        except SimUnsupportedError as exc:
            raise UserError(str(exc)) from None
    results_dir(args.out)
    cfg = replace(cfg, backend=backend, out_dir=os.path.abspath(args.out))
    target = os.path.join(cfg.out_dir, cfg.run_id)
    if os.path.realpath(target) == os.path.realpath(original):
        raise UserError(f"--out {args.out} would put the replay over the run itself "
                        f"({original}): give another directory")
    plan = plan_run(cfg.scenario, cfg.seed)
    recorded_delays = (params.get("plan") or {}).get("step_delays_s")
    if recorded_delays is not None and list(plan.step_delays_s) != recorded_delays:
        print(f"note: scenario {cfg.scenario.name} now gives seed {cfg.seed} the step delays "
              f"{list(plan.step_delays_s)}, the run had {recorded_delays}: the scenario "
              "changed since, and the replay follows today's", file=sys.stderr)
    print(f"replay of {cfg.run_id} ({recorded_backend} run) on the {backend} backend",
          flush=True)
    run_dir = make_run(cfg, log=lambda s: print(s, flush=True)).execute()
    outcome = run_outcome(run_dir)
    print(faults_heading(outcome))
    print("\n".join(fault_lines(outcome.faults)) or "  none")
    print(f"outcome:  {outcome_line(outcome)}")
    try:
        print(f"original: {outcome_line(run_outcome(original))}")
    except (ValueError, OSError) as exc:
        print(f"original: outcome unreadable ({exc})")
    print(f"results: {run_dir}")
    code = 1 if outcome.promise_violations else 0
    if backend == "sim" and recorded_backend == "sim":
        differ = differing_files(original, run_dir)
        if differ:
            shown = ", ".join(differ[:10]) + (f" and {len(differ) - 10} more"
                                             if len(differ) > 10 else "")
            print(f"NOT identical to the original: {len(differ)} file(s) differ: {shown}")
            return 1
        print(f"identical to the original, byte for byte ({len(tree_hashes(run_dir))} files)")
    return code


def _replay_case(args: argparse.Namespace, original: str, record: Any) -> int:
    """A case of `dlab chaos explore` (chaos/explore/replay.py): its crash
    point, target and disk state again; on the sim, byte for byte."""
    from chaos.explore.replay import CaseError, case_directory, replay_case

    where = os.path.join(args.run_dir, "params.json")
    if args.backend not in (None, "sim"):
        raise UserError(f"{args.run_dir} is a case of `dlab chaos explore`: it crashes at one "
                        "event of a simulated run, so it replays on the sim backend only "
                        "(drop --backend)")
    results_dir(args.out)
    out = os.path.abspath(args.out)
    try:
        target = case_directory(out, record)
    except CaseError as exc:
        raise UserError(f"{where}: {exc}") from None
    if os.path.realpath(target) == os.path.realpath(original):
        raise UserError(f"--out {args.out} would put the replay over the case itself "
                        f"({original}): give another directory")
    replayed = replay_case(record, out)
    verdict = replayed.verdict
    print(f"replay of the case crashing at {replayed.label}")
    print(f"outcome: {', '.join(verdict['kinds']) or 'nothing found'}; "
          f"{verdict['acked']} of {verdict['puts']} puts acked, "
          f"{verdict['acked_lost_master']} acked lost on the master, "
          f"{verdict['promise_violations']} promise violations, "
          f"{verdict['evidence_breaches']} evidence breaches, slave ahead by "
          f"{verdict['slave_ahead_bytes']} bytes, {verdict['divergent_records']} divergent "
          "records")
    print(f"results: {replayed.run_dir}")
    differ = differing_files(original, replayed.run_dir)
    if differ:
        shown = ", ".join(differ[:10]) + (f" and {len(differ) - 10} more"
                                         if len(differ) > 10 else "")
        print(f"NOT identical to the original: {len(differ)} file(s) differ: {shown}")
        return 1
    print(f"identical to the original, byte for byte ({len(tree_hashes(original))} files)")
    return 1 if verdict["promise_violations"] or verdict["evidence_breaches"] else 0


REPLAY_EXIT = """exit status: 0 when the replay finished and no acknowledged message broke its
mode's promise (and, for a sim run replayed on sim, the new directory is
byte-identical to the original); 1 when some did, or the sim replay
differs; 2 for bad input (not a run directory, missing or corrupt
params.json, a scenario the chosen backend cannot run)."""


def register(csub: Any) -> None:
    p = csub.add_parser(
        "replay", help="run a recorded run again from its seed and parameters",
        description="Re-runs RUN_DIR from the seed and parameters in its params.json. A sim "
        "run replayed on sim is checked byte for byte against the original; --backend "
        "local runs the same fault schedule (step times, failpoint hits, workload seed) on "
        "real processes.", epilog=REPLAY_EXIT)
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (OUT/runs/RUN_ID)")
    p.add_argument("--backend", choices=BACKENDS, default=None,
                   help="where to run it (default: the backend the run was on)")
    p.add_argument("--out", default="dlab-replay", metavar="DIR",
                   help="directory for the replay's run directory (default: %(default)s)")
    p.set_defaults(handler=cmd_replay)
