"""The durability checker and report as one Spark job over any number of run
directories (chaos/schema.py): `build_report(run_dirs, out_dir)`.

1. runs    chaos/check/run_dirs.py reads the small files of every run in Python and
           leaves out (as a Problem) any run that breaks the schema; a run
           that kept its nodes' stores has them read again
           (chaos/check/kept_stores.py), and is judged from what they hold now.
2. query   ONE Spark query. Every history.jsonl and nodes/*/records.jsonl is
           parsed once with the declared schema; each row is tagged with its
           run (and node) by file and flagged if malformed; both tables are
           shuffled by run once. Every figure below groups by run (and
           more), so each is a branch that reads that same shuffle (Spark
           reuses the exchange) and none shuffles the large tables again;
           the branches' small results come back in one collect, each row
           a JSON payload tagged with its branch:
           - messages: per (run, msg_id), history and record rows together:
             which nodes hold it (a bit per node), copies, its acks by
             whether the scenario voided the master's disk / a slave's copy
             when it was invoked. Per message its acks are judged by
             chaos.check.promises.judge, looked up in the table of its answers
             (promises.JUDGE_TABLE), then summed per run; order is checked over the messages of a
             producer. The acknowledged messages missing from the master
             ride along by name (the first LOST_IDS_MAX per run: lost.csv).
           - divergence: per (run, offset), each node's record (size, CRC,
             id hash, whole-record hash), compared on the master's and each
             slave's common range; also the malformed record rows per node, and, in
             the pass over records that finds each node's range, the
             slave's records inside each measured slave_ahead gap.
           - timeline: operations per run, second since its start and status
             with latency percentiles (µs); also the malformed history rows.
           - latency: PUT_OK latency value counts per run, in µs to three
             significant digits (percentiles for runs and comparison
             groups, chaos/report/tables.py).
           - recovery: per fault that can stop writes, the first PUT_OK
             invoked after its node answered again, and the failed puts
             after it (availability, chaos/check/outage.py).
3. check   a run with a malformed row is left out; Python names the file,
           line and field (chaos.check.run_dirs.first_row_problem). Its figures were
           computed from its good rows and are dropped.
4. tables  chaos/report/tables.py builds verdicts, comparison and timeline, and
           lost_table the lost ids (CSV and Parquet); chaos/report/document.py writes
           report.md, report.html and the plots, chaos/report/run_pages.py a page
           per run.

Speed: a report of a few runs is one short-lived JVM, so below
SMALL_INPUT_BYTES (chaos/report/inputs.py) the JVM runs its quick compiler
only and the query runs without whole-stage code generation and adaptive
re-planning (compiling and re-planning a dozen stages cost more than running
them on a few MB).

Definitions not in chaos/check/promises.py:
- duplicates: message ids stored at more than one offset on some node;
  duplicate_records: the extra copies, over all nodes.
- order_inversions: acknowledged messages held by the master at a lower
  offset than the same producer's previous acknowledged message (by op_id)
  held there, when that one completed before this one was invoked. A
  message acknowledged twice is placed by its first acknowledgement.
- slave ahead at restart: per slave_ahead observation, bytes =
  slave_offset - master_offset when positive; messages = the slave's
  records (read back after the run) at offsets in [master_offset,
  slave_offset) — a `truncate` slave no longer holds them, so bytes are the
  measure there. Slave ahead at end: the same for each slave whose end of
  data after the run is past the master's.
- ignored slaves: slaves found ahead of the master (at its restart or at
  the end) under the reject or trust policy: the master refuses them, or
  believes their offset and never looks at what they hold past its own.
  A message acknowledged, missing from the master and held only by such
  slaves is stranded (chaos/check/promises.py).
- divergence: on the offsets both the master and a slave hold (from the
  larger of their first offsets to the smaller of their ends), a master
  record the slave does not hold byte for byte at the same offset (whole
  record hash; id, size and body CRC for read-backs without the hash) —
  which covers offsets a restarted master reused for different records.
  Counted once per master record, however many slaves differ.
- acked_distinct: message ids with at least one PUT_OK (`acked` counts
  PUT_OK rows: a retry acknowledged twice counts twice there).
- evidence_breaches: PUT_OKs whose recorded evidence does not cover them
  (chaos/check/evidence.py, in Python per run, not in Spark); a run with
  one is a violation even when it lost nothing.
- split_brain_acks: PUT_OKs answered by a node the run's route no longer
  named as master at the answer (chaos/check/failover.py, in Python per
  run over the history the evidence rule reads; 0 without a failover).
- first_divergent_offset: the offset of the first divergent record of a
  run (the divergence rule's, chaos/check/divergence.py); null when none.
  After a failover the master is the node serving as master at the end,
  so this is where another node's log (an old master's, typically) parts
  from the new master's.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.window import Window

from chaos.check import (
    consumption,
    divergence,
    evidence,
    failover,
    kept_stores,
    matrix_plan,
    outage,
    promises,
    slave_ahead,
    summary,
)
from chaos.check.run_dirs import (
    NEVER_MS,
    Problem,
    RunInfo,
    find_run_dirs,
    first_row_problem,
    load_runs,
)
from chaos.report import answer, tables
from chaos.report import document as report
from chaos.report.inputs import SMALL_INPUT_BYTES, inputs
from chaos.report.progress import Progress, QuietProgress
from chaos.schema import CONSUMER_NODE, read_jsonl
from chaos.spark_session import spark_session
from store.status import INDETERMINATE, PutStatus

SPARK_LOG = "spark.log"
_LONG = T.LongType()
LOST_IDS_MAX = 1000  # lost message ids named per run (lost.csv, the run pages)


def _latency_us() -> Column:
    """The history's µs times, or its ms times for results written before them."""
    return F.coalesce(F.col("complete_us") - F.col("invoke_us"),
                      (F.col("complete_ms") - F.col("invoke_ms")) * 1000)


