"""The epoch list and the rejoin rule (ha/autoswitch/epochs.py, rejoin.py
`decide`), sans IO. Each rule test cites its rule as RocketMQ 5 states it
(EpochFileCache.findConsistentPoint, AutoSwitchHAClient.doTruncate,
AutoSwitchHAService.changeToMaster) and docs/design.md, "Controller mode: the
broker's epoch file and rejoin truncation", restates it; a model of whole
histories checks the rule's promise: what a replica keeps is the master's."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ha.autoswitch.epochs import EpochEntry, EpochList, EpochOrderError, last_common_point
from ha.autoswitch.rejoin import MasterEpochsError, RejoinKind, decide

E = EpochList.of


# --------------------------------------------------------- the rejoin rule
def test_rule_walks_newest_first_and_cuts_at_the_smaller_end_of_the_first_common_epoch(
) -> None:
    """Rule: walk the replica's epochs newest to oldest; at the first one the
    master holds with the same start, truncate to the smaller end offset.
    The replica's epoch 2 (a master that lost its seat) is not the master's;
    epoch 1 is, and ends at 100 on the replica, 150 on the master."""
    d = decide(E((1, 0), (2, 100)), 180, E((1, 0), (3, 150)), 400)
    assert d.kind is RejoinKind.TRUNCATE
    assert d.truncate_to == 100
    assert d.epochs_after == E((1, 0))


def test_rule_takes_the_master_end_when_the_replica_ran_ahead_in_the_common_epoch() -> None:
    """Rule: the smaller end: the replica's epoch 1 runs to 180 (its log's
    end), the master's to 150, where epoch 3 began: cut at 150."""
    d = decide(E((1, 0)), 180, E((1, 0), (3, 150)), 400)
    assert (d.kind, d.truncate_to, d.epochs_after) == (RejoinKind.TRUNCATE, 150, E((1, 0)))


def test_rule_cuts_nothing_when_the_replica_is_behind_in_the_common_epoch() -> None:
    """Rule: the smaller end is the replica's own: the point is its log's
    end and nothing is cut."""
    d = decide(E((1, 0), (3, 150)), 170, E((1, 0), (3, 150)), 400)
    assert (d.truncate_to, d.epochs_after) == (170, E((1, 0), (3, 150)))


def test_rule_skips_an_epoch_both_hold_at_different_start_offsets() -> None:
    """Rule: the same epoch *with the same start offset*: epoch 2 at 100 on
    the replica and at 90 on the master are two histories; epoch 1 is the
    common one (ending at 90 on the master)."""
    d = decide(E((1, 0), (2, 100)), 200, E((1, 0), (2, 90)), 300)
    assert d.truncate_to == 90


def test_rule_an_empty_epoch_file_is_a_new_replica_and_nothing_is_truncated() -> None:
    """Rule: an empty epoch file means a new replica: nothing truncated."""
    d = decide(EpochList(), 500, E((1, 0), (2, 100)), 300)
    assert d.kind is RejoinKind.NEW_REPLICA and d.truncate_to is None


def test_rule_no_common_epoch_is_refused() -> None:
    """RocketMQ: findConsistentPoint returns -1, doTruncate fails: no cut."""
    d = decide(E((2, 50)), 80, E((1, 0), (3, 60)), 90)
    assert d.kind is RejoinKind.NO_COMMON_POINT and d.truncate_to is None
    assert "refusing" in d.reason


def test_a_master_whose_max_offset_precedes_its_last_epoch_is_refused_as_its_error() -> None:
    """The master's word is checked before anything is cut: a last epoch
    starting past its own log's end is a contradiction (a remote error)."""
    with pytest.raises(MasterEpochsError, match="max offset 90 with epochs"):
        decide(E((1, 0)), 180, E((1, 0), (3, 150)), 90)
    with pytest.raises(MasterEpochsError):
        decide(E((1, 0)), 180, E((1, 0)), -1)


def test_rule_the_last_local_epoch_ends_at_the_log_and_entries_past_it_do_not_count() -> None:
    """The last entry covers up to the log's max offset (doTruncate sets it);
    an entry starting past the log's end (the log was cut below it) names no
    record: the point comes from the entry before."""
    assert last_common_point(E((1, 0), (2, 100)), 60, E((1, 0), (2, 100)), 300) == 60


