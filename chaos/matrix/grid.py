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
from ha.config import HAMode
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
    # classic and/or controller. A controller cell takes the template's
    # controller settings, and the role they make (RunConfig.controller_role)
    # in place of the roles: one cell per flush mode.
    ha_modes: Sequence[str] = ("classic",)

    def cells(self) -> list[tuple[str, str, str, str, int, str]]:
        """(scenario, role, flush, policy, seed, ha mode), scenario-major."""
        out = []
        for scenario in self.scenarios:
            for ha in self.ha_modes:
                roles = self.roles if ha == HAMode.CLASSIC else (self._controller_role(),)
                out += [(scenario, role, flush, policy, self.base_seed + k, ha)
                        for role, flush, policy, k in itertools.product(
                            roles, self.flushes, self.corruption_policies, range(self.runs))]
        return out

    def _controller_role(self) -> str:
        probe = RunConfig(scenario=get(self.scenarios[0]), role=Role.SYNC_MASTER,
                          flush=FlushMode.SYNC_FLUSH, seed=0, out_dir="",
                          **{k: v for k, v in self.template.items() if k in _CONTROLLER_FIELDS})
        return probe.controller_role.value

    def run_configs(self) -> list[RunConfig]:
        """One RunConfig per cell, in cells() order, writing under OUT/runs."""
        runs_dir = os.path.join(self.out_dir, "runs")
        classic = {k: v for k, v in self.template.items() if k not in _CONTROLLER_FIELDS}
        return [
            replace(RunConfig(scenario=get(scenario), role=to_enum(Role, "role", role, ROLES),
                              flush=to_enum(FlushMode, "flush", flush), seed=seed,
                              out_dir=runs_dir),
                    **{**(classic if ha == HAMode.CLASSIC else self.template),
                       "corruption_policy": policy, "ha_mode": HAMode(ha)})
            for scenario, role, flush, policy, seed, ha in self.cells()
        ]


# The RunConfig fields of controller mode: a classic cell runs without them.
_CONTROLLER_FIELDS = frozenset({"ha_mode", "all_ack_in_sync_state_set", "in_sync_replicas",
                                "min_in_sync_replicas", "elect_unclean"})


@dataclass
class MatrixOutcome:
    run_dirs: list[str]
    failed: list[tuple[str, str]]  # (run id, error)
    seconds: float

    @property
    def runs_per_minute(self) -> float:
        return 60.0 * len(self.run_dirs) / self.seconds if self.seconds else 0.0
