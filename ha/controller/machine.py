"""The controller's state machine: `step(state, request, now_ms=, config=)`.

One request in, the new state and the decisions out; time is an argument,
nothing here reads a clock, a file or a socket (docs/design.md, "Controller
(state machine)"). The rules, each after RocketMQ 5's ReplicasInfoManager,
DefaultElectPolicy and its heartbeat manager:

- Register: a new name gets the next id; a known name keeps its id. A
  registration is not a heartbeat: the broker is alive once it heartbeats.
- Heartbeat: a registered broker's (epoch, max offset, confirmed offset,
  priority) and the time. An epoch above the controller's master epoch is
  refused: no controller handed it out.
- Liveness: a broker whose last heartbeat is older than
  `heartbeat_timeout_ms` is not alive. Tick: a master not alive is down and
  an election follows, without it.
- Election (elect.py): from the live SyncStateSet, else (unclean only) any
  live replica. A new master: SyncStateSet = {master}, master epoch + 1,
  SyncStateSet epoch + 1. A live master asked to stay (no other broker
  preferred) stays, unless the master itself asks: a restarted master is
  elected again in a new epoch, its SyncStateSet kept (RocketMQ's
  controller changes nothing then, and its broker resumes with that set).
  No candidate after the scan found the master down: it is deposed
  (master None, master epoch + 1) and the SyncStateSet is kept, so a
  member that comes back can be elected; no candidate for a broker's or an
  operator's request changes nothing. The first election of a broker set
  elects the requester.
- AlterSyncStateSet, fenced, checked in this order: the master epoch (an
  older one is stale, refused), the requester is the master, the
  SyncStateSet epoch, then the new set: registered members only, all alive,
  the master in it, different from the current set. Applied: the set epoch
  + 1.
A refused request changes nothing.
"""

from __future__ import annotations

from dataclasses import replace

from ha.controller.config import ControllerConfig
from ha.controller.elect import elect
from ha.controller.messages import (
    AlterSyncStateSet,
    Decision,
    ElectionFailed,
    ElectMaster,
    Heartbeat,
    HeartbeatAccepted,
    MasterDown,
    MasterElected,
    MasterStillAlive,
    Refusal,
    Refused,
    Register,
    Registered,
    Request,
    SyncStateSetChanged,
    Tick,
)
from ha.controller.state import ControllerState, LiveInfo, Member, problems, transition_problems

Step = tuple[ControllerState, tuple[Decision, ...]]


def step(state: ControllerState, request: Request, *, now_ms: int,
         config: ControllerConfig) -> Step:
    """Apply one request at controller time `now_ms`."""
    if isinstance(request, Register):
        new, decisions = _register(state, request)
    elif isinstance(request, Heartbeat):
        new, decisions = _heartbeat(state, request, now_ms)
    elif isinstance(request, ElectMaster):
        new, decisions = _elect_master(state, request, now_ms, config)
    elif isinstance(request, AlterSyncStateSet):
        new, decisions = _alter_sync_state_set(state, request, now_ms, config)
    elif isinstance(request, Tick):
        new, decisions = _tick(state, now_ms, config)
    else:  # pragma: no cover - the Request union is closed
        raise TypeError(f"not a controller request: {request!r}")
    broken = problems(new) + transition_problems(state, new)
    assert not broken, f"controller step {request!r} broke: {'; '.join(broken)}"
    return new, decisions


def _refuse(state: ControllerState, request: Request, code: Refusal, reason: str) -> Step:
    return state, (Refused(request, code, reason),)


def _register(state: ControllerState, request: Register) -> Step:
    if not request.name:
        return _refuse(state, request, Refusal.BAD_REQUEST,
                       "a broker registers with a non-empty name")
    known = state.member_named(request.name)
    if known is not None:
        return state, (Registered(known.name, known.broker_id, rejoined=True),)
    member = Member(request.name, state.next_id)
    return state.with_member(member), (Registered(member.name, member.broker_id, False),)


