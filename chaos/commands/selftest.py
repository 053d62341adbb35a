"""`dlab chaos selftest`: the lab measures its own power. Defects planted in
the node code (store/emulate.py, the `planted-*` switches) are switched on
one at a time, the main job's default scenarios run (the ones
`dlab chaos compare-backends` and scripts/run-comparison run:
scenarios.QUICK_MATRIX) in the modes where each defect matters, N seeds
each, and the same runs again without any switch; every run is judged by
the checker `dlab chaos bugs --check` uses (chaos/commands/bugs.py
judge_run), plus whether a node refused to start.

A run SHOWS a defect when any of SIGNALS is above zero: a broken promise
(an acknowledged message missing where its mode promised it), a message a
consumer got that no node holds, an acknowledged message on disk the
drained consumer never got, a node whose recovery refused its store, or a
PUT_OK answered on evidence that did not cover it (chaos/check/evidence.py:
a broken rule even when nothing was lost).
What a run of the main job may show by design (allowed loss, a slave ahead,
divergence after one) is not a signal: the baseline runs hold those too.

A defect is caught when some run with its switch shows it; the baseline
(no switch) must show nothing. A defect the default scenarios cannot catch
is marked `known_miss` with the reason (docs/findings.md says it too): it
is run and tabulated like the others, and does not fail the selftest;
caught anyway, the table says the reason is out of date.

The catalogue and the tally are data; the runs are at the edge (`run_cell`).
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from chaos.harness import scenarios
from store.emulate import (
    PLANTED,
    PLANTED_ACK_BEFORE_FLUSH,
    PLANTED_ACK_BEFORE_FSYNC,
    PLANTED_CHECKPOINT_BEFORE_FLUSH,
    PLANTED_DISPATCH_BEFORE_DURABLE,
    PLANTED_RECOVERY_SKIPS_CRC,
    PLANTED_SLAVE_WRONG_OFFSET,
    PLANTED_STALE_ACK,
)
from store.tools.cli_args import UserError, positive_float, positive_int

SM, AM = "SYNC_MASTER", "ASYNC_MASTER"
SF, AF = "SYNC_FLUSH", "ASYNC_FLUSH"
# Per-run figures that show a defect (module docstring); judge_run's,
# `refused_starts` (the nodes whose store recovery refused) and
# `evidence_breaches` (the run summary's).
SIGNALS = ("disk_violations", "replica_violations", "delivered_then_lost",
           "stored_never_delivered", "refused_starts", "evidence_breaches")


@dataclass(frozen=True)
class Planted:
    id: str  # the --emulate value
    breaks: str  # the promise it breaks, in a user's words
    modes: tuple[tuple[str, str], ...]  # (role, flush) where it matters
    known_miss: str | None = None  # why the default scenarios cannot catch it

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "switch": PLANTED[self.id], "breaks": self.breaks,
                "modes": [f"{r} + {f}" for r, f in self.modes],
                "known_miss": self.known_miss}


DEFECTS: tuple[Planted, ...] = (
    Planted(PLANTED_ACK_BEFORE_FSYNC,
            "SYNC_FLUSH acknowledges bytes a crash can still take (disk promise)",
            ((AM, SF), (SM, SF))),
    Planted(PLANTED_ACK_BEFORE_FLUSH,
            "SYNC_FLUSH acknowledges puts before their flush covers them (disk promise)",
            ((AM, SF), (SM, SF))),
    Planted(PLANTED_CHECKPOINT_BEFORE_FLUSH,
            "after a crash inside a flush the checkpoint vouches for bytes the disk never "
            "got: recovery refuses the store, or (truncate policy) cuts flushed data",
            ((AM, SF), (AM, AF))),
    Planted(PLANTED_DISPATCH_BEFORE_DURABLE,
            "under SYNC_FLUSH a consumer gets messages a crash then takes",
            ((AM, SF), (SM, SF)),
            known_miss="on the sim a flush is one step (its fsync time passes before it), so "
                       "no read ever falls between its start and its fsync: the switch "
                       "changes nothing in the default scenarios (0 of 2,673 reads in 20 "
                       "runs saw more than the flushed end). Where a flush does take time (a "
                       "stalled flusher; a real machine) the master ships what it wrote (ship "
                       "limit `wrote`, the default), so the slave holds what the consumer got "
                       "early and no message is lost anywhere: only a check per serving node "
                       "would see it (docs/findings.md)"),
    Planted(PLANTED_RECOVERY_SKIPS_CRC,
            "recovery keeps a record whose body was damaged on disk",
            ((AM, AF), (SM, SF)),
            known_miss="no default scenario damages a stored body and keeps its layout: "
                       "crashes tear only unsynced writes, which the size and layout checks "
                       "recovery still makes reject (in 60 recoveries of 20 runs with the "
                       "switch the CRC check would have decided the same every time). The "
                       "bit-flip scenario does (the full matrix), but there the fixed node's "
                       "refusal of the damaged store is a signal too"),
    Planted(PLANTED_SLAVE_WRONG_OFFSET,
            "a slave holds records at offsets where the master holds others",
            ((SM, AF), (AM, AF)),
            known_miss="a master ships from the offset the slave itself reported and then "
                       "contiguously (ha/session.py MasterSession), so every range starts at "
                       "the slave's end and the planted path never runs (0 of 10,025 ranges "
                       "in 20 runs with the switch); it needs a master shipping from a stale or "
                       "foreign offset, which no scenario has"),
    Planted(PLANTED_STALE_ACK,
            "SYNC_MASTER acknowledges messages no slave holds (replica promise)",
            ((SM, AF), (SM, SF))),
)
BY_ID = {d.id: d for d in DEFECTS}
assert set(BY_ID) == set(PLANTED), "every planted switch of store/emulate.py needs its entry"


@dataclass(frozen=True)
class Cell:
    """One run to make: `defect` None is the baseline (no switch)."""

    defect: str | None
    scenario: str
    role: str
    flush: str
    seed: int

    @property
    def where(self) -> str:
        return f"{self.scenario} @ {self.role} + {self.flush}"


@dataclass(frozen=True)
class CellRun:
    cell: Cell
    run_dir: str | None
    signals: dict[str, int]
    error: str | None = None

    @property
    def shows(self) -> bool:
        return any(v > 0 for v in self.signals.values())


def plan_cells(defects: Sequence[Planted], names: Sequence[str], seeds: Sequence[int]
               ) -> list[Cell]:
    """Every defect's runs (its modes x the scenarios x the seeds), then one
    baseline per (scenario, mode, seed) any defect needs, shared by all."""
    cells = [Cell(d.id, s, r, f, seed) for d in defects for s in names
             for r, f in d.modes for seed in seeds]
    modes = sorted({m for d in defects for m in d.modes})
    return cells + [Cell(None, s, r, f, seed) for s in names for r, f in modes
                    for seed in seeds]


@dataclass(frozen=True)
class CatchRow:
    defect: str
    caught: int  # runs with the switch that showed it
    with_switch: int
    best: str | None  # the scenario @ mode that caught it most
    best_k: int
    best_n: int
    false_positives: int  # baseline runs (its modes) that showed something
    without_switch: int
    failed_runs: int
    known_miss: str | None

    @property
    def holds(self) -> bool:
        """Caught at least once (unless a known miss), no false positive,
        every run finished."""
        return (self.failed_runs == 0 and self.false_positives == 0
                and (self.caught > 0 or self.known_miss is not None))


def tabulate(defects: Sequence[Planted], runs: Sequence[CellRun]) -> list[CatchRow]:
    rows = []
    for d in defects:
        mine = [r for r in runs if r.cell.defect == d.id]
        base = [r for r in runs if r.cell.defect is None and (r.cell.role, r.cell.flush)
                in d.modes]
        done = [r for r in mine if r.error is None]
        per_where: dict[str, list[CellRun]] = {}
        for r in done:
            per_where.setdefault(r.cell.where, []).append(r)
        best = max(per_where.items(), key=lambda kv: sum(r.shows for r in kv[1]), default=None)
        best_k = sum(r.shows for r in best[1]) if best else 0
        base_done = [r for r in base if r.error is None]
        rows.append(CatchRow(
            d.id, sum(r.shows for r in done), len(done),
            best[0] if best and best_k else None, best_k, len(best[1]) if best else 0,
            sum(r.shows for r in base_done), len(base_done),
            sum(r.error is not None for r in mine + base), d.known_miss))
    return rows


def table_lines(rows: Sequence[CatchRow]) -> list[str]:
    out = [f"{'DEFECT':34} {'CAUGHT':>8} {'FALSE POS':>9}  WHERE CAUGHT (k/n there)"]
    for c in rows:
        where = f"{c.best} ({c.best_k}/{c.best_n})" if c.best else "not caught"
        if c.known_miss and c.caught:
            where += "  [listed as a known miss: docs/findings.md is out of date]"
        elif c.known_miss:
            where += "  [known miss: docs/findings.md]"
        if c.failed_runs:
            where += f"  [{c.failed_runs} run(s) failed]"
        out.append(f"{c.defect:34} {c.caught:>3}/{c.with_switch:<4} "
                   f"{c.false_positives:>3}/{c.without_switch:<5}  {where}"
                   f"{'' if c.holds else '  FAILS'}")
    return out


# ------------------------------------------------------------------ edge
def run_signals(run_dir: str) -> dict[str, int]:
    """SIGNALS of one finished run (None figures, as with no consumer, count 0)."""
    from chaos.check.summary import run_outcome
    from chaos.commands.bugs import judge_run

    figures = judge_run(run_dir)
    outcome = run_outcome(run_dir)
    out = {k: int(figures.get(k) or 0) for k in SIGNALS
           if k not in ("refused_starts", "evidence_breaches")}
    out["refused_starts"] = sum(f["kind"] == "refused" for f in outcome.faults)
    out["evidence_breaches"] = int(outcome.evidence_breaches or 0)
    return out


RunFn = Callable[[Cell, str], str]  # (cell, out dir) -> the run's directory


def run_cell(cell: Cell, out_dir: str, run: RunFn) -> CellRun:
    side = os.path.join(out_dir, cell.defect or "baseline")
    try:
        run_dir = run(cell, side)
        return CellRun(cell, run_dir, run_signals(run_dir))
    except Exception as exc:  # a failed run is reported; the selftest goes on
        return CellRun(cell, None, {}, error=f"{type(exc).__name__}: {exc}")


def _chosen(args: argparse.Namespace) -> list[Planted]:
    unknown = [d for d in args.defect if d not in BY_ID]
    if unknown:
        raise UserError(f"unknown planted defect(s) {', '.join(unknown)} for --defect; known: "
                        f"{', '.join(BY_ID)} (see `dlab chaos selftest --list`)")
    return [BY_ID[d] for d in args.defect] if args.defect else list(DEFECTS)


def _scenario_names(given: str | None) -> list[str]:
    """--scenarios: a subset of the main job's default scenarios (default all)."""
    if not given:
        return list(scenarios.QUICK_MATRIX)
    names = [n.strip() for n in given.split(",") if n.strip()]
    bad = [n for n in names if n not in scenarios.QUICK_MATRIX]
    if bad or not names:
        raise UserError(f"--scenarios {given!r}: {', '.join(bad) or 'no name'} is not one of "
                        f"the main job's default scenarios; give some of "
                        f"{','.join(scenarios.QUICK_MATRIX)}")
    return names


