"""One node: a store, HA (master or slave side) and the broker service
(cluster/node/broker_service.py), in one asyncio process with a grpc.aio
server; this module is the node's lifecycle: start, stop, and the calls
the servicers make.

The store must only be touched from the event loop thread (its flusher and
group commit hand results back to the loop), so everything here is
coroutines and callbacks on one loop.

Put path (masters). The node checks a put (role, shutdown), then hands it
to the store's put path (store/put_path.py: sends arriving in one loop tick
are appended together, one CommitLog append), which answers each batch
with the node's PutAnswer (cluster/node/put_answer.py), given to the store
when it is opened: the flush wait and, on a SYNC_MASTER, the replica wait
run in parallel, and ha/sync_master.py decides each put's status from
their outcomes (SLAVE_NOT_AVAILABLE, FLUSH_SLAVE_TIMEOUT,
FLUSH_DISK_TIMEOUT, PUT_OK; its docstring has the rules). An ASYNC_MASTER
never waits for a slave; a SLAVE refuses every put.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from cluster.node import consume_service
from cluster.node.auth import TokenInterceptor
from cluster.node.broker_service import BrokerServicer
from cluster.node.guards import MalformedRequestInterceptor
from cluster.node.put_answer import PutAnswer
from cluster.node.repair import grpc_repair_source
from cluster.node.role import Role
from cluster.node.send_stream import End, SendSession
from cluster.node.wire import (
    MAX_BODY_BYTES,
    grpc_limit_for,
    peer_host,
)
from ha.autoswitch import acks
from ha.autoswitch import confirm as confirm_rules
from ha.autoswitch import rejoin as rejoin_rules
from ha.autoswitch.epoch_file import FILE_NAME as EPOCH_FILE_NAME
from ha.autoswitch.epoch_file import EpochFile
from ha.autoswitch.epochs import EpochEntry, EpochList
from ha.config import HAConfig, HAMode
from ha.credentials import token_metadata
from ha.master import HAMaster
from ha.master import add_to_server as add_ha_to_server
from ha.slave import HA_CHANNEL_OPTIONS, HASlave
from ha.sync_master import SyncMasterRules
from ha.transport.streams import HAConnector, InProcessNetwork
from proto import broker_pb2, broker_pb2_grpc, ha_pb2
from store.config import ConfigError, CorruptionPolicy, StoreConfig
from store.failpoints import Failpoints
from store.log.record import CorruptRecordError, Message
from store.seams.clock import Clock, LoopClock, SystemClock
from store.seams.disk import Disk, RealDisk
from store.seams.flush_executor import FlushExecutor
from store.status import PutResult, PutStatus
from store.store import MessageStore

log = logging.getLogger("dlab.node")

BROKER_SERVICE = broker_pb2.DESCRIPTOR.services_by_name["Broker"].full_name
HA_SERVICE = ha_pb2.DESCRIPTOR.services_by_name["HA"].full_name
MAX_READ_BYTES = 16 * 1024 * 1024
DEFAULT_READ_BYTES = 1024 * 1024


@dataclass(frozen=True, kw_only=True)
class NodeConfig:
    name: str
    role: Role
    data_dir: str
    token: str
    listen: str = "127.0.0.1:0"
    master: str | None = None  # a slave's master (HA) address
    store: StoreConfig = field(default_factory=StoreConfig)
    ha: HAConfig = field(default_factory=HAConfig)
    failpoints: str = ""
    # Replicas the REPAIR corruption policy fetches a damaged range from
    # (HOST:PORT of their Broker service); a slave defaults to its master.
    repair_from: tuple[str, ...] = ()
    shutdown_grace_s: float = 2.0
    # A slave copies its master's consumer offset table this often
    # (RocketMQ's SlaveSynchronize runs every 10 s).
    consumer_offset_sync_interval_ms: int = 10_000
    # Controller mode (ha.ha_mode): the controller's address. The node
    # starts with no role; the controller's election makes it the master
    # or a slave (cluster/node/replicas_manager.py).
    controller: str | None = None
    # Controller mode: this broker's election priority (lower is preferred).
    priority: int = 0
    # Controller mode: the address the controller and the other nodes reach
    # this node at, sent in every heartbeat (the controller hands it to
    # slaves as their master's). None: `listen`, which is right unless the
    # node listens on a wildcard address (a container: 0.0.0.0:7000, reached
    # as its service name).
    advertise: str | None = None
    # Controller mode: (name, HOST:PORT) pairs; when the controller names
    # broker NAME master, this node reaches it at HOST:PORT instead of the
    # address NAME advertises (the local backend's link proxies, so that a
    # partition cuts one pair of nodes: docs/design.md, "The controller
    # process"). Clients and the controller keep the advertised address.
    peer_addresses: tuple[tuple[str, str], ...] = ()

    @property
    def advertised(self) -> str:
        """The address this node gives the controller."""
        return self.advertise or self.listen

    def peer_address(self, name: str, advertised: str) -> str:
        """Where this node reaches broker `name`, which advertises `advertised`."""
        return dict(self.peer_addresses).get(name, advertised)

    @property
    def controller_mode(self) -> bool:
        return self.ha.ha_mode is HAMode.CONTROLLER

    def validate(self) -> NodeConfig:
        if not _valid_name(self.name):
            raise ConfigError(f"node name {self.name!r}: use 1-64 letters, digits, - or _")
        if self.controller_mode:
            if not self.controller:
                raise ConfigError("--ha-mode controller needs --controller HOST:PORT (the "
                                  "controller's address)")
            if self.master:
                raise ConfigError("--master is for classic mode; in controller mode the "
                                  "controller tells a slave its master")
        elif self.controller:
            raise ConfigError("--controller is for --ha-mode controller")
        elif self.advertise or self.peer_addresses:
            raise ConfigError(f"{'--advertise' if self.advertise else '--peer-address'} is for "
                              "--ha-mode controller (a classic slave is given its master's "
                              "address by --master)")
        elif self.role == Role.SLAVE and not self.master:
            raise ConfigError("a SLAVE needs --master HOST:PORT (its master's address)")
        elif self.role != Role.SLAVE and self.master:
            raise ConfigError(f"--master is for slaves; a {self.role.value} has no master")
        for what, addr in (("--listen", self.listen), ("--master", self.master),
                           ("--controller", self.controller), ("--advertise", self.advertise)):
            if addr is not None:
                host, sep, port = addr.rpartition(":")
                if not sep or not host or not port.isdigit() or int(port) > 65535:
                    raise ConfigError(f"{what} {addr!r}: expected HOST:PORT, e.g. "
                                      "127.0.0.1:7001")
        for peer, addr in self.peer_addresses:
            host, sep, port = addr.rpartition(":")
            if (not _valid_name(peer) or not sep or not host or not port.isdigit()
                    or int(port) > 65535):
                raise ConfigError(f"--peer-address {peer}={addr}: expected NAME=HOST:PORT")
        if not self.token:
            raise ConfigError("the cluster token is empty")
        for addr in self.repair_from:
            host, sep, port = addr.rpartition(":")
            if not sep or not host or not port.isdigit() or int(port) > 65535:
                raise ConfigError(f"--repair-from {addr!r}: expected HOST:PORT")
        if self.consumer_offset_sync_interval_ms < 1:
            raise ConfigError("--consumer-offset-sync-ms must be at least 1")
        if self.store.max_message_size_bytes > MAX_BODY_BYTES:
            raise ConfigError(f"max_message_size_bytes {self.store.max_message_size_bytes}: "
                              f"at most {MAX_BODY_BYTES} (a put travels as one gRPC message, "
                              "which gRPC caps at 2 GiB)")
        self.store.validate()
        self.ha.validate()
        return self


def _valid_name(name: str) -> bool:
    """A node name: 1-64 letters, digits, - or _."""
    return bool(name) and len(name) <= 64 and name.replace("-", "").replace("_", "").isalnum()


def server_options(max_message_size_bytes: int) -> list[tuple[str, Any]]:
    """The node's gRPC server options: HA's, with limits that let the
    largest message the store accepts through, in a put and in a pull (the
    store, not gRPC, refuses a body over max_message_size with
    MESSAGE_ILLEGAL)."""
    options: dict[str, Any] = dict(HA_CHANNEL_OPTIONS)
    for key in ("grpc.max_receive_message_length", "grpc.max_send_message_length"):
        options[key] = max(options[key], grpc_limit_for(max_message_size_bytes))
    # No SO_REUSEPORT: a second node on the same port must fail to start,
    # not share the port with the first.
    return [("grpc.so_reuseport", 0), *options.items()]


def _plain(v: Any) -> Any:
    """A config value as JSON takes it (enums by value, sets sorted)."""
    if isinstance(v, frozenset):
        return sorted(v)
    return v.value if hasattr(v, "value") else v


class Node:
    """`clock` must be the loop's time (SystemClock on asyncio's own loops,
    VirtualTimeLoop.clock() on a simulated one); `executor` is where the
    store's file IO runs (store/seams/flush_executor.py); with `network` (an
    ha/transport/ MemoryNetwork) the node serves no gRPC: its HA stream
    runs over that network at its `listen` address, and puts, status and
    pulls are the methods below (what the servicers call)."""

    def __init__(self, config: NodeConfig, *, clock: Clock | None = None,
                 executor: FlushExecutor | None = None,
                 network: InProcessNetwork | None = None, disk: Disk | None = None) -> None:
        self.config = config.validate()
        self.disk = disk  # where the store's files live (store/seams/disk.py; default: the OS)
        self.clock = clock or SystemClock()
        self.executor = executor
        self.network = network
        self.failpoints = Failpoints(config.failpoints)
        self.role = config.role
        self.store: MessageStore | None = None
        self.ha_master: HAMaster | None = None
        self.ha_slave: HASlave | None = None
        self.server: grpc.aio.Server | None = None
        self.port = 0
        self._health = health.aio.HealthServicer()
        self._stopping = False
        self._send_sessions: set[SendSession] = set()
        self._offset_sync: asyncio.Task[None] | None = None
        self._offset_sync_state: consume_service.OffsetSyncState | None = None
        # The store's put path answers with this (given when the store opens).
        self._answer = PutAnswer(self, SyncMasterRules.of(
            config.ha, sync_master=config.role == Role.SYNC_MASTER))
        # Controller mode: the node starts with no role (a SLAVE following
        # no one) until the controller's election says (replicas_manager.py).
        if config.controller_mode:
            self.role = Role.SLAVE
        self.epochs: EpochFile | None = None
        self.master_epoch = 0  # controller mode: the epoch served or followed
        self.following: str | None = config.master  # a slave's master address
        self.sync_state_set: frozenset[str] = frozenset()
        # A SyncStateSet change on its way to the controller (its members
        # count for acks and the confirm offset until its answer).
        self._synchronizing: frozenset[str] = frozenset()
        self._role_tasks: list[asyncio.Task[Any]] = []
        self._replicas_manager: Any = None

    # ------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Open (recover) the store, then serve: over gRPC, or over the
        in-memory network when the node was given one."""
        store_cfg = self._open_store()
        assert self.store is not None
        await self.store.start()
        if self.config.controller_mode:
            self._open_epochs()
        if self.network is not None:
            self._start_in_memory(self.network)
            self._start_replicas_manager()
            return
        await self._serve_grpc()
        cfg = self.config
        log.info("node %s (%s, %s, crash model %s) serving on %s:%d, wrote=%d flushed=%d",
                 cfg.name, self.role.value, store_cfg.flush_mode.value,
                 store_cfg.crash_model.value, cfg.listen.rpartition(":")[0], self.port,
                 self.store.log.wrote, self.store.log.flushed)
        if store_cfg.emulate:
            log.warning("node %s emulates known RocketMQ bug(s) on purpose: %s", cfg.name,
                        ", ".join(sorted(store_cfg.emulate)))
        self._start_replicas_manager()

    def _open_store(self) -> StoreConfig:
        """Open and recover the store, its put path answering with the
        node's PutAnswer; returns the store's configuration as opened."""
        cfg = self.config
        host, _, port = cfg.listen.rpartition(":")
        # A slave's log is read back only when something fails over to it:
        # it drops what it has flushed from the page cache (StoreConfig).
        store_cfg = cfg.store.with_(store_host=(host if host != "0.0.0.0" else "127.0.0.1",
                                                int(port)),
                                    drop_flushed_pages=(cfg.role == Role.SLAVE
                                                        and not cfg.controller_mode),
                                    # Controller mode: consumers read up to the
                                    # SyncStateSet's confirm offset (_update_confirm).
                                    confirm_offset_by_acks=cfg.controller_mode)
        repair_from = cfg.repair_from or ((cfg.master,) if cfg.master else ())
        source = (grpc_repair_source(repair_from, cfg.token)
                  if cfg.store.corruption_policy is CorruptionPolicy.REPAIR and repair_from
                  else None)
        self.store = MessageStore.open(cfg.data_dir, store_cfg, clock=self.clock,
                                       failpoints=self.failpoints, repair_source=source,
                                       executor=self.executor, disk=self.disk,
                                       answer=self._answer)
        log.info("store %s recovered: %s", cfg.data_dir, self.store.recovery.summary)
        return store_cfg

    async def _serve_grpc(self) -> None:
        """The Broker, HA (masters), health and reflection services on one
        grpc.aio server; a slave then connects to its master."""
        cfg = self.config
        store = self.store
        assert store is not None
        self.server = grpc.aio.server(
            interceptors=[TokenInterceptor(cfg.token), MalformedRequestInterceptor()],
            options=server_options(cfg.store.max_message_size_bytes),
        )
        broker_pb2_grpc.add_BrokerServicer_to_server(BrokerServicer(self), self.server)
        services = [BROKER_SERVICE, health.SERVICE_NAME, reflection.SERVICE_NAME]
        if cfg.controller_mode:
            # The role comes and goes: the HA service hands each stream to
            # the HAMaster of the moment, or refuses it.
            add_ha_to_server(_RoleHA(self), self.server)
            services.append(HA_SERVICE)
        elif self.role != Role.SLAVE:
            self.ha_master = HAMaster(store, cfg.ha, clock=self.clock,
                                      failpoints=self.failpoints)
            add_ha_to_server(self.ha_master, self.server)  # pre-encoded ranges
            services.append(HA_SERVICE)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self.server)
        reflection.enable_server_reflection(services, self.server)
        try:
            self.port = self.server.add_insecure_port(cfg.listen)
        except RuntimeError:
            self.port = 0
        if not self.port:
            raise NodeStartError(f"cannot listen on {cfg.listen}: the port is in use or the "
                                 "address is not local; choose another --listen")
        await self.server.start()
        if self.role == Role.SLAVE and not cfg.controller_mode:
            self._start_slave()
        for svc in ("", BROKER_SERVICE):
            await self._health.set(svc, health_pb2.HealthCheckResponse.SERVING)

    def _start_in_memory(self, network: InProcessNetwork) -> None:
        """HA and the broker's unary calls over `network` instead of gRPC
        (ha/transport/); a slave copies its master's consumer offsets
        through the network's stub."""
        cfg = self.config
        store = self.store
        assert store is not None
        self.port = int(cfg.listen.rpartition(":")[2])
        network.serve_calls(cfg.listen, BrokerServicer(self), token=cfg.token)
        if cfg.controller_mode:
            return  # the role comes from the controller (become_master / become_slave)
        if self.role != Role.SLAVE:
            self.ha_master = HAMaster(store, cfg.ha, clock=self.clock,
                                      failpoints=self.failpoints)
            network.serve(cfg.listen, self.ha_master.serve, token=cfg.token)
        else:
            assert cfg.master is not None
            self._start_slave(connector=network.connector(cfg.listen),
                              stub=network.stub(cfg.listen, cfg.master),
                              wall_ms=self.clock.wall_ms)

    def _start_slave(self, *, connector: HAConnector | None = None, stub: Any | None = None,
                     wall_ms: Callable[[], int] | None = None, master: str | None = None,
                     on_applied: Callable[[int], object] | None = None) -> None:
        """A slave's HA stream to its master (`master`, else the configured
        one) and its copy of the master's consumer offsets (over gRPC unless
        given a connector and stub)."""
        cfg = self.config
        master = master or cfg.master
        assert self.store is not None and master is not None
        self.ha_slave = HASlave(self.store, name=cfg.name, master_address=master,
                                token=cfg.token, config=cfg.ha, clock=self.clock,
                                failpoints=self.failpoints, connector=connector,
                                on_applied=on_applied)
        self.ha_slave.start()
        self._offset_sync_state = consume_service.OffsetSyncState()
        self._offset_sync = asyncio.get_running_loop().create_task(
            consume_service.sync_from_master(
                self.store, master, cfg.token, cfg.consumer_offset_sync_interval_ms / 1000,
                self._offset_sync_state, stub=stub, wall_ms=wall_ms))

    async def stop(self) -> None:
        """Clean shutdown: stop accepting, finish in-flight calls, stop HA,
        close the store (flush, checkpoint, remove `abort`)."""
        if self._stopping:
            return
        self._stopping = True
        log.info("node %s shutting down", self.config.name)
        for task in self._role_tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for session in list(self._send_sessions):
            # Stop reading; each call ends once its taken puts are answered
            # (server.stop below waits for that within the grace period).
            session.close(f"node {self.config.name} is shutting down; send again once it "
                          "is back (results not received are indeterminate)")
        await self._health.enter_graceful_shutdown()
        if self.network is not None:
            self.network.unserve_calls(self.config.listen)
        if self.ha_slave is not None:
            await self.ha_slave.stop()
        if self.ha_master is not None:
            await self.ha_master.close()
            if self.network is not None:
                self.network.unserve(self.config.listen)
        if self.server is not None:
            await self.server.stop(self.config.shutdown_grace_s)
        if self._offset_sync is not None:
            self._offset_sync.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._offset_sync
        # Puts still waiting for their flush or replica (each wait ends by
        # its own timeout at the latest): answered before the store closes.
        deadline = self.clock.monotonic() + 30
        while (self.store is not None and self.store.puts.unanswered
               and self.clock.monotonic() < deadline):
            await asyncio.sleep(0.01)
        if self.store is not None:
            await self.store.close()
            if self.store.close_problem is None:
                log.info("store closed cleanly (abort marker removed), wrote=%d",
                         self.store.log.wrote)
            else:
                log.error("store closed, NOT cleanly: %s; the abort marker stays, so the next "
                          "start runs abnormal recovery, wrote=%d", self.store.close_problem,
                          self.store.log.wrote)

    # ------------------------------------------------------- controller mode
    def _open_epochs(self) -> None:
        """The broker's epoch file beside its log (RocketMQ's
        epochFileCheckpoint), its entries past the recovered log's end
        dropped (ha/autoswitch/rejoin.py recover)."""
        store = self.store
        assert store is not None
        disk = self.disk or RealDisk()
        self.epochs = EpochFile(disk, os.path.join(self.config.data_dir, EPOCH_FILE_NAME),
                                failpoints=self.failpoints, emulate=self.config.store.emulate,
                                mark=store.log.mark)
        if self.epochs.note:
            log.warning("%s", self.epochs.note)
        rejoin_rules.recover(store, self.epochs)
        log.info("epoch file: %s (read from %s)", self.epochs.epochs or "no epochs",
                 self.epochs.loaded_from)

    def _start_replicas_manager(self) -> None:
        if not self.config.controller_mode:
            return
        from cluster.node.replicas_manager import ReplicasManager

        manager = ReplicasManager(self, self._controller_stub())
        self._replicas_manager = manager
        self._role_tasks.append(asyncio.get_running_loop().create_task(
            manager.run(), name="replicas-manager"))

    def _controller_stub(self) -> Any:
        cfg = self.config
        assert cfg.controller is not None
        if self.network is not None:
            return self.network.stub(cfg.listen, cfg.controller)
        from proto import controller_pb2_grpc

        channel = grpc.aio.insecure_channel(cfg.controller)
        return controller_pb2_grpc.ControllerStub(channel)

    def _broker_stub(self, address: str) -> Any:
        if self.network is not None:
            return self.network.stub(self.config.listen, address)
        return broker_pb2_grpc.BrokerStub(grpc.aio.insecure_channel(address))

    async def become_master(self, epoch: int, sync_state_set: frozenset[str]) -> None:
        """Controller mode: serve as master in `epoch` (RocketMQ's
        changeToMaster): stop following, record (epoch, log end) in the
        epoch file, durably, then serve the HA side and take puts. The whole
        log is kept: what it holds past the last shared point is the
        others' to truncate when they rejoin."""
        store, epochs = self.store, self.epochs
        assert store is not None and epochs is not None
        if self._stopping:
            return
        await self._stop_following()
        epochs.begin_epoch(epoch, store.log.wrote)
        self.failpoints.hit("become_master_after_epoch")
        cfg = self.config
        new = self.ha_master is None
        if new:
            self.ha_master = HAMaster(store, cfg.ha, clock=self.clock,
                                      failpoints=self.failpoints)
            self.ha_master.on_ack = self._on_ack
        self.master_epoch = epoch
        self.following = None
        # The set first, and the confirm offset from it (RocketMQ's
        # changeToMaster: changeSyncStateSet, then the HA service's
        # changeToMaster, which waits for dispatch to reach the confirm
        # offset and then recovers the queue offset table).
        self.set_sync_state_set(sync_state_set)
        if new:
            # What it received as a replica has no queue offsets counted
            # yet, and what it holds past the confirm offset keeps its own.
            store.recover_topic_queue_table()
            if self.network is not None:
                assert self.ha_master is not None
                self.network.serve(cfg.listen, self.ha_master.serve, token=cfg.token)
        # The role node status shows: whether puts may wait for a slave.
        self.role = (Role.SYNC_MASTER if cfg.ha.all_ack_in_sync_state_set
                     or cfg.ha.in_sync_replicas > 1 else Role.ASYNC_MASTER)
        log.warning("node %s is the master of epoch %d from log offset %d (epochs %s)",
                    cfg.name, epoch, store.log.wrote, epochs.epochs)

    def set_sync_state_set(self, members: frozenset[str],
                           synchronizing: frozenset[str] | None = None) -> None:
        """Controller mode, on the master: the SyncStateSet the controller
        holds (names); puts from now on wait for its quorum
        (ha/autoswitch/acks.py). `synchronizing`: a change on its way to the
        controller, whose members count too until its answer."""
        cfg = self.config
        self.sync_state_set = members
        self._synchronizing = synchronizing or frozenset()
        quorum = acks.quorum(cfg.ha, cfg.name, members | self._synchronizing)
        if self.ha_master is not None:
            self.ha_master.set_quorum(quorum)
        self._answer.set_rules(replace(SyncMasterRules.of(cfg.ha, sync_master=quorum.waits),
                                       controller=True))
        self._update_confirm()

    def _on_ack(self, slave: str, acked: int) -> None:
        """HAMaster's hook after every accepted report: the confirm offset,
        then the replicas manager's expansion check."""
        self._update_confirm()
        if self._replicas_manager is not None:
            self._replicas_manager.on_ack(slave, acked)

    def _update_confirm(self) -> None:
        """Controller mode, on the master: the store's confirm offset from
        the SyncStateSet and the acks (ha/autoswitch/confirm.py)."""
        store, ha = self.store, self.ha_master
        if store is None or ha is None or not self.config.controller_mode:
            return
        value = confirm_rules.confirm_offset(
            master=self.config.name, local_set=self.sync_state_set,
            members=self.sync_state_set | self._synchronizing,
            acks={a.slave: a.acked for a in ha.acks()}, wrote=store.log.wrote,
            current=store.confirmed_offset(),
            all_ack=self.config.ha.all_ack_in_sync_state_set)
        if value is confirm_rules.FOLLOWS_WRITTEN:
            store.confirm_written()
        else:
            store.set_confirm_offset(value)

    async def become_slave(self, master_address: str, epoch: int) -> str | None:
        """Controller mode: follow the master at `master_address` in `epoch`.
        The rejoin handshake first (ha/autoswitch/rejoin.py): the master's
        epochs and max offset, the last point both logs share, this log and
        epoch file cut there, crash-safely; then replicate, recording each
        master epoch in the epoch file as its first bytes arrive. Returns
        why it cannot follow yet (None: following)."""
        store, epochs = self.store, self.epochs
        assert store is not None and epochs is not None
        if self._stopping:
            return "stopping"
        await self._stop_following()
        if self.ha_master is not None:
            # Demoted: puts waiting for a replica end FLUSH_SLAVE_TIMEOUT.
            await self.ha_master.close()
            if self.network is not None:
                self.network.unserve(self.config.listen)
            self.ha_master = None
        self.role = Role.SLAVE
        self.sync_state_set = self._synchronizing = frozenset()
        self.following = None
        # A replica's consumers read what it received (RocketMQ's slave
        # takes the master's confirm offset, bounded by its own end: the
        # same for one slave; with two, this reads further).
        store.confirm_written()
        try:
            status = await self._broker_stub(master_address).Status(
                broker_pb2.StatusRequest(), metadata=token_metadata(self.config.token),
                timeout=5.0)
        except grpc.RpcError as exc:
            return f"cannot ask the master {master_address} for its epochs: {exc.details()}"
        if status.master_epoch != epoch or status.role == Role.SLAVE.value:
            return (f"{master_address} is not yet the master of epoch {epoch} "
                    f"(it serves epoch {status.master_epoch} as {status.role})")
        master_epochs = EpochList(tuple(EpochEntry(e.epoch, e.start_offset)
                                        for e in status.epochs))
        try:
            decision = rejoin_rules.decide(epochs.epochs, store.log.wrote, master_epochs,
                                           status.wrote)
        except rejoin_rules.MasterEpochsError as exc:
            return str(exc)
        if decision.kind is rejoin_rules.RejoinKind.NO_COMMON_POINT:
            log.error("cannot follow %s: %s", master_address, decision.reason)
            return decision.reason
        if decision.kind is rejoin_rules.RejoinKind.TRUNCATE and (
                decision.truncate_to is not None and decision.truncate_to < store.log.wrote):
            log.warning("truncating to %d before following %s: %s", decision.truncate_to,
                        master_address, decision.reason)
        rejoin_rules.carry_out(decision, store, epochs)
        pending = [e for e in master_epochs.entries
                   if epochs.epochs.last is None or e.epoch > epochs.epochs.last.epoch]

        def record_epochs(new_max: int) -> None:
            """A master epoch goes into the epoch file once its first bytes
            are in this log (before the slave reports them)."""
            while pending and pending[0].start_offset < new_max:
                epochs.append(pending.pop(0))

        record_epochs(store.log.wrote)
        if self.network is not None:
            self._start_slave(connector=self.network.connector(self.config.listen),
                              stub=self.network.stub(self.config.listen, master_address),
                              wall_ms=self.clock.wall_ms, master=master_address,
                              on_applied=record_epochs)
        else:
            self._start_slave(master=master_address, on_applied=record_epochs)
        self.following = master_address
        self.master_epoch = epoch
        log.warning("node %s follows %s in epoch %d from log offset %d", self.config.name,
                    master_address, epoch, store.log.wrote)
        return None

    async def _stop_following(self) -> None:
        if self.ha_slave is not None:
            await self.ha_slave.stop()
            self.ha_slave = None
        if self._offset_sync is not None:
            self._offset_sync.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._offset_sync
            self._offset_sync = None

    # ------------------------------------------------------------------ puts
    async def put_many(self, messages: Sequence[Message]) -> list[PutResult]:
        # A private future: a caller cancelled while it waits (its RPC's
        # deadline passed) must not cancel the batch the other puts share.
        fut: asyncio.Future[list[PutResult]] = asyncio.get_running_loop().create_future()

        def done(results: list[PutResult]) -> None:
            if not fut.done():
                fut.set_result(results)

        self.submit(messages, done)
        return await fut

    def submit(self, messages: Sequence[Message],
               on_done: Callable[[list[PutResult]], object]) -> None:
        """Put `messages` with this loop tick's batch; `on_done` gets their
        results, in order, once, from the loop (never from inside this call).
        A put is the node's from here on: it completes whatever happens to
        the caller (a cancelled RPC, a closed stream)."""
        loop = asyncio.get_running_loop()
        if self.role == Role.SLAVE:
            loop.call_soon(on_done, [PutResult(
                PutStatus.SERVICE_NOT_AVAILABLE, msg_id=m.msg_id,
                detail=f"{self.config.name} is a SLAVE; send to its master "
                       f"({self.following or 'none elected yet'})") for m in messages])
            return
        if self.config.controller_mode and (why := acks.refusal(self.config.ha,
                                                                self.sync_state_set)):
            loop.call_soon(on_done, [PutResult(PutStatus.IN_SYNC_REPLICAS_NOT_ENOUGH,
                                               msg_id=m.msg_id, detail=why)
                                     for m in messages])
            return
        if self._stopping or self.store is None:
            loop.call_soon(on_done, [PutResult(PutStatus.SERVICE_NOT_AVAILABLE, msg_id=m.msg_id,
                                               detail="node is shutting down")
                                     for m in messages])
            return
        if self.failpoints.watched("after_put_answered"):
            on_done = _then_hit(on_done, self.failpoints)
        self.store.puts.submit(messages, on_done)

    async def serve_send_stream(self, context: grpc.aio.ServicerContext) -> End | None:
        """One SendStream call (cluster/node/send_stream.py); returns the status
        to end it with (None: OK)."""
        if self._stopping:
            return (grpc.StatusCode.UNAVAILABLE, f"node {self.config.name} is shutting down")
        peer = context.peer()
        session = SendSession(self.submit, peer_host(peer), peer=peer)
        self._send_sessions.add(session)
        try:
            return await session.serve(context)
        finally:
            self._send_sessions.discard(session)

    # ---------------------------------------------------------------- status
    def status(self) -> broker_pb2.NodeStatus:
        store = self.store
        assert store is not None
        st = store.state()
        cfg = self.config
        offsets, bad_offsets = consume_service.status_offsets(store.consumer_offsets.snapshot())
        msg = broker_pb2.NodeStatus(
            name=cfg.name, role=self.role.value, flush_mode=st["flush_mode"],
            crash_model=st["crash_model"], min_offset=st["min_offset"], flushed=st["flushed"],
            wrote=st["wrote"], slave_ahead_policy=cfg.ha.slave_ahead_policy.value,
            ha_ship_limit=cfg.ha.ship_limit.value, recovery_json=json.dumps(st["recovery"]),
            pid=os.getpid(), failed=st["failed"] or st["cannot_grow"] or "",
            config_json=json.dumps(self._config_dict()),
            confirmed_offset=store.confirmed_offset(),
            consume_json=json.dumps({
                "queues": {f"{t}/{q}": store.queue_offsets(t, q)
                           for t, qs in store.topic_queues().items() for q in qs},
                "offsets": offsets, "malformed_offset_entries": bad_offsets,
                "consume_queue_error": st.get("consume_queue_error"),
                "consumer_offsets_error": st.get("consumer_offsets_error"),
                "offset_sync": (None if self._offset_sync_state is None
                                else asdict(self._offset_sync_state))}),
        )
        msg.failpoint_hits.update(self.failpoints.hits())
        if cfg.controller_mode:
            msg.ha_mode = HAMode.CONTROLLER.value
            msg.master_epoch = self.master_epoch
            msg.sync_state_set.extend(sorted(self.sync_state_set))
            if self.epochs is not None:
                for e in self.epochs.epochs.entries:
                    msg.epochs.add(epoch=e.epoch, start_offset=e.start_offset)
        if self.ha_master is not None:
            for link in self.ha_master.status():
                msg.slaves.add(**asdict(link))
        if self.ha_slave is not None:
            msg.master.CopyFrom(broker_pb2.MasterLink(**asdict(self.ha_slave.link)))
        return msg

    def _config_dict(self) -> dict[str, Any]:
        cfg = self.config
        d: dict[str, Any] = {"name": cfg.name, "role": cfg.role.value, "listen": cfg.listen,
                             "master": cfg.master, "controller": cfg.controller,
                             "priority": cfg.priority, "data_dir": cfg.data_dir,
                             "peer_addresses": dict(cfg.peer_addresses),
                             "failpoints": cfg.failpoints, "repair_from": list(cfg.repair_from)}
        d["store"] = {k: _plain(v) for k, v in asdict(cfg.store).items()}
        d["ha"] = {k: _plain(v) for k, v in asdict(cfg.ha).items()}
        return d

    def read(self, offset: int, max_bytes: int) -> broker_pb2.ReadResponse:
        store = self.store
        assert store is not None
        lg = store.log
        if offset < lg.min_offset or offset > lg.wrote:
            raise ValueError(f"offset {offset} is outside this node's log "
                             f"[{lg.min_offset}, {lg.wrote}]")
        n = DEFAULT_READ_BYTES if max_bytes <= 0 else min(max_bytes, MAX_READ_BYTES)
        try:
            data, nxt = lg.read_range(offset, n)
        except CorruptRecordError as exc:
            raise ValueError(f"no record starts at offset {offset} ({exc}); read from an "
                             "offset a send returned, or from the log's first offset") from None
        return broker_pb2.ReadResponse(data=data, next_offset=nxt, min_offset=lg.min_offset,
                                       wrote=lg.wrote)


