"""Scenarios as data: a schedule of faults against a loaded cluster.

A scenario is a list of steps. Each step waits a delay drawn from its window
(from the run's seed) after the previous step, then acts on a target node.
Every run ends the same way whatever the scenario did (runner.py): downed
nodes restarted and recovered, replication settled, all nodes stopped
cleanly, every store read back from disk.

Actions:
  kill, stop, start, restart, pause, resume   on `target`
  partition, heal                             the master-slave link
  await_crash   wait (up to 10 s) for the target to die from an armed
                failpoint; kill it if it has not, and say so in the fault
  torn_tail     on a stopped target: partial record bytes after its last record
  bit_flip      on a stopped target: one bit inside a record on disk
Targets: master, slave (the first slave), both; and, in a scenario that
consumes while producing, consumer: kill (SIGKILL: offsets since its last
commit are lost), stop (clean: it commits first), start (a new incarnation,
resuming from the offsets its broker returns).

Adding a scenario is a few lines in SCENARIOS.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Step:
    action: str
    target: str = "master"
    after_s: tuple[float, float] = (0.0, 0.0)  # delay window after the previous step


@dataclass(frozen=True)
class FailpointPlan:
    """Arm `name` with `action` on `target`, to fire on a hit drawn from `hits`."""

    target: str
    name: str
    action: str = "crash"
    hits: tuple[int, int] = (200, 2000)


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    steps: tuple[Step, ...]
    failpoints: tuple[FailpointPlan, ...] = ()
    load_s: float = 6.0  # producers run this long from the start (faults happen inside)
    settle_s: float = 1.5  # load after the last step, before the end phase
    tags: tuple[str, ...] = field(default=())
    # A consumer process consumes while the producers produce (target
    # "consumer" in steps); the run then records every delivery.
    consume: bool = False
    # How often that consumer commits its offsets (RocketMQ's
    # persistConsumerOffsetInterval, 5 s by default).
    consumer_commit_interval_ms: int = 5_000


ACTIONS = {"kill", "stop", "start", "restart", "pause", "resume", "partition", "heal",
           "await_crash", "torn_tail", "bit_flip"}
TARGETS = {"master", "slave", "both", "consumer"}

SCENARIOS: dict[str, Scenario] = {}


def _add(s: Scenario) -> None:
    for step in s.steps:
        assert step.action in ACTIONS, step
        assert step.target in TARGETS, step
        if step.target == "consumer":
            assert s.consume and step.action in ("kill", "stop", "start"), step
    SCENARIOS[s.name] = s


_add(Scenario(
    "master-crash", "SIGKILL the master under load, restart it",
    (Step("kill", "master", (1.5, 3.0)), Step("start", "master", (0.5, 1.0))),
))
_add(Scenario(
    "master-crash-unflushed",
    "the master crashes at a failpoint right after an append, before its flush",
    (Step("await_crash", "master", (0.0, 0.0)), Step("start", "master", (0.3, 0.6))),
    failpoints=(FailpointPlan("master", "after_append_before_flush", hits=(300, 3000)),),
))
_add(Scenario(
    "master-crash-after-ship",
    "the master crashes right after shipping a range, before the slave's ack arrives",
    (Step("await_crash", "master", (0.0, 0.0)), Step("start", "master", (0.3, 0.6))),
    failpoints=(FailpointPlan("master", "after_ship_before_ack", hits=(100, 1000)),),
))
_add(Scenario(
    "slave-crash", "SIGKILL the slave under load, restart it",
    (Step("kill", "slave", (1.5, 3.0)), Step("start", "slave", (1.0, 2.0))),
))
_add(Scenario(
    "slave-pause", "SIGSTOP the slave for longer than the slave timeout, then resume",
    (Step("pause", "slave", (1.0, 2.0)), Step("resume", "slave", (3.5, 4.5))),
    load_s=7.0,
))
_add(Scenario(
    "partition", "cut the master-slave link for longer than the slave timeout, heal it",
    (Step("partition", "master", (1.0, 2.0)), Step("heal", "master", (3.5, 4.5))),
    load_s=7.0,
))
_add(Scenario(
    "clean-restart", "stop the master cleanly (SIGTERM), start it again",
    (Step("stop", "master", (1.5, 3.0)), Step("start", "master", (0.3, 0.8))),
))
_add(Scenario(
    "double-crash", "SIGKILL master and slave together, restart both",
    (Step("kill", "both", (1.5, 3.0)), Step("start", "both", (0.5, 1.0))),
))
_add(Scenario(
    "torn-tail", "SIGKILL the master, leave a torn record at its log's end, restart",
    (Step("kill", "master", (1.5, 3.0)), Step("torn_tail", "master"),
     Step("start", "master", (0.2, 0.4))),
))
_add(Scenario(
    "bit-flip", "stop the master, flip one bit inside a stored record, restart",
    (Step("stop", "master", (1.5, 3.0)), Step("bit_flip", "master"),
     Step("start", "master", (0.2, 0.4))),
))

_add(Scenario(
    "consumer-crash",
    "consume while producing; SIGKILL the consumer inside its 5 s offset-commit interval, "
    "start it again (it resumes from the last committed offset)",
    (Step("kill", "consumer", (2.0, 3.5)), Step("start", "consumer", (0.3, 0.6))),
    consume=True,
))
_add(Scenario(
    "master-crash-consuming",
    "consume while producing, committing every second; SIGKILL the master before it first "
    "persists the committed offsets (every 5 s); while it is down the consumer stops "
    "cleanly (its last commit goes to the slave); the master restarts and a new consumer "
    "asks it where to resume",
    # A running consumer keeps its offsets in memory and commits them again,
    # so the broker's lost commits show only when a consumer asks it (a
    # restart or rebalance). The clean stop commits first: every redelivery
    # here is the broker's doing, not the consumer's.
    (Step("kill", "master", (1.5, 3.0)), Step("stop", "consumer", (0.2, 0.4)),
     Step("start", "master", (0.3, 0.6)), Step("start", "consumer", (0.0, 0.2))),
    consume=True, consumer_commit_interval_ms=1_000,
))
_add(Scenario(
    "slave-crash-consuming",
    "consume while producing; SIGKILL the slave (which holds a copy of the offsets), "
    "restart it",
    (Step("kill", "slave", (2.0, 3.5)), Step("start", "slave", (0.5, 1.0))),
    consume=True,
))
# Disk faults of the fsync itself and a stalled flusher; also the scenarios
# of the known-bug corpus (chaos/bugs.py), so not in the default matrix.
_add(Scenario(
    "fsync-eio",
    "one of the master's fsyncs fails with EIO (the bytes it was to make durable are "
    "discarded, as Linux drops dirty pages after a failed writeback); SIGKILL the master "
    "later, restart it",
    (Step("kill", "master", (2.5, 3.5)), Step("start", "master", (0.5, 1.0))),
    failpoints=(FailpointPlan("master", "flush_fsync", "eio", hits=(20, 80)),),
))
_add(Scenario(
    "flusher-stall-crash-consuming",
    "consume while producing; the master's flusher stalls 2.5 s before writing what it "
    "took (still in memory under the power model), then the master is SIGKILLed; restart",
    # The stall outlasts the consumer's start (under a second), so a hit
    # early in the load is as good as a late one.
    (Step("await_crash", "master", (0.0, 0.0)), Step("start", "master", (0.3, 0.6))),
    failpoints=(FailpointPlan("master", "flush_before_write", "delay:2500+crash",
                              hits=(100, 250)),),
    consume=True,
))

DEFAULT_MATRIX = ("master-crash", "master-crash-unflushed", "master-crash-after-ship",
                  "slave-crash", "slave-pause", "partition", "clean-restart", "double-crash",
                  "torn-tail", "bit-flip", "consumer-crash", "master-crash-consuming",
                  "slave-crash-consuming")
QUICK_MATRIX = ("master-crash", "master-crash-unflushed", "clean-restart",
                "master-crash-consuming")


def get(name: str) -> Scenario:
    try:
        return SCENARIOS[name]
    except KeyError:
        raise KeyError(
            f"unknown scenario {name!r}; known: {', '.join(sorted(SCENARIOS))}"
        ) from None
