"""What an exploration runs: its options (a small deterministic workload and
the cluster's mode) and the sim RunConfig of each of its runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from chaos.explore.disk_states import SECTOR_BYTES
from chaos.harness.run_config import MASTER_ROLES, Backend, KeepStores, RunConfig
from chaos.harness.scenarios import Scenario
from chaos.harness.workload import WorkloadConfig
from cluster.node.role import Role
from ha.config import HAMode, ShipLimit, SlaveAheadPolicy
from store.config import FlushMode
from store.emulate import SWITCHES

# Puts per second per producer (the sim run's default rate): 6 puts of 2
# producers take 0.08 s of simulated time.
RATE_PER_S = 25.0
# Simulated time after the last put is sent, before the load ends: its
# answer, replication and the flushes it started come within it.
TAIL_S = 0.5
# Segments sized to the workload, not to the 4 MiB message a chaos run may
# send: a crash copies and a read-back scans whole segments, and 64 KiB
# holds a hundred puts of the default size (more roll, as on any node).
SEGMENT_BYTES = 64 * 1024
MAX_MESSAGE_BYTES = SEGMENT_BYTES - 512
# Options that came after the first explorations, at the value those had:
# to_json leaves an option out at this value, from_json reads it back.
LEGACY: dict[str, Any] = {"puts_after": 0, "slave_ahead_policy": "reject",
                          "ha_ship_limit": "wrote", "failover": False, "ha_mode": "classic"}
# A task's `promote` in controller mode: the controller elects, whoever it is.
ELECTED = "elected"


@dataclass(frozen=True, kw_only=True)
class ExploreOptions:
    """One exploration (`dlab chaos explore`'s options)."""

    role: Role = Role.SYNC_MASTER
    flush: FlushMode = FlushMode.SYNC_FLUSH
    puts: int = 6
    producers: int = 2
    slaves: int = 1
    body_bytes: int = 1024
    consumer: bool = False
    emulate: tuple[str, ...] = ()
    seed: int = 1
    max_disk_states: int = 256  # per crash point and target
    sector_bytes: int = SECTOR_BYTES
    # How long the disk's fsync takes (each 0.5 to 1.5 times it; the seed
    # draws the rest of the timing): a busy disk's, so that replication
    # overtakes the flush as it does beside a slow one (docs/simulation.md).
    fsync_ms: float = 5.0
    targets: tuple[str, ...] = ("master", "slave", "both")
    events: tuple[int, ...] = field(default=())  # only these crash points (empty: every one)
    # Puts after the crashed nodes restarted and the master heard from its
    # slaves again (None: half of `puts`; 0: none, the load ends with the
    # first phase).
    puts_after: int | None = None
    # What a master does with a slave's report beyond its end, and how far
    # it ships: the chaos run options of the same names (RunConfig).
    slave_ahead_policy: SlaveAheadPolicy = SlaveAheadPolicy.REJECT
    ha_ship_limit: ShipLimit = ShipLimit.WROTE
    # After a crash of the master, fail over instead of restarting it in
    # place: a slave is promoted (classic: by hand, one run per running
    # slave; controller mode: the controller elects) and the old master
    # rejoins as a slave.
    failover: bool = False
    # Controller mode: a controller elects the master; SYNC_MASTER is
    # allAckInSyncStateSet (a put waits for every member), ASYNC_MASTER the
    # defaults (no wait).
    ha_mode: HAMode = HAMode.CLASSIC

    def __post_init__(self) -> None:
        object.__setattr__(self, "role", Role(self.role))
        object.__setattr__(self, "flush", FlushMode(self.flush))
        object.__setattr__(self, "slave_ahead_policy", SlaveAheadPolicy(self.slave_ahead_policy))
        object.__setattr__(self, "ha_ship_limit", ShipLimit(self.ha_ship_limit))
        object.__setattr__(self, "ha_mode", HAMode(self.ha_mode))
        if self.puts_after is None:
            object.__setattr__(self, "puts_after", self.puts // 2)

    def validate(self) -> ExploreOptions:
        if self.role not in MASTER_ROLES:
            raise ValueError(f"role must be one of {', '.join(MASTER_ROLES)}, got {self.role}")
        for name in ("puts", "producers", "slaves", "body_bytes", "max_disk_states"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1, got "
                                 f"{getattr(self, name)}")
        if self.body_bytes > MAX_MESSAGE_BYTES:
            raise ValueError(f"--body-bytes {self.body_bytes}: at most {MAX_MESSAGE_BYTES} "
                             "(the exploration's segments are 64 KiB)")
        if self.after < 0:
            raise ValueError(f"--puts-after must be 0 or more, got {self.puts_after}")
        if self.puts > 1000 or self.after > 1000:
            raise ValueError(f"--puts {self.puts}, --puts-after {self.puts_after}: an "
                             "exhaustive exploration grows with the puts' events; give at "
                             "most 1000 each")
        if not 0.01 <= self.fsync_ms <= 1000:
            raise ValueError(f"--fsync-ms {self.fsync_ms}: give 0.01 to 1000 ms")
        if self.sector_bytes < 1:
            raise ValueError("the sector size must be at least 1 byte")
        unknown = sorted(set(self.emulate) - set(SWITCHES))
        if unknown:
            raise ValueError(f"unknown bug(s) to emulate: {', '.join(unknown)}")
        bad = sorted(set(self.targets) - {"master", "slave", "both"})
        if bad or not self.targets:
            raise ValueError(f"targets are master, slave and both, got {', '.join(bad) or 'none'}")
        return self

    @property
    def mode(self) -> str:
        return f"{self.role}-{self.flush}"

    @property
    def after(self) -> int:
        """The puts after the restart (puts_after, resolved)."""
        assert self.puts_after is not None  # set in __post_init__
        return self.puts_after

    def to_json(self) -> dict[str, Any]:
        """The options as params.json's `explore` records them. An option
        at the value every exploration had before the option existed is
        left out (LEGACY), so a case recorded then replays byte for byte."""
        doc = self._json()
        return {k: v for k, v in doc.items() if k not in LEGACY or LEGACY[k] != v}

    def _json(self) -> dict[str, Any]:
        return {"role": str(self.role), "flush": str(self.flush), "puts": self.puts,
                "puts_after": self.puts_after, "producers": self.producers, "slaves": self.slaves,
                "slave_ahead_policy": str(self.slave_ahead_policy),
                "ha_ship_limit": str(self.ha_ship_limit), "failover": self.failover,
                "ha_mode": str(self.ha_mode),
                "body_bytes": self.body_bytes, "consumer": self.consumer,
                "emulate": sorted(self.emulate), "seed": self.seed,
                "max_disk_states": self.max_disk_states, "sector_bytes": self.sector_bytes,
                "fsync_ms": self.fsync_ms,
                "targets": list(self.targets), "events": list(self.events)}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> ExploreOptions:
        fields = {**LEGACY, **doc}
        for name in ("emulate", "targets", "events"):
            fields[name] = tuple(fields.get(name, ()))
        return cls(**fields).validate()

    def run_config(self, name: str, out_dir: str) -> RunConfig:
        """The sim run of one exploration run (`name`: its scenario name,
        which its run id starts with)."""
        duration = self.puts / (self.producers * RATE_PER_S) + TAIL_S
        scenario = Scenario(name, "dlab chaos explore: the workload, one crash, recovery",
                            (), load_s=duration, settle_s=0.0, consume=self.consumer)
        workload = WorkloadConfig(producers=self.producers, rate_per_s=RATE_PER_S,
                                  body_min_bytes=self.body_bytes, body_max_bytes=self.body_bytes,
                                  max_ops=self.puts)
        node_args = ("--max-message-size", str(MAX_MESSAGE_BYTES))
        return RunConfig(scenario=scenario, role=self.role, flush=self.flush, seed=self.seed,
                         out_dir=out_dir, backend=Backend.SIM, slaves=self.slaves,
                         slave_ahead_policy=self.slave_ahead_policy,
                         ha_ship_limit=self.ha_ship_limit, ha_mode=self.ha_mode,
                         all_ack_in_sync_state_set=(self.ha_mode is HAMode.CONTROLLER
                                                    and self.role is Role.SYNC_MASTER),
                         workload=workload, emulate=self.emulate, sim_duration_s=duration,
                         segment_size_bytes=SEGMENT_BYTES, master_args=node_args,
                         slave_args=node_args,
                         keep_stores=KeepStores.ALL).validate()

    def promotions(self, crashed: tuple[str, ...], slaves: tuple[str, ...]) -> tuple[str, ...]:
        """Who takes over after a crash of `crashed`, one run each: "" (the
        crashed nodes restart in place) unless --failover and the master
        crashed; then each slave still running (classic), or whoever the
        controller elects (ELECTED); "" when no slave is left running."""
        if not self.failover or "master" not in crashed:
            return ("",)
        running = tuple(s for s in slaves if s not in crashed)
        if not running:
            return ("",)
        return (ELECTED,) if self.ha_mode is HAMode.CONTROLLER else running

    def after_load(self) -> tuple[WorkloadConfig, float] | None:
        """The load after the restart (None: none): puts_after puts at
        the same rate, and how long it runs (their time and the tail)."""
        if not self.after:
            return None
        workload = WorkloadConfig(producers=self.producers, rate_per_s=RATE_PER_S,
                                  body_min_bytes=self.body_bytes, body_max_bytes=self.body_bytes,
                                  max_ops=self.after)
        return workload, self.after / (self.producers * RATE_PER_S) + TAIL_S
