"""HA settings: one frozen dataclass, one validate(), presets.

Defaults follow RocketMQ's MessageStoreConfig where it has one
(haSendHeartbeatInterval 5 s, haHousekeepingInterval 20 s,
haMaxGapNotInSync 256 MiB, slave timeout 3 s since 4.9.3). The transfer batch
is larger than RocketMQ's 32 KiB (haTransferBatchSize): in Python every
shipped range costs a protobuf message, a gRPC write and a loop wake-up on
both sides, so 1 MiB batches are what lets a slave catch up at disk speed
(see `dlab bench catch-up`).

What one master holds for its streams is bounded (docs/design.md, "What a
master holds for its slaves"): at most `len(slaves) + extra_streams` streams,
each with at most its window shipped and not acknowledged (a new stream's
window starts at one batch), and a stream whose slave acknowledges nothing
for the housekeeping interval is closed.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

from store.config import ConfigError
from store.emulate import SWITCHES
from store.names import name_problem

KIB = 1024
MIB = 1024 * KIB
SLAVE_NAME_MAX_LENGTH = 64  # a node name's bound (cluster/node/server.py NodeConfig)


class SlaveAheadPolicy(enum.StrEnum):
    """What a master does when a slave reports more than the master has."""

    REJECT = "reject"
    TRUST = "trust"
    TRUNCATE = "truncate"


class HAMode(enum.StrEnum):
    """Classic master-slave (roles fixed by configuration, promotion by
    hand), or RocketMQ 5's controller mode (a controller elects the master
    from the SyncStateSet; ha/autoswitch/, cluster/node/replicas_manager.py)."""

    CLASSIC = "classic"
    CONTROLLER = "controller"


class ShipLimit(enum.StrEnum):
    """How far a master ships: what it wrote, or only what it has flushed."""

    WROTE = "wrote"
    FLUSHED = "flushed"


@dataclass(frozen=True, kw_only=True)
class HAConfig:
    slave_ahead_policy: SlaveAheadPolicy = SlaveAheadPolicy.REJECT
    ship_limit: ShipLimit = ShipLimit.WROTE
    # One shipped Range holds whole records up to about this many bytes.
    batch_bytes: int = 1 * MIB
    # Shipped but not yet reported by the slave: the pipeline depth.
    window_bytes: int = 8 * MIB
    heartbeat_interval_ms: int = 5_000
    housekeeping_interval_ms: int = 20_000
    slave_timeout_ms: int = 3_000
    max_gap_not_in_sync_bytes: int = 256 * MIB
    # The slaves this master is configured with, by name (--ha-slave). Each
    # may always hold one stream; their links stay in node status while they
    # are away.
    slaves: frozenset[str] = frozenset()
    # Streams at once from names not among `slaves` (a replacement node, a
    # tool): beyond these a stream is refused (RESOURCE_EXHAUSTED), and such
    # a name is forgotten once its stream has closed.
    extra_streams: int = 2
    # Slave reconnect backoff (tenacity, exponential between these bounds).
    reconnect_min_ms: int = 100
    reconnect_max_ms: int = 5_000
    # Known RocketMQ bugs re-introduced on purpose (store/emulate.py).
    emulate: frozenset[str] = frozenset()
    # Controller mode (RocketMQ 5's MessageStoreConfig names and defaults):
    # a put waits for every SyncStateSet member's ack
    # (allAckInSyncStateSet), else for in_sync_replicas copies counting the
    # master's (inSyncReplicas: 1 waits for no slave); a SyncStateSet
    # smaller than min_in_sync_replicas refuses puts at once.
    ha_mode: HAMode = HAMode.CLASSIC
    all_ack_in_sync_state_set: bool = False
    in_sync_replicas: int = 1
    min_in_sync_replicas: int = 1
    # A broker's heartbeat to the controller (brokerHeartbeatInterval).
    controller_heartbeat_ms: int = 1_000
    # A member that has not caught up for this long leaves the SyncStateSet
    # (haMaxTimeSlaveNotCatchup); the master checks this often.
    max_time_slave_not_catchup_ms: int = 15_000
    sync_state_set_check_ms: int = 5_000

    def validate(self) -> HAConfig:
        def need(ok: bool, msg: str) -> None:
            if not ok:
                raise ConfigError(msg)

        need(isinstance(self.slave_ahead_policy, SlaveAheadPolicy),
             "slave_ahead_policy must be reject, trust or truncate")
        need(isinstance(self.ship_limit, ShipLimit), "ha_ship_limit must be wrote or flushed")
        need(4 * KIB <= self.batch_bytes <= 64 * MIB,
             "ha batch size must be between 4 KiB and 64 MiB")
        need(self.window_bytes >= self.batch_bytes,
             "ha window must be at least one batch (raise --ha-window-bytes)")
        need(self.heartbeat_interval_ms >= 10, "ha heartbeat interval must be at least 10 ms")
        need(self.housekeeping_interval_ms > self.heartbeat_interval_ms,
             "ha housekeeping interval must be longer than the heartbeat interval, or "
             "idle-but-healthy streams would be closed")
        need(0 <= self.extra_streams <= 64,
             "ha extra streams must be between 0 and 64 (--ha-extra-streams)")
        need(len(self.slaves) <= 64, "at most 64 --ha-slave names")
        for name in sorted(self.slaves):
            problem = name_problem("--ha-slave name", name, SLAVE_NAME_MAX_LENGTH)
            need(problem is None, str(problem))
        need(self.slave_timeout_ms >= 1, "slave timeout must be at least 1 ms")
        need(self.max_gap_not_in_sync_bytes >= 1, "ha max gap must be at least 1 byte")
        need(1 <= self.reconnect_min_ms <= self.reconnect_max_ms,
             "reconnect backoff needs 1 <= min <= max (ms)")
        need(isinstance(self.ha_mode, HAMode), "ha mode must be classic or controller")
        need(isinstance(self.all_ack_in_sync_state_set, bool),
             "all_ack_in_sync_state_set must be true or false")
        need(1 <= self.in_sync_replicas <= 64,
             "--in-sync-replicas must be between 1 and 64 (copies, the master's included)")
        need(1 <= self.min_in_sync_replicas <= 64,
             "--min-in-sync-replicas must be between 1 and 64 (copies, the master's "
             "included)")
        need(self.controller_heartbeat_ms >= 10,
             "the controller heartbeat interval must be at least 10 ms")
        need(self.max_time_slave_not_catchup_ms >= 1 and self.sync_state_set_check_ms >= 1,
             "the SyncStateSet check interval and catch-up time must be at least 1 ms")
        unknown = sorted(set(self.emulate) - set(SWITCHES))
        need(not unknown, f"emulate: unknown bug(s) {', '.join(unknown)}")
        return self

    def with_(self, **changes: object) -> HAConfig:
        return replace(self, **changes).validate()  # type: ignore[arg-type]


PRODUCTION = HAConfig()
# Short intervals so tests see heartbeats, housekeeping and timeouts quickly.
TESTING = HAConfig(
    heartbeat_interval_ms=200,
    housekeeping_interval_ms=2_000,
    slave_timeout_ms=1_000,
    reconnect_min_ms=50,
    reconnect_max_ms=500,
)
