"""The cluster backend interface: what the CLI and the chaos harness may do to
a cluster, whatever runs it (local processes by default, docker-compose).

One contract test suite (tests/cluster/test_backend_contract.py) drives every
backend through this interface.

Every node runs `dlab node` with the options NodeSpec.node_args() gives, so
both backends start the same program the same way. A cluster lives in a
directory (`ClusterSpec.directory`): `cluster.json` (the spec and each node's
address; written by `up`, read by any later command), per node
`nodes/NAME/data` (its store) and `nodes/NAME/node.log`; `route.json` (the
route clients follow to the master: cluster/node/route.py), rewritten at
every change of master; `nodes/NAME/lost-N/` (the store of a node lost for
the N-th time, kept as evidence).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Protocol

from cluster.node.role import Role
from cluster.node.route import Route
from ha.config import HAMode, ShipLimit, SlaveAheadPolicy
from store.config import CorruptionPolicy, CrashModel, FlushMode


class NodeState(enum.StrEnum):
    RUNNING = "running"
    PAUSED = "paused"
    STOPPED = "stopped"  # clean stop or killed, not restarted yet
    # Not running: its last start refused to open a store holding corruption
    # of flushed data (NodeInfo.extra["refused"] says where and what).
    REFUSED = "refused"
    # The machine is gone (`lose`): no process, its store moved aside as
    # evidence (NodeInfo.extra["lost"] lists where); `rejoin` brings a
    # replacement with an empty store.
    LOST = "lost"


# Beside a node's data directory (nodes/NAME/refused): `dlab node` writes why
# it refused to start there (store.store.CorruptionRefusedError) and removes it
# at its next start; backends read it to report the node as REFUSED.
REFUSAL_FILE = "refused"

# Controller mode: the controller as one end of a link, in `partition` and
# `heal` (`dlab cluster partition master controller`); no node may be
# called so in that mode. The sim's controller answers to it too.
CONTROLLER_NAME = "controller"


def read_refusal(path: str) -> str | None:
    """The message of a refusal file, or None when there is none."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read().strip() or None
    except OSError:
        return None


@dataclass(frozen=True, kw_only=True)
class NodeSpec:
    """How to start one node. Everything the `dlab node` command takes."""

    name: str
    role: Role
    flush: FlushMode = FlushMode.ASYNC_FLUSH
    crash_model: CrashModel = CrashModel.POWER
    segment_size_bytes: int = 64 * 1024 * 1024
    slave_ahead_policy: SlaveAheadPolicy = SlaveAheadPolicy.REJECT
    ha_ship_limit: ShipLimit = ShipLimit.WROTE
    failpoints: str = ""
    corruption_policy: CorruptionPolicy = CorruptionPolicy.REFUSE
    emulate: tuple[str, ...] = ()  # known RocketMQ bugs re-introduced (store/emulate.py)
    # The consume side's timings; None leaves the node's default (RocketMQ's:
    # the offset table persisted every 5 s, a slave's copy synced every 10 s).
    consumer_offset_persist_interval_ms: int | None = None
    consumer_offset_sync_interval_ms: int | None = None
    extra_args: tuple[str, ...] = ()
    # Controller mode (RocketMQ 5): the controller elects the master, the
    # role above is only where the node starts in the backend's plan.
    ha_mode: HAMode = HAMode.CLASSIC
    all_ack_in_sync_state_set: bool = False
    in_sync_replicas: int = 1
    min_in_sync_replicas: int = 1

    def node_args(self, *, data_dir: str, listen: str, master: str | None, token_file: str,
                  refusal_file: str | None = None, repair_from: tuple[str, ...] = (),
                  slaves: tuple[str, ...] = (), controller: str | None = None,
                  advertise: str | None = None,
                  peer_addresses: tuple[tuple[str, str], ...] = ()) -> list[str]:
        """Arguments after `dlab node` (no secrets on the command line: the
        token is read from a file). `refusal_file`: where the node says why
        it refused to start; `repair_from`: replicas a master repairs from;
        `slaves`: a master's slaves by name (its stream limit counts them,
        ha/config.py); `controller`, `advertise` (controller mode): the
        controller's address, and the node's own as the controller and its
        peers reach it when that is not `listen`; `peer_addresses`
        (controller mode): (name, address) of the other nodes where this one
        reaches them instead of the address they advertise (link proxies)."""
        args = [
            "--name", self.name,
            "--role", self.role.value,
            "--flush", self.flush,
            "--crash-model", self.crash_model,
            "--segment-size", str(self.segment_size_bytes),
            "--data-dir", data_dir,
            "--listen", listen,
            "--token-file", token_file,
            "--slave-ahead-policy", self.slave_ahead_policy.value,
            "--ha-ship-limit", self.ha_ship_limit.value,
        ]
        if self.ha_mode is HAMode.CONTROLLER:
            assert controller, "controller mode: node_args needs the controller's address"
            args += ["--ha-mode", "controller", "--controller", controller,
                     "--in-sync-replicas", str(self.in_sync_replicas),
                     "--min-in-sync-replicas", str(self.min_in_sync_replicas)]
            if self.all_ack_in_sync_state_set:
                args += ["--all-ack-in-sync-state-set"]
            if advertise:
                args += ["--advertise", advertise]
            for peer, address in peer_addresses:
                args += ["--peer-address", f"{peer}={address}"]
        elif master:
            args += ["--master", master]
        if self.failpoints:
            args += ["--failpoints", self.failpoints]
        if self.corruption_policy is not CorruptionPolicy.REFUSE:
            args += ["--corruption-policy", self.corruption_policy.value]
        if refusal_file:
            args += ["--refusal-file", refusal_file]
        for peer in repair_from:
            args += ["--repair-from", peer]
        for slave in slaves:
            args += ["--ha-slave", slave]
        for bug in self.emulate:
            args += ["--emulate", bug]
        if self.consumer_offset_persist_interval_ms is not None:
            args += ["--consumer-offset-persist-ms", str(self.consumer_offset_persist_interval_ms)]
        if self.consumer_offset_sync_interval_ms is not None:
            args += ["--consumer-offset-sync-ms", str(self.consumer_offset_sync_interval_ms)]
        return args + list(self.extra_args)