def _heartbeat(state: ControllerState, request: Heartbeat, now_ms: int) -> Step:
    member = state.member(request.broker_id)
    if member is None:
        return _refuse(state, request, Refusal.NOT_REGISTERED,
                       f"broker {request.broker_id} is not registered: register first")
    if min(request.epoch, request.max_offset, request.confirmed_offset) < 0:
        return _refuse(state, request, Refusal.BAD_REQUEST,
                       f"broker {request.broker_id} reported epoch {request.epoch}, "
                       f"max offset {request.max_offset}, confirmed offset "
                       f"{request.confirmed_offset}: none may be negative")
    if request.epoch > state.master_epoch:
        return _refuse(state, request, Refusal.BAD_REQUEST,
                       f"broker {request.broker_id} reports epoch {request.epoch}, above "
                       f"the controller's master epoch {state.master_epoch}: the "
                       "controller's state is behind the broker's; restore it")
    live = LiveInfo(request.epoch, request.max_offset, request.confirmed_offset,
                    request.priority, now_ms)
    return state.with_member(replace(member, live=live)), (HeartbeatAccepted(member.broker_id),)


def _alive(state: ControllerState, now_ms: int, config: ControllerConfig) -> dict[int, LiveInfo]:
    return {m.broker_id: m.live for m in state.members
            if m.live is not None and m.alive(now_ms, config.heartbeat_timeout_ms)}


def _elect_master(state: ControllerState, request: ElectMaster, now_ms: int,
                  config: ControllerConfig) -> Step:
    for named in (request.requester, request.preferred):
        if named is not None and state.member(named) is None:
            return _refuse(state, request, Refusal.NOT_REGISTERED,
                           f"broker {named} is not registered: register it first")
    alive = _alive(state, now_ms, config)
    if state.master_epoch == 0:
        return _first_election(state, request, alive)
    if (request.requester is not None and request.requester == state.master
            and state.master in alive and request.preferred in (None, state.master)):
        # The master itself asks: a new process of it (a restart quicker
        # than the heartbeat timeout, or a controller restarted with it).
        # It serves a new epoch, so that a replica that holds what its old
        # process wrote and it lost cuts back to what both hold
        # (ha/autoswitch/epochs.py: only a new epoch at every return of a
        # master keeps the rejoin rule sound). Its SyncStateSet stays: in
        # RocketMQ the controller finds its master alive and changes
        # nothing, and the restarted broker takes the role with the set the
        # controller holds (ReplicasManager.changeToMaster); the members
        # still hold everything acknowledged, and what the master holds
        # past their acks stays unconfirmed until they have it
        # (ha/autoswitch/confirm.py; apache/rocketmq#7689 is about that tail).
        new = replace(state, master_epoch=state.master_epoch + 1)
        return new, (MasterElected(master=state.master, master_epoch=new.master_epoch,
                                   sync_state_set_epoch=new.sync_state_set_epoch,
                                   unclean=False,
                                   reason="the master asked again: a restarted master serves "
                                          "a new epoch with its SyncStateSet"),)
    if state.master is not None and state.master in alive and request.preferred in (
            None, state.master):
        return state, (MasterStillAlive(state.master, state.master_epoch),)
    # A broker's or an operator's election that finds no candidate deposes
    # nobody: a live master stays, and a dead one is the liveness scan's to
    # depose (RocketMQ applies the failed-election event only then).
    return _elect(state, alive, request.preferred, config, depose=False)


def _first_election(state: ControllerState, request: ElectMaster,
                    alive: dict[int, LiveInfo]) -> Step:
    """A broker set that never had a master elects the broker that asks
    (RocketMQ: isFirstTimeForElect), if it is alive."""
    first = request.requester
    if first is None or first not in alive:
        return state, (ElectionFailed(state.master_epoch,
                                      "no master was ever elected: the first election "
                                      "needs a live registered broker to ask for it"),)
    return _install(state, first, unclean=False,
                    reason="the first master of the broker set: the broker that asked")