class NoRunsError(ValueError):
    """No run could be reported; `problems` says why for each."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems = list(problems)
        first = f": {self.problems[0]}" if self.problems else ""
        super().__init__(f"no run could be reported ({len(self.problems)} with problems)"
                         f"{first}")


@dataclass
class ReportSummary:
    out_dir: str
    runs: int
    problems: list[Problem]
    verdicts: pd.DataFrame
    comparison: pd.DataFrame
    timeline: pd.DataFrame
    files: list[str] = field(default_factory=list)
    # Per matrix plan found with the runs: the planned runs not among them.
    coverage: list[matrix_plan.PlanCoverage] = field(default_factory=list)

    @property
    def missing(self) -> int:
        return sum(len(c.missing) for c in self.coverage)

    @property
    def violations(self) -> int:
        return int(self.verdicts["promise_violations"].sum())


def _runs_table(spark: SparkSession, runs: Sequence[RunInfo]) -> DataFrame:
    """Per run, what the Spark side needs to judge its messages (broadcast)."""
    rows = []
    for run in runs:
        # A node lost for good is no slave (chaos/check/promises.py, failover).
        lost = failover.lost_mask([n.name for n in run.nodes], run.faults)
        slave_mask = ((1 << len(run.nodes)) - 2) & ~lost
        ignored = slave_ahead.ignored_slaves(run)
        disk_until = [n.disk_void_until_ms for n in run.nodes]
        copy_until = [n.copy_void_until_ms for n in run.nodes]
        rows.append((
            run.index, len(run.nodes), slave_mask, ignored, slave_mask & ~ignored,
            promises.MODES.index((run.params["role"], run.params["flush"])),
            disk_until, copy_until, any(t > NEVER_MS for t in disk_until + copy_until),
            run.params["started_ms"], [n.name for n in run.nodes],
        ))
    return F.broadcast(spark.createDataFrame(rows, (
        "run int, n_nodes int, slave_mask long, ignored_mask long, served_mask long, "
        "mode int, disk_void_until array<long>, copy_void_until array<long>, "
        "any_void boolean, started_ms long, names array<string>")))


def _void_categories(history: DataFrame, runs_df: DataFrame, max_nodes: int) -> DataFrame:
    """History rows with `acker` (the index of the node the row names; 0
    when it names none) and `cat`: for a PUT_OK, 2 * (the acker's disk
    promise is void for it) + (the copy of some node other than the acker
    is void for it); null otherwise."""
    # Runs without any void skip the test. Unrolled over max_nodes rather
    # than a lambda over the run's nodes: Spark interprets higher-order
    # functions row by row.
    acker = F.greatest(F.array_position(F.col("names"), F.col("acker_name")) - 1, F.lit(0))
    invoke = F.col("invoke_ms")
    disk_void = F.col("any_void") & (invoke <= F.element_at(F.col("disk_void_until"),
                                                            (acker + 1).cast("int")))
    slave_void = F.col("any_void") & F.greatest(F.lit(False), *[
        (F.lit(i) < F.col("n_nodes")) & (acker != i)
        & (invoke <= F.col("copy_void_until")[i]) for i in range(max_nodes)])
    return history.join(runs_df.select("run", "n_nodes", "disk_void_until", "copy_void_until",
                                       "any_void", "names"), "run") \
        .withColumn("acker", acker) \
        .withColumn("cat", F.when(F.col("status") == PutStatus.PUT_OK,
                                  F.coalesce(disk_void, F.lit(False)).cast("int") * 2
                                  + F.coalesce(slave_void, F.lit(False)).cast("int")))


def _message_figures(history: DataFrame, records: DataFrame, runs_df: DataFrame,
                     max_nodes: int) -> DataFrame:
    """Per run: acknowledged messages judged against the mode's promises,
    losses, indeterminate outcomes, duplicates, order."""
    # Malformed rows take part as rows that count nothing (see _inputs).
    good = ~F.col("bad")
    ok = good & (F.col("status") == PutStatus.PUT_OK)
    h = _void_categories(history, runs_df, max_nodes).select(
        "run", "msg_id", F.lit(None).cast("int").alias("node"),
        F.lit(None).cast(_LONG).alias("offset"), F.when(good, F.col("status")).alias("status"),
        F.when(ok, F.col("cat")).alias("cat"), F.when(ok, F.col("op_id")).alias("ok_op"),
        "producer", "invoke_ms", "complete_ms", F.when(ok, F.col("offset")).alias("ok_offset"),
        "acker")
    r = records.select(
        "run", "msg_id", F.when(good & F.col("msg_id").isNotNull(), F.col("node")).alias("node"),
        "offset", F.lit(None).cast("string").alias("status"),
        F.lit(None).cast("int").alias("cat"), F.lit(None).cast(_LONG).alias("ok_op"),
        F.lit(None).cast(_LONG).alias("producer"), F.lit(None).cast(_LONG).alias("invoke_ms"),
        F.lit(None).cast(_LONG).alias("complete_ms"), F.lit(None).cast(_LONG).alias("ok_offset"),
        F.lit(None).cast("int").alias("acker"))
    cat = F.col("cat")
    msgs = h.unionByName(r).groupBy("run", "msg_id").agg(
        F.coalesce(F.bit_or(F.expr("shiftleft(1L, node)")), F.lit(0).cast(_LONG)).alias("held"),
        F.count("node").alias("copies"),
        F.min(F.when(F.col("node") == 0, F.col("offset"))).alias("master_offset"),
        *[F.count_if(cat == k).alias(f"c{k}") for k in range(4)],
        F.count_if(F.col("status") == INDETERMINATE).alias("n_indet"),
        F.min("ok_op").alias("first_ok_op"),
        *[F.min_by(c, "ok_op").alias(c) for c in ("producer", "invoke_ms", "complete_ms",
                                                   "ok_offset", "acker")],
    ).join(runs_df.select("run", "n_nodes", "slave_mask", "ignored_mask", "served_mask",
                          "mode"), "run")

    # Each message's acks judged by promises.judge: looked up in its table,
    # per void category c{2 * master_disk_void + some_slave_void}, the key's
    # two lowest bits (promises.judge_key packs JUDGE_INPUTS in this order).
    held = F.col("held")
    n_ok = sum((F.col(f"c{k}") for k in range(4)), F.lit(0).cast(_LONG))
    on_master = held.bitwiseAND(1) != 0
    on_slave = held.bitwiseAND(F.col("slave_mask")) != 0
    only_on_rejected = held.bitwiseAND(F.col("served_mask")) == 0
    # The first PUT_OK's acker (chaos/check/promises.py, after a failover).
    by_failover = F.coalesce(F.col("acker"), F.lit(0)) != 0
    on_acker = F.expr("shiftright(held, coalesce(acker, 0)) & 1") != 0
    on_replica = F.expr("held & ~shiftleft(1L, coalesce(acker, 0))") != 0
    base = F.col("mode")
    for bit in (on_master, on_slave, only_on_rejected, by_failover, on_acker, on_replica):
        base = base * 2 + bit.cast("int")
    assert promises.JUDGE_INPUTS == ("on_master", "on_slave", "only_on_rejected", "by_failover",
                                     "on_acker", "on_replica", "master_disk_void",
                                     "some_slave_void")

    def judged(figure: str) -> Column:
        table = F.array(*[F.lit(v) for v in promises.JUDGE_TABLE[figure]])
        return sum((F.col(f"c{k}") * F.element_at(table, base * 4 + k + 1)
                    for k in range(4)), F.lit(0).cast(_LONG)).alias(figure)

    msgs = msgs.select("*", *[judged(f) for f in promises.ACK_FIGURES])
    present = F.bit_count(held)

    def if_(cond: Column, value: Column) -> Column:
        return F.when(cond, value).otherwise(0)

    # Order, over the messages acknowledged and held by the master.
    placed = (n_ok > 0) & on_master
    by_producer = (Window.partitionBy("run", "producer").orderBy("first_ok_op")
                   .rowsBetween(Window.unboundedPreceding, -1))
    prev = F.last(F.when(placed, F.struct("complete_ms", "master_offset")),
                  ignorenulls=True).over(by_producer)
    inversion = placed & (F.col("prev.complete_ms") <= F.col("invoke_ms")) \
        & (F.col("master_offset") < F.col("prev.master_offset"))

    # The acknowledged messages missing from the master, by name: the first
    # LOST_IDS_MAX per run in offset order (the counts above are exact).
    lost = F.when((n_ok > 0) & ~on_master, F.struct(
        F.col("ok_offset").alias("offset"), F.col("msg_id"), held.alias("held"),
        (F.col("acked_stranded") > 0).alias("stranded"),
        (F.col("promise_violations") > 0).alias("violation")))
    return msgs.withColumn("prev", prev).groupBy("run").agg(
        F.slice(F.sort_array(F.collect_list(lost)), 1, LOST_IDS_MAX).alias("lost_ids"),
        F.sum(n_ok).alias("acked"),
        F.count_if(n_ok > 0).alias("acked_distinct"),
        *[F.sum(f).alias(f) for f in ("acked_stranded", "acked_lost_master",
                                      "acked_lost_everywhere", "acked_lost_failover")],
        *[F.sum(if_((F.lit(i) < F.col("n_nodes")) & (F.shiftright(held, i).bitwiseAND(1) == 0),
                    n_ok)).alias(f"lost_node{i}") for i in range(max_nodes)],
        *[F.sum(f).alias(f) for f in ("disk_promises", "disk_void", "disk_violations",
                                      "replica_promises", "replica_void",
                                      "replica_violations", "promise_violations",
                                      "allowed_loss")],
        F.sum("n_indet").alias("indeterminate"),
        F.sum(if_(held != 0, F.col("n_indet"))).alias("indeterminate_found"),
        F.count_if(F.col("copies") > present).alias("duplicates"),
        F.sum(F.col("copies") - present).alias("duplicate_records"),
        F.count_if(F.coalesce(inversion, F.lit(False))).alias("order_inversions"),
    )


def _divergence(records: DataFrame, max_nodes: int, ahead: DataFrame | None = None
                ) -> DataFrame:
    """Per run: malformed rows per node; and with `ahead` (slave_ahead.ahead_table), `ahead{k}`: the
    slave's records inside the gap of the run's k-th slave_ahead observation."""
    good = ~F.col("bad")
    node = F.col("node")
    # The gap counts ride on the pass that counts each node's malformed
    # rows: a branch of their own would read the whole records exchange again.
    per_run, ahead_counts = records, []
    if ahead is not None:
        per_run = records.join(ahead, "run", "left")
        slots = sum(1 for c in ahead.columns if c.startswith("node_"))
        offset = F.col("offset")
        ahead_counts = [F.count_if(F.coalesce(
            good & (node == F.col(f"node_{k}")) & (offset >= F.col(f"lo_{k}"))
            & (offset < F.col(f"hi_{k}")), F.lit(False))).alias(f"ahead{k}")
            for k in range(slots)]
    return per_run.groupBy("run").agg(
        *[F.count_if(~good & (node == i)).alias(f"bad{i}") for i in range(max_nodes)],
        *ahead_counts)


def _divergent(records: DataFrame) -> DataFrame:
    """Per run: its divergent records and the first one's offset, by the
    rule of chaos/check/divergence.py run on the run's records (grouped by
    run, as the input exchange already is). A branch of its own, merged
    with _divergence's by run after the query: a join here would shuffle
    the rule's output again."""
    return records.select("run", "node", "offset", "size", "body_crc", "msg_id",
                          "record_hash", "bad").groupBy("run").applyInPandas(
        divergence.divergence_group, divergence.FRAME_SCHEMA)


