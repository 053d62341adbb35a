"""The run matrix: role × flush × scenario × corruption policy × runs, one chaos run each, then
the durability report over all of them.

Seeds: run k of a cell uses seed `base_seed + k`, so every cell sees the
same fault schedules and failpoint hits for the same k — the modes are
compared under the same chaos.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from chaos.runner import FLUSHES, ROLES, Run, RunConfig
from chaos.scenarios import get


@dataclass(frozen=True, kw_only=True)
class MatrixConfig:
    out_dir: str
    scenarios: Sequence[str]
    roles: Sequence[str] = ROLES
    flushes: Sequence[str] = FLUSHES
    runs: int = 1
    base_seed: int = 1
    template: dict[str, Any] = field(default_factory=dict)  # extra RunConfig fields
    # Every cell runs under each (the cost of each policy, same chaos).
    corruption_policies: Sequence[str] = ("refuse",)

    def cells(self) -> list[tuple[str, str, str, str, int]]:
        return [
            (scenario, role, flush, policy, self.base_seed + k)
            for scenario, role, flush, policy, k in itertools.product(
                self.scenarios, self.roles, self.flushes, self.corruption_policies,
                range(self.runs))
        ]


@dataclass
class MatrixOutcome:
    run_dirs: list[str]
    failed: list[tuple[str, str]]  # (run id, error)
    seconds: float

    @property
    def runs_per_minute(self) -> float:
        return 60.0 * len(self.run_dirs) / self.seconds if self.seconds else 0.0


def run_matrix(
    cfg: MatrixConfig,
    make_run: Callable[[RunConfig], Run],
    *,
    on_done: Callable[[int, int, str, str | None, str | None], None] = (
        lambda i, n, run_id, error, run_dir: None),
) -> MatrixOutcome:
    """Run every cell in order; a run that fails is reported and the matrix
    goes on (its error is kept with its id)."""
    runs_dir = os.path.join(cfg.out_dir, "runs")
    os.makedirs(runs_dir, exist_ok=True)
    cells = cfg.cells()
    done: list[str] = []
    failed: list[tuple[str, str]] = []
    t0 = time.monotonic()
    for i, (scenario, role, flush, policy, seed) in enumerate(cells, 1):
        run_cfg = replace(
            RunConfig(scenario=get(scenario), role=role, flush=flush, seed=seed,
                      out_dir=runs_dir),
            **{**cfg.template, "corruption_policy": policy},
        )
        try:
            run_dir = make_run(run_cfg).execute()
            done.append(run_dir)
            on_done(i, len(cells), run_cfg.run_id, None, run_dir)
        except Exception as exc:
            failed.append((run_cfg.run_id, f"{type(exc).__name__}: {exc}"))
            on_done(i, len(cells), run_cfg.run_id, f"{type(exc).__name__}: {exc}", None)
    return MatrixOutcome(done, failed, time.monotonic() - t0)
