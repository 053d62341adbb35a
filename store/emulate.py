"""Known RocketMQ bugs a node can re-introduce on purpose (`--emulate BUG`).

Each id names one defect RocketMQ shipped; the switch flips our code back to
that defect at the one place the real fix changed, so a chaos scenario can
show the checker catching it (the corpus, with scenarios and expected
verdicts, is chaos/commands/bugs.py; the model behind each switch is
docs/known-bugs-model.md). Off by default; a node with no switch behaves as
the fixed code.

The switch points say in a comment what the real fix was:
- rmq-2706  store/log/commitlog.py CommitLog.flush
- rmq-8239  store/consume/consume_side.py MessageStore.confirmed_offset
- rmq-3349  ha/session.py MasterSession._first_report, ha/master.py best_acked
- rmq-3015  ha/session.py MasterSession.on_report, ha/master.py best_acked
- rmq-10666 store/log/commitlog.py CommitLog.truncate_to
- rmq-405   store/store.py _reput_floor and MessageStore._drain_dispatch
- rmq-epoch-in-place  ha/autoswitch/epoch_file.py EpochFile._write_in_place
  (RocketMQ 5's epoch file rewritten in place; no upstream issue number).
  A controller-mode node keeps its epoch file in its store's root and
  writes it this way under the switch; a classic-mode node keeps none, so
  there the switch changes nothing. Under the power crash model a power
  cut takes those unsynced writes on every backend
  (store/log/durable_mark.py, "Unsynced files")
- rmq-5663  cluster/node/replicas_manager.py
  ReplicasManager._change_sync_state_set (controller mode: the master
  acknowledges by its old SyncStateSet while a change is on its way)
- rmq-6703  store/consume/consume_side.py ConsumeSide._recover_confirm_offset
  (controller mode's confirm offset at open; no corpus entry: with this
  lab's whole-record replication it differs from the fix only after two
  crashes in a row, and no scenario forces that: docs/known-bugs.md)
- rmq-7689  store/consume/consume_side.py ConsumeSide._continue_queue_offsets
  (controller mode: QUEUEOFFSETs after the confirm offset)

Planted faults are switches of the same kind that re-introduce no
RocketMQ bug: defects written on purpose to show that the lab catches a
class of bug (ids start with `planted-`; `dlab chaos bugs` lists only the
RocketMQ corpus). They are accepted wherever `--emulate` is, so both
backends take them the same way:
- planted-ack-before-fsync  store/log/commitlog.py CommitLog.flush: a flush
  counts its bytes flushed (SYNC_FLUSH acks them) after writing them and
  before the fsync, which a later flush runs once 1 MiB waits for it (or a
  clean close). The `power` crash model
  must catch it on every backend (docs/known-bugs.md).
- planted-checkpoint-before-flush  store/log/commitlog.py CommitLog.flush:
  the checkpoint (its flushed end and timestamp) is written and fsynced
  before the CommitLog bytes it names are written and fsynced. A crash in
  between leaves a checkpoint vouching for bytes that never reached the
  disk: recovery takes the torn tail for corruption of flushed data.
- planted-dispatch-before-durable  store/consume/consume_side.py
  MessageStore.confirmed_offset: under SYNC_FLUSH consumers may read up to
  the end the running flush has taken (CommitLog.flush_target) instead of
  what it has made durable, so a crash during the flush takes records a
  consumer already got.
- planted-recovery-skips-crc  store/log/recovery.py scan_segment: recovery
  checks each record's size, magic, position and layout but not its body
  CRC, so a record whose body was damaged on disk is kept as valid.
- planted-slave-wrong-offset  ha/session.py SlaveSession.on_range,
  ha/slave.py: a range that does not start at the slave's end is applied
  at the slave's end anyway (RocketMQ's HAClient drops the connection), so
  the slave holds records at offsets where the master holds others.
- planted-stale-ack  ha/sync_master.py plan_replica_wait: a SYNC_MASTER
  put waits for a slave ack covering the put's start (the log's end before
  the put, which the slave acked earlier) instead of its end, so the put is
  answered PUT_OK from a stale ack, before any slave holds it.
- planted-ack-before-flush  cluster/node/put_answer.py PutAnswer: a master
  answers SYNC_FLUSH puts PUT_OK without waiting for the flush to cover
  them. A run without a crash loses nothing; the evidence each PUT_OK
  carries shows it (chaos/check/evidence.py, docs/design.md "Evidence").

This module is the one list of ids the lower layers (store, ha) accept;
it holds no behaviour.
"""