def _timeline(history: DataFrame, runs_df: DataFrame) -> DataFrame:
    """Operations per run, second since the run's start (by invoke time) and
    status, with latency percentiles; malformed rows counted in `bad`."""
    good = ~F.col("bad")
    latency = _three_digits(_latency_us())
    second = F.floor((F.col("invoke_ms") - F.col("started_ms")) / 1000).cast("long")
    # Latency value counts first (a compiled hash aggregation), then the
    # percentiles weighted by them: percentile keeps value counts anyway,
    # so the result is the same, but fed every row it is an object
    # aggregation that falls back to sorting all rows (over 128 groups).
    counts = (history.join(runs_df.select("run", "started_ms"), "run")
              .groupBy("run", second.alias("second"), "status", "bad",
                       F.when(good, latency).alias("latency"))
              .agg(F.count("*").alias("n")))
    n = F.col("n")
    return counts.groupBy("run", "second", "status").agg(
        F.sum(F.when(good, n).otherwise(0)).alias("ops"),
        F.sum(F.when(good, 0).otherwise(n)).alias("bad"),
        F.percentile("latency", [0.5, 0.99], n).alias("us"))


def _three_digits(us: Column) -> Column:
    """A latency in µs to three significant digits (exact below 1 ms), so
    value counts stay few per run: percentiles are within 0.5 %."""
    scale = F.pow(F.lit(10.0), F.floor(F.log10(us)) - 2)
    return F.when(us < 1000, us).otherwise(F.round(us / scale) * scale).cast(_LONG)


