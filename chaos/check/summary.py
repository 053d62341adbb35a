"""What a finished run came to, from its result directory, for the end of
`dlab chaos run` and the matrix's live output: one line a person reads at
once, and the same figures as a dict for `--json`.

Each acknowledged message is judged by chaos.check.promises.judge against the
mode's promises, as the report's Spark job judges it (chaos/report/pipeline.py:
ignored slaves, void times and stranded are the same definitions), but
from the run's own read-back only: `dlab report` reads the kept stores
again and is the verdict of record. Counts are per acknowledgement (a
message acknowledged twice counts twice), as in the report's verdicts.
Every PUT_OK's evidence is verified too (chaos.check.evidence): a breach
there is a broken promise even when the run lost nothing."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from chaos.check import consumption, evidence, failover, outage, promises
from chaos.check.run_dirs import RunInfo, load_run
from chaos.schema import SchemaError, read_jsonl
from store.status import PutStatus


@dataclass(frozen=True)
class RunOutcome:
    run_id: str
    run_dir: str
    mode: str  # "ROLE + FLUSH"
    promises: str  # disk+replica, disk, replica, none
    puts: int
    acked: int
    not_put_ok: int  # failed with a status, or INDETERMINATE
    acked_lost_master: int
    acked_lost_everywhere: int
    acked_stranded: int
    promise_violations: int
    slave_ahead_bytes: int  # largest gap seen, at a master restart or at the end
    replication: str  # how the end of the run's replication settled
    replication_stalled: bool
    backend: str = "local"  # a sim run's times are simulated (chaos/sim)
    unwritable_s: float | None = None  # time without a writable master (chaos/check/outage.py)
    faults: list[dict[str, Any]] = field(default_factory=list)  # kind, node, at_s, until_s
    consumer: dict[str, int | None] | None = None
    consumer_problem: str | None = None
    # PUT_OKs whose evidence did not cover them (chaos/check/evidence.py),
    # per rule, and the first few, each with its moment.
    evidence_breaches: int = 0
    evidence_rules: dict[str, int] = field(default_factory=dict)
    evidence_first: list[str] = field(default_factory=list)
    # After a failover (chaos/check/failover.py): PUT_OKs missing from the
    # final master that another node acknowledged, the largest replication
    # lag at their loss, and PUT_OKs answered by a node no longer master.
    acked_lost_failover: int = 0
    failover_lag_ms: int | None = None
    split_brain_acks: int = 0

    @property
    def broke_a_promise(self) -> bool:
        """A violation of the mode's promise, or an answer its own evidence
        does not support."""
        return bool(self.promise_violations or self.evidence_breaches)

    @property
    def failed_share(self) -> float:
        return self.not_put_ok / self.puts if self.puts else 0.0

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "failed_share": round(self.failed_share, 4)}


def _ignored_slaves(run: RunInfo) -> int:
    # Imported here: the pipeline module loads Spark's Python side (a second
    # or two), which only runs that end need.
    from chaos.check.slave_ahead import ignored_slaves

    return ignored_slaves(run)


def _slave_ahead_bytes(run: RunInfo) -> int:
    gaps = [o["slave_offset"] - o["master_offset"] for o in run.observations
            if o["kind"] == "slave_ahead"]
    master_end = int(run.nodes[0].final["wrote"])
    lost = failover.lost_at_end(run.faults)
    gaps += [int(s.final["wrote"]) - master_end for s in run.nodes[1:] if s.name not in lost]
    return max([0, *gaps])


def _faults(run: RunInfo) -> list[dict[str, Any]]:
    t0 = int(run.params["started_ms"])
    return [{"kind": f["kind"], "node": f["node"], "peer": f["peer"],
             "at_s": round((f["start_ms"] - t0) / 1000, 3),
             "until_s": None if f["end_ms"] is None else round((f["end_ms"] - t0) / 1000, 3),
             "detail": f["detail"]} for f in run.faults]


def acker_index(run: RunInfo, node: str) -> int:
    """The index of the node a history row names (0, the master, when it
    names none of the run's nodes: an address)."""
    found = run.node(node)
    return 0 if found is None else found.index


def judge_run_acks(run: RunInfo, history: Sequence[dict[str, Any]],
                   held: list[set[str]] | None = None) -> dict[str, int]:
    """The verdict figures of the run's PUT_OKs (chaos.check.promises.judge_acks)
    against the records its nodes' read-backs hold."""
    if held is None:
        held = held_ids(run)
    acks = [promises.Ack(h["msg_id"], h["invoke_ms"], acker_index(run, h["node"]))
            for h in history if h["status"] == PutStatus.PUT_OK]
    return promises.judge_acks(
        run.params["role"], run.params["flush"], acks, held,
        disk_void_until_ms=[n.disk_void_until_ms for n in run.nodes],
        copy_void_until_ms=[n.copy_void_until_ms for n in run.nodes],
        ignored_mask=_ignored_slaves(run),
        lost_mask=failover.lost_mask([n.name for n in run.nodes], run.faults))


def held_ids(run: RunInfo) -> list[set[str]]:
    """Per node, the message ids its read-back holds."""
    return [{r["msg_id"] for r in read_jsonl(n.records_path) if r["msg_id"]}
            for n in run.nodes]


def route(run: RunInfo) -> list[tuple[int, str | None]]:
    """Who the run's route named as master when (chaos.check.failover)."""
    first = str(run.params.get("first_master") or run.nodes[0].name)
    return failover.route_changes(run.faults, first)


def split_brain_acks(run: RunInfo, history: Sequence[Mapping[str, Any]]) -> int:
    """The run's PUT_OKs answered by a node the route no longer named as
    master (chaos.check.failover.split_brain_acks); 0 without a failover.
    The run summary and the report (chaos/report/pipeline.py) both count
    them here."""
    if not failover.failed_over(run.faults):
        return 0
    return failover.split_brain_acks(history, route(run), PutStatus.PUT_OK)


def failover_fields(run: RunInfo, history: Sequence[dict[str, Any]],
                    held: list[set[str]]) -> dict[str, Any]:
    """RunOutcome's failover figures (chaos.check.failover)."""
    if not failover.failed_over(run.faults):
        return {}
    changes = route(run)
    final = run.nodes[0].name
    firsts: dict[str, dict[str, Any]] = {}
    for h in history:
        if h["status"] == PutStatus.PUT_OK:
            firsts.setdefault(h["msg_id"], h)
    lost = [(h["node"], int(h["invoke_ms"])) for h in firsts.values()
            if h["node"] != final and h["msg_id"] not in held[0]]
    return {"split_brain_acks": split_brain_acks(run, history),
            "failover_lag_ms": failover.failover_lag_ms(run.faults, changes, lost)}


def run_outcome(run_dir: str) -> RunOutcome:
    """Judge one run from its directory; raises SchemaError for a malformed one."""
    run = load_run(run_dir, 0)
    role, flush = run.params["role"], run.params["flush"]
    history = read_jsonl(run.history_path)
    held = held_ids(run)
    figures = judge_run_acks(run, history, held)
    acked = figures["acked"]
    settle = [o["detail"] for o in run.observations if o["kind"] == "settle"]
    replication = str(settle[-1]) if settle else "not recorded"
    consumer: dict[str, int | None] | None = None
    problem = None
    try:
        consumer = consumption.run_figures(run)
    except (SchemaError, ValueError, OSError) as exc:  # the report names it in full
        problem = str(exc)
    return RunOutcome(
        run_id=run.run_id, run_dir=run.run_dir, mode=f"{role} + {flush}",
        promises=promises.short(role, flush), puts=len(history),
        acked=acked, not_put_ok=len(history) - acked,
        acked_lost_master=figures["acked_lost_master"],
        acked_lost_everywhere=figures["acked_lost_everywhere"],
        acked_stranded=figures["acked_stranded"],
        promise_violations=figures["promise_violations"], slave_ahead_bytes=_slave_ahead_bytes(run),
        replication=replication, replication_stalled=replication != "replication settled",
        backend=run.params["backend"],
        unwritable_s=outage.availability(
            outage.fault_rows(run.faults, history, PutStatus.PUT_OK)).unwritable_s,
        faults=_faults(run), consumer=consumer, consumer_problem=problem,
        acked_lost_failover=figures["acked_lost_failover"],
        **failover_fields(run, history, held), **_evidence_fields(run, history))


def _evidence_fields(run: RunInfo, history: Sequence[dict[str, Any]]) -> dict[str, Any]:
    figures = evidence.run_figures(run, history)
    return {"evidence_breaches": figures["evidence_breaches"],
            "evidence_rules": figures["evidence_by_rule"],
            "evidence_first": figures["first_evidence_breaches"]}


def outcome_line(o: RunOutcome) -> str:
    """The outcome in one line: losses and violations first, then the slave
    ahead, the failed share and how replication ended."""
    parts = [f"{o.acked} of {o.puts} puts acked",
             f"{o.acked_lost_master} acked lost on the master",
             f"{o.acked_lost_everywhere} lost everywhere",
             f"{o.acked_stranded} stranded",
             f"{o.promise_violations} promise violation{'' if o.promise_violations == 1 else 's'}"
             f" ({o.promises} promised)"]
    if o.evidence_breaches:
        rules = ", ".join(f"{n} {rule}" for rule, n in o.evidence_rules.items() if n)
        parts.append(f"{o.evidence_breaches} PUT_OK{'' if o.evidence_breaches == 1 else 's'} "
                     f"not covered by their evidence ({rules})")
    if o.acked_lost_failover or o.split_brain_acks:
        lag = "" if o.failover_lag_ms is None else f", lag {o.failover_lag_ms} ms at the loss"
        parts.append(f"{o.acked_lost_failover} acked lost by failover{lag}, "
                     f"{o.split_brain_acks} acked by a node no longer master")
    if o.slave_ahead_bytes:
        parts.append(f"slave {o.slave_ahead_bytes:,} bytes ahead")
    parts.append(f"{100 * o.failed_share:.1f} % of puts failed")
    if o.unwritable_s:
        parts.append(f"no writable master for {o.unwritable_s:.3f} {seconds(o)}")
    parts.append(f"replication stalled ({o.replication})" if o.replication_stalled
                 else o.replication)
    if o.consumer is not None:
        never = o.consumer["stored_never_delivered"]
        parts.append(f"consumer: {o.consumer['delivered']} delivered, "
                     f"{o.consumer['duplicates_delivered']} duplicates, "
                     f"{'?' if never is None else never} stored never delivered, "
                     f"{o.consumer['delivered_then_lost']} delivered then lost")
    elif o.consumer_problem:
        parts.append(f"consumer files unreadable ({o.consumer_problem})")
    return ", ".join(parts)


def seconds(o: RunOutcome) -> str:
    """The unit of the run's times: a sim run's are simulated."""
    return "simulated s" if o.backend == "sim" else "s"


def faults_heading(o: RunOutcome) -> str:
    sim = "simulated " if o.backend == "sim" else ""
    return f"faults ({sim}seconds since the run started):"


def fault_lines(faults: Sequence[dict[str, Any]]) -> list[str]:
    """One line per fault: seconds since the run started, what, on which node."""
    lines = []
    for f in faults:
        span = f"{f['at_s']:7.3f} s" + (f" .. {f['until_s']:.3f} s"
                                        if f["until_s"] not in (None, f["at_s"]) else "")
        who = (f["node"] or "") + (f" <-> {f['peer']}" if f["peer"] else "")
        lines.append(f"  {span:<22} {f['kind']:<11} {who}"
                     + (f"  ({f['detail']})" if f["detail"] else ""))
    return lines


def one_line(run_dir: str) -> str:
    return outcome_line(run_outcome(run_dir))