def _maker(args: argparse.Namespace) -> RunFn:
    from chaos.harness.run_config import RunConfig
    from chaos.matrix.launch import make_run

    def run(cell: Cell, out: str) -> str:
        # Strings for the enum fields, as chaos/commands/bugs.py passes them:
        # RunConfig converts them (run_config.py _ENUM_FIELDS).
        fields: dict[str, Any] = {
            "scenario": scenarios.get(cell.scenario), "role": cell.role, "flush": cell.flush,
            "seed": cell.seed, "out_dir": os.path.abspath(out), "backend": args.backend,
            "sim_duration_s": args.sim_duration,
            "emulate": (cell.defect,) if cell.defect else ()}
        return make_run(RunConfig(**fields).validate()).execute()
    return run


def cmd_selftest(args: argparse.Namespace) -> int:
    chosen = _chosen(args)
    if args.list:
        if args.json:
            print(json.dumps([d.as_dict() for d in chosen], indent=1))
        else:
            for d in chosen:
                print(f"{d.id}: {PLANTED[d.id]}")
                print(f"  breaks: {d.breaks}; modes: "
                      f"{', '.join(f'{r} + {f}' for r, f in d.modes)}")
                if d.known_miss:
                    print(f"  known miss: {d.known_miss}")
        return 0
    if not args.out:
        raise UserError("selftest needs --out DIR (where the runs go), or --list")
    from chaos.matrix.launch import results_dir

    if args.backend == "sim":
        # The planted faults act under the power crash model, the only one
        # the sim runs; refuse before any run if that ever changes.
        from chaos.sim.run import SimUnsupportedError, check_supported

        try:
            check_supported("power")
        except SimUnsupportedError as exc:
            raise UserError(str(exc)) from None
    results_dir(args.out)
    seeds = [args.seed + k for k in range(args.runs)]
    names = _scenario_names(args.scenarios)
    cells = plan_cells(chosen, names, seeds)
    print(f"selftest: {len(chosen)} planted defect(s) x {', '.join(names)} x their modes x "
          f"{len(seeds)} seed(s), plus baselines: {len(cells)} runs on the {args.backend} "
          f"backend; results in {args.out}", flush=True)
    run = _maker(args)
    runs: list[CellRun] = []
    for i, cell in enumerate(cells, 1):
        r = run_cell(cell, args.out, run)
        runs.append(r)
        what = r.error or ("SHOWS " if r.shows else "clean ") + ", ".join(
            f"{k}={v}" for k, v in r.signals.items() if v)
        print(f"  [{i}/{len(cells)}] {cell.defect or 'baseline'} {cell.where} seed "
              f"{cell.seed}: {what}", flush=True)
    rows = tabulate(chosen, runs)
    with open(os.path.join(args.out, "selftest.json"), "w", encoding="utf-8") as f:
        json.dump({"backend": args.backend, "seeds": seeds, "scenarios": names,
                   "rows": [{**asdict(c), "holds": c.holds} for c in rows],
                   "runs": [{**asdict(r.cell), "run_dir": r.run_dir, "signals": r.signals,
                             "error": r.error} for r in runs]}, f, indent=1)
    print("\n".join(table_lines(rows)))
    print(f"table: {os.path.join(args.out, 'selftest.json')}")
    return 0 if all(c.holds for c in rows) else 1