def _latency(history: DataFrame) -> DataFrame:
    """PUT_OK latency value counts per run, in µs (other rows under us null)."""
    ok = ~F.col("bad") & (F.col("status") == PutStatus.PUT_OK)
    return (history.groupBy("run", F.when(ok, _three_digits(_latency_us())).alias("us"))
            .agg(F.count("*").alias("n")))


def _fault_table(spark: SparkSession, runs: Sequence[RunInfo]) -> DataFrame | None:
    """Every fault that can stop writes (not its ending step, not the
    consumer's), as (run, fault_id, fault_ms, answered_ms: when its node
    answered again, lasting: a partition or pause, chaos/check/outage.py),
    broadcast; None if none."""
    rows = [(run.index, int(f["fault_id"]), int(f["start_ms"]),
             outage.answered_ms(run.faults, i), f["kind"] in outage.LASTING)
            for run in runs for i, f in enumerate(run.faults)
            if f["kind"] not in outage.ENDING and f["node"] != CONSUMER_NODE]
    if not rows:
        return None
    # Not null: see chaos/report/inputs.py _read_large.
    return F.broadcast(spark.createDataFrame(
        rows, "run int not null, fault_id long not null, fault_ms long not null, "
        "answered_ms long, lasting boolean not null"))


def _recovery(history: DataFrame, faults: DataFrame) -> DataFrame:
    """Per fault (chaos.check.outage.FaultRow): the first PUT_OK invoked
    after its node answered again, as its complete time (null if none came
    or the node never answered); the first failed put invoked at or after
    the fault; the run's last answer; the puts invoked from the fault on
    and how many failed; the last PUT_OK invoked from the fault on before
    that first failure. A partition's or pause's recovery may also be the
    first PUT_OK invoked after that first failure (writes resumed during
    it)."""
    good = ~F.col("bad")
    ok = good & (F.col("status") == PutStatus.PUT_OK)
    after = good & (F.col("invoke_ms") >= F.col("fault_ms"))
    failed_after = after & (F.col("status") != PutStatus.PUT_OK)
    recovered = ok & (F.col("invoke_ms") > F.col("answered_ms"))
    first_failed = F.min(F.when(failed_after, F.col("invoke_ms"))).over(
        Window.partitionBy("run", "fault_id"))
    ok_until = ok & after & (F.col("invoke_ms") < F.col("first_failed_w"))
    resumed = ok & F.col("lasting") & (F.col("invoke_ms") > F.col("first_failed_w"))
    return (history.join(faults, "run").withColumn("first_failed_w", first_failed)
            .groupBy("run", "fault_id", "fault_ms").agg(
                F.least(F.min(F.when(recovered, F.col("complete_ms"))),
                        F.min(F.when(resumed, F.col("complete_ms")))).alias("put_ok_ms"),
                F.min(F.when(failed_after, F.col("invoke_ms"))).alias("first_failed_ms"),
                F.max(F.when(good, F.col("complete_ms"))).alias("load_end_ms"),
                F.count(F.when(after, 1)).alias("puts_after"),
                F.count(F.when(failed_after, 1)).alias("failed_after"),
                F.max(F.when(ok_until, F.col("invoke_ms"))).alias("ok_until_ms")))


