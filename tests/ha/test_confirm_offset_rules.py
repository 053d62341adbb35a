"""A controller-mode master's confirm offset (ha/autoswitch/confirm.py): the
three rules of its docstring, each pinned."""

from __future__ import annotations

from ha.autoswitch.confirm import FOLLOWS_WRITTEN, confirm_offset

SET = frozenset({"m", "s1", "s2"})


def _offset(**kw: object) -> int | None:
    args: dict[str, object] = {"master": "m", "local_set": SET, "members": SET,
                               "acks": {"s1": 700, "s2": 500}, "wrote": 900,
                               "current": 400, "all_ack": True}
    args.update(kw)
    return confirm_offset(**args)  # type: ignore[arg-type]


def test_a_set_of_the_master_alone_or_no_all_ack_follows_what_it_wrote() -> None:
    alone = frozenset({"m"})
    assert _offset(local_set=alone, members=alone) is FOLLOWS_WRITTEN
    assert _offset(all_ack=False) is FOLLOWS_WRITTEN


def test_the_least_ack_of_the_members_bounded_by_the_masters_end() -> None:
    assert _offset() == 500
    assert _offset(acks={"s1": 950, "s2": 980}) == 900
    # A connected slave outside the set does not count.
    assert _offset(local_set=frozenset({"m", "s1"}), members=frozenset({"m", "s1"}),
                   acks={"s1": 700, "s2": 10}) == 700


def test_a_member_with_no_stream_leaves_it_where_it_is() -> None:
    """apache/rocketmq#6662: a member cut off must not drop out of the minimum."""
    assert _offset(acks={"s1": 700}) == 400


def test_while_a_change_is_on_its_way_the_union_counts() -> None:
    """The local set is the master alone, an expansion to s1 on its way:
    rule 1 counts the local set only, so it still follows `wrote` (as
    RocketMQ's getLocalSyncStateSet().size() == 1); a shrink on its way
    keeps the leaving member in the minimum."""
    alone = frozenset({"m"})
    assert _offset(local_set=alone, members=frozenset({"m", "s1"})) is FOLLOWS_WRITTEN
    assert _offset(local_set=frozenset({"m", "s1"}), members=SET) == 500
