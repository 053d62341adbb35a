"""What one chaos run is: its scenario, mode, seed, backend and policies
(RunConfig), the one input of a run on every backend (chaos/harness/runner.py,
chaos/sim/run.py) and what params.json's `config` records for a replay.

Every state is an enum. Those of the node (role, flush mode, crash model,
corruption policy, slave-ahead policy, HA ship limit) are the node's own
(cluster/node/role.py, store/config.py, ha/config.py); those only a run has
(backend, sim disk faults) are here. All are `StrEnum`s, so a result's JSON
and a run id read exactly as the strings they replace. Strings from a
command line or a recorded params.json become enums at construction, and a
value that names no state is a ValueError that lists the ones that do.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from chaos.harness.scenarios import Scenario
from chaos.harness.timings import MachineTimings
from chaos.harness.workload import WorkloadConfig
from cluster.backends.interface import ControllerSpec
from cluster.node.role import Role
from ha.config import HAMode, ShipLimit, SlaveAheadPolicy
from store.config import CorruptionPolicy, CrashModel, FlushMode
from store.emulate import SWITCHES


class Backend(enum.StrEnum):
    """Where a run's nodes run (docs/backends.md)."""

    LOCAL = "local"
    COMPOSE = "compose"
    SIM = "sim"


class SimDiskFaults(enum.StrEnum):
    """Disk faults a sim-backend run draws (chaos/sim/run.py)."""

    TORN = "torn"  # crash-time torn writes only
    DRAWN = "drawn"  # also fsync EIO and latent read corruption, rates drawn per seed


class KeepStores(enum.StrEnum):
    """Which runs keep their nodes' stores (RUN/cluster/) after the read-back
    (chaos/check/keep_decision.py decides; README, "Kept stores")."""

    ALL = "all"
    FINDINGS = "findings"  # runs that found something, and a seeded 1 in 10 of the others
    NONE = "none"


# The roles a run's master may have (a slave is never the master's role).
MASTER_ROLES = (Role.SYNC_MASTER, Role.ASYNC_MASTER)
ROLES = tuple(r.value for r in MASTER_ROLES)
FLUSHES = tuple(f.value for f in FlushMode)
CORRUPTION_POLICIES = tuple(p.value for p in CorruptionPolicy)
SIM_DISK_FAULTS = tuple(d.value for d in SimDiskFaults)
KEEP_STORES = tuple(k.value for k in KeepStores)

# RunConfig field -> the enum its value must name, with the words an error uses.
_ENUM_FIELDS: dict[str, tuple[type[enum.StrEnum], str]] = {
    "role": (Role, "role"), "flush": (FlushMode, "flush"),
    "backend": (Backend, "backend"), "crash_model": (CrashModel, "crash model"),
    "slave_ahead_policy": (SlaveAheadPolicy, "slave-ahead policy"),
    "ha_ship_limit": (ShipLimit, "HA ship limit"),
    "corruption_policy": (CorruptionPolicy, "corruption policy"),
    "sim_disk_faults": (SimDiskFaults, "sim disk faults"),
    "keep_stores": (KeepStores, "keep-stores setting"),
    "ha_mode": (HAMode, "HA mode"),
}


def to_enum(kind: type[enum.StrEnum], what: str, value: object,
            allowed: tuple[str, ...] | None = None) -> Any:
    """`value` as a member of `kind` (one of `allowed`, when given), or a
    ValueError naming the ones it may be."""
    allowed = allowed or tuple(m.value for m in kind)
    if value not in allowed:
        raise ValueError(f"{what} must be one of {', '.join(allowed)}, got {value!r}")
    return kind(value)