def checker_query(spark: SparkSession, runs: Sequence[RunInfo]
                  ) -> tuple[DataFrame, dict[str, list[str]], list[slave_ahead.Observation]]:
    """The one Spark query: a row per result of every branch, as (kind,
    payload JSON); the columns of each branch; the slave_ahead observations
    it counted against."""
    # Arithmetic on a malformed value must not fail the whole report; the
    # run it belongs to is left out anyway.
    spark.conf.set("spark.sql.ansi.enabled", "false")
    # One exchange per input for all branches (see _inputs).
    spark.conf.set("spark.sql.optimizer.nestedSchemaPruning.enabled", "false")
    # Joins and groupings by (run, ...) reuse the partitioning by run.
    spark.conf.set("spark.sql.requireAllClusterKeysForCoPartition", "false")
    history, records = inputs(spark, runs)
    runs_df = _runs_table(spark, runs)
    max_nodes = max(len(r.nodes) for r in runs)
    obs = slave_ahead.ahead_observations(runs)
    branches = {
        "messages": _message_figures(history, records, runs_df, max_nodes),
        "divergent": _divergent(records),
        "divergence": _divergence(records, max_nodes,
                                  slave_ahead.ahead_table(spark, obs) if obs else None),
        "timeline": _timeline(history, runs_df),
        "latency": _latency(history),
    }
    faults = _fault_table(spark, runs)
    if faults is not None:
        branches["recovery"] = _recovery(history, faults)
    tagged = [
        df.select(F.lit(kind).alias("kind"),
                  F.to_json(F.struct(*df.columns), {"ignoreNullFields": "false"})
                  .alias("payload"))
        for kind, df in branches.items()
    ]
    union = tagged[0]
    for df in tagged[1:]:
        union = union.unionByName(df)
    return union, {kind: df.columns for kind, df in branches.items()}, obs


