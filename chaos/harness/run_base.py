"""What every chaos run shares, whatever its backend: the contract a
command drives (ChaosRun) and the part of a run that does not depend on
where its nodes run (RunBase) — its plan from the seed, its node names,
which nodes a step targets, their specs and armed failpoints, its recorder
(chaos/harness/recorder.py) and its params.json.

chaos/harness/runner.py's Run (local processes, compose containers) and
chaos/sim/run.py's SimRun (one process on simulated time) are RunBases; each
adds only how its backend acts and waits.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from chaos.harness.plan import RunPlan, plan_run
from chaos.harness.recorder import RunRecorder
from chaos.harness.run_config import RunConfig
from chaos.schema import CONSUMER_NODE
from cluster.backends.interface import CONTROLLER_NAME, NodeSpec
from cluster.node.role import Role

MASTER = "master"

# A partition's detail when it cuts the master from the controller, which
# is no node of the run: the fault names no peer.
CONTROLLER_CUT = "from the controller (it cannot hear the master's heartbeats)"


# A master killed or started with the controller (target
# "master_and_controller" in controller mode): said in its fault's detail
# (the controller is no node of the run).
CONTROLLER_KILLED = "with the controller's process (SIGKILL, the controller first)"
CONTROLLER_STARTED = "after the controller's start"

class ChaosRun(Protocol):
    """A run a command starts (chaos/matrix/launch.py's make_run)."""

    @property
    def run_dir(self) -> str: ...

    def execute(self) -> str:
        """Run it to its end; the result directory it wrote."""
        ...


class RunBase:
    def __init__(self, cfg: RunConfig, log: Callable[[str], None]) -> None:
        self.cfg = cfg.validate()
        self.plan: RunPlan = plan_run(cfg.scenario, cfg.seed)
        self.record = RunRecorder(os.path.join(cfg.out_dir, cfg.run_id), log)
        self._log = log
        # The nodes as they started; `master` and `slaves` follow promotions
        # (the route's master, and the others), so a step's target and the
        # end of the run act on the cluster as it is then.
        self.initial_slaves = tuple(f"slave{i + 1}" for i in range(cfg.slaves))
        self.master: str | None = MASTER
        self.slaves = list(self.initial_slaves)
        self.old_master: str | None = None  # the master before the latest promotion
        self.lost: set[str] = set()  # lost and not rejoined

    @property
    def run_dir(self) -> str:
        return self.record.run_dir

    @property
    def cluster_dir(self) -> str:
        return self.record.cluster_dir

    @property
    def nodes(self) -> list[str]:
        """The master (the route's, or while it has none the last one), then
        the slaves: after a failover the node serving as master at the end
        comes first in params.json, and the checker judges against it."""
        first = self.master or self.old_master or MASTER
        return [first, *(n for n in (MASTER, *self.initial_slaves) if n != first)]

    @property
    def acting_master(self) -> str:
        """The master the route names, or while it names none (lost, not yet
        promoted) the last one."""
        return self.nodes[0]

    def _targets(self, target: str, end_of: Callable[[str], int | None] | None = None
                 ) -> list[str]:
        """The nodes (or the consumer) a step's target names (chaos/harness/scenarios.py),
        resolved as the step runs; `end_of` (a node's end offset, None when
        unknown) resolves best_slave."""
        if target == "best_slave":
            assert end_of is not None, "best_slave needs the slaves' end offsets"
            live = [s for s in self.slaves if s not in self.lost]
            ends = self._slave_ends(end_of)  # a slave down has none: never preferred
            # The longest log; the first such slave on a tie (max keeps the first).
            return [max(live, key=lambda s: ends.get(s, -1))] if live else [self.slaves[0]]
        if target == "consumer":
            return [CONSUMER_NODE]
        if target in ("master", "master_and_controller"):
            # (the controller is no node: a runner acts on it beside the master)
            return [self.acting_master]
        if target == "old_master":
            assert self.old_master is not None, "old_master before any promotion"
            return [self.old_master]
        if target == "slave":
            return [next((s for s in self.slaves if s not in self.lost), self.slaves[0])]
        return self.nodes

    def _promoted(self, name: str) -> None:
        """The route names `name` from now (a promotion)."""
        self.old_master = self.acting_master
        self.master = name
        self.slaves = [n for n in self.nodes if n != name]

    def _take_election(self, elected: str | None, serving: Callable[[str], bool],
                       since_ms: int, t: int, end_ms: Callable[[], int], detail: str) -> bool:
        """Controller mode: the controller elected `elected`, serving, and
        the run does not have it as its master yet: record it as a
        promotion, as the classic scenarios' by hand. Dated from the
        election (`since_ms`; `t`, the step's time, when unknown), which
        may be before the step that looks (an election quicker than the
        scenario's operator delay): the checker moves the route at the
        fault's start, so the new master's first acks are not taken for a
        deposed one's. True when it did."""
        if elected is None or elected == self.master or not serving(elected):
            return False
        old = self.acting_master
        self._promoted(elected)
        self.record.fault("promote", elected, since_ms if since_ms > 0 else t, peer=old,
                          end=end_ms(), detail=detail)
        return True

    def _slave_ends(self, wrote: Callable[[str], int | None]) -> dict[str, int]:
        """Before a promotion: the end of every running slave's log (the
        one to be promoted among them), read while no master ships to them."""
        return {s: w for s in self.slaves if s not in self.lost and (w := wrote(s)) is not None}

    def _record_followers(self, name: str, before: Mapping[str, int],
                          followers: Iterable[str], now_ms: int) -> None:
        """After promoting `name`: each other slave that now follows it,
        against it, as they stood before the promotion (`before`). A
        follower that had received more than the promoted slave is the
        slave-ahead case of a master restart met at a promotion: its first
        report goes through the slave-ahead policy, and what only it holds
        is stranded under reject or trust (chaos/check/slave_ahead.py)."""
        offsets = {f: before[f] for f in followers if f != name and f in before}
        if name in before and offsets:
            self.record.slave_ahead(now_ms, name, before[name], offsets)

    def _record_partition(self, a: str, b: str, t: int) -> None:
        """Node `a` cut from node `b`, or from the controller (CONTROLLER_NAME)."""
        if b == CONTROLLER_NAME:
            self.record.fault("partition", a, t, detail=CONTROLLER_CUT)
        else:
            self.record.fault("partition", a, t, peer=b)

    def _record_heal(self, a: str, b: str, t: int, closed_ms: int, detail: str | None) -> None:
        """The cut of `a` from `b` (a node, or CONTROLLER_NAME) ended at
        `closed_ms`; the heal step at `t`. `detail`: why (the end of the run)."""
        if b == CONTROLLER_NAME:
            self.record.close_fault("partition", a, closed_ms, detail=CONTROLLER_CUT)
            self.record.fault("heal", a, t, end=t, detail=f"{detail}: the controller" if detail
                              else "the controller")
        else:
            self.record.close_fault("partition", a, closed_ms, peer=b)
            self.record.fault("heal", a, t, peer=b, end=t, detail=detail)

    def _lost_node(self, name: str) -> None:
        self.lost.add(name)
        if name == self.master:
            self.old_master, self.master = name, None

    def _armed(self, name: str) -> str:
        """The failpoints the plan arms on node `name`: the first master's,
        or the first slave's (a plan's "slave")."""
        if name == MASTER:
            return self.plan.failpoints.get("master", "")
        return self.plan.failpoints.get("slave", "") if name == self.initial_slaves[0] else ""

    def _damage_rng(self) -> random.Random:
        """The draw of a disk damage step: from the plan, and as many faults
        as the run has recorded, on every backend alike."""
        return random.Random(self.plan.disk_fault_seed + len(self.record.faults))

    def _spec(self, name: str, role: Role) -> NodeSpec:
        """How node `name` runs: the run's mode and policies, its failpoints."""
        cfg = self.cfg
        return NodeSpec(
            name=name, role=role, flush=cfg.flush, crash_model=cfg.crash_model,
            segment_size_bytes=cfg.segment_size_bytes,
            slave_ahead_policy=cfg.slave_ahead_policy, ha_ship_limit=cfg.ha_ship_limit,
            failpoints=self._armed(name), corruption_policy=cfg.corruption_policy,
            extra_args=cfg.master_args if role is not Role.SLAVE else cfg.slave_args,
            emulate=cfg.emulate,
            consumer_offset_persist_interval_ms=cfg.scenario.offset_persist_interval_ms,
            ha_mode=cfg.ha_mode, all_ack_in_sync_state_set=cfg.all_ack_in_sync_state_set,
            in_sync_replicas=cfg.in_sync_replicas, min_in_sync_replicas=cfg.min_in_sync_replicas)

    def _write_params(self, *, backend: str, roles: Mapping[str, Role], started_ms: int,
                      ended_ms: int, extra: Mapping[str, Any] | None = None) -> None:
        failpoints = {MASTER if t == "master" else self.initial_slaves[0]: s
                      for t, s in self.plan.failpoints.items()}
        # params.json's nodes start with the final master; the first one is
        # named too (chaos/check/failover.py's route starts from it).
        self.record.params(self.cfg, self.plan, backend=backend, nodes=roles,
                           failpoints=failpoints, started_ms=started_ms, ended_ms=ended_ms,
                           extra={"first_master": MASTER, **(extra or {})})
