"""The report's tables from the pipeline's small per-run results (pandas):
verdicts (one row per run), comparison (one row per comparison group) and
timeline (operations per run, second and status). Nothing here touches
Spark or files.

Latencies are in microseconds (to three significant digits, see
chaos.report.pipeline._three_digits; whole milliseconds for histories written
before schema_version 2). Percentiles are exact over those values, from
value counts, interpolated linearly between the two nearest ranks — the
same definition as Spark's `percentile` (and numpy's default) — so a
group's p99 is over every PUT_OK of its runs, not an average of the runs'
p99s.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from chaos.check import consumption, outage, promises, rates
from chaos.check.run_dirs import RunInfo
from chaos.report import blocks
from store.status import PutStatus

# The comparison has one row per value of these: the role x flush x
# scenario, split further only when a sweep varied the run conditions.
COMPARISON_KEYS = ("role", "flush", "ha", "scenario", "backend", "crash_model",
                   "slave_ahead_policy", "ha_ship_limit", "corruption_policy")

COUNTS = (
    "acked", "acked_lost_master", "acked_lost_everywhere", "disk_promises", "disk_void",
    "disk_violations", "replica_promises", "replica_void", "replica_violations",
    "promise_violations", "allowed_loss", "indeterminate", "indeterminate_found",
    "duplicates", "duplicate_records", "order_inversions", "divergent_records",
    "acked_distinct", "acked_stranded", "acked_lost_failover",
)

# Slave ahead of the master, at its restart (slave_ahead observations) and at
# the end of the run (the stores' ends), in bytes and in the slave's messages.
AHEAD_COLUMNS = tuple(f"slave_ahead_at_{when}_{unit}" for when in ("restart", "end")
                      for unit in ("bytes", "messages"))


# Consume-side figures (chaos.check.consumption); empty for runs without a consumer.
CONSUME_COLUMNS = consumption.COLUMNS


def percentiles(values: Any, counts: Any, ps: Sequence[float]) -> list[float | None]:
    """Exact percentiles of a multiset given as values and their counts."""
    v = np.asarray(values, dtype=float)
    c = np.asarray(counts, dtype=np.int64)
    if not len(v) or c.sum() == 0:
        return [None for _ in ps]
    order = np.argsort(v, kind="stable")
    v, cum = v[order], np.cumsum(c[order])
    out: list[float | None] = []
    for p in ps:
        pos = p * (cum[-1] - 1)
        lo, hi = int(np.floor(pos)), int(np.ceil(pos))
        v_lo = v[np.searchsorted(cum, lo, side="right")]
        v_hi = v[np.searchsorted(cum, hi, side="right")]
        out.append(float(v_lo + (pos - lo) * (v_hi - v_lo)))
    return out


def _fault_rows(group: pd.DataFrame | None) -> list[outage.FaultRow]:
    if group is None:
        return []

    def ms(v: Any) -> int | None:
        return None if v is None or pd.isna(v) else int(v)

    return [outage.FaultRow(fault_ms=int(r["fault_ms"]), put_ok_ms=ms(r["put_ok_ms"]),
                            first_failed_ms=ms(r["first_failed_ms"]),
                            load_end_ms=int(r["load_end_ms"]), puts_after=int(r["puts_after"]),
                            failed_after=int(r["failed_after"]),
                            ok_until_ms=ms(r["ok_until_ms"]))
            for r in group.to_dict("records")]


def _run_columns(run: RunInfo) -> dict[str, Any]:
    """A verdict row's columns from the run's parameters."""
    p = run.params
    return {
        "run_id": run.run_id, "role": p["role"], "flush": p["flush"], "ha": blocks.ha_label(p),
        "scenario": p["scenario"], "seed": p["seed"], "backend": p["backend"],
        "crash_model": p["crash_model"], "slave_ahead_policy": p["slave_ahead_policy"],
        "ha_ship_limit": p["ha_ship_limit"], "corruption_policy": p["corruption_policy"],
        "nodes": ",".join(n.name for n in run.nodes),
        "failpoints": json.dumps(p["failpoints"], sort_keys=True),
        "faults": ",".join(f"{x['kind']}:{x['node'] or '-'}" for x in run.faults),
        "versions": json.dumps(p["versions"], sort_keys=True),
        "started_ms": p["started_ms"], "ended_ms": p["ended_ms"],
        "duration_s": (p["ended_ms"] - p["started_ms"]) / 1000,
        "promises": promises.short(p["role"], p["flush"]),
    }


def _store_columns(run: RunInfo) -> dict[str, Any]:
    """A verdict row's columns about the run's stores: damage each holds (a
    record failing its checks before the end of data: its offset); for a
    store the run kept, the first offset where it no longer matches the
    run's read-back (chaos/check/kept_stores.py); what the verdict was
    judged from; why the stores were kept or not (--keep-stores,
    chaos/check/keep_decision.py; null for runs from before it)."""
    return {
        "disk_damage_by_node": json.dumps(
            {n.name: n.final["first_bad_offset"] for n in run.nodes
             if n.final["first_bad_offset"] is not None}),
        "store_changed_by_node": json.dumps(
            {n.name: n.store_differs_at for n in run.nodes
             if n.store_differs_at is not None}),
        "judged_from": ("kept stores" if all(n.store_dir for n in run.nodes)
                        else "read-back" if not any(n.store_dir for n in run.nodes)
                        else "kept stores and read-back"),
        "stores_kept_why": run.params.get("stores_kept_why"),
    }


def _finish_row(row: dict[str, Any], consumed: Mapping[str, int | None] | None,
                ev: Mapping[str, Any]) -> None:
    """The consume-side, derived and evidence columns, and the verdict."""
    for k in CONSUME_COLUMNS:
        v = None if consumed is None else consumed[k]
        row[k] = None if v is None else int(v)
    row["indeterminate_not_found"] = row["indeterminate"] - row["indeterminate_found"]
    row["slave_ahead"] = (row["slave_ahead_at_restart_bytes"] > 0
                          or row["slave_ahead_at_end_bytes"] > 0)
    row["evidence_breaches"] = int(ev.get("evidence_breaches", 0))
    row["evidence_by_rule"] = json.dumps(ev.get("evidence_by_rule", {}), sort_keys=True)
    row["first_evidence_breaches"] = "\n".join(ev.get("first_evidence_breaches", ()))
    row["verdict"] = ("violation" if row["promise_violations"] or row["evidence_breaches"]
                      else "stranded" if row["acked_stranded"] else "ok")


def verdicts_table(runs: Sequence[RunInfo], figures: pd.DataFrame, timeline: pd.DataFrame,
                   latency: pd.DataFrame, ahead: pd.DataFrame,
                   consume: Mapping[int, Mapping[str, int | None] | None] | None = None,
                   recovery: pd.DataFrame | None = None,
                   evidence: Mapping[int, Mapping[str, Any]] | None = None,
                   split_brain: Mapping[int, int] | None = None) -> pd.DataFrame:
    """One row per run. `figures`: the per-run counts (run, COUNTS...,
    lost_node{i}, first_divergent_offset); `timeline`: run, second, status,
    ops; `latency`: run, ms, n (PUT_OK latency counts); `ahead`: run,
    AHEAD_COLUMNS; `consume`: run -> the
    consume-side figures (chaos.check.consumption), None for a run without a
    consumer (its consume columns are then empty, not zero); `recovery`:
    run and chaos.check.outage.RECOVERY_COLUMNS per fault that can stop
    writes (availability, chaos/check/outage.py);
    `evidence`: run -> chaos.check.evidence.run_figures (absent: no breach
    found); `split_brain`: run -> its PUT_OKs answered by a node no longer
    master (chaos.check.summary.split_brain_acks; absent: none)."""
    fig = figures.set_index("run")
    failed: dict[int, dict[str, int]] = {}
    for (run_index, status), n in (timeline[timeline["status"] != PutStatus.PUT_OK]
                                   .groupby(["run", "status"])["ops"].sum().items()):
        failed.setdefault(int(run_index), {})[str(status)] = int(n)
    puts = timeline.groupby("run")["ops"].sum()
    lat = {int(r): g for r, g in latency.groupby("run")}
    rec = {int(r): g for r, g in (recovery if recovery is not None else pd.DataFrame(
        columns=["run", *outage.RECOVERY_COLUMNS])).groupby("run")}
    ahead_by = ahead.set_index("run")
    rows = []
    for run in runs:
        i = run.index
        f = fig.loc[i] if i in fig.index else None

        def count(key: str, f: Any = f) -> int:
            return 0 if f is None or pd.isna(f.get(key)) else int(f[key])

        by_status = failed.get(i, {})
        n_puts = int(puts.get(i, 0))
        g = lat.get(i)
        p50, p99 = (percentiles(g["us"], g["n"], (0.5, 0.99)) if g is not None
                    else (None, None))
        avail = outage.availability(_fault_rows(rec.get(i)))
        a = ahead_by.loc[i] if i in ahead_by.index else None
        divergent = count("divergent_records")
        row: dict[str, Any] = {
            **_run_columns(run),
            "puts": n_puts,
            **{k: count(k) for k in COUNTS},
            "failed": sum(by_status.values()),
            "failed_put_share": sum(by_status.values()) / n_puts if n_puts else 0.0,
            "failed_by_status": json.dumps(by_status, sort_keys=True),
            "acked_lost_by_node": json.dumps(
                {n.name: count(f"lost_node{n.index}") for n in run.nodes}),
            **{k: int(a[k]) if a is not None else 0 for k in AHEAD_COLUMNS},
            **_store_columns(run),
            "first_divergent_offset": (count("first_divergent_offset") if divergent
                                       else None),
            "split_brain_acks": int((split_brain or {}).get(i, 0)),
            "put_ok_p50_us": p50, "put_ok_p99_us": p99,
            # Availability per unit of time (chaos/check/outage.py): the
            # longest time from a fault to the first PUT_OK invoked after its
            # node answered again; whether some fault had none after it; the
            # time without a writable master; failed puts from the first fault.
            "fault_to_put_ok_s": avail.fault_to_put_ok_s,
            "unwritable_until_end": avail.unwritable_until_end,
            "unwritable_s": avail.unwritable_s,
            "failed_after_fault_share": avail.failed_after_fault_share,
            "failed_after_fault_per_s": avail.failed_after_fault_per_s,
            "run_dir": run.run_dir,
        }
        _finish_row(row, (consume or {}).get(i), (evidence or {}).get(i) or {})
        rows.append(row)
    df = pd.DataFrame(rows)
    df["first_divergent_offset"] = df["first_divergent_offset"].astype("Int64")
    for k in CONSUME_COLUMNS:
        df[k] = df[k].astype("Int64")
    return df.sort_values(["role", "flush", "ha", "scenario", "run_id"]).reset_index(drop=True)


def _sum_counts(column: pd.Series) -> dict[str, int]:
    total: dict[str, int] = {}
    for text in column:
        for k, v in json.loads(text).items():
            total[k] = total.get(k, 0) + int(v)
    return total


def comparison_table(verdicts: pd.DataFrame, latency: pd.DataFrame,
                     runs: Sequence[RunInfo]) -> pd.DataFrame:
    """One row per comparison group; latency percentiles over all its PUT_OKs."""
    by_id = {r.run_id: r.index for r in runs}
    rows = []
    for key, group in verdicts.groupby(list(COMPARISON_KEYS), sort=True):
        puts = int(group["puts"].sum())
        lat = latency[latency["run"].isin([by_id[r] for r in group["run_id"]])]
        lat = lat.groupby("us")["n"].sum()
        p50, p99 = percentiles(lat.index, lat.to_numpy(), (0.5, 0.99))
        rows.append({
            **dict(zip(COMPARISON_KEYS, key, strict=True)),
            "runs": len(group),
            "puts": puts,
            "acked": int(group["acked"].sum()),
            "acked_distinct": int(group["acked_distinct"].sum()),
            "acked_stranded": int(group["acked_stranded"].sum()),
            "acked_lost_master": int(group["acked_lost_master"].sum()),
            "acked_lost_everywhere": int(group["acked_lost_everywhere"].sum()),
            "acked_lost_failover": int(group["acked_lost_failover"].sum()),
            "promise_violations": int(group["promise_violations"].sum()),
            "violation_runs": int(((group["promise_violations"] > 0)
                                   | (group["evidence_breaches"] > 0)).sum()),
            "evidence_breaches": int(group["evidence_breaches"].sum()),
            "allowed_loss": int(group["allowed_loss"].sum()),
            "slave_ahead_runs": int(group["slave_ahead"].sum()),
            **{f"{k}_max": int(group[k].max()) for k in AHEAD_COLUMNS},
            "split_brain_runs": int((group["split_brain_acks"] > 0).sum()),
            "split_brain_acks": int(group["split_brain_acks"].sum()),
            "divergence_runs": int((group["divergent_records"] > 0).sum()),
            "divergent_records": int(group["divergent_records"].sum()),
            "duplicates": int(group["duplicates"].sum()),
            "indeterminate": int(group["indeterminate"].sum()),
            "indeterminate_found": int(group["indeterminate_found"].sum()),
            "order_inversions": int(group["order_inversions"].sum()),
            "put_ok_p50_us": p50,
            "put_ok_p99_us": p99,
            "failed": int(group["failed"].sum()),
            "failed_put_share": int(group["failed"].sum()) / puts if puts else 0.0,
            "failed_by_status": json.dumps(_sum_counts(group["failed_by_status"]),
                                           sort_keys=True),
            "fault_to_put_ok_s_max": group["fault_to_put_ok_s"].max(),
            "unwritable_s_mean": group["unwritable_s"].mean(),
            "unwritable_s_max": group["unwritable_s"].max(),
            "failed_after_fault_per_s_mean": group["failed_after_fault_per_s"].mean(),
            "unwritable_runs": int(group["unwritable_until_end"].sum()),
            **{k: (int(group[k].sum()) if group[k].notna().any() else None)
               for k in CONSUME_COLUMNS},
            # How many runs showed each outcome, with its interval, and the
            # spread of the counts over the runs (chaos/check/rates.py).
            **rates.group_rates(group),
        })
    df = pd.DataFrame(rows)
    for k in CONSUME_COLUMNS:
        df[k] = df[k].astype("Int64")
    return df