def _run_query(spark: SparkSession, runs: Sequence[RunInfo]) -> dict[str, pd.DataFrame]:
    """The query's results as pandas, by branch."""
    union, columns, obs = checker_query(spark, runs)
    rows: dict[str, list[dict[str, Any]]] = {kind: [] for kind in columns}
    for row in union.collect():
        rows[row.kind].append(json.loads(row.payload))
    out = {kind: pd.DataFrame(rows[kind], columns=columns[kind]) for kind in columns}
    if "recovery" not in out:
        out["recovery"] = pd.DataFrame(columns=["run", "fault_id", *outage.RECOVERY_COLUMNS])
    divergent = out.pop("divergent")
    merged = out["divergence"].merge(divergent, on="run", how="left")
    merged["divergent_records"] = merged["divergent_records"].fillna(0).astype("int64")
    out["divergence"] = merged[["run", "divergent_records", "first_divergent_offset",
                                *[c for c in out["divergence"].columns if c != "run"]]]
    out["slave_ahead"] = slave_ahead.ahead_messages(out["divergence"], obs)
    out["divergence"] = out["divergence"].drop(
        columns=[c for c in columns["divergence"] if c.startswith("ahead")])
    out["slave_ahead_obs"] = pd.DataFrame(obs, columns=["run", "obs", "node", "lo", "hi",
                                                         "at_end"])
    for df in out.values():  # an empty branch has no types to infer
        df["run"] = df["run"].astype("int64")
    out["slave_ahead"] = out["slave_ahead"].astype("int64")
    return out


