"""Everything random in a run, derived from its seed (pure: no IO, no clock).

Each purpose draws from its own stream (`stream(seed, purpose)`), so adding
a draw for one purpose never shifts another's: the fault schedule, the
failpoint hit counts and the workload of a seed stay the same.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from chaos.harness.scenarios import Scenario


def stream(seed: int, purpose: str) -> random.Random:
    return random.Random(f"dlab:{seed}:{purpose}")


@dataclass(frozen=True)
class RunPlan:
    seed: int
    scenario: str
    step_delays_s: tuple[float, ...]  # delay before each step, in order
    failpoints: dict[str, str]  # target (master/slave) -> failpoint spec
    workload_seed: int
    disk_fault_seed: int


def load_s(scenario: Scenario, backend: str, sim_duration_s: float | None) -> float:
    """How long the producers run from the start, at least: the scenario's
    load_s on real nodes; on the sim backend the longer of that and
    --sim-duration, in simulated seconds (chaos/sim/run.py), or the
    scenario's load_s too when the duration is None (the same experiment
    as on real nodes). Either runs on past it when the steps take longer,
    until settle_s after the last."""
    if backend == "sim" and sim_duration_s is not None:
        return max(scenario.load_s, sim_duration_s)
    return scenario.load_s


def plan_run(scenario: Scenario, seed: int) -> RunPlan:
    faults = stream(seed, "faults")
    delays = tuple(round(faults.uniform(*step.after_s), 3) for step in scenario.steps)
    fp_rng = stream(seed, "failpoints")
    specs: dict[str, list[str]] = {}
    for fp in scenario.failpoints:
        nth = fp_rng.randint(*fp.hits)
        specs.setdefault(fp.target, []).append(f"{fp.name}={fp.action}@{nth}")
    return RunPlan(
        seed=seed,
        scenario=scenario.name,
        step_delays_s=delays,
        failpoints={t: ",".join(v) for t, v in specs.items()},
        workload_seed=stream(seed, "workload").getrandbits(32),
        disk_fault_seed=stream(seed, "disk").getrandbits(32),
    )
