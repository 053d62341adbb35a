"""The known-bug corpus: RocketMQ defects a node re-introduces on demand
(`--emulate BUG`, store/emulate.py), each with the scenario that exposes it
and the verdict the checker must then give.

What a corpus entry claims: with the switch, `expected` (a figure of the
run's verdict) is above zero in (nearly) every seeded run of its scenario
in its mode; without the switch it is zero in every run of the same seeds.
`dlab chaos bugs --check` measures both (docs/known-bugs.md has the
figures); tests/test_known_bugs.py does the same on fewer seeds.

How a run is judged here (`judge_run`): chaos.promises.judge for every
PUT_OK row of the history against the records read back from each node,
with the void times chaos.runs gives (the same rule the Spark pipeline's
_message_figures mirrors, per PUT_OK row as its counts are), and
chaos.consumption.run_figures for the consume side. It is the report's
checker without Spark: a run is judged in well under a second, where the
Spark job takes tens of seconds to start.

The model behind each switch (what the bug was, the real fix, what the
switch must change and must not) is docs/known-bugs-model.md; the code at
each switch point says what the real fix was.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from chaos import consumption, promises
from chaos.runs import load_run
from chaos.scenarios import get as get_scenario
from chaos.schema import read_jsonl
from chaos.workload import WorkloadConfig
from store.emulate import RMQ_2706, RMQ_3349, RMQ_8239, SWITCHES

# Figures judge_run gives; a bug's `expected` is one of them.
FIGURES = ("acked", "disk_violations", "replica_violations", "promise_violations",
           "delivered_then_lost")


@dataclass(frozen=True)
class Bug:
    id: str  # the --emulate value (store/emulate.py)
    thread: str  # the GitHub thread that reported it
    title: str
    reintroduces: str  # what the switch changes in this lab's code
    real_fix: str
    scenario: str  # chaos/scenarios.py
    role: str
    flush: str
    expected: str  # a FIGURES name: > 0 with the switch, 0 without
    verdict: str  # the expected verdict in words
    ha_ship_limit: str = "wrote"
    master_args: tuple[str, ...] = ()
    slave_args: tuple[str, ...] = ()
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)

    def run_fields(self) -> dict[str, Any]:
        """RunConfig fields of this bug's scenario (mode and tuning)."""
        return {"scenario": get_scenario(self.scenario), "role": self.role,
                "flush": self.flush, "ha_ship_limit": self.ha_ship_limit,
                "master_args": self.master_args, "slave_args": self.slave_args,
                "workload": self.workload}

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
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
)

BY_ID = {b.id: b for b in CORPUS}
assert set(BY_ID) <= set(SWITCHES), "every corpus entry needs its switch in store/emulate.py"


def get(bug_id: str) -> Bug:
    try:
        return BY_ID[bug_id]
    except KeyError:
        raise KeyError(f"unknown bug {bug_id!r}; known: {', '.join(BY_ID)}") from None


# ------------------------------------------------------------- the checker
def judge_run(run_dir: str) -> dict[str, int | None]:
    """The verdict figures of one finished run (see the module docstring)."""
    run = load_run(run_dir, 0)
    role, flush = run.params["role"], run.params["flush"]
    held = {n.name: {r["msg_id"] for r in read_jsonl(n.records_path)} for n in run.nodes}
    master, slaves = run.nodes[0], run.nodes[1:]
    out: dict[str, int | None] = {k: 0 for k in FIGURES}
    for h in read_jsonl(run.history_path):
        if h["status"] != "PUT_OK":
            continue
        inv, mid = h["invoke_ms"], h["msg_id"]
        v = promises.judge(
            role, flush, on_master=mid in held[master.name],
            on_slave=any(mid in held[s.name] for s in slaves),
            master_disk_void=inv <= master.disk_void_until_ms,
            some_slave_void=any(inv <= s.copy_void_until_ms for s in slaves))
        out["acked"] = (out["acked"] or 0) + 1
        for key, broken in (("disk_violations", v.disk is promises.Outcome.VIOLATED),
                            ("replica_violations", v.replica is promises.Outcome.VIOLATED),
                            ("promise_violations", v.violation)):
            out[key] = (out[key] or 0) + int(broken)
    consumed = consumption.run_figures(run)
    out["delivered_then_lost"] = None if consumed is None else consumed["delivered_then_lost"]
    return out


# ------------------------------------------------------------------ checks
@dataclass(frozen=True)
class CheckRun:
    bug: str
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
    judge each run. `run` executes one chaos run (chaos.run_commands.make_run
    in practice)."""
    results: list[CheckRun] = []
    for emulated in (True, False):
        side = os.path.join(out_dir, bug.id, "with" if emulated else "without")
        for seed in seeds:
            fields = {**bug.run_fields(), "seed": seed, "out_dir": side,
                      "emulate": (bug.id,) if emulated else ()}
            try:
                run_dir = run(fields)
                r = CheckRun(bug.id, emulated, seed, run_dir, judge_run(run_dir))
            except Exception as exc:  # a failed run is reported, the check goes on
                r = CheckRun(bug.id, emulated, seed, None, {},
                             error=f"{type(exc).__name__}: {exc}")
            results.append(r)
            on_run(r)
    return BugCheck(bug, tuple(results))