def build_report(
    run_dirs: Sequence[str],
    out_dir: str,
    spark_master: str | None = None,
    progress: Progress | None = None,
) -> ReportSummary:
    """Check and compare the runs under `run_dirs` (run directories, or
    directories holding them) and write the tables, report and plots to
    `out_dir`. Malformed runs are left out and listed in the report; raises
    NoRunsError when none is left, FileNotFoundError for a path that holds
    no run."""
    progress = progress or QuietProgress()
    dirs = find_run_dirs(run_dirs)
    plans, unread = matrix_plan.find_plans(run_dirs)
    for message in unread:
        progress.step(f"{message}; whether that matrix is complete is not known")
    coverage = matrix_plan.coverage(plans, dirs)
    progress.step(f"reading {len(dirs)} run director{'y' if len(dirs) == 1 else 'ies'}")
    with progress.items(len(dirs), "runs") as tick:
        runs, problems = load_runs(dirs, tick)
    for p in problems:
        progress.step(f"left out: {p}")
    if not runs:
        raise NoRunsError(problems)
    os.makedirs(out_dir, exist_ok=True)
    # The kept stores' records, for Spark to read in place of the read-backs;
    # under out_dir, on a filesystem the driver sees (chaos.spark_session).
    with tempfile.TemporaryDirectory(prefix=".kept-stores-", dir=out_dir) as work:
        progress.step("reading the kept stores again")
        with progress.items(len(runs), "runs") as tick:
            runs, reread_problems = kept_stores.reread(runs, work, tick)
        for p in reread_problems:
            progress.step(f"left out: {p}")
        for run in runs:
            for node in run.nodes:
                if node.store_differs_at is not None:
                    progress.step(f"{run.run_dir}: {node.name}'s kept store differs from the "
                                  f"run's read-back from offset {node.store_differs_at:,}; "
                                  "judged from the store")
        problems += reread_problems
        if not runs:
            raise NoRunsError(problems)
        # The JVM's own stderr (start-up notes, Spark's warnings) goes to a
        # file beside the report, not the user's terminal.
        size = sum(os.path.getsize(p) for r in runs
                   for p in (r.history_path, *(n.records_path for n in r.nodes)))
        with spark_session(spark_master, log_path=os.path.join(out_dir, SPARK_LOG),
                           short_job=size < SMALL_INPUT_BYTES) as spark:
            progress.step(f"checking {len(runs)} runs (Spark)")
            with progress.spark_job(spark.sparkContext, "check"):
                results = _run_query(spark, runs)
        agreement, unread_agreement = answer.find_agreement(run_dirs, dirs)
        if unread_agreement:
            progress.step(unread_agreement)
        elif agreement is not None:
            progress.step(f"the backends' agreement: {agreement.path}")
        # Inside: the consume figures and run pages read the re-read records.
        return _write(runs, problems, results, out_dir, progress, coverage, agreement)


def _malformed(runs: Sequence[RunInfo], results: dict[str, pd.DataFrame]) -> dict[int, str]:
    """Runs with malformed rows -> the first problem, named by Python."""
    bad_files: list[tuple[int, str, str, int]] = []
    tl = results["timeline"]
    for run_index, n in tl.groupby("run")["bad"].sum().items():
        if n:
            bad_files.append((int(run_index), runs[int(run_index)].history_path, "history",
                              int(n)))
    for row in results["divergence"].to_dict("records"):
        for node in runs[row["run"]].nodes:
            if row[f"bad{node.index}"]:
                bad_files.append((row["run"], node.records_path, "records",
                                  int(row[f"bad{node.index}"])))
    bad: dict[int, str] = {}
    for run_index, path, kind, count in sorted(bad_files):
        if run_index not in bad:
            bad[run_index] = first_row_problem(path, kind) or (
                f"{path}: {count} row(s) Spark cannot read as {kind} rows of the schema")
    return bad


def lost_table(runs: Sequence[RunInfo], figures: pd.DataFrame) -> pd.DataFrame:
    """One row per acknowledged message missing from the master (the first
    LOST_IDS_MAX of each run, in offset order): where it was acknowledged,
    the nodes that still hold it, and whether it is stranded or broke a
    promise."""
    by_index = {r.index: r for r in runs}
    rows = []
    for run_index, lost in zip(figures["run"], figures["lost_ids"], strict=True):
        run = by_index.get(int(run_index))
        if run is None or not isinstance(lost, list):
            continue
        for m in lost:
            held = [n.name for n in run.nodes if int(m["held"]) >> n.index & 1]
            rows.append({"run_id": run.run_id, "msg_id": m["msg_id"],
                         "acked_offset": m["offset"], "held_by": ",".join(held),
                         "lost_everywhere": not held, "stranded": bool(m["stranded"]),
                         "violation": bool(m["violation"])})
    df = pd.DataFrame(rows, columns=["run_id", "msg_id", "acked_offset", "held_by",
                                     "lost_everywhere", "stranded", "violation"])
    df["acked_offset"] = df["acked_offset"].astype("Int64")
    return df.sort_values(["run_id", "acked_offset"]).reset_index(drop=True)


