"""The known-bug corpus: RocketMQ defects a node re-introduces on demand
(`--emulate BUG`, store/emulate.py), each with the scenario that exposes it
and the verdict the checker must then give.

What a corpus entry claims: with the switch, `expected` (a figure of the
run's verdict) is above zero in (nearly) every seeded run of its scenario
in its mode; without the switch it is zero in every run of the same seeds.
One switch may have entries for several shapes of its bug (scenarios that
reach the switched code by different paths): the first is named by the
switch, each other by SWITCH/SHAPE (`Bug.name`, what --bug takes).
`dlab chaos bugs --check` measures both, on the local backend or, for
the bugs `sim_refusal` lets through, on the simulated one (docs/known-bugs.md
has the figures); tests/chaos/test_known_bugs.py does the same on fewer seeds.

How a run is judged here (`judge_run`): chaos.check.promises.judge for every
PUT_OK row of the history against the records read back from each node
(chaos.check.summary.judge_run_acks, the figures the Spark pipeline looks up
in promises.JUDGE_TABLE), and chaos.check.consumption.run_figures for the
consume side. It is the report's checker without Spark: a run is judged
in well under a second, where the Spark job takes tens of seconds to
start.

The model behind each switch (what the bug was, the real fix, what the
switch must change and must not) is docs/known-bugs-model.md; the code at
each switch point says what the real fix was.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from chaos.check import consumption, divergence
from chaos.check.run_dirs import load_run
from chaos.check.summary import judge_run_acks
from chaos.harness.scenarios import get as get_scenario
from chaos.harness.workload import WorkloadConfig
from chaos.schema import read_jsonl
from store.emulate import (
    RMQ_405,
    RMQ_2706,
    RMQ_3015,
    RMQ_3349,
    RMQ_5663,
    RMQ_7689,
    RMQ_8239,
    RMQ_10666,
    RMQ_EPOCH_IN_PLACE,
    SWITCHES,
)

# Figures judge_run gives; a bug's `expected` is one of them.
FIGURES = ("acked", "disk_violations", "replica_violations", "promise_violations",
           "delivered_then_lost", "stored_never_delivered", "divergent_records")


@dataclass(frozen=True)
class Bug:
    id: str  # the --emulate value (store/emulate.py)
    thread: str  # the GitHub thread that reported it
    title: str
    reintroduces: str  # what the switch changes in this lab's code
    real_fix: str
    scenario: str  # chaos/harness/scenarios.py
    role: str
    flush: str
    expected: str  # a FIGURES name: > 0 with the switch, 0 without
    verdict: str  # the expected verdict in words
    ha_ship_limit: str = "wrote"
    slave_ahead_policy: str = "reject"
    master_args: tuple[str, ...] = ()
    slave_args: tuple[str, ...] = ()
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    # A second shape of the switch's bug: its name ("" for the switch's
    # first entry); the entry is then named SWITCH/SHAPE.
    shape: str = ""
    # Controller mode's bugs run in it, with these settings and slaves.
    ha_mode: str = "classic"
    all_ack_in_sync_state_set: bool = False
    slaves: int = 1

    @property
    def name(self) -> str:
        """The entry's name in the corpus: the switch, or SWITCH/SHAPE."""
        return f"{self.id}/{self.shape}" if self.shape else self.id

    def run_fields(self) -> dict[str, Any]:
        """RunConfig fields of this bug's scenario (mode and tuning)."""
        return {"scenario": get_scenario(self.scenario), "role": self.role,
                "flush": self.flush, "ha_ship_limit": self.ha_ship_limit,
                "slave_ahead_policy": self.slave_ahead_policy,
                "master_args": self.master_args, "slave_args": self.slave_args,
                "workload": self.workload, "ha_mode": self.ha_mode,
                "all_ack_in_sync_state_set": self.all_ack_in_sync_state_set,
                "slaves": self.slaves}

    def as_dict(self) -> dict[str, Any]:
        d = {"name": self.name, **asdict(self)}
        d["master_args"] = list(self.master_args)
        d["slave_args"] = list(self.slave_args)
        d["workload"] = asdict(self.workload)
        return d


