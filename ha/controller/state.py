"""The controller's state for one broker set, and its invariants.

What is held (RocketMQ's ReplicasInfoManager: BrokerReplicaInfo and
SyncStateInfo):
    members            every broker that registered: name -> id, for good
    master             the master's id, or None (none elected, or it died
                       and no successor could be elected)
    master_epoch       goes up by one on every change of master, including
                       to None; the fencing token of every master request
    sync_state_set     the replicas that hold everything acknowledged
    sync_state_set_epoch  goes up by one on every change of the set
What is not persisted: each member's last heartbeat. It is measured on the
controller process's clock, so it means nothing to another process; RocketMQ
keeps it outside the replicated state too (its heartbeat manager).

Invariants (`problems` lists the ones broken; `machine.step` asserts none):
    ids and names unique, names not empty; next_id > every id; ids >= 1
    master is None or master in sync_state_set
    sync_state_set is a subset of the members
    master_epoch == 0  =>  no master and an empty sync_state_set (never elected)
    master_epoch > 0   =>  sync_state_set not empty
Across a step (`transition_problems`):
    epochs never decrease; a member keeps its id and name;
    master changed => master_epoch went up by exactly one;
    sync_state_set changed => sync_state_set_epoch went up by exactly one.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

# RocketMQ 5 controller mode hands out broker ids from 1 (MixAll.FIRST_SLAVE_ID);
# 0 was the classic master's fixed id.
FIRST_BROKER_ID = 1


@dataclass(frozen=True)
class LiveInfo:
    """What a broker last reported in a heartbeat, and when."""

    epoch: int  # the last epoch in the broker's epoch file
    max_offset: int
    confirmed_offset: int
    priority: int  # election priority: lower is preferred
    at_ms: int  # controller time the heartbeat arrived


@dataclass(frozen=True)
class Member:
    name: str
    broker_id: int
    live: LiveInfo | None = None  # None: not heard from by this process

    def alive(self, now_ms: int, timeout_ms: int) -> bool:
        """Alive unless its last heartbeat is older than the timeout."""
        return self.live is not None and now_ms - self.live.at_ms <= timeout_ms


@dataclass(frozen=True)
class ControllerState:
    members: tuple[Member, ...] = ()  # sorted by broker id
    next_id: int = FIRST_BROKER_ID
    master: int | None = None
    master_epoch: int = 0
    sync_state_set: frozenset[int] = frozenset()
    sync_state_set_epoch: int = 0

    def member(self, broker_id: int) -> Member | None:
        for m in self.members:
            if m.broker_id == broker_id:
                return m
        return None

    def member_named(self, name: str) -> Member | None:
        for m in self.members:
            if m.name == name:
                return m
        return None

    def alive_ids(self, now_ms: int, timeout_ms: int) -> frozenset[int]:
        return frozenset(m.broker_id for m in self.members if m.alive(now_ms, timeout_ms))

    def with_member(self, member: Member) -> ControllerState:
        """The state with `member` added or replaced (by id)."""
        others = tuple(m for m in self.members if m.broker_id != member.broker_id)
        members = tuple(sorted((*others, member), key=lambda m: m.broker_id))
        return replace(self, members=members,
                       next_id=max(self.next_id, member.broker_id + 1))


def problems(state: ControllerState) -> list[str]:
    """Every invariant `state` breaks, in words (empty: none)."""
    out: list[str] = []
    ids = [m.broker_id for m in state.members]
    names = [m.name for m in state.members]
    if len(set(ids)) != len(ids):
        out.append(f"broker ids repeat: {sorted(ids)}")
    if len(set(names)) != len(names):
        out.append(f"broker names repeat: {sorted(names)}")
    if any(i < FIRST_BROKER_ID for i in ids):
        out.append(f"broker ids start at {FIRST_BROKER_ID}: {sorted(ids)}")
    if any(not n for n in names):
        out.append("a broker name is empty")
    if state.next_id < FIRST_BROKER_ID:
        out.append(f"next id {state.next_id} is below the first id {FIRST_BROKER_ID}")
    if ids and state.next_id <= max(ids):
        out.append(f"next id {state.next_id} is not above every id {sorted(ids)}")
    if state.master_epoch < 0 or state.sync_state_set_epoch < 0:
        out.append("epochs are never negative")
    if state.master is not None and state.master not in state.sync_state_set:
        out.append(f"master {state.master} is not in the SyncStateSet "
                   f"{sorted(state.sync_state_set)}")
    unknown = state.sync_state_set - set(ids)
    if unknown:
        out.append(f"SyncStateSet names unregistered brokers {sorted(unknown)}")
    if state.master_epoch == 0 and (state.master is not None or state.sync_state_set):
        out.append("master epoch 0 (never elected) with a master or a SyncStateSet")
    if state.master_epoch > 0 and not state.sync_state_set:
        out.append(f"master epoch {state.master_epoch} with an empty SyncStateSet")
    return out


def transition_problems(old: ControllerState, new: ControllerState) -> list[str]:
    """Every rule the step old -> new breaks, in words (empty: none)."""
    out: list[str] = []
    if new.master_epoch < old.master_epoch:
        out.append(f"master epoch went down: {old.master_epoch} -> {new.master_epoch}")
    if new.sync_state_set_epoch < old.sync_state_set_epoch:
        out.append(f"SyncStateSet epoch went down: {old.sync_state_set_epoch} -> "
                   f"{new.sync_state_set_epoch}")
    for m in old.members:
        kept = new.member(m.broker_id)
        if kept is None or kept.name != m.name:
            out.append(f"member {m.name} (id {m.broker_id}) lost its identity")
    if new.master != old.master and new.master_epoch != old.master_epoch + 1:
        out.append(f"master changed {old.master} -> {new.master} without the master "
                   f"epoch going up by one ({old.master_epoch} -> {new.master_epoch})")
    if (new.sync_state_set != old.sync_state_set
            and new.sync_state_set_epoch != old.sync_state_set_epoch + 1):
        out.append("SyncStateSet changed without its epoch going up by one")
    return out
