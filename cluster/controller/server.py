"""The controller process: the Controller gRPC service (servicer.py) with
the cluster token required on every call (cluster/node/auth.py), gRPC
health checking (open, as on nodes) and reflection, and the liveness scan
every `scan_interval_ms` on the event loop's clock. One event loop runs
everything, so requests and scans are applied one at a time, each written
durably before it is answered (core.py).

Start: lock and read the state directory (state_file.py; a refused file
stops the start before anything listens), listen, then report SERVING.
SIGTERM or SIGINT: NOT_SERVING, stop taking calls, finish those in flight,
release the lock. SIGKILL loses nothing that was answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from dataclasses import dataclass, field

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from cluster.controller.core import ControllerCore, ControllerPersistError
from cluster.controller.route_publisher import RoutePublisher
from cluster.controller.servicer import ControllerServicer
from cluster.controller.state_file import ControllerStateFile
from cluster.node.auth import TokenInterceptor
from cluster.node.guards import MalformedRequestInterceptor
from ha.controller.config import ControllerConfig
from proto import controller_pb2, controller_pb2_grpc
from store.config import ConfigError
from store.seams.clock import LoopClock

log = logging.getLogger("dlab.controller")

CONTROLLER_SERVICE = controller_pb2.DESCRIPTOR.services_by_name["Controller"].full_name
# RocketMQ's scanNotActiveBrokerInterval.
DEFAULT_SCAN_INTERVAL_MS = 5_000


@dataclass(frozen=True, kw_only=True)
class ControllerProcessConfig:
    state_dir: str
    token: str
    listen: str = "127.0.0.1:0"
    controller: ControllerConfig = field(default_factory=ControllerConfig)
    # How often the liveness scan runs: a dead master is noticed at most
    # heartbeat_timeout_ms + scan_interval_ms after its last heartbeat.
    scan_interval_ms: int = DEFAULT_SCAN_INTERVAL_MS
    shutdown_grace_s: float = 2.0
    # Publish the route clients follow as DIR/route.json (route_publisher.py).
    publish_route: str | None = None
    # (broker name, HOST:PORT): the address the route names for that broker
    # instead of the one it heartbeats from (route_publisher.py).
    route_addresses: tuple[tuple[str, str], ...] = ()

    def validate(self) -> ControllerProcessConfig:
        if not self.state_dir:
            raise ConfigError("the controller needs --dir, a directory for its state")
        host, sep, port = self.listen.rpartition(":")
        if not sep or not host or not port.isdigit() or int(port) > 65535:
            raise ConfigError(f"--listen {self.listen!r}: expected HOST:PORT, e.g. "
                              "127.0.0.1:9876")
        if not self.token:
            raise ConfigError("the cluster token is empty")
        if self.publish_route is not None and not os.path.isdir(self.publish_route):
            raise ConfigError(f"--publish-route {self.publish_route!r}: not a directory "
                              "(give the cluster's directory)")
        if self.route_addresses and self.publish_route is None:
            raise ConfigError("--route-address says at which address the route names a "
                              "broker: it needs --publish-route DIR")
        names = [name for name, _ in self.route_addresses]
        if len(set(names)) != len(names):
            raise ConfigError(f"--route-address: one address per broker, got {names}")
        for name, addr in self.route_addresses:
            host, sep, port = addr.rpartition(":")
            if not name or not sep or not host or not port.isdigit() or int(port) > 65535:
                raise ConfigError(f"--route-address {name}={addr}: expected NAME=HOST:PORT, "
                                  "e.g. master=127.0.0.1:7001")
        if isinstance(self.scan_interval_ms, bool) or self.scan_interval_ms < 1:
            raise ConfigError(f"--scan-interval-ms {self.scan_interval_ms}: at least 1")
        self.controller.validate()
        return self


class ControllerStartError(RuntimeError):
    """The controller cannot start; the message says why and what to do."""


class ControllerProcess:
    def __init__(self, config: ControllerProcessConfig, *,
                 state_file: ControllerStateFile | None = None) -> None:
        self.config = config.validate()
        self.state_file = state_file or ControllerStateFile(config.state_dir)
        self.server: grpc.aio.Server | None = None
        self.core: ControllerCore | None = None
        self.port = 0
        self._health = health.aio.HealthServicer()
        self._scanner: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Read the state (ControllerStateFileError if refused), then serve."""
        cfg = self.config
        state = self.state_file.open()
        clock = LoopClock(asyncio.get_running_loop())
        self.core = ControllerCore(cfg.controller, self.state_file, state, clock=clock)
        if cfg.publish_route is not None:
            self.core.on_applied = RoutePublisher(
                cfg.publish_route, client_addresses=dict(cfg.route_addresses)).update
        log.info("controller state %s: %d broker(s), master %s, master epoch %d, "
                 "SyncStateSet %s (epoch %d)", self.state_file.path, len(state.members),
                 state.master, state.master_epoch, sorted(state.sync_state_set),
                 state.sync_state_set_epoch)
        self.server = grpc.aio.server(interceptors=[
            TokenInterceptor(cfg.token),
            MalformedRequestInterceptor("proto/controller.proto "
                                        "(cluster/controller/client.py does)")])
        controller_pb2_grpc.add_ControllerServicer_to_server(ControllerServicer(
            self.core, scan_interval_ms=cfg.scan_interval_ms, state_file=self.state_file.path,
            started_ms=self.core.now_ms()), self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self.server)
        reflection.enable_server_reflection(
            [CONTROLLER_SERVICE, health.SERVICE_NAME, reflection.SERVICE_NAME], self.server)
        try:
            self.port = self.server.add_insecure_port(cfg.listen)
        except RuntimeError:
            self.port = 0
        if not self.port:
            raise ControllerStartError(f"cannot listen on {cfg.listen}: the port is in use "
                                       "or the address is not local; choose another --listen")
        await self.server.start()
        self._scanner = asyncio.get_running_loop().create_task(self._scan_forever())
        for svc in ("", CONTROLLER_SERVICE):
            await self._health.set(svc, health_pb2.HealthCheckResponse.SERVING)
        log.info("controller (pid %d) serving on %s:%d: heartbeat timeout %d ms, scan every "
                 "%d ms, unclean election %s", os.getpid(), cfg.listen.rpartition(":")[0],
                 self.port, cfg.controller.heartbeat_timeout_ms, cfg.scan_interval_ms,
                 "allowed" if cfg.controller.enable_elect_unclean_master else "refused")

    async def _scan_forever(self) -> None:
        """The liveness scan on the loop's clock (a late wake-up only
        delays it: the timeout is judged at the scan's own time)."""
        assert self.core is not None
        while True:
            await asyncio.sleep(self.config.scan_interval_ms / 1000)
            # A failed write is logged by the core; the next scan tries again.
            with contextlib.suppress(ControllerPersistError):
                self.core.scan()

    async def stop(self) -> None:
        await self._health.enter_graceful_shutdown()
        if self._scanner is not None:
            self._scanner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._scanner
        if self.server is not None:
            await self.server.stop(self.config.shutdown_grace_s)
        self.state_file.close()
        log.info("controller stopped")


async def serve(config: ControllerProcessConfig) -> int:
    """Run the controller until SIGTERM/SIGINT; returns the exit code."""
    loop = asyncio.get_running_loop()
    process = ControllerProcess(config)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await process.start()
    except BaseException:
        await process.stop()
        raise
    await stop.wait()
    await process.stop()
    return 0