from __future__ import annotations

from collections.abc import Iterable

RMQ_2706 = "rmq-2706"
RMQ_8239 = "rmq-8239"
RMQ_3349 = "rmq-3349"
RMQ_3015 = "rmq-3015"
RMQ_10666 = "rmq-10666"
RMQ_405 = "rmq-405"
RMQ_EPOCH_IN_PLACE = "rmq-epoch-in-place"
RMQ_5663 = "rmq-5663"
RMQ_6703 = "rmq-6703"
RMQ_7689 = "rmq-7689"
PLANTED_ACK_BEFORE_FSYNC = "planted-ack-before-fsync"
PLANTED_CHECKPOINT_BEFORE_FLUSH = "planted-checkpoint-before-flush"
PLANTED_DISPATCH_BEFORE_DURABLE = "planted-dispatch-before-durable"
PLANTED_RECOVERY_SKIPS_CRC = "planted-recovery-skips-crc"
PLANTED_SLAVE_WRONG_OFFSET = "planted-slave-wrong-offset"
PLANTED_STALE_ACK = "planted-stale-ack"
PLANTED_ACK_BEFORE_FLUSH = "planted-ack-before-flush"

# id -> what the switch re-introduces (one line; chaos/commands/bugs.py has the rest).
RMQ_BUGS: dict[str, str] = {
    RMQ_2706: "the flushed position advances even when the flush's fsync fails",
    RMQ_8239: "under SYNC_FLUSH consumers read messages that are not flushed yet",
    RMQ_3349: "a slave's first report beyond the master is believed and counts for "
              "SYNC_MASTER acks",
    RMQ_3015: "an HA peer's report beyond what the master shipped is believed and counts "
              "for SYNC_MASTER acks",
    RMQ_10666: "a slave's truncation resets only in-memory positions; the cut tail stays "
               "valid on disk and comes back after a restart",
    RMQ_405: "a normal (clean) open re-dispatches nothing, and a clean stop waits at most "
             "5 s for dispatch: records left without consume-queue units stay so",
    RMQ_EPOCH_IN_PLACE: "controller mode: the epoch file is rewritten in place (a .bak copy, "
                        "no fsync, no rename), so a crash can leave it torn or gone",
    RMQ_5663: "controller mode: while a SyncStateSet change is on its way to the "
              "controller, the master acknowledges by the old set, not the union of both",
    RMQ_6703: "controller mode: abnormal recovery dispatches every record that starts below "
              "the persisted confirm offset and keeps that offset unless it is past the "
              "recovered end, even inside a record",
    RMQ_7689: "controller mode: a restarted master continues QUEUEOFFSETs from its consume "
              "queues, which stop at the confirm offset, so new messages take the offsets "
              "of the records after it",
}
# Planted faults (not RocketMQ's; see the module docstring).
PLANTED: dict[str, str] = {
    PLANTED_ACK_BEFORE_FSYNC: "planted fault, not a RocketMQ bug: a flush counts its bytes "
                              "flushed (SYNC_FLUSH acks them) before their fsync",
    PLANTED_CHECKPOINT_BEFORE_FLUSH: "planted fault: the checkpoint's flushed end is made "
                                     "durable before the bytes it names are",
    PLANTED_DISPATCH_BEFORE_DURABLE: "planted fault: under SYNC_FLUSH consumers read up to "
                                     "the running flush's target before its fsync",
    PLANTED_RECOVERY_SKIPS_CRC: "planted fault: recovery does not check the body CRC of "
                                "the records it keeps",
    PLANTED_SLAVE_WRONG_OFFSET: "planted fault: a slave applies a range that does not start "
                                "at its end at its end anyway",
    PLANTED_STALE_ACK: "planted fault: a SYNC_MASTER put is answered from an ack that covers "
                       "its start, not its end",
    PLANTED_ACK_BEFORE_FLUSH: "planted fault, not a RocketMQ bug: a master answers SYNC_FLUSH "
                              "puts PUT_OK without waiting for their flush",
}
# Every id --emulate accepts.
SWITCHES: dict[str, str] = {**RMQ_BUGS, **PLANTED}


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
                                   f"{', '.join(sorted(SWITCHES))} (see `dlab chaos bugs`; "
                                   "planted-* are faults planted on purpose)")
            out.add(item)
    return frozenset(out)
