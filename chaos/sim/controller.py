"""The controller of a simulated controller-mode cluster: the real
controller (cluster/controller/: its core, state file and gRPC servicer)
served on the sim's MemoryNetwork at CONTROLLER_ADDRESS, its state file on
its own MemoryDisk, its liveness scan on simulated time. It is a process
of its own (OWNER "controller"): a kill cancels its tasks and cuts its
calls, its disk keeps what was durable, a start reads it back.

One controller, as RocketMQ's single-node controller deployment; its own
Raft group is not modelled (docs/design.md, "Controller mode")."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import weakref
from typing import Any

# The controller's name as one end of a partition, the backends' own.
from cluster.backends.interface import CONTROLLER_NAME
from cluster.controller.core import ControllerCore, ControllerPersistError
from cluster.controller.servicer import ControllerServicer
from cluster.controller.state_file import ControllerStateFile
from ha.controller.config import ControllerConfig
from store.sim.memory_disk import MemoryDisk

CONTROLLER_ADDRESS = "10.0.0.100:9876"
STATE_DIR = "/controller"
# RocketMQ's scanNotActiveBrokerInterval is 5 s; the sim's runs are
# seconds long, so it scans every second unless told (a chaos run gives
# every backend's RUN_CONTROLLER timings).
SCAN_INTERVAL_MS = 1_000


class SimController:
    def __init__(self, loop: asyncio.AbstractEventLoop, network: Any, clock: Any,
                 disk: MemoryDisk, config: ControllerConfig, *, token: str,
                 owner: contextvars.ContextVar[str | None],
                 scan_interval_ms: int = SCAN_INTERVAL_MS) -> None:
        self.scan_interval_ms = scan_interval_ms
        self.loop = loop
        self.network = network
        self.clock = clock
        self.disk = disk
        self.config = config
        self.token = token
        self.owner = owner
        self.core: ControllerCore | None = None
        self._state_file: ControllerStateFile | None = None
        self._tasks: weakref.WeakSet[asyncio.Task[Any]] = weakref.WeakSet()
        # When the master it holds last changed, on the cluster's wall
        # clock (the local controller's route.json `since_ms`): a run dates
        # the promotion it follows from here, not from when it looked.
        self.master_since_ms = 0
        self._master_seen: str | None = None

    @property
    def running(self) -> bool:
        return self.core is not None

    def start(self) -> None:
        """Read the state from its disk and serve (a restart after a kill
        reads what was durable)."""
        assert self.core is None
        self._state_file = ControllerStateFile(STATE_DIR, disk=self.disk)
        state = self._state_file.open()
        self.core = ControllerCore(self.config, self._state_file, state, clock=self.clock)
        self.core.on_applied = self._applied
        servicer = ControllerServicer(self.core, scan_interval_ms=self.scan_interval_ms,
                                      state_file=self._state_file.path,
                                      started_ms=self.core.now_ms())
        ctx = contextvars.copy_context()
        ctx.run(self.owner.set, CONTROLLER_NAME)
        ctx.run(self.network.serve_calls, CONTROLLER_ADDRESS, servicer, token=self.token)
        self._tasks.add(self.loop.create_task(self._scan_forever(), context=ctx))

    def _applied(self, state: Any, addresses: Any) -> None:
        """After every request the core applied: note a master change."""
        name = self.master_name()
        if name is not None and name != self._master_seen:
            self._master_seen = name
            self.master_since_ms = self.clock.wall_ms()

    async def _scan_forever(self) -> None:
        while True:
            await asyncio.sleep(self.scan_interval_ms / 1000)
            assert self.core is not None
            with contextlib.suppress(ControllerPersistError):
                self.core.scan()

    def kill(self) -> None:
        """Its process is gone: calls under way fail, the scan stops, its
        disk keeps what was durable (the state file is written durably
        before every answer)."""
        if self.core is None:
            return
        self.network.unserve_calls(CONTROLLER_ADDRESS)
        for task in list(self._tasks):
            task.cancel()
        self.core = None
        self.disk = self.disk.crash()
        self._state_file = None

    def master_name(self) -> str | None:
        """The master the controller holds now (what the route follows)."""
        if self.core is None:
            return None
        state = self.core.state
        member = state.member(state.master) if state.master is not None else None
        return member.name if member is not None else None

    def sync_state_set(self) -> set[str]:
        """The SyncStateSet the controller holds now, by name."""
        if self.core is None:
            return set()
        state = self.core.state
        return {m.name for m in state.members if m.broker_id in state.sync_state_set}