class _RoleHA:
    """A controller-mode node's HA service: each stream goes to the node's
    HAMaster of the moment; while the node is not the master, refused."""

    def __init__(self, node: Node) -> None:
        self._node = node

    async def Replicate(self, request_iterator: Any,  # noqa: N802 - the gRPC method
                        context: grpc.aio.ServicerContext) -> None:
        master = self._node.ha_master
        if master is None:
            await context.abort(grpc.StatusCode.UNAVAILABLE,
                                f"{self._node.config.name} is not the master now; ask the "
                                "controller which broker is")
            return
        await master.Replicate(request_iterator, context)


class NodeStartError(RuntimeError):
    """The node cannot start; the message says why and what to do."""


async def serve(config: NodeConfig) -> int:
    """Run a node until SIGTERM/SIGINT; returns the process exit code."""
    loop = asyncio.get_running_loop()
    node = Node(config, clock=LoopClock(loop))  # timers and deadlines: one clock
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await node.start()
    except BaseException:
        await node.stop()
        raise
    await stop.wait()
    await node.stop()
    return 0


def _then_hit(on_done: Callable[[list[PutResult]], object], failpoints: Failpoints
              ) -> Callable[[list[PutResult]], None]:
    """`on_done`, then the failpoint after_put_answered: the answer has left
    (a crash from here on cannot take it back from the client)."""
    def answered(results: list[PutResult]) -> None:
        on_done(results)
        failpoints.hit("after_put_answered")
    return answered