def _elect(state: ControllerState, alive: dict[int, LiveInfo], preferred: int | None,
           config: ControllerConfig, *, depose: bool) -> Step:
    choice = elect(
        sync_state_set=state.sync_state_set,
        all_replicas=frozenset(m.broker_id for m in state.members),
        alive=alive, old_master=state.master, preferred=preferred,
        unclean_allowed=config.enable_elect_unclean_master)
    if choice is not None:
        return _install(state, choice.winner, unclean=choice.unclean, reason=choice.reason)
    reason = (f"no live member of the SyncStateSet {sorted(state.sync_state_set)}"
              + (f" is broker {preferred}" if preferred is not None else "")
              + ("" if config.enable_elect_unclean_master else
                 "; enable_elect_unclean_master would allow any live replica "
                 "(may lose messages)"))
    if state.master is None or not depose:
        return state, (ElectionFailed(state.master_epoch, reason),)
    deposed = replace(state, master=None, master_epoch=state.master_epoch + 1)
    return deposed, (ElectionFailed(deposed.master_epoch, reason),)


def _install(state: ControllerState, master: int, *, unclean: bool, reason: str) -> Step:
    new = replace(state, master=master, master_epoch=state.master_epoch + 1,
                  sync_state_set=frozenset({master}),
                  sync_state_set_epoch=state.sync_state_set_epoch + 1)
    return new, (MasterElected(master=master, master_epoch=new.master_epoch,
                               sync_state_set_epoch=new.sync_state_set_epoch,
                               unclean=unclean, reason=reason),)


def _tick(state: ControllerState, now_ms: int, config: ControllerConfig) -> Step:
    """A master whose recorded heartbeat timed out is down: elect without it.
    A master not heard from by this process (a restarted controller) is not
    judged until it heartbeats once."""
    master = state.member(state.master) if state.master is not None else None
    if master is None or master.live is None or master.alive(now_ms,
                                                             config.heartbeat_timeout_ms):
        return state, ()
    down = MasterDown(master.broker_id, master.live.at_ms)
    new, decisions = _elect(state, _alive(state, now_ms, config), None, config,
                            depose=True)
    return new, (down, *decisions)


def _alter_sync_state_set(state: ControllerState, request: AlterSyncStateSet, now_ms: int,
                          config: ControllerConfig) -> Step:
    fence = _fence(state, request)
    if fence is not None:
        return _refuse(state, request, *fence)
    new_set = frozenset(request.new_set)
    unknown = sorted(b for b in new_set if state.member(b) is None)
    if unknown:
        return _refuse(state, request, Refusal.INVALID_REPLICAS,
                       f"the new SyncStateSet names unregistered brokers {unknown}")
    dead = sorted(new_set - state.alive_ids(now_ms, config.heartbeat_timeout_ms))
    if dead:
        return _refuse(state, request, Refusal.BROKER_NOT_ALIVE,
                       f"the new SyncStateSet names brokers that are not alive {dead}: "
                       "leave them out")
    if request.master not in new_set:
        return _refuse(state, request, Refusal.INVALID_REPLICAS,
                       f"the new SyncStateSet {sorted(new_set)} leaves out the master "
                       f"{request.master}")
    if new_set == state.sync_state_set:
        return _refuse(state, request, Refusal.NO_CHANGE,
                       f"the SyncStateSet is already {sorted(new_set)}")
    new = replace(state, sync_state_set=new_set,
                  sync_state_set_epoch=state.sync_state_set_epoch + 1)
    return new, (SyncStateSetChanged(new_set, new.sync_state_set_epoch),)


def _fence(state: ControllerState, request: AlterSyncStateSet) -> tuple[Refusal, str] | None:
    """Why the request is fenced off, or None: the master epoch first (so a
    deposed master learns it is stale), then who sent it, then the set epoch."""
    if request.master_epoch != state.master_epoch:
        stale = "stale" if request.master_epoch < state.master_epoch else "unknown"
        return (Refusal.FENCED_MASTER_EPOCH,
                f"master epoch {request.master_epoch} is {stale}: the current master "
                f"epoch is {state.master_epoch} (master {state.master}); fetch the "
                "current master before asking again")
    if state.master != request.master:
        return (Refusal.NOT_MASTER,
                f"broker {request.master} is not the master (the master is "
                f"{state.master}): only the master changes the SyncStateSet")
    if request.sync_state_set_epoch != state.sync_state_set_epoch:
        return (Refusal.FENCED_SYNC_STATE_SET_EPOCH,
                f"SyncStateSet epoch {request.sync_state_set_epoch} is not the current "
                f"{state.sync_state_set_epoch}: fetch the current set and ask again")
    return None
