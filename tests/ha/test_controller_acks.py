"""Controller-mode ack rules (ha/autoswitch/acks.py; reference/README.md,
"Acks"), each test citing its rule."""

from __future__ import annotations

import pytest

from ha.autoswitch.acks import AckQuorum, quorum, quorum_acked, refusal
from ha.config import HAConfig, HAMode
from store.config import ConfigError

CTRL = HAConfig(ha_mode=HAMode.CONTROLLER)
SET = frozenset({"m", "s1", "s2"})


def test_rule_1_a_set_smaller_than_min_in_sync_replicas_refuses_the_put() -> None:
    cfg = CTRL.with_(min_in_sync_replicas=2)
    why = refusal(cfg, frozenset({"m"}))
    assert why is not None and "min_in_sync_replicas 2" in why
    assert refusal(cfg, frozenset({"m", "s1"})) is None
    assert refusal(CTRL, frozenset({"m"})) is None  # RocketMQ's default 1


def test_rule_2_all_ack_waits_for_every_other_member_and_only_members() -> None:
    q = quorum(CTRL.with_(all_ack_in_sync_state_set=True), "m", SET)
    assert q == AckQuorum(2, frozenset({"s1", "s2"}))
    # Both members must cover it: the quorum offset is the lower of the two.
    assert quorum_acked({"s1": 500, "s2": 300, "other": 900}, q) == 300
    # A member without a stream is waited for: no quorum offset at all.
    assert quorum_acked({"s1": 500, "other": 900}, q) is None


def test_rule_2_a_set_of_the_master_alone_waits_for_no_one() -> None:
    q = quorum(CTRL.with_(all_ack_in_sync_state_set=True), "m", frozenset({"m"}))
    assert not q.waits


def test_rule_3_in_sync_replicas_counts_copies_the_masters_included() -> None:
    assert not quorum(CTRL, "m", SET).waits  # default 1: no slave
    q = quorum(CTRL.with_(in_sync_replicas=2), "m", frozenset({"m"}))
    assert q == AckQuorum(1, None)  # any connected slave, member or not
    assert quorum_acked({"x": 700, "s1": 200}, q) == 700
    q3 = quorum(CTRL.with_(in_sync_replicas=3), "m", SET)
    assert quorum_acked({"s1": 700, "s2": 200}, q3) == 200
    assert quorum_acked({"s1": 700}, q3) is None


@pytest.mark.parametrize("field", ["in_sync_replicas", "min_in_sync_replicas"])
def test_counts_below_one_are_refused_with_the_option_named(field: str) -> None:
    with pytest.raises(ConfigError, match=field.replace("_", "-")):
        CTRL.with_(**{field: 0})
