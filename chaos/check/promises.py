"""What a PUT_OK promises in each mode, and how one acknowledged message is
judged against it. Pure data and logic: no Spark, no files. The pipeline
(chaos/report/pipeline.py) looks judge()'s answers up in JUDGE_TABLE;
tests/chaos/test_verdict_paths.py runs every checker over every combination.

    mode                          a PUT_OK promises
    SYNC_MASTER  + SYNC_FLUSH     on the master's disk, and received by a slave
    SYNC_MASTER  + ASYNC_FLUSH    received by a slave
    ASYNC_MASTER + SYNC_FLUSH     on the master's disk
    ASYNC_MASTER + ASYNC_FLUSH    nothing beyond the running process

The rules, for one PUT_OK operation m of a run (times are m's invoke_ms),
are written once, in judge(); every checker calls it, directly (per
acknowledgement: chaos/check/summary.py, chaos/commands/bugs.py, through judge_acks) or
through JUDGE_TABLE, its answers for every input (the Spark query,
chaos/report/pipeline.py, which looks them up per message):

- *held(N)*: node N's store after the run (the store the run kept, read
  again by `dlab report`, else the run's own read-back of it) holds a record
  whose msg_id is m's, at any offset (a client retry is the same message).
- **disk** (flush SYNC_FLUSH): kept if held(master). If not held it is *void*
  when the scenario damaged the master's disk at or after m was invoked (a
  fault with damages_disk on the master; final.json disk_damaged with no such
  fault means "at an unknown time", which voids it for every message), and a
  *violation* otherwise. A kill never voids it: a SYNC_FLUSH ack leaves after
  the fsync, which survives a power loss.
- **replica** (role SYNC_MASTER): kept if some slave holds m. If none does it
  is *void* when some slave's copy may have been destroyed at or after m was
  invoked — its disk damaged, or the slave crashed (kill, crashing failpoint)
  under crash_model power, since "received" is not "flushed" — and a
  *violation* otherwise. So "received by a slave" reads as "a slave that kept
  its memory and disk still has it": a copy missing from such a slave was
  never received (a `trust`-policy ack, apache/rocketmq#3015) or was removed
  by the system itself (a `truncate` slave cutting back to a master that lost
  it) — either way the mode's promise failed. A message gone from every node
  is therefore a violation whenever the promise was not void. A SYNC_MASTER
  run without slaves can keep no replica promise: its PUT_OKs are violations.
- m is **stranded** when it is missing from the recovered master and the
  only nodes holding it are slaves that master rejects or ignores (a slave
  found ahead of it under the `reject` or `trust` policy, at its restart or
  at the end of the run): stored, but no producer or consumer of the
  serving master can get it. Its replica promise is then STRANDED, not kept;
  stranded is an outcome of its own, neither a violation nor an allowed loss.
- m is a **violation** when any of its promises is violated (counted once);
  an **allowed loss** when it is missing from the recovered master and is
  neither a violation nor stranded — lost, but nothing the mode promised
  says it should be there.

After a failover (docs/design.md, "Failover: routing, promotion, rejoin")
the master is the node serving as master at the end (params.json's first
node) and m's *acker* is the node that answered its first PUT_OK:

- m is **lost by failover** when its acker is not the final master and the
  final master does not hold it (the promoted node never got it, or a
  second master acknowledged it: a split brain).
- **disk** is judged on the acker's store (its fsync is what the ack
  promised; a lost machine's disk is read from its moved-aside store), void
  by damage to the acker's disk.
- **replica** is judged on the nodes other than the acker ("received by a
  slave" of the master that answered), void when one of their copies may
  have been destroyed. So under SYNC_MASTER a message the promoted slave
  lacks, and no other replica holds, is a violation; under ASYNC_MASTER it
  is an allowed loss (its size, and the replication lag at the loss:
  chaos/check/failover.py).
- a lost node (lost, never rejoined) is no slave: what only it holds is
  neither held by a slave nor stranded.
With no failover every acker is the master and these read as above.

What this does not judge: which attempt of a retried message survived, the
bytes of the body (records carry its CRC, the history does not), and
anything about messages that were not acknowledged (see INDETERMINATE in
chaos/schema.py; the pipeline reports whether those were found).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


class Promise(enum.StrEnum):
    DISK = "disk"  # on the master's disk (fsynced before the ack)
    REPLICA = "replica"  # received by a slave before the ack


ROLES = ("SYNC_MASTER", "ASYNC_MASTER")
FLUSHES = ("SYNC_FLUSH", "ASYNC_FLUSH")

PROMISES: dict[tuple[str, str], frozenset[Promise]] = {
    ("SYNC_MASTER", "SYNC_FLUSH"): frozenset({Promise.DISK, Promise.REPLICA}),
    ("SYNC_MASTER", "ASYNC_FLUSH"): frozenset({Promise.REPLICA}),
    ("ASYNC_MASTER", "SYNC_FLUSH"): frozenset({Promise.DISK}),
    ("ASYNC_MASTER", "ASYNC_FLUSH"): frozenset(),
}

PROMISE_TEXT = {
    Promise.DISK: "on the master's disk",
    Promise.REPLICA: "received by a slave",
}


def promises(role: str, flush: str) -> frozenset[Promise]:
    try:
        return PROMISES[(role, flush)]
    except KeyError:
        raise ValueError(f"unknown mode {role} + {flush}") from None


def describe(role: str, flush: str) -> str:
    """The promise of a mode in words, as in the table above."""
    ps = promises(role, flush)
    if not ps:
        return "nothing beyond the running process"
    return ", and ".join(PROMISE_TEXT[p] for p in (Promise.DISK, Promise.REPLICA) if p in ps)


def short(role: str, flush: str) -> str:
    """The promises of a mode as a table cell: disk+replica, disk, replica, none."""
    ps = promises(role, flush)
    return "+".join(p.value for p in Promise if p in ps) or "none"


class Outcome(enum.StrEnum):
    NOT_PROMISED = "not_promised"
    KEPT = "kept"
    VOID = "void"  # missing, but the scenario destroyed what the promise relied on
    VIOLATED = "violated"
    STRANDED = "stranded"  # held only by slaves the serving master rejects or ignores


@dataclass(frozen=True)
class AckVerdict:
    """How one PUT_OK fared: per promise, and overall."""

    disk: Outcome
    replica: Outcome
    on_master: bool
    on_slave: bool
    stranded: bool = False  # off the master, held only by rejected/ignored slaves
    by_failover: bool = False  # acknowledged by a node other than the final master

    @property
    def violation(self) -> bool:
        return Outcome.VIOLATED in (self.disk, self.replica)

    @property
    def allowed_loss(self) -> bool:
        return not self.on_master and not self.violation and not self.stranded

    @property
    def lost_everywhere(self) -> bool:
        return not self.on_master and not self.on_slave

    @property
    def lost_by_failover(self) -> bool:
        return self.by_failover and not self.on_master


def _judge_one(promised: bool, held: bool, void: bool) -> Outcome:
    if not promised:
        return Outcome.NOT_PROMISED
    if held:
        return Outcome.KEPT
    return Outcome.VOID if void else Outcome.VIOLATED


def judge(
    role: str,
    flush: str,
    *,
    on_master: bool,
    on_slave: bool,
    master_disk_void: bool,
    some_slave_void: bool,
    only_on_rejected: bool = False,
    by_failover: bool = False,
    on_acker: bool = False,
    on_replica: bool = False,
) -> AckVerdict:
    """Judge one PUT_OK. `on_master`: the final master holds it; `on_slave`:
    some other node (not lost) does; `master_disk_void`: the acker's disk
    was damaged at or after the message was invoked; `some_slave_void`: the
    copy of some node other than the acker may have been destroyed at or
    after it (disk damage, or a crash under the power model);
    `only_on_rejected`: every slave holding it is one the master rejects or
    ignores. `by_failover`: its acker is not the final master; then
    `on_acker` (the acker holds it) and `on_replica` (a node other than the
    acker does) are what its promises are judged on; without a failover
    they are on_master and on_slave. See the module docstring for why."""
    if not by_failover:
        on_acker, on_replica = on_master, on_slave
    ps = promises(role, flush)
    stranded = not on_master and on_slave and only_on_rejected
    replica = _judge_one(Promise.REPLICA in ps, on_replica, some_slave_void)
    if stranded and replica == Outcome.KEPT:
        replica = Outcome.STRANDED
    return AckVerdict(
        disk=_judge_one(Promise.DISK in ps, on_acker, master_disk_void),
        replica=replica,
        on_master=on_master,
        on_slave=on_slave,
        stranded=stranded,
        by_failover=by_failover,
    )


# ------------------------------------------------- what one PUT_OK counts
def ack_figures(v: AckVerdict) -> dict[str, bool]:
    """Whether one judged PUT_OK counts in each of a run's verdict figures
    (the report's verdicts.csv columns of these names): a run's figure is
    the number of its PUT_OKs counted in it."""
    return {
        "acked_stranded": v.stranded,
        "acked_lost_master": not v.on_master,
        "acked_lost_everywhere": v.lost_everywhere,
        "acked_lost_failover": v.lost_by_failover,
        "disk_promises": v.disk is not Outcome.NOT_PROMISED,
        "disk_void": v.disk is Outcome.VOID,
        "disk_violations": v.disk is Outcome.VIOLATED,
        "replica_promises": v.replica is not Outcome.NOT_PROMISED,
        "replica_void": v.replica is Outcome.VOID,
        "replica_violations": v.replica is Outcome.VIOLATED,
        "promise_violations": v.violation,
        "allowed_loss": v.allowed_loss,
    }


ACK_FIGURES = tuple(ack_figures(AckVerdict(Outcome.KEPT, Outcome.KEPT, True, True)))


@dataclass(frozen=True)
class Ack:
    """One PUT_OK as judge_acks needs it: `node`, the index of the node that
    answered it (0: the final master)."""

    msg_id: str
    invoke_ms: int
    node: int = 0


def judge_acks(role: str, flush: str, acks: Iterable[Ack], held: Sequence[set[str]], *,
               disk_void_until_ms: int | Sequence[int], copy_void_until_ms: Sequence[int],
               ignored_mask: int, lost_mask: int = 0) -> dict[str, int]:
    """A run's verdict figures (ACK_FIGURES and `acked`) over its PUT_OKs.
    `held[i]`: the message ids node i holds (0: the final master); node i's
    copy is void for a message invoked at or before `copy_void_until_ms[i]`
    (given for the slaves only, i - 1: the master's copy counts for no
    ack), node i's disk at or before `disk_void_until_ms[i]` (one int: the
    master's, the only one any ack is judged on without a failover;
    chaos.check.run_dirs.void_until); bit i of `ignored_mask`: node
    i is a slave the master rejects or ignores (chaos.check.slave_ahead), of
    `lost_mask`: node i was lost and never rejoined. A message is judged with
    the acker of its first PUT_OK (as the report's query does)."""
    disk_void = ([disk_void_until_ms] if isinstance(disk_void_until_ms, int)
                 else list(disk_void_until_ms))
    copy_void = list(copy_void_until_ms)
    if len(copy_void) < len(held):
        copy_void = [-(2**63), *copy_void]  # by node index
    acks = list(acks)
    acker: dict[str, int] = {}
    for ack in acks:
        acker.setdefault(ack.msg_id, ack.node)
    out = dict.fromkeys(("acked", *ACK_FIGURES), 0)
    nodes = range(len(held))
    for ack in acks:
        a = acker[ack.msg_id]
        holders = [i for i in nodes if i and not lost_mask >> i & 1 and ack.msg_id in held[i]]
        v = judge(role, flush, on_master=ack.msg_id in held[0], on_slave=bool(holders),
                  master_disk_void=ack.invoke_ms <= disk_void[a if a < len(disk_void) else 0],
                  some_slave_void=any(ack.invoke_ms <= copy_void[i] for i in nodes
                                      if i != a and i < len(copy_void)),
                  only_on_rejected=all(ignored_mask >> i & 1 for i in holders),
                  by_failover=a != 0, on_acker=ack.msg_id in held[a],
                  on_replica=any(ack.msg_id in held[i] for i in nodes if i != a))
        out["acked"] += 1
        for name, counts in ack_figures(v).items():
            out[name] += counts
    return out


# ------------------------------------------------- judge() as a table
# Beside the mode, judge()'s inputs are five booleans, so a checker that
# cannot call Python per message (the Spark query) looks its answers up
# instead of restating the rule. A key packs the inputs, high bit first:
MODES: tuple[tuple[str, str], ...] = tuple(PROMISES)
JUDGE_INPUTS = ("on_master", "on_slave", "only_on_rejected", "by_failover", "on_acker",
                "on_replica", "master_disk_void", "some_slave_void")
JUDGE_KEYS = len(MODES) << len(JUDGE_INPUTS)


def judge_key(role: str, flush: str, **inputs: bool) -> int:
    """The key of judge(role, flush, **inputs): the mode's index in MODES,
    then one bit per JUDGE_INPUTS name."""
    key = MODES.index((role, flush))
    for name in JUDGE_INPUTS:
        key = key << 1 | bool(inputs[name])
    return key


def _judge_by_key(key: int) -> AckVerdict:
    bits = [bool(key >> (len(JUDGE_INPUTS) - 1 - i) & 1) for i in range(len(JUDGE_INPUTS))]
    role, flush = MODES[key >> len(JUDGE_INPUTS)]
    return judge(role, flush, **dict(zip(JUDGE_INPUTS, bits, strict=True)))


# JUDGE_TABLE[figure][key]: 1 if a PUT_OK with that key counts in the figure.
JUDGE_TABLE: dict[str, tuple[int, ...]] = {
    name: tuple(int(ack_figures(_judge_by_key(key))[name]) for key in range(JUDGE_KEYS))
    for name in ACK_FIGURES
}
