"""Known RocketMQ bugs a node can re-introduce on purpose (`--emulate BUG`).

Each id names one defect RocketMQ shipped; the switch flips our code back to
that defect at the one place the real fix changed, so a chaos scenario can
show the checker catching it (the corpus, with scenarios and expected
verdicts, is chaos/bugs.py; the model behind each switch is
docs/known-bugs-model.md). Off by default; a node with no switch behaves as
the fixed code.

The switch points say in a comment what the real fix was:
- rmq-2706  store/commitlog.py CommitLog.flush
- rmq-8239  store/store.py MessageStore.confirmed_offset
- rmq-3349  ha/session.py MasterSession._first_report, ha/master.py best_acked

This module is the one list of ids the lower layers (store, ha) accept;
it holds no behaviour.
"""

from __future__ import annotations

from collections.abc import Iterable

RMQ_2706 = "rmq-2706"
RMQ_8239 = "rmq-8239"
RMQ_3349 = "rmq-3349"

# id -> what the switch re-introduces (one line; chaos/bugs.py has the rest).
SWITCHES: dict[str, str] = {
    RMQ_2706: "the flushed position advances even when the flush's fsync fails",
    RMQ_8239: "under SYNC_FLUSH consumers read messages that are not flushed yet",
    RMQ_3349: "a slave's first report beyond the master is believed and counts for "
              "SYNC_MASTER acks",
}


class EmulateError(ValueError):
    """An --emulate value names no known bug."""


def parse(values: Iterable[str]) -> frozenset[str]:
    """Bug ids from --emulate values (each may hold several, comma-separated);
    EmulateError naming the unknown one and the known ones."""
    out: set[str] = set()
    for value in values:
        for item in filter(None, (p.strip() for p in value.split(","))):
            if item not in SWITCHES:
                raise EmulateError(f"unknown bug {item!r} for --emulate; known: "
                                   f"{', '.join(sorted(SWITCHES))} (see `dlab chaos bugs`)")
            out.add(item)
    return frozenset(out)