def _write(runs: list[RunInfo], problems: list[Problem], results: dict[str, pd.DataFrame],
           out_dir: str, progress: Progress,
           coverage: Sequence[matrix_plan.PlanCoverage] = (),
           agreement: answer.Agreement | None = None) -> ReportSummary:
    assert all(r.index == i for i, r in enumerate(runs))  # results are keyed by index
    for run_index, message in _malformed(runs, results).items():
        progress.step(f"left out: {message}")
        problems.append(Problem(runs[run_index].run_dir, message))
    left_out = {p.run_dir for p in problems}
    good = [r for r in runs if r.run_dir not in left_out]
    if not good:
        raise NoRunsError(problems)
    keep = {r.index for r in good}
    res = {k: v[v["run"].isin(keep)] for k, v in results.items()}
    res["latency"] = res["latency"].dropna(subset=["us"])

    timeline = res["timeline"][res["timeline"]["ops"] > 0].copy()
    ahead = res["slave_ahead_obs"].merge(res["slave_ahead"], on=["run", "obs"], how="left")
    ahead = ahead.assign(bytes=ahead["hi"] - ahead["lo"], messages=ahead["messages"].fillna(0))
    ahead = pd.concat([
        ahead[ahead["at_end"] == at_end].groupby("run")[["bytes", "messages"]].max()
        .add_prefix(f"slave_ahead_at_{when}_") for at_end, when in ((False, "restart"),
                                                                    (True, "end"))
    ], axis=1).fillna(0).astype("int64").reset_index()
    figures = res["messages"].merge(res["divergence"], on="run", how="outer")
    lost = lost_table(good, figures)
    figures = figures.drop(columns=["lost_ids"])

    progress.step(f"writing tables and report to {out_dir}")
    consume = {r.index: consumption.run_figures(r) for r in good}
    # The evidence and split-brain rules run in Python over each run's
    # history, read once, as the run summary runs them (chaos/check/
    # evidence.py, chaos/check/failover.py): the one definition of each.
    proofs: dict[int, dict[str, Any]] = {}
    split_brain: dict[int, int] = {}
    for r in good:
        history = read_jsonl(r.history_path)
        proofs[r.index] = evidence.run_figures(r, history)
        split_brain[r.index] = summary.split_brain_acks(r, history)
    verdicts = tables.verdicts_table(good, figures, timeline, res["latency"], ahead, consume,
                                     recovery=res["recovery"], evidence=proofs,
                                     split_brain=split_brain)
    comparison = tables.comparison_table(verdicts, res["latency"], good)
    timeline = timeline.assign(
        run_id=timeline["run"].map(lambda i: runs[i].run_id),
        latency_p50_us=timeline["us"].map(lambda v: v[0] if v else None),
        latency_p99_us=timeline["us"].map(lambda v: v[1] if v else None),
    )[["run_id", "second", "status", "ops", "latency_p50_us", "latency_p99_us"]]
    timeline = timeline.sort_values(["run_id", "second", "status"]).reset_index(drop=True)

    os.makedirs(out_dir, exist_ok=True)
    files = []
    for name, table in (("verdicts", verdicts), ("comparison", comparison),
                        ("timeline", timeline), ("lost", lost)):
        for ext in ("csv", "parquet"):
            path = os.path.join(out_dir, f"{name}.{ext}")
            if ext == "csv":
                table.to_csv(path, index=False)
            else:
                table.to_parquet(path, index=False)
            files.append(path)
    files += report.write_report(out_dir, verdicts=verdicts, comparison=comparison,
                                 timeline=timeline, runs=good, problems=problems, lost=lost,
                                 coverage=coverage, agreement=agreement, progress=progress)
    return ReportSummary(out_dir=out_dir, runs=len(good), problems=problems, verdicts=verdicts,
                         comparison=comparison, timeline=timeline, files=files,
                         coverage=list(coverage))
