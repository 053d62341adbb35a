"""`dlab chaos replay CASE`: an exploration's case run again, byte for byte.

A case directory is a crash run's result directory (chaos/explore/run.py);
its params.json `explore` says which exploration (the options), which crash
point, target and disk state. Its run is a pure function of those and the
code, so the replay's directory must be byte-identical to the case's."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from chaos.explore.explorer import Task, crash_run, judge
from chaos.explore.workload import ExploreOptions


class CaseError(ValueError):
    """params.json's `explore` is not a case this dlab can run again."""


@dataclass(frozen=True)
class Replayed:
    run_dir: str
    verdict: dict[str, Any]
    label: str


def case_of(record: object) -> tuple[ExploreOptions, Task]:
    """The exploration and the task a case's `explore` record names."""
    if not isinstance(record, dict) or "options" not in record:
        raise CaseError("`explore` is not an object with the exploration's options")
    if record.get("reference"):
        raise CaseError("this is an exploration's reference run (no crash): replay one of "
                        "its cases (OUT/cases/...) instead")
    try:
        return ExploreOptions.from_json(dict(record["options"])), Task.from_record(record)
    except (KeyError, TypeError, ValueError) as exc:
        raise CaseError(f"`explore` is not a case this dlab reads ({exc!r}): the case is "
                        "corrupt or from another version") from None


def replay_case(record: object, out_dir: str) -> Replayed:
    """Run the case again under `out_dir`; its directory and verdict."""
    opts, task = case_of(record)
    run = crash_run(opts, task, out_dir)
    run_dir = run.execute()
    return Replayed(run_dir, judge(run_dir), task.expect)


def case_directory(out_dir: str, record: object) -> str:
    """Where replay_case will write the case's run (to refuse writing over it)."""
    opts, task = case_of(record)
    return os.path.join(out_dir, opts.run_config(task.name, out_dir).run_id)