EXIT = """exit status: 0 when every planted defect (but the known misses) is caught
in some run and no run without a switch shows anything; 1 otherwise (or a run
failed); 2 for bad input."""


def register(csub: Any) -> None:
    p = csub.add_parser(
        "selftest", help="plant defects in the node code: which do the main job's scenarios "
        "catch?",
        description="Switches on each planted defect (store/emulate.py, planted-*) in turn, "
        "runs the main job's default scenarios in the modes where it matters (--runs seeds "
        "each), and the same runs without a switch, judges each with the checker of `dlab "
        "chaos bugs --check`, and prints the catch table: defect, where it was caught, "
        "caught k/n with the switch, false positives k/n without. Writes OUT/selftest.json.",
        epilog=EXIT)
    p.add_argument("--list", action="store_true", help="list the planted defects, run nothing")
    p.add_argument("--json", action="store_true", help="with --list: as JSON")
    p.add_argument("--defect", action="append", default=[],
                   help="only this planted defect (repeatable; default: all)")
    p.add_argument("--out", help="results directory (required unless --list)")
    p.add_argument("--scenarios", default=None,
                   help="comma-separated subset of the main job's default scenarios "
                   f"(default: all of {','.join(scenarios.QUICK_MATRIX)})")
    p.add_argument("--runs", type=positive_int, default=2,
                   help="seeds per scenario and mode (default %(default)s)")
    p.add_argument("--seed", type=int, default=1, help="first seed (default 1)")
    p.add_argument("--backend", choices=("sim", "local"), default="sim",
                   help="sim (default: fast, deterministic) or local processes")
    # 15 s covers every default scenario's faults, restart and settling (the
    # sim checks of docs/known-bugs.md use it too) at a quarter of the main
    # job's 60 s: the whole selftest then takes minutes, not most of an hour.
    p.add_argument("--sim-duration", type=positive_float, default=15.0, metavar="S",
                   help="with --backend sim: seconds of cluster time per run (default 15; "
                   "the main job runs 60)")
    p.set_defaults(handler=cmd_selftest)