CORPUS: tuple[Bug, ...] = (
    Bug(
        id=RMQ_3349, thread="apache/rocketmq#3349",
        title="SEND_OK although replication failed when the master is behind its slave",
        reintroduces="the master believes a slave's first report beyond its own max offset "
                     "(any --slave-ahead-policy acts as trust) and keeps the highest report "
                     "as RocketMQ's push2SlaveMaxOffset, so SYNC_MASTER puts ending at or "
                     "below it are acknowledged at once",
        real_fix="none in classic HA (closed as stale; the #3016 check for #3015 covers "
                 "only later reports); DLedger/Controller modes truncate to an "
                 "epoch-consistent point; here the reject (default) and truncate policies",
        scenario="master-crash-after-ship", role="SYNC_MASTER", flush="ASYNC_FLUSH",
        # A lazy flusher (4 MiB, no thorough flush within the run): the
        # crash loses all the master wrote since it started, which the slave
        # holds. A restarted master appends (and refuses, no slave yet) as
        # fast as producers send, so the slave must report before the master
        # passes its offset: a steady rate, and a slave that retries within
        # 0.2 s (with the default backoff of up to 5 s, on a loaded machine
        # the master passed the slave's offset first in some seeds and no
        # report was ever ahead).
        master_args=("--flush-least-pages", "1024", "--flush-thorough-interval-ms", "600000"),
        slave_args=("--ha-reconnect-max-ms", "200"),
        workload=WorkloadConfig(producers=4, rate_per_s=50.0),
        expected="replica_violations",
        verdict="replica promise violated: PUT_OKs after the master's restart that no "
                "slave holds",
    ),
    Bug(
        # The failover shape of the same line: the node ahead is an old
        # master rejoining the slave promoted in its place, and the one
        # believing it is the new master. Its report is a first report, so
        # --emulate rmq-3015 (later reports, #3016's check) leaves it
        # refused; a RocketMQ 4.9.2 master believes it for #3015's reason
        # and 4.9.3+ for #3349's (docs/known-bugs.md).
        id=RMQ_3349, shape="failover", thread="apache/rocketmq#3349",
        title="SEND_OK although no slave holds the put: an old master rejoins its promoted "
              "slave with a longer log and its first report is believed",
        reintroduces="rmq-3349's switch on the promoted master: the rejoining old master's "
                     "first report beyond the new master's max offset is believed (any "
                     "--slave-ahead-policy acts as trust) and kept as push2SlaveMaxOffset, so "
                     "the new master's SYNC_MASTER puts ending at or below it are acknowledged "
                     "at once, at offsets where the old master holds its own records",
        real_fix="none in classic HA (apache/rocketmq#3016, for #3015, checks only reports "
                 "after the first; #3349 was closed as stale); DLedger/Controller modes "
                 "truncate a rejoining replica to an epoch-consistent point; here the reject "
                 "(default) and truncate policies",
        scenario="cut-off-master-crash-failover", role="SYNC_MASTER", flush="ASYNC_FLUSH",
        # The cut-off master gets ahead by the puts it stores once its
        # slave's stream is closed (SLAVE_NOT_AVAILABLE at once, as
        # RocketMQ's connectionCount == 0 gives); before that each put waits
        # the 3 s slave timeout. With the default 20 s housekeeping the
        # stream outlives the cut, the old master stores a few puts, and the
        # new master has passed it by the rejoin. Links silent for 1 s are
        # closed, so slaves report every 200 ms (housekeeping must exceed
        # the heartbeat; a promoted slave and a rejoining master take the
        # other side's arguments).
        master_args=("--ha-heartbeat-ms", "200", "--ha-housekeeping-ms", "1000"),
        slave_args=("--ha-heartbeat-ms", "200", "--ha-housekeeping-ms", "1000"),
        workload=WorkloadConfig(producers=4, rate_per_s=50.0),
        expected="replica_violations",
        verdict="replica promise violated: the new master's PUT_OKs after the old master "
                "rejoined, at offsets where the old master holds other records (no slave "
                "holds them)",
    ),
    Bug(
        id=RMQ_8239, thread="apache/rocketmq#8239",
        title="under SYNC_FLUSH consumers may read messages before they are flushed",
        reintroduces="confirmed_offset() (how far consumers may read) is the written end "
                     "under SYNC_FLUSH too",
        real_fix="apache/rocketmq#8240 (5.3.0): consume-queue dispatch stops at the flushed "
                 "position under SYNC_FLUSH (readUnCommitted, default false, restores the "
                 "old behaviour)",
        scenario="flusher-stall-crash-consuming", role="ASYNC_MASTER", flush="SYNC_FLUSH",
        # The slave gets only flushed bytes, so it cannot hold (and hide) what
        # the master's crash takes; a steady rate makes the failpoint's hit
        # fall a few seconds in, once the consumer is up.
        ha_ship_limit="flushed",
        workload=WorkloadConfig(producers=4, rate_per_s=100.0),
        expected="delivered_then_lost",
        verdict="delivered then lost: messages handed to the consumer that no node holds "
                "after the crash",
    ),
    Bug(
        id=RMQ_2706, thread="apache/rocketmq#2706",
        title="the flushed position advances even when the flush's fsync fails",
        reintroduces="an fsync error in CommitLog.flush is logged and swallowed: flushed and "
                     "the checkpoint advance, SYNC_FLUSH answers PUT_OK, the log is not "
                     "marked failed",
        real_fix="apache/rocketmq#9714 (for #9713, 2025-09-16): flushedPosition is set only "
                 "after a successful force; with #9708 a force error marks the store not "
                 "writeable",
        scenario="fsync-eio", role="ASYNC_MASTER", flush="SYNC_FLUSH",
        expected="disk_violations",
        verdict="disk promise violated: SYNC_FLUSH PUT_OKs missing from the master after "
                "its restart",
    ),
    Bug(
        id=RMQ_3015, thread="apache/rocketmq#3015",
        title="an HA peer's report beyond the master is believed, so SYNC_MASTER "
              "acknowledges what no slave holds",
        reintroduces="a report after the first that is beyond what the master shipped is "
                     "accepted as the stream's acked offset and kept as RocketMQ's "
                     "push2SlaveMaxOffset, which SYNC_MASTER waits compare against while "
                     "any stream is connected",
        real_fix="apache/rocketmq#3016 (4.9.3-4.9.8): a non-first report beyond the "
                 "master's max offset closes the connection; lost again in 5.0 with the "
                 "RIP-34 DefaultHAConnection (#3979)",
        scenario="rogue-ha-peer", role="SYNC_MASTER", flush="ASYNC_FLUSH",
        # A lazy flusher: the master's crash loses what it acknowledged
        # through the rogue's report while the slave was paused.
        master_args=("--flush-least-pages", "1024", "--flush-thorough-interval-ms", "600000"),
        workload=WorkloadConfig(producers=4, rate_per_s=50.0),
        expected="replica_violations",
        verdict="replica promise violated: PUT_OKs while the only slave was paused, which no "
                "node holds after the master's crash",
    ),
    Bug(
        id=RMQ_10666, thread="apache/rocketmq#10666",
        title="a truncation resets only in-memory positions, so a stale tail with valid CRCs "
              "comes back after a restart",
        reintroduces="a slave told to truncate (slave-ahead policy truncate) sets its "
                     "positions to the cut and unlinks later segments, but leaves the bytes "
                     "after the cut in the segment holding it (RocketMQ's "
                     "MappedFileQueue.truncateDirtyFiles); its recovery takes them back",
        real_fix="none merged as of the corpus (the issue is open); apache/rocketmq#10816 "
                 "(open) persists an invalid header at the cut before truncating, as this "
                 "lab's cut_on_disk does. RocketMQ's bug is on the AutoSwitch (Controller) "
                 "slave's truncation; here the same storage defect on the classic-mode "
                 "truncate policy",
        scenario="slave-truncate-crash", role="ASYNC_MASTER", flush="ASYNC_FLUSH",
        slave_ahead_policy="truncate",
        # The master flushes all it has once a second (what its crash loses,
        # up to a second of puts, the slave holds: the slave is ahead at the
        # restart, and the cut falls inside the log, not at 0 as with a
        # flusher that has not run yet); the slave flushes every
        # 20 ms, so its tail is on disk before the truncation (a SIGKILL under
        # the power model loses what was not written: the stale tail must be
        # in the file, as RocketMQ's mapped bytes are in the page cache), and
        # reconnects within 20 ms, before the restarted master passes its end
        # (a slave that reconnects later is not seen as ahead; its stale tail
        # diverges without the switch too).
        master_args=("--flush-least-pages", "1024", "--flush-thorough-interval-ms", "1000"),
        slave_args=("--ha-reconnect-min-ms", "1", "--ha-reconnect-max-ms", "20",
                    "--flush-least-pages", "0",
                    "--flush-interval-ms", "20"),
        workload=WorkloadConfig(producers=4, rate_per_s=50.0),
        expected="divergent_records",
        verdict="divergence: after its restart the slave holds the records its truncation "
                "cut where the master holds others",
    ),
    Bug(
        id=RMQ_405, thread="apache/rocketmq#405",
        title="consume queue and commit log out of step after a restart with dispatch behind",
        reintroduces="a clean close waits at most 5 s for consume-queue dispatch, then closes "
                     "cleanly anyway; a normal (clean) open starts dispatch at the CommitLog's "
                     "end: records left without units never get one",
        real_fix="commits 0c69acafa9 and 03b4564d31 (first tagged in 4.5.1): reput starts at "
                 "the consume queues' max physical offset and the store waits for dispatch "
                 "to catch up. The thread's power-loss premise was refuted in it (abnormal "
                 "recovery re-dispatches); the defect is on the clean-restart path",
        scenario="dispatch-stall-clean-restart", role="ASYNC_MASTER", flush="SYNC_FLUSH",
        # The stall starts at the first or second dispatch pass that finds
        # records, which must come before the stop. The consumer's reads
        # dispatch too, so a pass right after one finds nothing: with the
        # default pass a second, on the sim's evenly spaced passes 9 of 200
        # seeds had none with records before the stop (the failpoint never
        # fired). Five passes a second start the stall within the first
        # second or so, on both backends.
        master_args=("--consume-queue-flush-ms", "200"),
        workload=WorkloadConfig(producers=4, rate_per_s=100.0),
        expected="stored_never_delivered",
        verdict="stored, never delivered: acknowledged messages on the master's disk that "
                "the drained consumer never got (they have no consume-queue unit)",
    ),
    Bug(
        id=RMQ_5663, thread="apache/rocketmq#5663",
        title="Messages lost when the SyncStateSet expands: the master acknowledges by the "
              "old set while the controller already holds the new one",
        reintroduces="the master keeps acknowledging by its old SyncStateSet while its "
                     "request to expand it is on the way (cluster/node/replicas_manager.py "
                     "_keep_sync_state_set); the fixed code counts the union of the old and "
                     "the new set until the controller's answer is adopted",
        real_fix="apache/rocketmq#5798 (AutoSwitchHAService.isSynchronizingSyncStateSet: "
                 "acks by the union of the local and the remote set while a change is "
                 "synchronizing); here the `synchronizing` set of Node.set_sync_state_set",
        scenario="sync-state-set-expand-master-crash", role="SYNC_MASTER",
        flush="ASYNC_FLUSH", ha_mode="controller", all_ack_in_sync_state_set=True,
        # One slave: its first ack proposes the set that holds every node
        # (with two, the first expansion holds one, and the second waits for
        # the first's answer, which the failpoint holds back).
        slaves=1,
        # The slaves take only flushed bytes, and the master flushes nothing
        # within the run (a lazy flusher: 4 MiB, no thorough flush), so what
        # it acknowledges alone is on no slave, and its power cut takes it
        # from the master too. Fixed, the puts of the window wait for the
        # new members, which get nothing unflushed: FLUSH_SLAVE_TIMEOUT.
        ha_ship_limit="flushed",
        master_args=("--flush-least-pages", "1024", "--flush-thorough-interval-ms", "600000"),
        workload=WorkloadConfig(producers=4, rate_per_s=50.0),
        expected="replica_violations",
        verdict="replica promise violated: PUT_OKs of the last moments before the crash "
                "that the elected member never received",
    ),
    Bug(
        id=RMQ_EPOCH_IN_PLACE,
        thread="no issue of its own (the in-place write is apache/rocketmq#5905's fix, 5.1.0)",
        title="The epoch file is rewritten in place and never fsynced: a power cut takes it, "
              "and the old master rejoins as a new replica that truncates nothing",
        reintroduces="the broker's epoch file is written as RocketMQ's CheckpointFile.write "
                     "does through MixAll.string2File: the old contents copied to .bak, the "
                     "file overwritten in place, neither fsynced, the directory never synced "
                     "(ha/autoswitch/epoch_file.py EpochFile._write_in_place); a broker whose "
                     "file and backup are both gone or unreadable starts with no epochs",
        real_fix="none in RocketMQ as of the corpus (CheckpointFile still writes through "
                 "string2File, while ConfigManager.persist now forces the file and syncs its "
                 "directory); here the default write: a temp file, fsynced, renamed over the "
                 "file, the directory fsynced",
        scenario="paused-slave-master-crash-failover", role="ASYNC_MASTER",
        flush="SYNC_FLUSH", ha_mode="controller", slaves=1,
        # Why the window is hit, on every seed: the master's one write of
        # its epoch file is its election as the cluster comes up, which
        # creates the file; with the switch nothing fsyncs it or its
        # directory, so the power cut that follows (the load starts once the
        # SyncStateSet is full; the slave is paused 1-2 s in, the master cut
        # 3-4 s after that: 4-6 s after the write on the sim, 8-14 s on
        # a loaded machine) takes it (store/log/durable_mark.py, "Unsynced
        # files"; the sim's disk by itself): the lab's power cut keeps
        # nothing no fsync covered, directory entries included. (A real file
        # system writes the data back within about 30 s and commits the
        # directory entry within seconds; docs/known-bugs.md says what a
        # later cut leaves and what RocketMQ does then.) The old master then
        # restarts with no epochs. What it has
        # that the new master lacks is the 3-4 s of puts it stored and
        # flushed while its slave was paused (SYNC_FLUSH: on its disk before
        # PUT_OK, so the power cut keeps them; ASYNC_MASTER: no put waits for
        # the slave); the paused slave stays in the SyncStateSet (15 s) and
        # is elected once it heartbeats again. Rejoining as a new replica
        # the old master cuts nothing: its tail sits at offsets where the
        # new master stores the producers' retries and new puts. Without
        # the switch its epoch file [1@0] survives, the last common point
        # is the new master's start, and it cuts its tail there.
        workload=WorkloadConfig(producers=4, rate_per_s=50.0),
        expected="divergent_records",
        verdict="divergence: the old master keeps the tail it stored while its slave was "
                "paused, at offsets where the elected master holds other records",
    ),
    Bug(
        id=RMQ_7689, thread="apache/rocketmq#7689",
        title="In controller mode messages may be lost because two share one consume-queue "
              "offset: a restarted master's queue offsets continue from its consume queues, "
              "which stop at the confirm offset",
        reintroduces="a master that takes the role (Node.become_master -> "
                     "MessageStore.recover_topic_queue_table) continues each queue's "
                     "QUEUEOFFSET from its consume queue alone "
                     "(store/consume/consume_side.py _continue_queue_offsets); the records "
                     "after its confirm offset, not dispatched yet, keep the offsets its "
                     "next puts then take",
        real_fix="apache/rocketmq#7690 (5.2.0): ConsumeQueueStore.recoverOffsetTable reads "
                 "the records from the confirm offset on (compensateForHA) and moves each "
                 "queue's offset past theirs; they stay unconsumable until confirmed",
        scenario="master-and-controller-crash-consuming", role="SYNC_MASTER",
        flush="SYNC_FLUSH", ha_mode="controller", all_ack_in_sync_state_set=True,
        # Why every run reaches the window. Dispatch stops at the confirm
        # offset (all-ack: what the slave acked), and the consume queue
        # keeps its units in memory until its flush, once a second; the
        # checkpoint keeps the confirm offset at its sync, every 10 s from
        # the store's start (none or one before the kill, 2.5-3.5 s into
        # the load, seconds old). The power cut takes the units of
        # the last flush interval and the recovered confirm offset is below
        # them, so the restarted master holds records with no unit: the
        # load's last 0-1 s of puts (SYNC_FLUSH: every acknowledged one is
        # on its disk) and the ones in flight (appended, not acked). The
        # controller dies with the master, so it cannot elect the slave
        # while the master is down (3 s timeout; a restart takes up to
        # 2.5 s on a loaded machine), and restarted it judges no one until
        # heard from: the master asks and is elected again with its
        # SyncStateSet (RocketMQ's restarted master resumes with the set
        # the controller holds), whose slave has not acked its tail, so the
        # confirm offset stays below it when the master counts its queue
        # offsets. Its first puts then take the offsets of those records.
        # The slave takes only flushed bytes: what it acks (the confirm
        # offset) and what it serves while the master is down are on the
        # master's disk, so the power cut takes nothing a consumer read.
        # Shipping `wrote`, a consumer read a record from the slave that
        # the master had not fsynced, the slave cut it when it rejoined,
        # and a new record took its queue offset behind the consumer's: 1
        # stored-never-delivered in 5 of 200 sim seeds without the switch
        # (the controller-mode phantom read, docs/design.md). A master
        # shipping flushed bytes looks for newly flushed ones every flush
        # interval (ha/master.py: no hook from the group commit): 10 ms, or
        # each all-ack put waits up to 500 ms for its shipping (8 puts/s
        # instead of 200).
        ha_ship_limit="flushed",
        master_args=("--flush-interval-ms", "10"),
        workload=WorkloadConfig(producers=4, rate_per_s=50.0),
        expected="stored_never_delivered",
        verdict="stored, never delivered: puts the restarted master took first share their "
                "consume-queue offsets with records from before its crash and get no unit",
    ),
)

