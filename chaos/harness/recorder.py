"""What a chaos run records, and the result directory it writes it to
(chaos/schema.py), for every backend: the local and compose runs
(chaos/harness/runner.py) and the sim run (chaos/sim/run.py) record through this one
recorder, so a change to what a run records is made here, once.

The recorder keeps no clock: every time it records is given to it (wall
milliseconds on a real backend, simulated ones on the sim), so the same
calls give the same bytes.

Files (chaos/schema.py declares each): params.json, history.jsonl, faults.jsonl,
observations.jsonl, consumed.jsonl/committed.jsonl/consumer.json when a
consumer ran, and nodes/NAME/{records.jsonl,final.json,node.log}.
"""

from __future__ import annotations

import os
import platform
import shutil
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from chaos.harness.plan import RunPlan
from chaos.harness.readback import read_back
from chaos.harness.run_config import RunConfig
from chaos.schema import SCHEMA_VERSION, write_json, write_jsonl
from cluster.node.role import Role

Row = dict[str, Any]


class Consumer(Protocol):
    """A run's consumer, as far as its results go (chaos/harness/consumer_proc.py,
    chaos/sim/consumer.py)."""

    def collect(self) -> tuple[list[Row], list[Row], Row]: ...


def versions() -> dict[str, str]:
    """The versions params.json records: Python's and the lab's packages'."""
    from importlib import metadata

    out = {"python": platform.python_version()}
    for dist in ("durability-lab", "grpcio"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "unknown"
    return out


@dataclass
class RunRecorder:
    """Faults, observations and recoveries as a run makes them; the result
    directory at its end."""

    run_dir: str
    log: Callable[[str], None] = lambda s: None
    faults: list[Row] = field(default_factory=list)
    observations: list[Row] = field(default_factory=list)
    recoveries: dict[str, list[str]] = field(default_factory=dict)
    killed: set[str] = field(default_factory=set)
    damaged: set[str] = field(default_factory=set)

    @property
    def cluster_dir(self) -> str:
        """Where the nodes keep their stores (and a sim run exports them)."""
        return os.path.join(self.run_dir, "cluster")

    def open(self) -> None:
        """An empty result directory: a run of the same id before is replaced."""
        if os.path.exists(self.run_dir):
            shutil.rmtree(self.run_dir)
        os.makedirs(self.run_dir)

    # ------------------------------------------------------------ during the run
    def fault(self, kind: str, node: str | None, start: int, *, peer: str | None = None,
              damages: bool = False, detail: str | None = None, end: int | None = None) -> None:
        self.faults.append({
            "fault_id": len(self.faults), "kind": kind, "node": node, "peer": peer,
            "start_ms": start, "end_ms": end, "damages_disk": damages, "detail": detail,
        })
        self.log(f"  fault {kind} {node or ''} {detail or ''}".rstrip())

    def close_fault(self, kind: str, node: str, end: int, *, peer: str | None = None,
                    detail: str | None = None) -> None:
        """End the latest open fault of `kind` on `node` (a pause at its
        resume); with `peer` or `detail`, the one with that peer or detail
        (a partition of one of a node's links: a node's, or the controller's,
        which has no peer and says so in its detail)."""
        for f in reversed(self.faults):
            if (f["kind"] == kind and f["node"] == node and f["end_ms"] is None
                    and (peer is None or f["peer"] == peer)
                    and (detail is None or f["detail"] == detail)):
                f["end_ms"] = end
                return

    def kill(self, node: str, start: int, *, detail: str | None = None) -> None:
        self.killed.add(node)
        self.fault("kill", node, start, detail=detail)

    def damage(self, kind: str, node: str, start: int, end: int, detail: str) -> None:
        """A disk damage step (torn tail, bit flip) done to a stopped node."""
        self.damaged.add(node)
        self.fault(kind, node, start, damages=True, detail=detail, end=end)

    def recovery(self, node: str, text: str) -> None:
        self.recoveries.setdefault(node, []).append(text)

    def refused(self, node: str, start: int, reason: str | None) -> None:
        """A node that would not start (corruption its policy refuses)."""
        self.fault("refused", node, start, detail=reason)
        self.recovery(node, f"refused: {reason}")

    def rogue_peer(self, node: str, start: int, first: int, over_by: int) -> None:
        self.fault("rogue_peer", node, start, detail=f"HA stream with the cluster token: first "
                                                     f"report {first}, then {first + over_by}")

    def slave_ahead(self, time_ms: int, master: str, master_offset: int,
                    slave_offsets: Mapping[str, int]) -> None:
        """The slaves' offsets read while the master was down, against the
        recovered master's: the slave-ahead observation."""
        for s, off in slave_offsets.items():
            self.observations.append({
                "time_ms": time_ms, "kind": "slave_ahead", "master": master, "slave": s,
                "master_offset": master_offset, "slave_offset": off,
                "detail": f"slave ahead by {off - master_offset} bytes"
                if off > master_offset else "slave not ahead",
            })

    def settle(self, time_ms: int, master: str, master_offset: int | None, detail: str) -> None:
        self.observations.append({
            "time_ms": time_ms, "kind": "settle", "master": master, "slave": None,
            "master_offset": master_offset, "slave_offset": None, "detail": detail,
        })

    # -------------------------------------------------------------- at its end
    def node(self, name: str, role: Role, data_dir: str, *, log_path: str | None = None,
             log_lines: Iterable[str] | None = None) -> None:
        """nodes/NAME: its store read back from `data_dir`, its final
        positions, and its log (a file to copy, or lines)."""
        rb = read_back(data_dir)
        d = os.path.join(self.run_dir, "nodes", name)
        os.makedirs(d, exist_ok=True)
        write_jsonl(os.path.join(d, "records.jsonl"), rb.records)
        write_json(os.path.join(d, "final.json"), {
            "name": name, "role": role.value, "min_offset": rb.min_offset,
            "flushed": rb.end_offset, "wrote": rb.end_offset,
            "first_bad_offset": rb.first_bad_offset,
            "recoveries": self.recoveries.get(name, []),
            "disk_damaged": name in self.damaged, "killed": name in self.killed,
        })
        if log_path is not None and os.path.exists(log_path):
            shutil.copyfile(log_path, os.path.join(d, "node.log"))
        if log_lines is not None:
            with open(os.path.join(d, "node.log"), "w", encoding="utf-8") as f:
                f.write("".join(line + "\n" for line in log_lines))

    def run_files(self, history: list[Row], consumer: Consumer | None) -> None:
        """The client history, the faults, the observations, the consumer's rows."""
        write_jsonl(os.path.join(self.run_dir, "history.jsonl"), history)
        write_jsonl(os.path.join(self.run_dir, "faults.jsonl"), self.faults)
        write_jsonl(os.path.join(self.run_dir, "observations.jsonl"), self.observations)
        if consumer is not None:
            consumed, committed, summary = consumer.collect()
            write_jsonl(os.path.join(self.run_dir, "consumed.jsonl"), consumed)
            write_jsonl(os.path.join(self.run_dir, "committed.jsonl"), committed)
            write_json(os.path.join(self.run_dir, "consumer.json"), summary)

    def params(self, cfg: RunConfig, plan: RunPlan, *, backend: str,
               nodes: Mapping[str, Role], failpoints: Mapping[str, str], started_ms: int,
               ended_ms: int, extra: Mapping[str, Any] | None = None) -> None:
        """params.json: what ran (`config` replays it), on which nodes, when,
        with which versions; `extra` adds what only one backend has."""
        write_json(os.path.join(self.run_dir, "params.json"), {
            "schema_version": SCHEMA_VERSION, "run_id": cfg.run_id, "role": cfg.role,
            "flush": cfg.flush, "scenario": cfg.scenario.name, "seed": cfg.seed,
            "backend": backend, "crash_model": cfg.crash_model,
            "slave_ahead_policy": cfg.slave_ahead_policy, "ha_ship_limit": cfg.ha_ship_limit,
            "corruption_policy": cfg.corruption_policy,
            "nodes": [{"name": n, "role": role.value} for n, role in nodes.items()],
            "failpoints": dict(failpoints),
            "versions": versions(), "started_ms": started_ms, "ended_ms": ended_ms,
            "plan": {"step_delays_s": list(plan.step_delays_s),
                     "workload_seed": plan.workload_seed},
            "master_args": list(cfg.master_args),
            "slave_args": list(cfg.slave_args),
            "emulate": sorted(cfg.emulate),
            "config": cfg.to_record(),
            **(extra or {}),
        })

    def drop_cluster_dir(self) -> None:
        """The nodes' stores, once read back, for a run that keeps only results."""
        shutil.rmtree(self.cluster_dir, ignore_errors=True)
