"""Requests the controller takes and the decisions it returns, as data.

Requests come from brokers (Register, Heartbeat, ElectMaster,
AlterSyncStateSet) or from the controller's own liveness scan (Tick). Each
step returns decisions for the wrapper to carry out: answer the requester,
tell the brokers of a new master or set, log a refusal. Ordering rule (as
raft's Ready): the wrapper persists the new state BEFORE it sends any
decision, so nothing a broker was told is forgotten by a restarted controller.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


# ----------------------------------------------------------------- requests
@dataclass(frozen=True)
class Register:
    """A broker joins the set. A new name gets the next id; a name seen
    before keeps its id (RocketMQ: applyBrokerId with the same check code)."""

    name: str


@dataclass(frozen=True, kw_only=True)
class Heartbeat:
    """A registered broker is alive and reports where it stands."""

    broker_id: int
    epoch: int  # the last epoch in its epoch file
    max_offset: int
    confirmed_offset: int
    priority: int = 0  # election priority: lower is preferred


@dataclass(frozen=True)
class ElectMaster:
    """Elect a master. `requester`: the broker asking (a broker that finds no
    master asks; on a broker set that never had one, the requester becomes the
    first master); None for an operator's request. `preferred`: the broker an
    operator wants elected, if it is a candidate."""

    requester: int | None = None
    preferred: int | None = None


@dataclass(frozen=True, kw_only=True)
class AlterSyncStateSet:
    """The master asks to shrink or expand the SyncStateSet. Fenced: applied
    only from the current master, at the current master epoch and the current
    SyncStateSet epoch (RocketMQ: ReplicasInfoManager.alterSyncStateSet)."""

    master: int
    master_epoch: int
    sync_state_set_epoch: int
    new_set: frozenset[int]


@dataclass(frozen=True)
class Tick:
    """The controller's liveness scan: a master whose heartbeat timed out is
    dead, and an election follows."""


Request = Register | Heartbeat | ElectMaster | AlterSyncStateSet | Tick


# ---------------------------------------------------------------- decisions
class Refusal(enum.StrEnum):
    """Why a request was not applied (RocketMQ's CONTROLLER_* response codes)."""

    NOT_REGISTERED = "not_registered"
    BAD_REQUEST = "bad_request"
    FENCED_MASTER_EPOCH = "fenced_master_epoch"
    FENCED_SYNC_STATE_SET_EPOCH = "fenced_sync_state_set_epoch"
    NOT_MASTER = "not_master"
    INVALID_REPLICAS = "invalid_replicas"
    BROKER_NOT_ALIVE = "broker_not_alive"
    NO_CHANGE = "no_change"


@dataclass(frozen=True)
class Registered:
    name: str
    broker_id: int
    rejoined: bool  # True: the name was registered before and kept its id


@dataclass(frozen=True)
class HeartbeatAccepted:
    broker_id: int


@dataclass(frozen=True)
class MasterDown:
    """The master's heartbeat timed out; an election decision follows."""

    broker_id: int
    last_heartbeat_ms: int


@dataclass(frozen=True, kw_only=True)
class MasterElected:
    """A new master. The SyncStateSet is now just the master. `unclean`: it
    was not in the SyncStateSet (enable_elect_unclean_master), so it may lack
    acknowledged messages."""

    master: int
    master_epoch: int
    sync_state_set_epoch: int
    unclean: bool
    reason: str


@dataclass(frozen=True)
class MasterStillAlive:
    """No election: the current master is alive and was not asked to step
    aside (RocketMQ: CONTROLLER_MASTER_STILL_EXIST)."""

    master: int
    master_epoch: int


@dataclass(frozen=True)
class ElectionFailed:
    """No candidate. If there was a master, it is deposed (master None, the
    master epoch up by one, so its requests are fenced off)."""

    master_epoch: int
    reason: str


@dataclass(frozen=True)
class SyncStateSetChanged:
    members: frozenset[int]
    sync_state_set_epoch: int


@dataclass(frozen=True)
class Refused:
    """The request changed nothing; `reason` names the problem and what the
    requester should do."""

    request: Request
    code: Refusal
    reason: str


Decision = (Registered | HeartbeatAccepted | MasterDown | MasterElected | MasterStillAlive
            | ElectionFailed | SyncStateSetChanged | Refused)