def test_truncate_from_drops_the_entries_starting_at_or_after_the_cut() -> None:
    """RocketMQ's truncateSuffixByOffset: startOffset >= truncateOffset goes."""
    assert E((1, 0), (2, 100), (4, 150)).truncate_from(100) == E((1, 0))
    assert E((1, 0), (2, 100)).truncate_from(101) == E((1, 0), (2, 100))
    assert E((1, 0)).truncate_from(0) == EpochList()


# ---------------------------------------------------- appends, becoming master
def test_append_refuses_an_older_epoch_or_a_start_going_back() -> None:
    """RocketMQ's appendEntry refuses an entry whose epoch or start offset is
    not beyond the last; the message names both entries."""
    epochs = E((1, 0), (3, 100))
    with pytest.raises(EpochOrderError, match="2@200.*not newer.*3@100"):
        epochs.append(EpochEntry(2, 200))
    with pytest.raises(EpochOrderError, match="4@50 starts before the last entry 3@100"):
        epochs.append(EpochEntry(4, 50))
    assert epochs.append(EpochEntry(4, 180)) == E((1, 0), (3, 100), (4, 180))


def test_append_again_is_a_no_op_and_a_newer_epoch_at_the_same_start_keeps_the_empty_one(
) -> None:
    """A retried append (after a crash) changes nothing; an epoch that began
    where the last began leaves that one listed with an empty range
    (RocketMQ refuses that append instead)."""
    epochs = E((1, 0), (3, 100))
    assert epochs.append(EpochEntry(3, 100)) is epochs
    assert epochs.append(EpochEntry(5, 100)) == E((1, 0), (3, 100), (5, 100))
    assert epochs.append(EpochEntry(5, 100)).end_of(3, 400) == 100


def test_a_master_elected_again_with_an_empty_log_is_still_matched_by_its_replica() -> None:
    """A master whose whole log a power cut took (nothing flushed) is elected
    again in a new epoch: its epoch 1 is empty on it now, and a replica that
    copied records of epoch 1 matches it there and is cut to 0, the point
    both logs share. With the empty epoch dropped (the old rule) the
    replica found no common epoch and could not rejoin at all."""
    master = E((1, 0)).begin_epoch(2, 0)
    assert master == E((1, 0), (2, 0))
    d = decide(E((1, 0)), 16, master, 5)
    assert d.kind is RejoinKind.TRUNCATE and d.truncate_to == 0


def test_begin_epoch_refuses_a_lower_epoch_and_appends_the_new_one_at_the_log_end() -> None:
    """changeToMaster: a master epoch lower than the last is refused; the new
    epoch is appended at the max offset."""
    epochs = E((1, 0), (3, 100))
    with pytest.raises(EpochOrderError, match="cannot become master in epoch 2"):
        epochs.begin_epoch(2, 500)
    assert epochs.begin_epoch(4, 500) == E((1, 0), (3, 100), (4, 500))


def test_begin_epoch_again_moves_the_epoch_start_to_the_log_end() -> None:
    """changeToMaster with the last epoch again (a restart the controller did
    not notice): truncateSuffixByEpoch, then append at the max offset, so
    a tail lost in the restart and rewritten in this epoch is not taken for
    the old one; entries past the log's end (a cut tail) go first."""
    assert E((1, 0), (3, 100)).begin_epoch(3, 500) == E((1, 0), (3, 500))
    assert E((1, 0), (3, 100)).begin_epoch(4, 80) == E((1, 0), (4, 80))
    assert E((1, 0), (3, 100)).begin_epoch(3, 100) == E((1, 0), (3, 100))


def test_a_master_back_in_its_epoch_after_losing_its_tail_is_not_matched_past_the_loss(
) -> None:
    """Why changeToMaster moves the start: the master wrote 10..20 in epoch
    2, the replica copied to 16; a power cut took the master back to 13 and
    it came back master in epoch 2, writing new records from 13. Matching
    epoch 2 would keep the replica's 13..16, which the master no longer
    holds; with the start moved the rule falls back to epoch 1 and cuts at
    10 (conservative: 10..13 were the same)."""
    master = E((1, 0), (2, 10)).begin_epoch(2, 13)
    assert master == E((1, 0), (2, 13))
    d = decide(E((1, 0), (2, 10)), 16, master, 18)
    assert d.truncate_to == 10


