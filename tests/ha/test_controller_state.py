"""The controller's state machine (ha/controller/), sans IO: requests and
times in, state and decisions out. Each rule test cites its rule: the
reference README's "5.x controller mode" facts and RocketMQ's
DefaultElectPolicy / ReplicasInfoManager, as docs/design.md, "Controller
(state machine)", restates them."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ha.controller.config import ControllerConfig
from ha.controller.machine import step
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
from ha.controller.persist import ControllerStateError, from_json, to_json
from ha.controller.state import ControllerState, problems, transition_problems
from ha.controller.sync_set import ReplicaProgress, next_sync_state_set
from store.config import ConfigError

TIMEOUT = 1_000
CFG = ControllerConfig(heartbeat_timeout_ms=TIMEOUT)
UNCLEAN = ControllerConfig(heartbeat_timeout_ms=TIMEOUT, enable_elect_unclean_master=True)


class Cluster:
    """A controller state driven by hand: each call is one step."""

    def __init__(self, config: ControllerConfig = CFG) -> None:
        self.state = ControllerState()
        self.config = config
        self.now = 0

    def do(self, request: Request, *, at: int | None = None) -> tuple[Decision, ...]:
        if at is not None:
            self.now = at
        self.state, decisions = step(self.state, request, now_ms=self.now, config=self.config)
        return decisions

    def beat(self, broker: int, *, epoch: int | None = None, offset: int = 0,
             priority: int = 0) -> None:
        e = self.state.master_epoch if epoch is None else epoch
        assert self.do(Heartbeat(broker_id=broker, epoch=e, max_offset=offset,
                                 confirmed_offset=0, priority=priority)) == (
            HeartbeatAccepted(broker),)

    def alter(self, new_set: set[int], *, master: int | None = None,
              master_epoch: int | None = None, set_epoch: int | None = None) -> Decision:
        s = self.state
        req = AlterSyncStateSet(
            master=s.master if master is None else master,  # type: ignore[arg-type]
            master_epoch=s.master_epoch if master_epoch is None else master_epoch,
            sync_state_set_epoch=s.sync_state_set_epoch if set_epoch is None else set_epoch,
            new_set=frozenset(new_set))
        (decision,) = self.do(req)
        return decision


def three_in_sync(config: ControllerConfig = CFG) -> Cluster:
    """Brokers 1, 2, 3 registered and alive; 1 the first master; set {1, 2, 3}."""
    c = Cluster(config)
    for name in ("n1", "n2", "n3"):
        c.do(Register(name))
    for b in (1, 2, 3):
        c.beat(b)
    (elected,) = c.do(ElectMaster(requester=1))
    assert isinstance(elected, MasterElected) and elected.master == 1
    assert isinstance(c.alter({1, 2, 3}), SyncStateSetChanged)
    return c


def kill_master_and_beat(c: Cluster, survivors: dict[int, tuple[int, int, int]]) -> None:
    """Let time pass the timeout while only `survivors` heartbeat
    (broker -> (epoch, max offset, priority)), then run the liveness scan."""
    c.now += TIMEOUT // 2
    for b, (epoch, offset, prio) in survivors.items():
        c.beat(b, epoch=epoch, offset=offset, priority=prio)
    c.now += TIMEOUT // 2 + 1


# ------------------------------------------------------------------ register
def test_register_gives_a_new_broker_the_next_id_and_a_rejoining_one_its_own() -> None:
    """Register: a new broker gets an id (RocketMQ hands them out from 1); a
    broker rejoining keeps its identity (ReplicasInfoManager.applyBrokerId)."""
    c = Cluster()
    assert c.do(Register("n1")) == (Registered("n1", 1, rejoined=False),)
    assert c.do(Register("n2")) == (Registered("n2", 2, rejoined=False),)
    before = c.state
    assert c.do(Register("n1")) == (Registered("n1", 1, rejoined=True),)
    assert c.state == before
    assert c.do(Register("n3")) == (Registered("n3", 3, rejoined=False),)


def test_a_master_that_rejoins_keeps_its_id_but_not_the_mastership() -> None:
    """Register: a broker rejoining keeps its identity; the master role went to
    the election that followed its death, and rejoining does not undo it."""
    c = three_in_sync()
    kill_master_and_beat(c, {2: (1, 100, 0), 3: (1, 50, 0)})
    c.do(Tick())
    assert c.state.master == 2
    assert c.do(Register("n1")) == (Registered("n1", 1, rejoined=True),)
    c.beat(1)
    assert c.state.master == 2 and c.state.sync_state_set == {2}


def test_register_refuses_an_empty_name() -> None:
    (refused,) = Cluster().do(Register(""))
    assert isinstance(refused, Refused) and refused.code is Refusal.BAD_REQUEST
    assert "non-empty name" in refused.reason


# ----------------------------------------------------------------- heartbeats
def test_a_heartbeat_older_than_the_timeout_means_not_alive() -> None:
    """Heartbeats: a broker whose last heartbeat is older than the timeout is
    not alive (RocketMQ's controller heartbeat manager, default 10 s)."""
    c = Cluster()
    c.do(Register("n1"))
    c.beat(1)
    member = c.state.member(1)
    assert member is not None
    assert member.alive(TIMEOUT, TIMEOUT)  # exactly the timeout old: still alive
    assert not member.alive(TIMEOUT + 1, TIMEOUT)
    assert c.state.alive_ids(TIMEOUT + 1, TIMEOUT) == frozenset()


def test_a_heartbeat_from_an_unregistered_broker_is_refused() -> None:
    """Heartbeats: brokers register, then heartbeat."""
    c = Cluster()
    (refused,) = c.do(Heartbeat(broker_id=7, epoch=0, max_offset=0, confirmed_offset=0))
    assert isinstance(refused, Refused) and refused.code is Refusal.NOT_REGISTERED
    assert "register first" in refused.reason and c.state == ControllerState()


def test_a_heartbeat_with_an_epoch_no_controller_handed_out_is_refused() -> None:
    """Heartbeats: epochs come from the controller; a broker ahead of it means
    the controller's state is behind (restored from an old copy)."""
    c = three_in_sync()
    before = c.state
    (refused,) = c.do(Heartbeat(broker_id=2, epoch=5, max_offset=0, confirmed_offset=0))
    assert isinstance(refused, Refused) and "restore" in refused.reason
    assert c.state == before


def test_the_masters_death_by_timeout_triggers_an_election() -> None:
    """Heartbeats: the master's death (timeout) triggers an election; the new
    SyncStateSet is just the new master, the master epoch goes up by one."""
    c = three_in_sync()
    epoch, set_epoch = c.state.master_epoch, c.state.sync_state_set_epoch
    assert c.do(Tick(), at=TIMEOUT) == ()  # every heartbeat still fresh
    kill_master_and_beat(c, {2: (1, 100, 0), 3: (1, 100, 0)})
    down, elected = c.do(Tick())
    assert down == MasterDown(1, 0)
    assert isinstance(elected, MasterElected) and elected.master == 2 and not elected.unclean
    assert c.state.master == 2 and c.state.sync_state_set == {2}
    assert c.state.master_epoch == epoch + 1 == elected.master_epoch
    assert c.state.sync_state_set_epoch == set_epoch + 1


def test_a_restored_controller_judges_a_master_only_after_hearing_from_it() -> None:
    """Heartbeats are not persisted (times on another process's clock): a
    restored controller does not depose a master it has not heard from yet."""
    c = three_in_sync()
    c.state = from_json(to_json(c.state))
    assert c.do(Tick(), at=10 * TIMEOUT) == () and c.state.master == 1


# ------------------------------------------------------------------- election
def test_a_master_that_asks_itself_is_elected_again_in_a_new_epoch() -> None:
    """Election: the master itself asking is a new process of it (a restart
    quicker than the heartbeat timeout, or a restarted controller): it is
    elected again, master epoch + 1, so its replicas cut to what both hold
    (ha/autoswitch/epochs.py); the SyncStateSet is kept, as RocketMQ's
    controller keeps it (the restarted broker resumes with it)."""
    c = three_in_sync()
    before = c.state
    (elected,) = c.do(ElectMaster(requester=1))
    assert isinstance(elected, MasterElected) and elected.master == 1
    assert c.state.master_epoch == before.master_epoch + 1
    assert c.state.sync_state_set == before.sync_state_set == frozenset({1, 2, 3})
    assert c.state.sync_state_set_epoch == before.sync_state_set_epoch


def test_the_old_master_stays_while_it_is_alive() -> None:
    """Election: the old master if alive (DefaultElectPolicy: the old master
    is still valid and no other broker is preferred -> MASTER_STILL_EXIST)."""
    c = three_in_sync()
    before = c.state
    assert c.do(ElectMaster(requester=2)) == (MasterStillAlive(1, before.master_epoch),)
    assert c.state == before


def test_a_preferred_live_member_is_elected_over_the_old_master() -> None:
    """Election: else a preferred replica (DefaultElectPolicy: a preferred
    broker that is a live candidate wins)."""
    c = three_in_sync()
    (elected,) = c.do(ElectMaster(preferred=3))
    assert isinstance(elected, MasterElected) and elected.master == 3
    assert c.state.sync_state_set == {3}


def test_a_preferred_broker_that_is_not_a_candidate_elects_nobody() -> None:
    """Election: a preferred broker that is no live candidate elects nobody
    from the set (DefaultElectPolicy), and a live master is not deposed."""
    c = three_in_sync()
    c.alter({1, 2})  # 3 leaves the set
    before = c.state
    (failed,) = c.do(ElectMaster(preferred=3))
    assert isinstance(failed, ElectionFailed) and "is broker 3" in failed.reason
    assert c.state == before


@pytest.mark.parametrize("survivors, winner", [
    ({2: (2, 100, 0), 3: (3, 50, 0)}, 3),   # newest epoch first
    ({2: (3, 100, 0), 3: (3, 150, 0)}, 3),  # then the most data
    ({2: (3, 100, 5), 3: (3, 100, 1)}, 3),  # then the lower priority number
    ({2: (3, 100, 1), 3: (3, 100, 1)}, 2),  # then the lower id (deterministic)
], ids=["epoch", "max-offset", "priority", "id"])
def test_else_the_best_live_member_by_epoch_max_offset_priority(
        survivors: dict[int, tuple[int, int, int]], winner: int) -> None:
    """Election: else the best by epoch, max offset, priority
    (DefaultElectPolicy's comparator: epoch desc, max offset desc, priority asc)."""
    c = three_in_sync()
    for preferred in (2, 1):  # two switchovers: master epochs 2 and 3 exist
        c.do(ElectMaster(preferred=preferred))
        c.alter({1, 2, 3})
    assert c.state.master == 1 and c.state.master_epoch == 3
    kill_master_and_beat(c, survivors)
    _, elected = c.do(Tick())
    assert isinstance(elected, MasterElected) and elected.master == winner


def test_only_live_members_of_the_sync_state_set_are_candidates() -> None:
    """Election: candidates are the live members of the SyncStateSet; a live
    replica outside it, even with more data, is not one (unclean off)."""
    c = three_in_sync()
    c.alter({1, 2})
    kill_master_and_beat(c, {2: (1, 10, 0), 3: (1, 10**6, 0)})
    _, elected = c.do(Tick())
    assert isinstance(elected, MasterElected) and elected.master == 2


def test_no_live_member_and_unclean_off_means_no_master_with_a_reason() -> None:
    """Election: with enable_elect_unclean_master false (default) and no live
    member, no master: the election fails with a clear reason; the dead master
    is deposed (epoch + 1, its requests fenced), the set is kept."""
    c = three_in_sync()
    c.alter({1, 2})
    epoch = c.state.master_epoch
    kill_master_and_beat(c, {3: (1, 10**6, 0)})
    down, failed = c.do(Tick())
    assert isinstance(down, MasterDown) and isinstance(failed, ElectionFailed)
    assert "no live member of the SyncStateSet [1, 2]" in failed.reason
    assert "enable_elect_unclean_master" in failed.reason
    assert c.state.master is None and c.state.master_epoch == epoch + 1 == failed.master_epoch
    assert c.state.sync_state_set == {1, 2}
    assert c.do(Tick()) == ()  # nothing more to depose


def test_unclean_election_picks_any_live_replica_and_says_so() -> None:
    """Election: with enable_elect_unclean_master, if no member is alive, any
    live replica may be elected ("may lose messages")."""
    c = three_in_sync(UNCLEAN)
    c.alter({1, 2})
    kill_master_and_beat(c, {3: (1, 10, 0)})
    _, elected = c.do(Tick())
    assert isinstance(elected, MasterElected) and elected.master == 3 and elected.unclean
    assert "may lose messages" in elected.reason
    assert c.state.sync_state_set == {3}


def test_a_member_back_after_a_failed_election_is_elected_when_it_asks() -> None:
    """Election: the SyncStateSet outlives a failed election (RocketMQ keeps it),
    so a member that comes back is a candidate again."""
    c = three_in_sync()
    c.alter({1, 2})
    kill_master_and_beat(c, {3: (1, 0, 0)})
    c.do(Tick())
    c.beat(2, epoch=1)
    (elected,) = c.do(ElectMaster(requester=2))
    assert isinstance(elected, MasterElected) and elected.master == 2


def test_the_first_election_elects_the_broker_that_asks() -> None:
    """Election: a broker set that never had a master elects the requester
    (ReplicasInfoManager: isFirstTimeForElect), once it is alive."""
    c = Cluster()
    c.do(Register("n1"))
    c.do(Register("n2"))
    (failed,) = c.do(ElectMaster(requester=2))
    assert isinstance(failed, ElectionFailed) and c.state.master is None  # not alive yet
    c.beat(2)
    (elected,) = c.do(ElectMaster(requester=2))
    assert elected == MasterElected(master=2, master_epoch=1, sync_state_set_epoch=1,
                                    unclean=False, reason=elected.reason)  # type: ignore[union-attr]


# -------------------------------------------------------------- SyncStateSet
def test_a_set_change_from_the_master_at_current_epochs_applies() -> None:
    """SyncStateSet: a change requested by the current master with the current
    master epoch and set epoch is accepted; the set epoch goes up by one."""
    c = three_in_sync()
    set_epoch = c.state.sync_state_set_epoch
    assert c.alter({1, 3}) == SyncStateSetChanged(frozenset({1, 3}), set_epoch + 1)
    assert c.state.sync_state_set == {1, 3} and c.state.sync_state_set_epoch == set_epoch + 1


def test_a_deposed_masters_set_change_is_refused_as_stale() -> None:
    """Fencing: any request with an older master epoch is refused with a
    reason (CONTROLLER_FENCED_MASTER_EPOCH) — the old master after a failover."""
    c = three_in_sync()
    old_epoch, old_set_epoch = c.state.master_epoch, c.state.sync_state_set_epoch
    kill_master_and_beat(c, {2: (1, 0, 0), 3: (1, 0, 0)})
    c.do(Tick())
    c.beat(1)  # the old master is back, unaware
    before = c.state
    refused = c.alter({1}, master=1, master_epoch=old_epoch, set_epoch=old_set_epoch)
    assert isinstance(refused, Refused) and refused.code is Refusal.FENCED_MASTER_EPOCH
    assert f"master epoch {old_epoch} is stale" in refused.reason
    assert c.state == before


def test_a_set_change_with_a_stale_set_epoch_is_refused() -> None:
    """SyncStateSet: changes are fenced by the set epoch too
    (CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH)."""
    c = three_in_sync()
    stale = c.state.sync_state_set_epoch
    c.alter({1, 2})
    before = c.state
    refused = c.alter({1}, set_epoch=stale)
    assert isinstance(refused, Refused) and refused.code is Refusal.FENCED_SYNC_STATE_SET_EPOCH
    assert c.state == before


def test_a_set_change_from_a_broker_that_is_not_the_master_is_refused() -> None:
    """SyncStateSet: changes are accepted only from the current master
    (CONTROLLER_INVALID_MASTER)."""
    c = three_in_sync()
    before = c.state
    refused = c.alter({1, 2}, master=2)
    assert isinstance(refused, Refused) and refused.code is Refusal.NOT_MASTER
    assert c.state == before


def test_the_new_set_must_contain_the_master() -> None:
    """SyncStateSet: the new set must contain the master."""
    c = three_in_sync()
    before = c.state
    refused = c.alter({2, 3})
    assert isinstance(refused, Refused) and refused.code is Refusal.INVALID_REPLICAS
    assert "leaves out the master 1" in refused.reason and c.state == before


@pytest.mark.parametrize("new_set, code", [
    ({1, 9}, Refusal.INVALID_REPLICAS),  # never registered
    ({1, 3}, Refusal.BROKER_NOT_ALIVE),  # 3 stopped heartbeating
    ({1, 2, 3}, Refusal.BROKER_NOT_ALIVE),
], ids=["unregistered", "dead", "dead-kept"])
def test_the_new_set_names_only_live_registered_brokers(new_set: set[int],
                                                        code: Refusal) -> None:
    """SyncStateSet: every member of the new set is a registered, live replica
    (ReplicasInfoManager: CONTROLLER_INVALID_REPLICAS, CONTROLLER_BROKER_NOT_ALIVE)."""
    c = three_in_sync()
    c.now += TIMEOUT // 2
    c.beat(1)
    c.beat(2)
    c.now += TIMEOUT // 2 + 1
    before = c.state
    refused = c.alter(new_set)
    assert isinstance(refused, Refused) and refused.code is code and c.state == before


def test_asking_for_the_current_set_changes_nothing() -> None:
    c = three_in_sync()
    before = c.state
    refused = c.alter({1, 2, 3})
    assert isinstance(refused, Refused) and refused.code is Refusal.NO_CHANGE
    assert c.state == before


# ------------------------------------------------- the master's side of the set
def progress(*, connected: bool = True, acked: int = 0, caught_up: int = 0) -> ReplicaProgress:
    return ReplicaProgress(connected=connected, acked_offset=acked, last_caught_up_ms=caught_up)


def test_shrink_a_member_not_caught_up_for_15_s_or_disconnected() -> None:
    """SyncStateSet shrink: a replica not caught up for haMaxTimeSlaveNotCatchup
    (15 s) or disconnected leaves."""
    members = frozenset({1, 2, 3, 4})
    replicas = {2: progress(caught_up=5_000),  # 15 s exactly: stays
                3: progress(caught_up=4_999),  # 15.001 s: leaves
                4: progress(connected=False, caught_up=20_000)}
    assert next_sync_state_set(master=1, current=members, replicas=replicas,
                               confirmed_offset=0, epoch_start_offset=0,
                               now_ms=20_000) == {1, 2}


def test_expand_a_replica_whose_ack_reached_the_confirmed_offset_and_epoch_start() -> None:
    """SyncStateSet expand: a replica joins when its ack reached the confirmed
    offset and the current epoch's start offset."""
    def ask(acked: int) -> frozenset[int] | None:
        return next_sync_state_set(master=1, current=frozenset({1}),
                                   replicas={2: progress(acked=acked, caught_up=0)},
                                   confirmed_offset=500, epoch_start_offset=800, now_ms=0)
    assert ask(499) is None  # behind the confirmed offset
    assert ask(700) is None  # past it, but not into this master's epoch
    assert ask(800) == {1, 2}


# ----------------------------------------------------------------- config, JSON
@pytest.mark.parametrize("changes, words", [
    ({"heartbeat_timeout_ms": 0}, "heartbeat timeout"),
    ({"heartbeat_timeout_ms": 1.5}, "heartbeat timeout"),
    ({"enable_elect_unclean_master": "yes"}, "true or false"),
])
def test_config_validate_names_the_bad_setting(changes: dict[str, object], words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        ControllerConfig().with_(**changes)
    assert ControllerConfig().validate().heartbeat_timeout_ms == 10_000


def test_the_json_form_round_trips_without_heartbeats() -> None:
    """Persisted form: versioned; heartbeats (another process's clock) left out."""
    c = three_in_sync()
    text = to_json(c.state)
    assert json.loads(text)["version"] == 1
    restored = from_json(text)
    assert restored == replace(c.state, members=tuple(replace(m, live=None)
                                                      for m in c.state.members))


@pytest.mark.parametrize("edit, words", [
    (lambda d: d.update(version=2), "version 2 is not supported"),
    (lambda d: d.update(format="other"), "not a controller state file"),
    (lambda d: d.update(master=2, sync_state_set=[1]), "not in the SyncStateSet"),
    (lambda d: d.update(master_epoch="3"), "'master_epoch' must be a whole number"),
    (lambda d: d.update(members=[{"name": "n1"}]), "'broker_id' must be a whole number"),
    (lambda d: d.update(members=[], master=None, master_epoch=0, sync_state_set=[],
                        next_id=0), "next id 0 is below the first id 1"),
], ids=["version", "format", "master-outside-set", "epoch-type", "member-id", "next-id"])
def test_a_bad_persisted_state_is_refused_with_the_reason(edit: object, words: str) -> None:
    doc = json.loads(to_json(three_in_sync().state))
    edit(doc)  # type: ignore[operator]
    with pytest.raises(ControllerStateError, match=words):
        from_json(json.dumps(doc))
    with pytest.raises(ControllerStateError, match="not JSON"):
        from_json("{")


# ------------------------------------------------------------------ properties
brokers = st.integers(min_value=1, max_value=5)
heartbeats = st.builds(Heartbeat, broker_id=brokers, epoch=st.integers(0, 8),
                      max_offset=st.integers(0, 3), confirmed_offset=st.just(0),
                      priority=st.integers(0, 2))
requests = st.one_of(
    st.builds(Register, st.sampled_from(["n1", "n2", "n3", "n4"])),
    heartbeats, heartbeats,  # twice: brokers mostly stay alive
    st.builds(ElectMaster, st.none() | brokers, st.none() | brokers),
    st.builds(AlterSyncStateSet, master=brokers, master_epoch=st.integers(0, 8),
              sync_state_set_epoch=st.integers(0, 8),
              new_set=st.frozensets(brokers, max_size=4)),
    st.just(Tick()),
)
# Mostly short steps (brokers stay alive, elections happen), some past the timeout.
delays = st.integers(0, TIMEOUT // 4) | st.integers(0, 2 * TIMEOUT)
runs = st.lists(st.tuples(requests, delays), max_size=80)


def drive(run: list[tuple[Request, int]], config: ControllerConfig) -> list[tuple[
        ControllerState, Request, ControllerState, tuple[Decision, ...]]]:
    # Every run starts from three registered, live brokers, 1 the master; the random part
    # then adds a fourth, kills, revives, elects and alters.
    preamble: list[tuple[Request, int]] = [(Register(f"n{b}"), 0) for b in (1, 2, 3)]
    preamble += [(Heartbeat(broker_id=b, epoch=0, max_offset=0, confirmed_offset=0), 0)
                 for b in (1, 2, 3)]
    preamble.append((ElectMaster(requester=1), 0))
    state, now, trace = ControllerState(), 0, []
    for request, dt in preamble + run:
        now += dt
        # Steer requests toward the interesting cases: half the set changes
        # come from the master, naming live brokers, mostly at the current
        # epochs and sometimes one behind (a request that crossed a change).
        if isinstance(request, AlterSyncStateSet) and request.master_epoch % 2 == 0 \
                and state.master is not None:
            stale_master = request.master_epoch % 4 == 2
            stale_set = request.sync_state_set_epoch % 3 == 0
            request = replace(
                request, master=state.master,
                master_epoch=state.master_epoch - stale_master,
                sync_state_set_epoch=max(0, state.sync_state_set_epoch - stale_set),
                new_set=(request.new_set & state.alive_ids(now, TIMEOUT)) | {state.master})
        # And most heartbeats carry an epoch the controller handed out.
        if isinstance(request, Heartbeat) and request.epoch % 4 != 0:
            request = replace(request, epoch=min(request.epoch, state.master_epoch))
        new, decisions = step(state, request, now_ms=now, config=config)
        trace.append((state, request, new, decisions))
        state = new
    return trace


@settings(max_examples=200, deadline=None)
@given(runs, st.booleans())
def test_invariants_hold_and_epochs_never_go_down(run: list[tuple[Request, int]],
                                                  unclean: bool) -> None:
    """Random request sequences: every state keeps the invariants (master in
    the SyncStateSet, ...) and every step keeps epochs monotonic."""
    for old, _, new, _ in drive(run, UNCLEAN if unclean else CFG):
        assert problems(new) == [] and transition_problems(old, new) == []
        assert new.master_epoch >= old.master_epoch
        assert new.sync_state_set_epoch >= old.sync_state_set_epoch


@settings(max_examples=200, deadline=None)
@given(runs, st.booleans())
def test_never_two_masters_in_the_same_epoch(run: list[tuple[Request, int]],
                                             unclean: bool) -> None:
    """Random request sequences: a master epoch names at most one master, in
    the state and in every MasterElected decision."""
    seen: dict[int, int | None] = {0: None}
    for _, _, new, decisions in drive(run, UNCLEAN if unclean else CFG):
        assert seen.setdefault(new.master_epoch, new.master) == new.master
        for d in decisions:
            if isinstance(d, MasterElected):
                assert d.master_epoch == new.master_epoch and d.master == new.master


@settings(max_examples=200, deadline=None)
@given(runs)
def test_a_set_change_with_a_stale_epoch_never_applies(run: list[tuple[Request, int]]) -> None:
    """Random request sequences: a SyncStateSet change whose master epoch or
    set epoch is not the current one is refused and changes nothing."""
    for old, request, new, decisions in drive(run, CFG):
        if not isinstance(request, AlterSyncStateSet):
            continue
        fresh = (request.master_epoch == old.master_epoch
                 and request.sync_state_set_epoch == old.sync_state_set_epoch)
        if not fresh:
            assert new == old and len(decisions) == 1 and isinstance(decisions[0], Refused)
        if isinstance(decisions[0], SyncStateSetChanged):
            assert fresh and request.master == old.master and old.master in new.sync_state_set


@settings(max_examples=200, deadline=None)
@given(runs)
def test_the_json_form_round_trips_every_reachable_state(run: list[tuple[Request, int]]) -> None:
    for _, _, new, _ in drive(run, UNCLEAN):
        restored = from_json(to_json(new))
        assert restored == replace(new, members=tuple(replace(m, live=None)
                                                      for m in new.members))


json_values = st.none() | st.booleans() | st.integers(-2, 9) | st.text(max_size=3) | st.lists(
    st.integers(-1, 9), max_size=4)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["members", "next_id", "master", "master_epoch",
                                        "sync_state_set", "sync_state_set_epoch"]),
                       json_values | st.lists(st.fixed_dictionaries(
                           {"name": st.text(max_size=2), "broker_id": st.integers(-1, 9)}),
                           max_size=3)),
       st.data())
def test_a_persisted_state_reads_back_consistent_or_raises_controller_state_error(
        edits: dict[str, object], data: st.DataObject) -> None:
    """Persisted form, untrusted: it reads back as a state that keeps every
    invariant (so a controller can step from it), or raises
    ControllerStateError — nothing else."""
    doc = json.loads(to_json(three_in_sync().state))
    doc.update(edits)
    try:
        state = from_json(json.dumps(doc))
    except ControllerStateError:
        return
    assert problems(state) == []
    request = data.draw(requests)
    step(state, request, now_ms=0, config=UNCLEAN)