BY_NAME = {b.name: b for b in CORPUS}
assert len(BY_NAME) == len(CORPUS), "corpus entries need distinct names (a shape per switch)"
assert {b.id for b in CORPUS} <= set(SWITCHES), \
    "every corpus entry needs its switch in store/emulate.py"


def get(name: str) -> Bug:
    """The entry named `name` (a switch, or SWITCH/SHAPE)."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"unknown bug {name!r}; known: {', '.join(BY_NAME)}") from None


def backend_refusal(bug: Bug, backend: str) -> str | None:
    """Why `backend` cannot run `bug`'s scenario yet, or None: None for
    every bug on local and compose, which both run a controller for
    controller mode's (the sim's limits are sim_refusal's)."""
    return None


def sim_refusal(bug: Bug, crash_model: str = "power") -> str | None:
    """Why the sim backend cannot check `bug`, or None when it can (today
    the sim runs every bug's scenario, under the power crash model only)."""
    from chaos.sim.run import SimUnsupportedError, check_supported

    try:
        check_supported(crash_model)
    except SimUnsupportedError as exc:
        return str(exc)
    return None


# ------------------------------------------------------------- the checker
def judge_run(run_dir: str) -> dict[str, int | None]:
    """The verdict figures of one finished run (see the module docstring)."""
    run = load_run(run_dir, 0)
    rows = {n.name: read_jsonl(n.records_path) for n in run.nodes}
    master, slaves = run.nodes[0], run.nodes[1:]
    judged = judge_run_acks(run, read_jsonl(run.history_path))
    out: dict[str, int | None] = {k: judged[k] for k in FIGURES if k in judged}
    consumed = consumption.run_figures(run)
    for key in ("delivered_then_lost", "stored_never_delivered"):
        out[key] = None if consumed is None else consumed[key]
    out["divergent_records"], _ = divergence.divergence(
        [rows[master.name], *[rows[s.name] for s in slaves]])
    return out