def test_limit_a_master_back_in_its_epoch_at_the_same_start_is_matched(
) -> None:
    """The rule's limit, shown (docs/design.md): a master lost all of its
    epoch 2 (a power cut back to 10, the epoch's start) and came back master
    in epoch 2; its new records from 10 are not the replica's, yet both hold
    2@10 and the replica keeps its 10..16. Only a new epoch at every return
    of a master (a controller election) keeps the rule sound; the model
    above assumes it."""
    master = E((1, 0), (2, 10)).begin_epoch(2, 10)
    assert master == E((1, 0), (2, 10))
    assert decide(E((1, 0), (2, 10)), 16, master, 18).truncate_to == 16


def test_a_list_out_of_order_cannot_be_built() -> None:
    with pytest.raises(EpochOrderError, match="epochs must increase"):
        E((2, 0), (2, 10))
    with pytest.raises(EpochOrderError, match="start offsets must not decrease"):
        E((1, 10), (2, 9))
    with pytest.raises(EpochOrderError, match="negative"):
        E((1, -1))


# ------------------------------------------------------ a model of histories
@dataclass
class Broker:
    """A broker in the model: a log of unit-size records (offset = index),
    each named by the epoch that wrote it and its number, and its epochs."""

    log: list[tuple[int, int]] = field(default_factory=list)
    epochs: EpochList = EpochList()

    def receive(self, records: list[tuple[int, int]]) -> None:
        """A replica appends an entry when the epoch of what it gets changes."""
        for rec in records:
            last = self.epochs.last
            if last is None or last.epoch != rec[0]:
                self.epochs = self.epochs.append(EpochEntry(rec[0], len(self.log)))
            self.log.append(rec)


STEPS = st.lists(st.tuples(st.sampled_from(["elect", "write", "sync", "crash"]),
                           st.integers(0, 2), st.integers(1, 5)), max_size=40)


@settings(max_examples=300, deadline=None)
@given(STEPS)
def test_model_a_rejoining_replica_keeps_only_records_the_master_holds(
        steps: list[tuple[str, int, int]]) -> None:
    """Any history of elections (clean or not), writes, partial copies and
    power crashes losing an unflushed tail (a master comes back elected
    again, in a new epoch): at every rejoin the replica keeps
    exactly a prefix of the master's log (the rule's promise), and after
    copying from the point its log is the master's prefix."""
    brokers = [Broker() for _ in range(3)]
    master, epoch, serial = 0, 1, 0
    brokers[0].epochs = brokers[0].epochs.begin_epoch(1, 0)
    for action, who, n in steps:
        m = brokers[master]
        if action == "elect":
            master, epoch = who, epoch + 1
            b = brokers[master]
            b.epochs = b.epochs.begin_epoch(epoch, len(b.log))
        elif action == "write":
            for _ in range(n):
                serial += 1
                m.log.append((epoch, serial))
        elif action == "crash":  # a power cut loses up to n unflushed records
            b = brokers[who]
            del b.log[max(0, len(b.log) - n):]
            b.epochs = b.epochs.beyond_log_end_dropped(len(b.log))
            if who == master:  # back as master, elected again: a new epoch
                epoch += 1
                b.epochs = b.epochs.begin_epoch(epoch, len(b.log))
        elif who != master:
            r = brokers[who]
            d = decide(r.epochs, len(r.log), m.epochs, len(m.log))
            if d.kind is RejoinKind.NO_COMMON_POINT:
                continue
            point = d.truncate_to or 0
            if d.kind is RejoinKind.TRUNCATE:
                assert d.epochs_after is not None
                del r.log[point:]
                r.epochs = d.epochs_after
            else:
                point = len(r.log)
            assert r.log == m.log[:point], (r.log, m.log)
            r.receive(m.log[point:point + n])
            assert r.log == m.log[:len(r.log)]