# Controller mode: the controller's liveness settings in a chaos run, on
# every backend alike (the sim's twin runs with the same). RocketMQ's 10 s
# timeout and 5 s scan would leave a run without a master for up to 15 s of
# its 9-12 s of load; a node heartbeats every second, so 3 s is three
# missed heartbeats, still above the pauses of a loaded machine (load 8).
# Recorded in params.json (`controller`).
RUN_CONTROLLER = ControllerSpec(heartbeat_timeout_ms=3_000, scan_interval_ms=500)


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    scenario: Scenario
    role: Role
    flush: FlushMode
    seed: int
    out_dir: str
    backend: Backend = Backend.LOCAL
    crash_model: CrashModel = CrashModel.POWER
    slave_ahead_policy: SlaveAheadPolicy = SlaveAheadPolicy.REJECT
    ha_ship_limit: ShipLimit = ShipLimit.WROTE
    # What a node does about corruption of flushed data at recovery (the
    # bit-flip scenario shows each policy's cost): refuse, truncate, repair.
    corruption_policy: CorruptionPolicy = CorruptionPolicy.REFUSE
    slaves: int = 1
    segment_size_bytes: int = 8 * 1024 * 1024  # rolls a few times per run; holds a 4 MiB message
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    settle_timeout_s: float = 5.0
    keep_cluster_dir: bool = True
    # Which runs keep their stores once read back, decided after the run by
    # what it found (chaos/check/keep_decision.py). `all` here: a config
    # without it (an older params.json replayed) keeps them, as runs did;
    # the commands default to `findings`.
    keep_stores: KeepStores = KeepStores.ALL
    # Extra `dlab node` options for the master (recorded in params.json), for
    # runs that must hold a timing window open, e.g. a lazy flusher so that a
    # crash surely finds acknowledged bytes unflushed.
    master_args: tuple[str, ...] = ()
    # The same for the slaves, e.g. a short reconnect backoff so that a
    # slave is back before a restarted master passes its offset.
    slave_args: tuple[str, ...] = ()
    # Known RocketMQ bugs every node re-introduces (store/emulate.py; the
    # corpus is chaos/commands/bugs.py), recorded in params.json.
    emulate: tuple[str, ...] = ()
    # Cluster time a sim-backend run's load covers at least (chaos/sim/run.py;
    # the load goes on after the steps); None: the scenario's load_s, as
    # every other backend runs it (dlab chaos compare-backends: the same
    # experiment on both sides).
    sim_duration_s: float | None = 60.0
    # This machine's fsync, per-put and network times for a sim run
    # (chaos/harness/timings.py); None: a disk speed drawn per seed.
    sim_timings: MachineTimings | None = None
    # Disk faults a sim-backend run draws (chaos/sim/run.py).
    sim_disk_faults: SimDiskFaults = SimDiskFaults.TORN
    # Classic master-slave, or RocketMQ 5's controller mode with its
    # settings (RocketMQ's defaults; ha/autoswitch/acks.py, ha/controller/).
    ha_mode: HAMode = HAMode.CLASSIC
    all_ack_in_sync_state_set: bool = False
    in_sync_replicas: int = 1
    min_in_sync_replicas: int = 1
    elect_unclean: bool = False

    def __post_init__(self) -> None:
        # Strings (a command line, a recorded config, a bug's fields) become
        # the enums here, once; a wrong one is named with the right ones.
        for name, (kind, what) in _ENUM_FIELDS.items():
            allowed = ROLES if name == "role" else None
            object.__setattr__(self, name, to_enum(kind, what, getattr(self, name), allowed))

    def validate(self) -> RunConfig:
        if self.sim_duration_s is not None and self.sim_duration_s <= 0:
            raise ValueError("the simulated duration must be positive")
        if self.slaves < 1:
            raise ValueError("a chaos run needs at least one slave")
        if self.ha_mode is HAMode.CONTROLLER and self.role is not self.controller_role:
            raise ValueError(
                f"in controller mode the role follows the ack settings: they make "
                f"{self.controller_role}, not {self.role} (--all-ack-in-sync-state-set or "
                "--in-sync-replicas above 1 wait for a slave: SYNC_MASTER)")
        if not 1 <= self.min_in_sync_replicas <= self.slaves + 1 or not (
                1 <= self.in_sync_replicas <= self.slaves + 1):
            raise ValueError(f"--in-sync-replicas and --min-in-sync-replicas count copies, "
                             f"the master's included: 1..{self.slaves + 1} with "
                             f"--slaves {self.slaves}")
        self.workload.validate()
        unknown = sorted(set(self.emulate) - set(SWITCHES))
        if unknown:
            raise ValueError(f"unknown bug(s) to emulate: {', '.join(unknown)}; known: "
                             f"{', '.join(sorted(SWITCHES))}")
        return self

    def to_record(self) -> dict[str, Any]:
        """Every field but out_dir, as JSON (params.json's `config`): what
        `dlab chaos replay` needs to run it again (chaos/commands/replay.py)."""
        rec: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)
                               if f.name != "out_dir"}
        rec |= {"scenario": self.scenario.name, "workload": asdict(self.workload),
                "master_args": list(self.master_args), "slave_args": list(self.slave_args),
                "emulate": sorted(self.emulate),
                "sim_timings": None if self.sim_timings is None else self.sim_timings.as_record()}
        return rec

    @property
    def run_id(self) -> str:
        policy = ("" if self.corruption_policy is CorruptionPolicy.REFUSE
                  else f"-{self.corruption_policy}")
        emulated = "".join(f"-{bug}" for bug in sorted(self.emulate))
        drawn = "-diskfaults" if self.sim_disk_faults is SimDiskFaults.DRAWN else ""
        # The same cell and seed on two backends are two runs one report may
        # read side by side (dlab chaos compare-backends): local is unmarked.
        backend = "" if self.backend is Backend.LOCAL else f"-{self.backend}"
        return (f"{self.scenario.name}-{self.role}-{self.flush}-{self.crash_model}-"
                f"{self.slave_ahead_policy}{policy}{emulated}{drawn}{self.ha_label_suffix}"
                f"{backend}-s{self.seed}")

    @property
    def controller_role(self) -> Role:
        """The classic role whose promise a controller-mode master's ack
        settings make: SYNC_MASTER when a put waits for a slave (all-ack,
        or in-sync-replicas above 1), else ASYNC_MASTER (the report judges
        it by that promise)."""
        waits = self.all_ack_in_sync_state_set or self.in_sync_replicas > 1
        return Role.SYNC_MASTER if waits else Role.ASYNC_MASTER

    @property
    def ha_label(self) -> str:
        """"classic", or controller mode with its settings in words (the
        report's and compare-backends' label: ha_label)."""
        return ha_label(self.ha_mode.value, self.all_ack_in_sync_state_set,
                        self.in_sync_replicas, self.min_in_sync_replicas, self.elect_unclean)

    @property
    def ha_label_suffix(self) -> str:
        """'' in classic mode; else the controller settings, e.g.
        -controller-allack-min2-unclean (run ids and the report's labels)."""
        if self.ha_mode is HAMode.CLASSIC:
            return ""
        acks = ("-allack" if self.all_ack_in_sync_state_set
                else f"-isr{self.in_sync_replicas}")
        least = f"-min{self.min_in_sync_replicas}" if self.min_in_sync_replicas > 1 else ""
        return f"-controller{acks}{least}{'-unclean' if self.elect_unclean else ''}"


def ha_label(ha_mode: str, all_ack: bool, in_sync_replicas: int, min_in_sync_replicas: int,
             elect_unclean: bool) -> str:
    """The one wording of an HA mode and its settings: "classic", or e.g.
    "controller all-ack, min 2, unclean" (run ids use the same fields as
    RunConfig.ha_label_suffix)."""
    if ha_mode == HAMode.CLASSIC.value:
        return "classic"
    acks = "all-ack" if all_ack else f"in-sync-replicas {in_sync_replicas}"
    least = f", min {min_in_sync_replicas}" if min_in_sync_replicas > 1 else ""
    return f"controller {acks}{least}{', unclean' if elect_unclean else ''}"