# ------------------------------------------------------------------ checks
@dataclass(frozen=True)
class CheckRun:
    bug: str  # the entry's name (Bug.name)
    emulated: bool
    seed: int
    run_dir: str | None
    figures: dict[str, int | None]
    error: str | None = None

    def shows(self, figure: str) -> bool:
        return (self.figures.get(figure) or 0) > 0


@dataclass(frozen=True)
class BugCheck:
    bug: Bug
    runs: tuple[CheckRun, ...]

    def _side(self, emulated: bool) -> list[CheckRun]:
        return [r for r in self.runs if r.emulated == emulated and r.error is None]

    @property
    def caught(self) -> int:
        return sum(r.shows(self.bug.expected) for r in self._side(True))

    @property
    def with_switch(self) -> int:
        return len(self._side(True))

    @property
    def false_positives(self) -> int:
        return sum(r.shows(self.bug.expected) for r in self._side(False))

    @property
    def without_switch(self) -> int:
        return len(self._side(False))

    @property
    def failed_runs(self) -> int:
        return sum(r.error is not None for r in self.runs)

    @property
    def holds(self) -> bool:
        """≥ 95 % caught with the switch, none without, no run failed."""
        return (self.failed_runs == 0 and self.with_switch > 0
                and self.caught >= 0.95 * self.with_switch and self.false_positives == 0)


RunFn = Callable[[dict[str, Any]], str]  # RunConfig fields -> run directory


def check_bug(bug: Bug, seeds: Sequence[int], out_dir: str, run: RunFn,
              on_run: Callable[[CheckRun], None] = lambda r: None) -> BugCheck:
    """Run the bug's scenario for every seed with and without its switch and
    judge each run. `run` executes one chaos run (chaos.commands.run.make_run
    in practice)."""
    results: list[CheckRun] = []
    for emulated in (True, False):
        side = os.path.join(out_dir, *bug.name.split("/"), "with" if emulated else "without")
        for seed in seeds:
            fields = {**bug.run_fields(), "seed": seed, "out_dir": side,
                      "emulate": (bug.id,) if emulated else ()}
            try:
                run_dir = run(fields)
                r = CheckRun(bug.name, emulated, seed, run_dir, judge_run(run_dir))
            except Exception as exc:  # a failed run is reported, the check goes on
                r = CheckRun(bug.name, emulated, seed, None, {},
                             error=f"{type(exc).__name__}: {exc}")
            results.append(r)
            on_run(r)
    return BugCheck(bug, tuple(results))
