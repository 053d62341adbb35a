"""The evidence checker: every PUT_OK of a run is verified against the
positions the node answered it on (history's `evidence`, chaos/schema.py;
docs/design.md "Evidence"), whatever the run lost. A defect that lost
nothing in one run still broke a rule this shows — TigerBeetle's checkers
run beside the cluster in the same spirit.

What it verifies, for each PUT_OK row that carries evidence (the message
spans [offset, offset + size)):
- `held`: the node held the message when it answered (end <= wrote), and
  flushed <= wrote: a node reports no position beyond what it holds;
- `flush` (flush SYNC_FLUSH): flushed >= end — the flush covered it;
- `replica` (role SYNC_MASTER, classic mode): the answer names the slave
  whose ack covered it (`by`), a node of the run, whose recorded ack
  reaches end, and that ack is a real report of bytes this master gave it:
  acked <= shipped to it and acked <= the master's wrote (a report beyond
  either is one the master should not have believed, apache/rocketmq#3015
  and #3349). In controller mode the answer records the quorum it waited
  for (ha/autoswitch/acks.py: `needed` acks, from the SyncStateSet's other
  `members` under all-ack, else from any slave): at least `needed` of the
  recorded acks are from slaves of the run that count, reach end, and are
  real reports in the same sense. A quorum of none (in-sync-replicas 1, or
  a set of the master alone) promises no copy, and nothing is checked;
  whether that lost messages is the promise checkers' question;
- `backwards`: positions never go back without a recorded cause. For two
  answers A, B of one node where A completed before B was invoked (so A's
  answer was made first), B's wrote, flushed and each slave's acked are at
  least A's — unless a fault of the run on that node (or, for a slave's
  acked, on that slave) started between A's invoke and B's completion: a
  crash, a restart, a truncation.

What it does not verify: rows without evidence (results written before it
was recorded, and every answer but PUT_OK), and whether the positions
themselves are true of the disk (the loss checks, chaos/check/promises.py,
judge what the stores hold after the run). A breach is reported as a broken
promise, with its run and moment (the operation and its completion time).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from chaos.check.run_dirs import RunInfo
from chaos.schema import read_jsonl
from store.status import PutStatus


@dataclass(frozen=True)
class Breach:
    """One rule an answer broke."""

    rule: str  # held, flush, replica or backwards
    op_id: int
    msg_id: str
    node: str
    at_ms: int  # when the client got the answer (complete_ms)
    detail: str

    def line(self, started_ms: int) -> str:
        return (f"{(self.at_ms - started_ms) / 1000:8.3f} s  {self.rule:<9} op {self.op_id} "
                f"({self.msg_id}) on {self.node}: {self.detail}")


def check_answer(row: Mapping[str, Any], role: str, flush: str,
                 nodes: frozenset[str]) -> list[tuple[str, str]]:
    """The (rule, detail) pairs one PUT_OK row's evidence breaks."""
    ev = row["evidence"]
    end = int(row["offset"]) + int(row["size"])
    wrote, flushed = int(ev["wrote"]), int(ev["flushed"])
    out: list[tuple[str, str]] = []
    if end > wrote or flushed > wrote:
        out.append(("held", f"answered with wrote {wrote}, flushed {flushed} for a message "
                            f"ending at {end}"))
    if flush == "SYNC_FLUSH" and flushed < end:
        out.append(("flush", f"PUT_OK under SYNC_FLUSH with flushed {flushed} < message end "
                             f"{end}: the flush did not cover it"))
    if role == "SYNC_MASTER":
        problem = _replica_problem(ev, end, wrote, nodes)
        if problem:
            out.append(("replica", problem))
    elif role == "controller" and ev.get("quorum"):
        problem = _quorum_problem(ev, end, wrote, nodes)
        if problem:
            out.append(("replica", problem))
    return out


def _quorum_problem(ev: Mapping[str, Any], end: int, wrote: int,
                    nodes: frozenset[str]) -> str | None:
    """The controller-mode replica rule (module docstring), or None."""
    q = ev["quorum"]
    needed = int(q["needed"])
    if needed <= 0:
        return None
    members = None if q.get("members") is None else {str(m) for m in q["members"]}
    covering = sorted(
        str(a["slave"]) for a in ev.get("acks") or ()
        if str(a["slave"]) in nodes and (members is None or str(a["slave"]) in members)
        and end <= int(a["acked"]) <= min(int(a["shipped"]), wrote))
    if len(covering) >= needed:
        return None
    whose = "any slave" if members is None else f"members {sorted(members)}"
    return (f"PUT_OK in controller mode with {len(covering)} of the {needed} acks it waited "
            f"for ({whose}) covering message end {end} as real reports "
            f"(covering: {covering or 'none'})")


def _replica_problem(ev: Mapping[str, Any], end: int, wrote: int,
                     nodes: frozenset[str]) -> str | None:
    by = ev.get("by") or ""
    acks = {a["slave"]: a for a in ev.get("acks") or ()}
    if not by:
        best = max((int(a["acked"]) for a in acks.values()), default=None)
        return (f"PUT_OK under SYNC_MASTER with no slave's ack covering message end {end} "
                f"(best slave ack {best})")
    ack = acks.get(by)
    if ack is None or by not in nodes:
        return (f"PUT_OK credited to slave {by!r}, which is no slave node of the run or "
                "has no ack recorded")
    acked, shipped = int(ack["acked"]), int(ack["shipped"])
    if acked < end:
        return f"PUT_OK credited to {by}, whose ack {acked} < message end {end}"
    if acked > shipped or acked > wrote:
        return (f"PUT_OK on {by}'s ack {acked}, beyond what the master shipped it ({shipped}) "
                f"or holds ({wrote}): not a report of bytes it was given")
    return None


