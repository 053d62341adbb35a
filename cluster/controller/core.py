"""The controller's state machine run on a clock and a state file: what a
controller process (server.py) or an in-process twin does with one request.

`handle(request)`: step the machine at the clock's time (ha/controller/
machine.py); if what is persisted changed, write it durably (state_file.py)
BEFORE adopting it, so no decision leaves that a restarted controller would
not remember (the ordering rule of ha/controller/messages.py). A write that
fails leaves the old state in memory and raises ControllerPersistError: the
request is answered as failed, nothing it decided was announced.
`scan()` is the liveness scan: a Tick at the clock's time, so heartbeat
timeouts are measured by this process's clock through the state machine.

Held beside the machine's state, not persisted: each broker's address from
its last heartbeat (it means something only while the broker runs there,
as its liveness does). No gRPC, no threads: one caller at a time (the
server's event loop).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from cluster.controller.state_file import ControllerStateFile
from ha.controller.config import ControllerConfig
from ha.controller.machine import step
from ha.controller.messages import (
    Decision,
    ElectionFailed,
    Heartbeat,
    HeartbeatAccepted,
    MasterDown,
    MasterElected,
    Refused,
    Request,
    SyncStateSetChanged,
    Tick,
)
from ha.controller.persist import to_json
from ha.controller.state import ControllerState
from store.seams.clock import Clock

log = logging.getLogger("dlab.controller")


class ControllerPersistError(RuntimeError):
    """The new state could not be written durably; it was not adopted."""


@dataclass(frozen=True)
class Outcome:
    """A request's decisions and the state after it."""

    decisions: tuple[Decision, ...]
    state: ControllerState


class ControllerCore:
    def __init__(self, config: ControllerConfig, state_file: ControllerStateFile,
                 state: ControllerState, *, clock: Clock) -> None:
        self.config = config.validate()
        self.state_file = state_file
        self.state = state
        self.clock = clock
        self.addresses: dict[int, str] = {}
        self._persisted = to_json(state)
        # Told the state and the addresses after every request applied (the
        # state durable by then): the route publisher (route_publisher.py).
        self.on_applied: Callable[[ControllerState, dict[int, str]], None] | None = None

    def now_ms(self) -> int:
        return int(self.clock.monotonic() * 1000)

    def handle(self, request: Request, *, address: str = "") -> Outcome:
        """Apply one request (module docstring). `address`: a heartbeat's
        broker address, kept if the heartbeat is accepted."""
        new, decisions = step(self.state, request, now_ms=self.now_ms(), config=self.config)
        text = to_json(new)
        if text != self._persisted:
            try:
                self.state_file.save(new)
            except OSError as exc:
                log.error("cannot write %s: %s; the request is refused and the state "
                          "stays as it was", self.state_file.path, exc)
                raise ControllerPersistError(
                    f"the controller cannot write its state file ({exc.strerror or exc}); "
                    "nothing was changed: retry, and see the controller's log") from None
            self._persisted = text
        self.state = new
        if isinstance(request, Heartbeat) and address and any(
                isinstance(d, HeartbeatAccepted) for d in decisions):
            self.addresses[request.broker_id] = address
        for decision in decisions:
            _log_decision(decision)
        if self.on_applied is not None:
            self.on_applied(new, self.addresses)
        return Outcome(decisions, new)

    def scan(self) -> Outcome:
        return self.handle(Tick())


def _log_decision(decision: Decision) -> None:
    if isinstance(decision, MasterDown):
        log.warning("master %d is down: no heartbeat since controller time %d ms",
                    decision.broker_id, decision.last_heartbeat_ms)
    elif isinstance(decision, MasterElected):
        log.warning("elected master %d at master epoch %d%s: %s", decision.master,
                    decision.master_epoch, " (UNCLEAN)" if decision.unclean else "",
                    decision.reason)
    elif isinstance(decision, ElectionFailed):
        log.warning("no master elected (master epoch %d): %s", decision.master_epoch,
                    decision.reason)
    elif isinstance(decision, SyncStateSetChanged):
        log.info("SyncStateSet is now %s (epoch %d)", sorted(decision.members),
                 decision.sync_state_set_epoch)
    elif isinstance(decision, Refused):
        # A broker heartbeats every second or so: its refusals at DEBUG.
        level = logging.DEBUG if isinstance(decision.request, Heartbeat) else logging.INFO
        log.log(level, "refused %s: %s", type(decision.request).__name__, decision.reason)
