"""The chaos area's subcommands. `register` is what chaos/cli.py calls;
each command has its own `register_*` so more (`dlab chaos run|matrix`) slot
in beside `dlab report` without touching it."""

from __future__ import annotations

import argparse
import json
import os
import sys

from store.tools.cli_args import UserError

# Missing runs named on the console per matrix; the report names every one.
MISSING_NAMED = 10


def register(subparsers: argparse._SubParsersAction, bench_subparsers: argparse._SubParsersAction
             ) -> None:
    register_report(subparsers)


def register_report(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "report",
        help="check chaos run results and compare the modes (Spark)",
        description=(
            "Read chaos run directories, judge every acknowledged message against what "
            "its mode promised, and compare the modes: verdicts.csv, comparison.csv and "
            "timeline.csv (and .parquet), report.md, report.html and plots/ in OUT. "
            "A malformed run is named on stderr and left out; the others are still "
            "reported. A DIR holding a matrix's plan.json (written by `dlab chaos matrix` "
            "before its first run) is checked against it: planned runs with no run "
            "directory (an interrupted matrix) are named in a warning on stderr and at the "
            "top and end of the report, which still covers the runs found. Progress goes "
            "to stderr."
        ),
        epilog="exit status: 0 when every run was reported and none broke its mode's "
        "promise; 1 when some run has promise violations, was left out as malformed, or "
        "was planned by a matrix and is missing (the report is written all the same: it "
        "does not cover what was asked); 2 for bad input (a DIR holding no run, or no run "
        "that could be reported).",
    )
    p.add_argument("dirs", nargs="+", metavar="DIR",
                   help="a run directory, or a directory holding run directories "
                        "(at any depth, e.g. a matrix's output)")
    p.add_argument("--out", default="dlab-report", metavar="OUT",
                   help="output directory (default: %(default)s)")
    p.add_argument("--spark-master", metavar="URL", default=None,
                   help="Spark master URL (default: local Spark on every core); on a "
                        "cluster the DIRs must be at the same path on every executor")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object (runs, violations, left out, planned and "
                        "missing runs, each run's verdict row) and nothing else on stdout")
    p.set_defaults(handler=cmd_report)


def cmd_report(args: argparse.Namespace) -> int:
    # Imported here: Spark and pandas are heavy, and other commands need neither.
    from chaos.report.pipeline import NoRunsError, build_report
    from chaos.report.progress import ConsoleProgress

    try:
        summary = build_report(args.dirs, args.out, spark_master=args.spark_master,
                               progress=ConsoleProgress())
    except NoRunsError as exc:
        for problem in exc.problems:
            print(f"dlab report: left out: {problem}", file=sys.stderr)
        raise UserError(str(exc)) from None
    except FileNotFoundError as exc:
        raise UserError(str(exc)) from None
    bad = int((summary.verdicts["promise_violations"] > 0).sum())
    exit_status = 1 if bad or summary.problems or summary.missing else 0
    for c in summary.coverage:
        if c.missing:
            print(f"dlab report: warning: {c.summary(max_named=MISSING_NAMED)}"
                  + (" (report.md names every one)" if len(c.missing) > MISSING_NAMED else ""),
                  file=sys.stderr)
    if args.json:
        # pandas writes numpy numbers and NaN as JSON (null); read back as plain objects.
        verdicts = json.loads(summary.verdicts.to_json(orient="records"))
        print(json.dumps({
            "runs": summary.runs, "runs_with_violations": bad,
            "promise_violations": summary.violations,
            "left_out": [{"run_dir": p.run_dir, "problem": p.message}
                         for p in summary.problems],
            "report": os.path.join(args.out, "report.html"), "files": summary.files,
            "verdicts": verdicts, "exit_status": exit_status,
            "planned_runs": sum(c.planned for c in summary.coverage),
            "missing_runs": [{"plan": c.plan.path, "run_id": r}
                             for c in summary.coverage for r in c.missing],
        }, sort_keys=True))
        return exit_status
    runs = f"{summary.runs} run{'' if summary.runs == 1 else 's'}"
    left_out = f"; {len(summary.problems)} left out (named above)" if summary.problems else ""
    planned = sum(c.planned for c in summary.coverage)
    missing = (f"; INCOMPLETE: {summary.missing} of {planned} planned runs missing (named "
               "above)") if summary.missing else ""
    print(f"{runs} reported, {bad} with promise violations{left_out}{missing}")
    print(f"report: {os.path.join(args.out, 'report.html')} "
          f"(and report.md, comparison.csv, verdicts.csv)")
    return exit_status
