"""The evidence a master's PUT_OK carries: the positions the answer relied
on, taken when it is made (docs/design.md, "Evidence"). Pure: positions in,
results out; the edge (cluster/node/put_answer.py) reads them off the store
and the HA side.

What is recorded, for each put answered PUT_OK:
- the node's `wrote` and `flushed` positions (SYNC_FLUSH promises
  flushed >= the put's end);
- on a SYNC_MASTER, every established slave stream's `acked` (its last
  accepted report) and `shipped` (where the next range to it starts), and
  `by`: the slave with the highest acked offset that covers the put's end,
  "" when none does (SYNC_MASTER promises some slave's report covered it);
- in controller mode, the quorum the put waited for: how many slave acks,
  and whose count (the SyncStateSet's other members under
  all-ack-in-sync-state-set, any connected slave otherwise).

The answer itself is decided elsewhere (ha/sync_master.py); this only
says what it was given. chaos/check/evidence.py verifies it after the run.
"""

from __future__ import annotations

from collections.abc import Sequence

from store.status import AnsweredPut, Evidence, PutResult, PutStatus, Quorum, SlaveAck


def covering_slave(end: int, acks: Sequence[SlaveAck]) -> str:
    """The slave whose ack covers `end`: the highest acked (the first such
    in `acks` on a tie), or "" when no slave's ack reaches `end`."""
    best: SlaveAck | None = None
    for a in acks:
        if a.acked >= end and (best is None or a.acked > best.acked):
            best = a
    return "" if best is None else best.slave


def with_evidence(results: Sequence[PutResult], *, wrote: int, flushed: int,
                  acks: Sequence[SlaveAck] | None, quorum: Quorum | None = None
                  ) -> list[PutResult]:
    """`results` with each PUT_OK's evidence; `acks` is None where the mode
    waits for no slave (ASYNC_MASTER), and then no ack is recorded;
    `quorum`, in controller mode, the acks the put waited for."""
    held = tuple(acks) if acks is not None else ()
    out: list[PutResult] = []
    for r in results:
        if r.status is not PutStatus.PUT_OK:
            out.append(r)
            continue
        by = covering_slave(r.end, held) if acks is not None else ""
        out.append(AnsweredPut(r, Evidence(wrote, flushed, held, by, quorum)))
    return out