def _positions(row: Mapping[str, Any]) -> dict[tuple[str, str], int]:
    """(slave or "", position) -> value: the node's own positions, then each
    slave's acked."""
    ev = row["evidence"]
    out = {("", "wrote"): int(ev["wrote"]), ("", "flushed"): int(ev["flushed"])}
    for a in ev.get("acks") or ():
        out[(str(a["slave"]), "acked")] = int(a["acked"])
    return out


def check_monotonic(rows: Sequence[Mapping[str, Any]], faults: Iterable[Mapping[str, Any]]
                    ) -> list[Breach]:
    """The `backwards` rule over one node's PUT_OK rows with evidence (see
    the module docstring)."""
    node = str(rows[0]["node"]) if rows else ""
    fault_times: dict[str, list[int]] = {}
    for f in faults:
        for who in {f.get("node"), f.get("peer")} - {None}:
            fault_times.setdefault(str(who), []).append(int(f["start_ms"]))
    for times in fault_times.values():
        times.sort()

    def epoch(who: str, t_ms: int) -> int:
        # Causes on the answering node count for every position; a slave's
        # own faults also for its acked.
        own = bisect.bisect_right(fault_times.get(node, []), t_ms)
        return own if not who else own + bisect.bisect_right(fault_times.get(who, []), t_ms)

    by_complete = sorted(rows, key=lambda r: r["complete_ms"])
    # (position key, epoch at A's invoke) -> (highest value, its row) over
    # the answers completed before the current one was invoked.
    highest: dict[tuple[tuple[str, str], int], tuple[int, Mapping[str, Any]]] = {}
    done = 0
    out: list[Breach] = []
    for b in sorted(rows, key=lambda r: (r["invoke_ms"], r["op_id"])):
        while done < len(by_complete) and by_complete[done]["complete_ms"] < b["invoke_ms"]:
            a = by_complete[done]
            done += 1
            for key, value in _positions(a).items():
                slot = (key, epoch(key[0], int(a["invoke_ms"])))
                if slot not in highest or highest[slot][0] < value:
                    highest[slot] = (value, a)
        for key, value in _positions(b).items():
            prior = highest.get((key, epoch(key[0], int(b["complete_ms"]))))
            if prior is not None and prior[0] > value:
                what = f"{key[0]}'s acked" if key[0] else key[1]
                out.append(Breach("backwards", int(b["op_id"]), str(b["msg_id"]), node,
                                  int(b["complete_ms"]),
                                  f"{what} {value} after {prior[0]} (op {prior[1]['op_id']}, "
                                  "answered before it) with no fault between"))
    return out


def breaches(params: Mapping[str, Any], history: Iterable[Mapping[str, Any]],
             faults: Iterable[Mapping[str, Any]]) -> list[Breach]:
    """Every breach of the run's evidence, in the order of the answers."""
    role, flush = str(params["role"]), str(params["flush"])
    if (params.get("config") or {}).get("ha_mode") == "controller":
        # A controller-mode master waits for its quorum (ha/autoswitch/
        # acks.py), which each answer's evidence records: the replica rule
        # is judged against it, not against the role its settings make.
        role = "controller"
    nodes = frozenset(str(n["name"]) for n in params["nodes"])
    faults = list(faults)
    out: list[Breach] = []
    per_node: dict[str, list[Mapping[str, Any]]] = {}
    for row in history:
        if row["status"] != PutStatus.PUT_OK or not row.get("evidence"):
            continue
        per_node.setdefault(str(row["node"]), []).append(row)
        for rule, detail in check_answer(row, role, flush, nodes):
            out.append(Breach(rule, int(row["op_id"]), str(row["msg_id"]), str(row["node"]),
                              int(row["complete_ms"]), detail))
    for rows in per_node.values():
        out += check_monotonic(rows, faults)
    return sorted(out, key=lambda b: (b.at_ms, b.op_id, b.rule))


def counts(found: Sequence[Breach]) -> dict[str, int]:
    """Breaches per rule (every rule named, zero when none)."""
    out = dict.fromkeys(RULES, 0)
    for b in found:
        out[b.rule] += 1
    return out


RULES = ("held", "flush", "replica", "backwards")
SHOWN = 5  # breaches a run's figures name; the count has them all
COLUMNS = ("evidence_breaches", "evidence_by_rule", "first_evidence_breaches")


def run_figures(run: RunInfo, history: Sequence[Mapping[str, Any]] | None = None
                ) -> dict[str, Any]:
    """A run's breaches as its verdict figures (COLUMNS): how many, per rule,
    and the first SHOWN as lines (seconds since the run started). Reads the
    run's history unless given it."""
    rows = read_jsonl(run.history_path) if history is None else history
    found = breaches(run.params, rows, run.faults)
    started = int(run.params["started_ms"])
    return {"evidence_breaches": len(found), "evidence_by_rule": counts(found),
            "first_evidence_breaches": [b.line(started) for b in found[:SHOWN]]}
