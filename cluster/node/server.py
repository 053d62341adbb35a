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
from dataclasses import asdict, dataclass, field
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
from ha.config import HAConfig
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
from store.seams.disk import Disk
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

    def validate(self) -> NodeConfig:
        if not self.name or len(self.name) > 64 or not self.name.replace("-", "").replace(
                "_", "").isalnum():
            raise ConfigError(f"node name {self.name!r}: use 1-64 letters, digits, - or _")
        if self.role == Role.SLAVE and not self.master:
            raise ConfigError("a SLAVE needs --master HOST:PORT (its master's address)")
        if self.role != Role.SLAVE and self.master:
            raise ConfigError(f"--master is for slaves; a {self.role.value} has no master")
        for what, addr in (("--listen", self.listen), ("--master", self.master)):
            if addr is not None:
                host, sep, port = addr.rpartition(":")
                if not sep or not host or not port.isdigit() or int(port) > 65535:
                    raise ConfigError(f"{what} {addr!r}: expected HOST:PORT, e.g. "
                                      "127.0.0.1:7001")
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

    # ------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Open (recover) the store, then serve: over gRPC, or over the
        in-memory network when the node was given one."""
        store_cfg = self._open_store()
        assert self.store is not None
        await self.store.start()
        if self.network is not None:
            self._start_in_memory(self.network)
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

    def _open_store(self) -> StoreConfig:
        """Open and recover the store, its put path answering with the
        node's PutAnswer; returns the store's configuration as opened."""
        cfg = self.config
        host, _, port = cfg.listen.rpartition(":")
        # A slave's log is read back only when something fails over to it:
        # it drops what it has flushed from the page cache (StoreConfig).
        store_cfg = cfg.store.with_(store_host=(host if host != "0.0.0.0" else "127.0.0.1",
                                                int(port)),
                                    drop_flushed_pages=cfg.role == Role.SLAVE)
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
        if self.role != Role.SLAVE:
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
        if self.role == Role.SLAVE:
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
                     wall_ms: Callable[[], int] | None = None) -> None:
        """A slave's HA stream to its master and its copy of the master's
        consumer offsets (over gRPC unless given a connector and stub)."""
        cfg = self.config
        assert self.store is not None and cfg.master is not None
        self.ha_slave = HASlave(self.store, name=cfg.name, master_address=cfg.master,
                                token=cfg.token, config=cfg.ha, clock=self.clock,
                                failpoints=self.failpoints, connector=connector)
        self.ha_slave.start()
        self._offset_sync_state = consume_service.OffsetSyncState()
        self._offset_sync = asyncio.get_running_loop().create_task(
            consume_service.sync_from_master(
                self.store, cfg.master, cfg.token, cfg.consumer_offset_sync_interval_ms / 1000,
                self._offset_sync_state, stub=stub, wall_ms=wall_ms))

    async def stop(self) -> None:
        """Clean shutdown: stop accepting, finish in-flight calls, stop HA,
        close the store (flush, checkpoint, remove `abort`)."""
        if self._stopping:
            return
        self._stopping = True
        log.info("node %s shutting down", self.config.name)
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
                       f"({self.config.master})") for m in messages])
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
        if self.ha_master is not None:
            for link in self.ha_master.status():
                msg.slaves.add(**asdict(link))
        if self.ha_slave is not None:
            msg.master.CopyFrom(broker_pb2.MasterLink(**asdict(self.ha_slave.link)))
        return msg

    def _config_dict(self) -> dict[str, Any]:
        cfg = self.config
        d: dict[str, Any] = {"name": cfg.name, "role": cfg.role.value, "listen": cfg.listen,
                             "master": cfg.master, "data_dir": cfg.data_dir,
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