@dataclass(frozen=True, kw_only=True)
class ControllerSpec:
    """Controller mode: how the backend runs `dlab controller run` (its
    options of the same names; RocketMQ's defaults)."""

    heartbeat_timeout_ms: int = 10_000
    scan_interval_ms: int = 5_000
    elect_unclean: bool = False

    def args(self) -> list[str]:
        return (["--heartbeat-timeout-ms", str(self.heartbeat_timeout_ms),
                 "--scan-interval-ms", str(self.scan_interval_ms)]
                + (["--elect-unclean"] if self.elect_unclean else []))


@dataclass(frozen=True, kw_only=True)
class ClusterSpec:
    directory: str
    master: NodeSpec  # in controller mode: the node started first, the first elected
    slaves: tuple[NodeSpec, ...] = ()
    # Controller mode (every node's ha_mode CONTROLLER): the controller's
    # settings; None there means ControllerSpec().
    controller: ControllerSpec | None = None

    @property
    def controller_mode(self) -> bool:
        return self.master.ha_mode is HAMode.CONTROLLER

    @property
    def nodes(self) -> tuple[NodeSpec, ...]:
        return (self.master, *self.slaves)


@dataclass(frozen=True)
class NodeInfo:
    name: str
    role: Role
    address: str  # host:port the client and harness reach the node's gRPC at
    state: NodeState
    data_dir: str  # on the host: what the harness reads after a run
    log_path: str
    pid: int | None = None  # local backend
    container: str | None = None  # compose backend
    extra: dict[str, Any] = field(default_factory=dict)


class BackendError(RuntimeError):
    """A backend operation failed; the message says what and how to fix it."""


class ClusterBackend(Protocol):
    """Operations every backend provides. Methods block until done: `up`
    returns when every node answers its health check and every slave's
    replication stream is connected; `kill` when the
    process is gone; `pause` when it is stopped; `restart`/`start` when the
    node is healthy again (recovery done)."""

    name: str  # "local" | "compose"

    def up(self, spec: ClusterSpec, *, token: str, timeout_s: float = 60.0) -> list[NodeInfo]: ...
    def nodes(self) -> list[NodeInfo]: ...
    def node(self, name: str) -> NodeInfo: ...
    def kill(self, name: str) -> None: ...  # SIGKILL: the node's crash model applies
    def stop(self, name: str) -> None: ...  # SIGTERM: clean shutdown
    def start(self, name: str, *, timeout_s: float = 60.0) -> NodeInfo: ...
    def restart(self, name: str, *, timeout_s: float = 60.0) -> NodeInfo: ...
    def pause(self, name: str) -> None: ...  # SIGSTOP / docker pause
    def resume(self, name: str) -> None: ...
    # Cut the link a-b (classic: the master and a slave; controller mode:
    # any two nodes, or a node and CONTROLLER_NAME; compose: classic only).
    def partition(self, a: str, b: str) -> None: ...
    def heal(self, a: str, b: str) -> None: ...
    def set_failpoints(self, name: str, spec: str) -> None: ...  # applies from next start
    # applies from the next start (how a node that refused is started again)
    def set_corruption_policy(self, name: str, policy: CorruptionPolicy) -> None: ...
    def down(self) -> None: ...  # stop everything; leaves data dirs, removes the rest
    # Failover (docs/design.md, "Failover: routing, promotion, rejoin"); a
    # backend that cannot yet raises BackendError saying so.
    # A running slave becomes the master with its own log (role and flush
    # the old master's unless given); every other node follows it.
    def promote(self, name: str, *, role: Role | None = None, flush: FlushMode | None = None,
                timeout_s: float = 60.0) -> NodeInfo: ...
    # The machine is gone: SIGKILL, and its store moved aside as evidence.
    def lose(self, name: str) -> NodeInfo: ...
    # A node not running starts as a slave of the current master, on its own
    # disk (after a crash) or an empty one (after lose).
    def rejoin(self, name: str, *, timeout_s: float = 60.0) -> NodeInfo: ...
    # The route clients follow now (DIR/route.json; in controller mode the
    # controller's master, as the controller published it).
    def route(self) -> Route: ...
    # Controller mode: SIGKILL the controller's process / start it again on
    # its state (a backend that runs no controller raises BackendError).
    def kill_controller(self) -> None: ...
    def start_controller(self, *, timeout_s: float = 60.0) -> None: ...
