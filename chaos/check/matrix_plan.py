"""What a matrix planned, so a report over it can say what is missing.

`dlab chaos matrix` writes OUT/plan.json before its first run: the run id
of every run it will make, under OUT/runs. A matrix that is interrupted (or
whose runs failed before writing a run directory) leaves fewer run
directories than planned; `dlab report` over OUT reads the plan and names
the runs that are not there, instead of reporting the ones that are as if
they were the whole matrix.

plan.json:
    {"kind": "dlab-matrix-plan", "version": 1,
     "runs_dir": "runs",            # relative to the plan's directory
     "planned": ["RUN_ID", ...]}    # in the order the matrix runs them

A plan counts for a report when the directory given to `dlab report` holds
it (at any depth: a matrix's OUT, or a directory of matrices) or is the
plan's runs directory itself (OUT/runs). A single run directory given alone
is not checked against any plan.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

PLAN_FILE = "plan.json"
KIND = "dlab-matrix-plan"
VERSION = 1
RUNS_DIR = "runs"


class PlanError(ValueError):
    """A plan.json that cannot be read; the message names the file."""


@dataclass(frozen=True)
class Plan:
    path: str  # the plan file, absolute
    runs_dir: str  # absolute
    planned: tuple[str, ...]  # run ids

    @property
    def matrix_dir(self) -> str:
        return os.path.dirname(self.path)


@dataclass(frozen=True)
class PlanCoverage:
    """How much of one plan the report found."""

    plan: Plan
    missing: tuple[str, ...]  # planned run ids with no run directory, in plan order

    @property
    def planned(self) -> int:
        return len(self.plan.planned)

    @property
    def found(self) -> int:
        return self.planned - len(self.missing)

    def summary(self, *, max_named: int | None = None) -> str:
        """"2 of 8 planned runs found; 6 missing: A, B, ..." for one matrix."""
        names = list(self.missing if max_named is None else self.missing[:max_named])
        more = len(self.missing) - len(names)
        listed = ", ".join(names) + (f" and {more} more" if more else "")
        return (f"incomplete matrix {self.plan.matrix_dir}: {self.found} of {self.planned} "
                f"planned runs found; {len(self.missing)} missing: {listed}")


def plan_record(run_ids: Sequence[str]) -> dict[str, object]:
    return {"kind": KIND, "version": VERSION, "runs_dir": RUNS_DIR, "planned": list(run_ids)}


def write_plan(out_dir: str, run_ids: Sequence[str]) -> str:
    """OUT/plan.json, replaced whole (a crash leaves the old plan or the new
    one, never half of one)."""
    path = os.path.join(out_dir, PLAN_FILE)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(plan_record(run_ids), f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def read_plan(path: str) -> Plan:
    try:
        with open(path, encoding="utf-8") as f:
            rec = json.load(f)
    except (OSError, ValueError) as exc:
        raise PlanError(f"{path}: cannot be read as a matrix plan ({exc})") from None
    if not isinstance(rec, dict) or rec.get("kind") != KIND:
        raise PlanError(f"{path}: not a matrix plan (no \"kind\": \"{KIND}\")")
    planned, runs_dir = rec.get("planned"), rec.get("runs_dir")
    if (rec.get("version") != VERSION or not isinstance(runs_dir, str)
            or not isinstance(planned, list) or not all(isinstance(r, str) for r in planned)):
        raise PlanError(f"{path}: expected version {VERSION}, a runs_dir and a list of "
                        "planned run ids")
    base = os.path.dirname(os.path.abspath(path))
    return Plan(path=os.path.abspath(path), runs_dir=os.path.normpath(os.path.join(base, runs_dir)),
                planned=tuple(planned))


def find_plans(paths: Iterable[str]) -> tuple[list[Plan], list[str]]:
    """The plans that count for a report over `paths` (module doc), and a
    message for each plan file that cannot be read."""
    plans: dict[str, Plan] = {}
    problems: list[str] = []

    def take(path: str) -> Plan | None:
        try:
            plan = read_plan(path)
        except PlanError as exc:
            problems.append(str(exc))
            return None
        plans[plan.path] = plan
        return plan

    for path in paths:
        for root, dirs, files in os.walk(path):
            dirs.sort()
            if "params.json" in files:
                dirs.clear()  # a run directory holds no plan
            elif PLAN_FILE in files:
                take(os.path.join(root, PLAN_FILE))
        above = os.path.join(os.path.dirname(os.path.abspath(path)), PLAN_FILE)
        if os.path.isfile(above) and above not in plans:
            try:
                plan = read_plan(above)
            except PlanError:
                continue  # not ours to judge: the plan of a directory not given
            if plan.runs_dir == os.path.abspath(path):
                plans[plan.path] = plan
    return list(plans.values()), list(dict.fromkeys(problems))


def coverage(plans: Sequence[Plan], run_dirs: Iterable[str]) -> list[PlanCoverage]:
    """Per plan, the planned runs with no run directory among `run_dirs`
    (absolute paths, as chaos.check.run_dirs.find_run_dirs gives them)."""
    found = {os.path.abspath(d) for d in run_dirs}
    return [PlanCoverage(plan, tuple(r for r in plan.planned
                                     if os.path.join(plan.runs_dir, r) not in found))
            for plan in plans]
