"""The Controller gRPC service (proto/controller.proto): each method
converts the request, checks what the state machine does not (a broker
name's form, ids and offsets in range, an address's form), calls the core
and answers with the decision. A request the machine refuses is answered
normally with outcome "refused", its code and reason (a broker acts on
them, as on RocketMQ's CONTROLLER_* codes); a malformed one is
INVALID_ARGUMENT naming the field and the rule. A broker name is data:
it never becomes a path (the state lives in one file named by the
operator's --dir)."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

import grpc

from cluster.controller.core import ControllerCore, ControllerPersistError, Outcome
from ha.controller.messages import (
    AlterSyncStateSet,
    ElectionFailed,
    ElectMaster,
    Heartbeat,
    HeartbeatAccepted,
    MasterElected,
    MasterStillAlive,
    Refused,
    Register,
    Registered,
    Request,
    SyncStateSetChanged,
)
from ha.controller.state import ControllerState
from proto import controller_pb2, controller_pb2_grpc
from store.names import name_problem

log = logging.getLogger("dlab.controller")

BROKER_NAME_MAX_LENGTH = 64
ADDRESS_MAX_LENGTH = 255
# Ids, epochs and offsets above this are not ones a broker could hold.
MAX_NUMBER = (1 << 62)
MAX_SET_SIZE = 64
# A broker set holds a handful of replicas; the cap keeps the state file
# (rewritten whole on every change) small however many names are sent.
MAX_BROKERS = 64


class BadRequest(ValueError):
    """A request field breaks its rule; the message names the field and the rule."""


def broker_name(name: str) -> str:
    if problem := name_problem("broker name", name, BROKER_NAME_MAX_LENGTH):
        raise BadRequest(problem)
    return name


def number(value: int, field: str, *, least: int = 0) -> int:
    if not least <= value <= MAX_NUMBER:
        raise BadRequest(f"{field} {value} is out of range: expected {least}..{MAX_NUMBER}")
    return value


def optional_id(value: int, field: str) -> int | None:
    """An optional broker id: 0 is none."""
    return None if number(value, field) == 0 else value


def broker_address(text: str) -> str:
    if not text:
        return ""
    host, sep, port = text.rpartition(":")
    if (len(text) > ADDRESS_MAX_LENGTH or not sep or not host or not port.isdigit()
            or not 0 < int(port) <= 65535 or any(c.isspace() or not c.isprintable()
                                                  for c in text)):
        raise BadRequest(f"address {text[:80]!r}: expected HOST:PORT (at most "
                         f"{ADDRESS_MAX_LENGTH} characters), e.g. 127.0.0.1:7001, or empty")
    return text


def replica_info(core: ControllerCore, state: ControllerState) -> controller_pb2.ReplicaInfo:
    master = state.member(state.master) if state.master is not None else None
    return controller_pb2.ReplicaInfo(
        master_id=state.master or 0, master_name=master.name if master else "",
        master_address=core.addresses.get(state.master, "") if state.master else "",
        master_epoch=state.master_epoch, sync_state_set=sorted(state.sync_state_set),
        sync_state_set_epoch=state.sync_state_set_epoch)


def reply(core: ControllerCore, outcome: Outcome) -> controller_pb2.ControllerReply:
    """The answer to a request: its first decision (a step decides one
    thing per request; a Tick's MasterDown never answers a request)."""
    msg = controller_pb2.ControllerReply(replica_info=replica_info(core, outcome.state))
    if not outcome.decisions:
        msg.outcome = "info"
        return msg
    decision = outcome.decisions[0]
    if isinstance(decision, Registered):
        msg.outcome, msg.broker_id, msg.rejoined = ("registered", decision.broker_id,
                                                    decision.rejoined)
    elif isinstance(decision, HeartbeatAccepted):
        msg.outcome = "heartbeat_accepted"
    elif isinstance(decision, MasterElected):
        msg.outcome, msg.unclean, msg.reason = "master_elected", decision.unclean, decision.reason
    elif isinstance(decision, MasterStillAlive):
        msg.outcome = "master_still_alive"
        msg.reason = f"master {decision.master} is alive and no other broker was preferred"
    elif isinstance(decision, ElectionFailed):
        msg.outcome, msg.reason = "election_failed", decision.reason
    elif isinstance(decision, SyncStateSetChanged):
        msg.outcome = "sync_state_set_changed"
    elif isinstance(decision, Refused):
        msg.outcome, msg.refusal, msg.reason = "refused", decision.code.value, decision.reason
    else:  # pragma: no cover - MasterDown comes only from a Tick, never a request
        raise AssertionError(f"no answer for {decision!r}")
    return msg


class ControllerServicer(controller_pb2_grpc.ControllerServicer):
    def __init__(self, core: ControllerCore, *, scan_interval_ms: int, state_file: str,
                 started_ms: int) -> None:
        self.core = core
        self.scan_interval_ms = scan_interval_ms
        self.state_file = state_file
        self.started_ms = started_ms

    async def _apply(self, build: Callable[[], tuple[Request, str]],
                     context: grpc.aio.ServicerContext) -> controller_pb2.ControllerReply:
        """Build the request and the broker address it carries ("" for none);
        a BadRequest is INVALID_ARGUMENT. Apply it and answer."""
        try:
            request, address = build()
        except BadRequest as exc:
            log.warning("malformed request from %s: %s", context.peer(), exc)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            raise AssertionError("abort returns only by raising") from None
        try:
            return reply(self.core, self.core.handle(request, address=address))
        except ControllerPersistError as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
            raise AssertionError("abort returns only by raising") from None

    async def RegisterBroker(self, request: Any, context: Any) -> Any:  # noqa: N802
        name = request.name
        state = self.core.state
        if len(state.members) >= MAX_BROKERS and state.member_named(name) is None:
            log.warning("refused to register %r from %s: %d brokers already", name[:80],
                        context.peer(), len(state.members))
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"the broker set already has {MAX_BROKERS} brokers, the most "
                                "one controller keeps; register a known name or use another "
                                "controller")
        return await self._apply(lambda: (Register(broker_name(name)), ""), context)

    async def Heartbeat(self, request: Any, context: Any) -> Any:  # noqa: N802
        def build() -> tuple[Request, str]:
            return (Heartbeat(broker_id=number(request.broker_id, "broker_id", least=1),
                              epoch=number(request.epoch, "epoch"),
                              max_offset=number(request.max_offset, "max_offset"),
                              confirmed_offset=number(request.confirmed_offset,
                                                      "confirmed_offset"),
                              priority=number(request.priority, "priority")),
                    broker_address(request.address))
        return await self._apply(build, context)

    async def ElectMaster(self, request: Any, context: Any) -> Any:  # noqa: N802
        return await self._apply(lambda: (ElectMaster(
            requester=optional_id(request.requester, "requester"),
            preferred=optional_id(request.preferred, "preferred")), ""), context)

    async def GetReplicaInfo(self, request: Any, context: Any) -> Any:  # noqa: N802
        return controller_pb2.ControllerReply(
            outcome="info", replica_info=replica_info(self.core, self.core.state))

    async def AlterSyncStateSet(self, request: Any, context: Any) -> Any:  # noqa: N802
        def build() -> tuple[Request, str]:
            members = list(request.new_sync_state_set)
            if not 0 < len(members) <= MAX_SET_SIZE:
                raise BadRequest(f"new_sync_state_set has {len(members)} ids: expected "
                                 f"1..{MAX_SET_SIZE}, the master among them")
            return AlterSyncStateSet(
                master=number(request.master, "master", least=1),
                master_epoch=number(request.master_epoch, "master_epoch"),
                sync_state_set_epoch=number(request.sync_state_set_epoch,
                                            "sync_state_set_epoch"),
                new_set=frozenset(number(b, "new_sync_state_set id", least=1)
                                  for b in members)), ""
        return await self._apply(build, context)

    async def GetMetadata(self, request: Any, context: Any) -> Any:  # noqa: N802
        core = self.core
        now = core.now_ms()
        timeout = core.config.heartbeat_timeout_ms
        msg = controller_pb2.Metadata(
            replica_info=replica_info(core, core.state), heartbeat_timeout_ms=timeout,
            scan_interval_ms=self.scan_interval_ms,
            elect_unclean_master=core.config.enable_elect_unclean_master,
            state_file=self.state_file, pid=os.getpid(), uptime_ms=now - self.started_ms)
        for m in core.state.members:
            info = msg.members.add(broker_id=m.broker_id, name=m.name,
                                   address=core.addresses.get(m.broker_id, ""),
                                   heard=m.live is not None, alive=m.alive(now, timeout))
            if m.live is not None:
                info.last_heartbeat_age_ms = now - m.live.at_ms
                info.epoch, info.max_offset = m.live.epoch, m.live.max_offset
                info.confirmed_offset, info.priority = m.live.confirmed_offset, m.live.priority
        return msg
