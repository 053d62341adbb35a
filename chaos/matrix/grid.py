"""The run matrix: role × flush × scenario × corruption policy × runs, one chaos run each, then
the durability report over all of them.

Seeds: run k of a cell uses seed `base_seed + k`, so every cell sees the
same fault schedules and failpoint hits for the same k — the modes are
compared under the same chaos.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from chaos.harness.run_config import FLUSHES, ROLES, RunConfig, to_enum
from chaos.harness.scenarios import get
from cluster.node.role import Role
from store.config import FlushMode


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

    def run_configs(self) -> list[RunConfig]:
        """One RunConfig per cell, in cells() order, writing under OUT/runs."""
        runs_dir = os.path.join(self.out_dir, "runs")
        return [
            replace(RunConfig(scenario=get(scenario), role=to_enum(Role, "role", role, ROLES),
                              flush=to_enum(FlushMode, "flush", flush), seed=seed,
                              out_dir=runs_dir),
                    **{**self.template, "corruption_policy": policy})
            for scenario, role, flush, policy, seed in self.cells()
        ]


@dataclass
class MatrixOutcome:
    run_dirs: list[str]
    failed: list[tuple[str, str]]  # (run id, error)
    seconds: float

    @property
    def runs_per_minute(self) -> float:
        return 60.0 * len(self.run_dirs) / self.seconds if self.seconds else 0.0
