"""report.md, report.html and the plots of a report, from the pipeline's
small tables (pandas). The document is built once as a list of blocks and
rendered twice, so the Markdown and the HTML always say the same thing.

The report leads with the answer (chaos/report/answer.py): per mode, and
per mode and scenario, each backend in a column of its own, with the
agreement of compare-backends, and for master-fault scenarios restart in
place beside fail over and what a failover left behind (split brain,
divergence); then what each mode promises, a durability
table, the rates of each outcome over a row's runs (with their intervals,
chaos/check/rates.py), an availability/latency table (the wide tables in
two parts, so each fits a 900 px window), the findings per mode and backend,
the plots (chaos/report/plots.py), the runs that lost data (their
timelines, chaos/report/run_pages.py), every run linked to its page, and a
glossary of every column.
"""

from __future__ import annotations

import html
import json
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from chaos.check import promises, rates
from chaos.check.matrix_plan import PlanCoverage
from chaos.check.run_dirs import Problem, RunInfo
from chaos.harness.scenarios import FAILOVER_MATRIX
from chaos.report import answer, blocks, plots, run_pages
from chaos.report.blocks import Block, Table
from chaos.report.progress import Progress, QuietProgress

RUNS = blocks.RUNS
FEATURED_RUNS = 4  # run timelines shown in the report itself
def mode_label(role: str, flush: str, ha: str = blocks.CLASSIC) -> str:
    return blocks.mode_label(role, flush, ha)


def _fmt(v: Any) -> str:
    if v is None or v is pd.NA or (isinstance(v, float) and np.isnan(v)):
        return "–"
    if isinstance(v, bool | np.bool_):
        return "yes" if v else "no"
    if isinstance(v, float | np.floating):
        return f"{v:.3g}" if abs(float(v)) < 1000 else f"{v:,.0f}"
    if isinstance(v, int | np.integer):
        return f"{int(v):,}"
    return str(v)


_plural = blocks.plural


def finding(role: str, flush: str, runs: pd.DataFrame) -> str:
    """A short plain-language finding for one mode over its runs."""
    acked = int(runs["acked"].sum())
    v = int(runs["promise_violations"].sum())
    lost_m = int(runs["acked_lost_master"].sum())
    lost_e = int(runs["acked_lost_everywhere"].sum())
    allowed = int(runs["allowed_loss"].sum())
    stranded = int(runs["acked_stranded"].sum())
    parts = [f"Promises: {promises.describe(role, flush)}. Over {_plural(len(runs), 'run')} "
             f"({', '.join(sorted(runs['scenario'].unique()))}), {_plural(acked, 'put')} "
             "acknowledged."]
    if v:
        bad = runs[runs["promise_violations"] > 0]
        parts.append(f"**{_plural(v, 'acknowledged message')} broke the mode's promise** in "
                     f"{_plural(len(bad), 'run')} "
                     f"({', '.join(sorted(bad['scenario'].unique()))}).")
    else:
        parts.append("No acknowledged message broke the mode's promise.")
    breached = runs[runs["evidence_breaches"] > 0] if "evidence_breaches" in runs else runs[:0]
    if len(breached):
        parts.append(f"**{_plural(int(breached['evidence_breaches'].sum()), 'PUT_OK')} were "
                     "answered on evidence that did not cover them** in "
                     f"{_plural(len(breached), 'run')} (chaos/check/evidence.py; the runs' "
                     "pages name them).")
    if lost_m:
        parts.append(f"{_plural(lost_m, 'acknowledged message')} went missing from the "
                     f"recovered master, {lost_e:,} from every node; {allowed:,} of the losses "
                     "are allowed by what the mode promises.")
        if stranded:
            parts.append(f"**{_plural(stranded, 'acknowledged message')} stranded**: held only "
                         "by a slave the serving master rejects or ignores, so no producer "
                         "or consumer of that master can get them.")
    else:
        parts.append("The recovered master kept every acknowledged message.")
    for when, text in (("restart", "the recovered master at its restart"),
                       ("end", "the master at the end of the run")):
        ahead = runs[runs[f"slave_ahead_at_{when}_bytes"] > 0]
        if len(ahead):
            parts.append(
                f"A slave was ahead of {text} in {_plural(len(ahead), 'run')} (up to "
                f"{int(ahead[f'slave_ahead_at_{when}_bytes'].max()):,} bytes, "
                f"{_plural(int(ahead[f'slave_ahead_at_{when}_messages'].max()), 'message')}).")
    div = runs[runs["divergent_records"] > 0]
    if len(div):
        parts.append(f"Master and slave logs held different records at the same offsets in "
                     f"{_plural(len(div), 'run')}.")
    dup = int(runs["duplicates"].sum())
    if dup:
        parts.append(f"{_plural(dup, 'message')} stored twice.")
    puts = int(runs["puts"].sum())
    if puts:
        parts.append(f"{runs['failed'].sum() / puts:.1%} of puts failed.")
    parts += consume_finding(runs)
    return " ".join(parts)


def consume_finding(runs: pd.DataFrame) -> list[str]:
    """The consume side of a mode's finding: one sentence, or none when no
    run of the mode consumed."""
    consumed = runs[runs["delivered"].notna()]
    if not len(consumed):
        return []
    dups = int(consumed["duplicates_delivered"].sum())
    lost = int(consumed["delivered_then_lost"].sum())
    drained = consumed[consumed["stored_never_delivered"].notna()]
    never = int(drained["stored_never_delivered"].sum())
    if not len(drained):
        stored = ", the consumer never drained (what was stored but not delivered is unknown)"
    elif never:
        stored = f", **{_plural(never, 'stored message')} never delivered**"
    else:
        stored = ", every stored message delivered"
    if len(drained) < len(consumed) and len(drained):
        stored += f" (of {_plural(len(drained), 'run')} whose consumer drained)"
    return [
        f"Consuming while producing ({_plural(len(consumed), 'run')}, "
        f"{', '.join(sorted(consumed['scenario'].unique()))}): "
        f"{dups:,} duplicate deliver{'y' if dups == 1 else 'ies'}" + stored
        + (f", **{_plural(lost, 'message')} delivered and then lost** (consumed before "
           f"{'it was' if lost == 1 else 'they were'} durable)." if lost
           else ", nothing delivered that was later lost.")]


_slug = blocks.slug
group_anchor = blocks.group_anchor
run_page = blocks.run_page
_severity = blocks.severity


def _conditions(df: pd.DataFrame) -> list[str]:
    # Run conditions appear only when the sweep varied them.
    return [c for c in ("backend", "crash_model", "slave_ahead_policy", "ha_ship_limit",
                        "corruption_policy")
            if c in df.columns and df[c].nunique() > 1]


DURABILITY = {
    "runs": "runs in the row (n)",
    "acked": "distinct messages acknowledged with PUT_OK",
    "lost on master": "acknowledged messages missing from the recovered master",
    "lost everywhere": "acknowledged messages missing from every node",
    "stranded": "lost on the master and held only by slaves the master rejects or ignores",
    "violations": "acknowledged messages gone from where the mode promised them",
    "allowed loss": "lost on the master, not covered by any promise of the mode",
    "slave ahead": "runs where a slave held more than the recovered master (max bytes)",
    "diverged": "runs where master and slave hold different records at one offset",
    "duplicates": "message ids stored at more than one offset",
    "indeterminate": "puts whose outcome the client cannot know (timeout, broken call)",
}
CONSUME = {
    "dup. delivered": "messages the consumer was handed more than once",
    "never delivered": "stored on the master at the end, never handed to the consumer",
    "delivered then lost": "handed to the consumer, then lost from the cluster",
}
# The Availability table: a column per key, in this order. Times of the sim
# backend are simulated time and say so: "(simulated)" in their cells.
AVAILABILITY = {
    "runs": "runs in the row",
    "puts": "put operations in the row",
    "failed": "puts not answered PUT_OK, and their share",
    "failures by status": "failed puts by the status they got",
    "failed/s after fault": "failed puts from the first fault to the end of the load, per "
                            "second of that time (mean over the runs)",
    "unwritable s": "time without a writable master: from a fault during which puts failed to "
                    "the first PUT_OK invoked after the faulted node answered again, or to the "
                    "end of the load; the same for runs of any length (mean over the runs)",
    "fault → PUT_OK s": "the longest time from a fault to the first PUT_OK invoked after the "
                        "faulted node answered again",
    "unwritable": "runs where some fault had no PUT_OK after it until the end of the run",
    "p50 ms": "PUT_OK latency median, measured in µs, over every PUT_OK of the row",
    "p99 ms": "PUT_OK latency 99th percentile, measured in µs, over every PUT_OK of the row",
}
# The Rates table: a column per outcome of chaos.check.rates.OUTCOMES, in its order.
RATES = {
    "n": "runs in the row; every rate below is out of these",
    "runs lost on master": "runs where some acknowledged message was missing from the "
                           "recovered master",
    "runs lost everywhere": "runs where some acknowledged message was missing from every node",
    "runs violated": "runs where some acknowledged message broke the mode's promise",
    "runs stranded": "runs where some acknowledged message was held only by slaves the master "
                     "rejects or ignores",
    "runs slave ahead": "runs where a slave held more than the master, at its restart or at "
                        "the end of the run",
    "runs diverged": "runs where master and slave held different records at one offset",
    "k/n (lo–hi %)": "k of the row's n runs showed the outcome; lo–hi is the 95 % Wilson score "
                     "interval for the rate of runs that show it (chaos/check/rates.py)",
    "lost on master per run": "min / median / max over the row's runs of the acknowledged "
                              "messages missing from the recovered master",
}
ANSWER = {
    "lost": "runs where some acknowledged message was missing from the recovered master, "
            "k/n (95 % interval); msgs/run: the messages so lost per run, median and max",
    "broke promise": "runs where an acknowledged message broke the mode's promise, or a "
                     "PUT_OK was answered on evidence that did not cover it",
    "unwritable/run": "time without a writable master per run (see unwritable s), median "
                      "and max over the runs with a fault; 'to the end': runs that never "
                      "got a PUT_OK after some fault",
    "refused after fault": "puts not answered PUT_OK from the first fault on: their share, "
                           "and how many per second of load (median over the runs)",
    "agreement": "per question of dlab chaos compare-backends (agreement.json): whether "
                 "the backends agree for the mode, and where they differ, why",
    "split brain": "after a failover: runs with a PUT_OK answered by a node the route no "
                   "longer named as master at the answer (an isolated or deposed master), "
                   "k/n (95 % interval), and those PUT_OKs in all (verdicts.csv "
                   "split_brain_acks per run)",
    "first divergent at": "per diverged run (by seed), the offset of the first record the "
                          "master at the end and another node hold differently: where their "
                          "logs part (verdicts.csv first_divergent_offset)",
}


def _group_cells(row: Any, conditions: list[str]) -> tuple[list[str], list[str | None]]:
    ha = row.get("ha", blocks.CLASSIC)
    anchor = "#" + group_anchor(row["role"], row["flush"], row["scenario"], ha)
    cells = [mode_label(row["role"], row["flush"], ha), row["scenario"],
             *[str(row[c]) for c in conditions]]
    return cells, [None, anchor, *[None for _ in conditions]]


def durability_table(comparison: pd.DataFrame) -> Table:
    conditions = _conditions(comparison)
    consume = comparison["delivered_then_lost"].notna().any()
    header = ["mode", "scenario", *conditions, *DURABILITY, *(CONSUME if consume else ())]
    rows, links, classes = [], [], []
    for _, r in comparison.iterrows():
        cells, link = _group_cells(r, conditions)
        ahead = (f"{int(r['slave_ahead_runs']):,} ({int(r['slave_ahead_at_restart_bytes_max']):,}"
                 f" B)" if r["slave_ahead_runs"] else "0")
        cells += [_fmt(r["runs"]), _fmt(r["acked_distinct"]), _fmt(r["acked_lost_master"]),
                  _fmt(r["acked_lost_everywhere"]), _fmt(r["acked_stranded"]),
                  _fmt(r["promise_violations"]), _fmt(r["allowed_loss"]), ahead,
                  _fmt(r["divergence_runs"]), _fmt(r["duplicates"]), _fmt(r["indeterminate"])]
        if consume:
            cells += [_fmt(r["duplicates_delivered"]), _fmt(r["stored_never_delivered"]),
                      _fmt(r["delivered_then_lost"])]
        rows.append(cells)
        links.append(link + [None] * (len(cells) - len(link)))
        sev = _severity(int(r["promise_violations"]), int(r["acked_stranded"]),
                        int(r["acked_lost_master"]))
        classes.append([""] * len(link) + [""] + [sev] * 6 + [""] * (len(cells) - len(link) - 7))
    return Table(header, rows, links=links, classes=classes)


def rates_table(comparison: pd.DataFrame) -> Table:
    """Per comparison row: n, then for each outcome of chaos.check.rates.OUTCOMES
    the runs that showed it as "k/n (lo–hi %)", then the spread of the
    messages lost on the master per run."""
    conditions = _conditions(comparison)
    outcomes = [name for name, _, _ in rates.OUTCOMES]
    header = ["mode", "scenario", *conditions, *RATES]
    header.remove("k/n (lo–hi %)")  # the form of a cell, explained in the glossary
    # An outcome seen in some run is coloured as in the grid.
    severity = {"lost_master": "loss", "lost_everywhere": "loss", "violation": "violation",
                "stranded": "stranded"}
    rows, links, classes = [], [], []
    for _, r in comparison.iterrows():
        cells, link = _group_cells(r, conditions)
        n = int(r["runs"])
        cells.append(f"{n:,}")
        cells += [rates.rate_cell(int(r[f"runs_{o}"]), n, r[f"runs_{o}_ci_low"],
                                  r[f"runs_{o}_ci_high"]) for o in outcomes]
        cells.append(f"{int(r['acked_lost_master_min']):,} / "
                     f"{_fmt(r['acked_lost_master_median'])} / "
                     f"{int(r['acked_lost_master_max']):,}")
        assert len(cells) == len(header), "RATES and rates.OUTCOMES are out of step"
        rows.append(cells)
        links.append(link + [None] * (len(cells) - len(link)))
        classes.append([""] * (len(link) + 1)
                       + [severity.get(o, "") if r[f"runs_{o}"] else "" for o in outcomes]
                       + [""])
    return Table(header, rows, links=links, classes=classes)


def _ms(us: Any) -> str:
    return "–" if us is None or pd.isna(us) else f"{float(us) / 1000:.3g}"


def _statuses(text: str) -> str:
    counts = json.loads(text)
    return ", ".join(f"{k} {v:,}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1])
                     ) or "–"


def _sim(backend: str, text: str) -> str:
    """A figure of simulated time says so (docs/simulation.md)."""
    return f"{text} (simulated)" if backend == "sim" and text != "–" else text


def availability_table(comparison: pd.DataFrame) -> Table:
    conditions = _conditions(comparison)
    header = ["mode", "scenario", *conditions, *AVAILABILITY]
    rows, links, classes = [], [], []
    for _, r in comparison.iterrows():
        cells, link = _group_cells(r, conditions)
        unwritable = int(r["unwritable_runs"])
        backend = str(r["backend"])
        cells += [_fmt(r["runs"]), _fmt(r["puts"]),
                  f"{int(r['failed']):,} ({r['failed_put_share']:.1%})",
                  _statuses(r["failed_by_status"]),
                  _sim(backend, _fmt(r["failed_after_fault_per_s_mean"])),
                  _sim(backend, _fmt(r["unwritable_s_mean"])),
                  _sim(backend, _fmt(r["fault_to_put_ok_s_max"])),
                  f"{unwritable:,} until the end" if unwritable else "0",
                  _sim(backend, _ms(r["put_ok_p50_us"])), _sim(backend, _ms(r["put_ok_p99_us"]))]
        assert len(cells) == len(header), "AVAILABILITY and its cells are out of step"
        rows.append(cells)
        links.append(link + [None] * (len(cells) - len(link)))
        classes.append([""] * (len(cells) - 3) + ["violation" if unwritable else ""] + ["", ""])
    return Table(header, rows, links=links, classes=classes)


def runs_table(verdicts: pd.DataFrame) -> Table:
    rows, links, classes, ids = [], [], [], []
    seen: set[str] = set()
    for r in verdicts.itertuples():
        ha = getattr(r, "ha", blocks.CLASSIC)
        anchor = group_anchor(r.role, r.flush, r.scenario, ha)
        ids.append(None if anchor in seen else anchor)
        seen.add(anchor)
        rows.append([r.run_id, mode_label(r.role, r.flush, ha), r.scenario, str(r.seed),
                     f"{r.acked_lost_master:,} / {r.acked_lost_everywhere:,} / "
                     f"{r.acked_stranded:,} / {r.promise_violations:,}",
                     f"{r.failed_put_share:.1%}",
                     _sim(r.backend, _fmt(r.unwritable_s)),
                     "until the end" if r.unwritable_until_end
                     else _sim(r.backend, _fmt(r.fault_to_put_ok_s))])
        links.append([run_page(r.run_id)] + [None] * 7)
        classes.append([""] * 4 + [_severity(r.promise_violations, r.acked_stranded,
                                             r.acked_lost_master)] + ["", "", ""])
    return Table(["run", "mode", "scenario", "seed", "lost m / e / s / v", "failed",
                  "unwritable s", "fault → PUT_OK s"], rows, links=links, classes=classes,
                 row_ids=ids)


READING = [
    "**The answer** comes first: a row per mode, a column per backend — runs of two "
    "backends are never pooled. Each cell says in how many of its n runs acknowledged "
    "(PUT_OK) messages were lost from the recovered master, broke the mode's promise or "
    "were stranded, as k/n with a 95 % interval, how many per run, and the cost of the "
    "faults: time without a writable master per run and puts refused after the fault.",
    "Red is a broken promise, purple a stranded message, amber a loss the mode allows, green "
    "nothing lost. **By scenario** splits each mode by scenario; a cell links to its run (or "
    "its runs). What each mode promises is in the table under this list.",
    "**Durability** and **Availability and latency** split the same rows; every column is "
    "explained in the Glossary at the end. Times are per run, not summed, so runs of "
    "different lengths compare; a time of the sim backend is simulated time and says so "
    "(simulated).",
    "Each run has a page (runs/RUN.html): its operations over time per producer and consumer, "
    "its faults per node, the lost message ids and links to its raw files.",
    "A cell of one run is one sample: rerun with other seeds (dlab chaos matrix --runs N) "
    "before drawing a conclusion. The **Rates** table says, per row, how many of its n runs "
    "showed each outcome, with a 95 % interval for the rate.",
]


# A report over a big matrix names this many runs per kind of store, then counts.
STORES_NAMED = 30


def stores_line(verdicts: pd.DataFrame) -> str:
    """Which runs were judged from the stores they kept, read again, and
    which from their read-back only (a run that kept none: --keep-stores,
    chaos/check/keep_decision.py; verdicts.csv judged_from and
    stores_kept_why say it per run)."""
    parts = []
    for judged, what in (("kept stores", "judged from the stores they kept, read again"),
                         ("kept stores and read-back",
                          "judged from the stores some of their nodes kept and the others' "
                          "read-back"),
                         ("read-back", "judged from their read-back only (stores not kept)")):
        ids = [str(r) for r in verdicts.loc[verdicts["judged_from"] == judged, "run_id"]]
        if not ids:
            continue
        named = ", ".join(ids[:STORES_NAMED])
        more = f" and {len(ids) - STORES_NAMED:,} more" if len(ids) > STORES_NAMED else ""
        parts.append(f"{_plural(len(ids), 'run')} {what}: {named}{more}")
    return "Stores: " + ("; ".join(parts) or "no runs") + "."


def _first_screen(verdicts: pd.DataFrame, problems: Sequence[Problem],
                  agreement: answer.Agreement | None) -> list[Block]:
    """The answer, per mode and backend, then per scenario (chaos/report/answer.py)."""
    n_v = int(((verdicts["promise_violations"] > 0)
               | (verdicts["evidence_breaches"] > 0)).sum())
    by_backend = ", ".join(f"{b} {int((verdicts['backend'] == b).sum()):,}"
                           for b in answer.backends(verdicts))
    return [
        ("h1", "Durability report"),
        ("p", f"{_plural(len(verdicts), 'run')} reported ({by_backend})"
              + (f", {len(problems):,} left out (see the end)" if problems else "")
              + f"; {_plural(n_v, 'run')} broke a promise."),
        ("h2", "The answer"),
        ("p", answer.agreement_sentence(agreement, verdicts) + " "
              + answer.load_sentence(verdicts)),
        ("table", answer.answer_table(verdicts, agreement)),
        ("p", "Per backend, over its n runs of the mode: k/n runs that showed each outcome "
              "with the 95 % interval of the rate (0/n does not mean never); messages per "
              "run; time without a writable master per run and the puts refused after the "
              "first fault (sim: simulated time). Red: a broken promise, purple: stranded, "
              "amber: a loss the mode allows, green: nothing acknowledged lost."),
        ("h2", "By scenario"),
        ("table", answer.scenario_table(verdicts)),
        *_restart_vs_failover(verdicts),
        *_after_failover(verdicts),
    ]


def _restart_vs_failover(verdicts: pd.DataFrame) -> list[Block]:
    """Restart the old master in place, or promote its slave: per mode, when
    the runs hold both kinds of master-fault scenario."""
    table = answer.restart_vs_failover_table(verdicts)
    if table is None:
        return []
    return [("h2", "Restart in place vs fail over"),
            ("p", "A dead master handled two ways: restarted on its own disk ("
                  + ", ".join(answer.RESTART_IN_PLACE) + ") or replaced by its promoted "
                  "slave (" + ", ".join(FAILOVER_MATRIX) + "); per mode and backend, k/n "
                  "runs with the 95 % interval."),
            ("table", table)]


def _after_failover(verdicts: pd.DataFrame) -> list[Block]:
    """Split brain and divergence per mode and failover scenario, when some
    run failed over."""
    table = answer.failover_table(verdicts)
    if table is None:
        return []
    return [("h2", "After a failover"),
            ("p", "Per mode and failover scenario: the runs where a node the route no longer "
                  "named as master still answered PUT_OK (split brain), and those answers in "
                  "all; the runs where the new master's log and another node's (the old "
                  "master's) hold different records at one offset, and per run the first "
                  "such offset, where the logs part. k/n runs with the 95 % interval; "
                  "coloured as the answer (the split-brain acks are judged with the rest)."),
            ("table", table)]


def _findings(verdicts: pd.DataFrame) -> list[Block]:
    """A finding per mode, and per backend when the runs have several."""
    present = answer.backends(verdicts)
    out: list[Block] = [("h2", "Findings")]
    for m in blocks.modes_in(verdicts):
        for backend in present:
            runs = verdicts[m.select(verdicts) & (verdicts["backend"] == backend)]
            if len(runs):
                title = m.label + (f", {backend}" if len(present) > 1 else "")
                out += [("h3", title), ("p", finding(m.role, m.flush, runs))]
    return out


def _document(verdicts: pd.DataFrame, comparison: pd.DataFrame, problems: Sequence[Problem],
              plot_files: list[tuple[str, str]], lost_plots: list[tuple[str, str, str]],
              agreement: answer.Agreement | None = None, timelines_note: str = ""
              ) -> list[Block]:
    doc: list[Block] = [
        *_first_screen(verdicts, problems, agreement),
        ("h2", "Reading this report"),
        ("ul", READING),
        ("h2", "What a PUT_OK promises"),
        ("table", Table(["mode", "promise"], [
            [mode_label(r, f), promises.describe(r, f)] for r, f in promises.PROMISES])),
        ("p", "A violation is a promised message that is gone from where it was promised; an "
              "allowed loss is an acknowledged message missing from the recovered master that "
              "no promise covered; a stranded one is missing from it and held only by slaves "
              "it rejects or ignores (found ahead of it under the reject or trust policy). "
              "A promise is void for a node whose disk the scenario "
              "damaged, or (for a slave's copy) that crashed under the power crash model. "
              "Exact definitions: chaos/check/promises.py and chaos/report/pipeline.py."),
        ("h2", "Durability"),
        *split_table(durability_table(comparison), "slave ahead"),
        ("h2", "Rates"),
        ("p", "How many of each row's n runs showed each outcome, as k/n with the 95 % Wilson "
              "interval for the rate: with few runs the interval is wide, and 0/n does not "
              "mean never."),
        ("table", rates_table(comparison)),
        ("h2", "Availability and latency"),
        *split_table(availability_table(comparison), "failed/s after fault"),
        *_findings(verdicts),
        ("h2", "Plots"),
        *[("img", plot) for plot in plot_files],
    ]
    if lost_plots:
        lost_any = bool((verdicts["acked_lost_master"] > 0).any())
        doc += [("h2", "Runs that lost data" if lost_any else "The run with the most faults"),
                ("p", "Per run: each producer's and consumer's operations, the faults per "
                      "node, the latency of every put with its p50 and p99, and puts per "
                      "second. The run's page has its lost message ids and files. "
                      + timelines_note)]
        for run_id, rel, page in lost_plots:
            doc += [("h3", run_id), ("link", (f"the page of {run_id}", page)),
                    ("img", (f"timeline of {run_id}", rel))]
    doc += [("h2", "Runs"), ("table", runs_table(verdicts)), ("p", stores_line(verdicts))]
    disk = [(r, node, off, "damaged on disk at") for r in verdicts.itertuples()
            for node, off in json.loads(r.disk_damage_by_node).items()]
    disk += [(r, node, off, "kept store differs from the run's read-back from")
             for r in verdicts.itertuples()
             for node, off in json.loads(r.store_changed_by_node).items()]
    if disk:
        doc += [("h2", "Stores damaged or changed on disk"), (
            "p", "Per node, read from the store the run kept where it did (the verdicts are "
                 "judged from what the store holds now), else from the run's read-back."),
            ("ul", [f"{r.run_id}: {node} {what} offset {off:,}"
                    for r, node, off, what in disk])]
    if problems:
        doc += [("h2", "Runs left out"), ("ul", [str(p) for p in problems])]
    doc += [("h2", "Glossary"), ("ul", [
        f"**{name}**: {text}" for name, text in
        {**ANSWER, **DURABILITY, **CONSUME, **RATES, **AVAILABILITY,
         "lost m / e / s / v": "per run: acknowledged messages lost on the master / lost "
                               "everywhere / stranded / promise violations",
         "conditions": "backend, crash_model, slave_ahead_policy, ha_ship_limit, "
                       "corruption_policy appear as "
                       "columns when the runs varied them",
         "tables": "verdicts.csv (a row per run), comparison.csv (a row per mode, scenario "
                   "and conditions), timeline.csv and lost.csv (the lost message ids) hold "
                   "every figure"}.items()])]
    return doc


def split_table(table: Table, at: str) -> list[Block]:
    """The table as two, the second from column `at` on, both led by the
    row's mode, scenario and conditions: so that each fits a 900 px window."""
    keys = table.header.index("runs")
    cut = table.header.index(at)

    def part(cols: list[int], row_ids: list[str | None] | None) -> Table:
        def pick(rows: list[list[Any]] | None) -> list[list[Any]] | None:
            return None if rows is None else [[r[c] for c in cols] for r in rows]

        picked = pick(table.rows)
        assert picked is not None
        return Table([table.header[c] for c in cols], picked, links=pick(table.links),
                     classes=pick(table.classes), row_ids=row_ids, css=table.css)

    head = list(range(keys))
    return [("table", part(head + list(range(keys, cut)), table.row_ids)),
            ("table", part(head + list(range(cut, len(table.header))), None))]


def _html_text_breakable(text: str) -> str:
    """Escaped, with a break allowed after each underscore, so status names
    and condition names wrap in a narrow column."""
    return html.escape(text).replace("_", "_<wbr>")


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", "; ")


def render_markdown(blocks: Sequence[Block]) -> str:
    out: list[str] = []
    for kind, body in blocks:
        if kind in ("h1", "h2", "h3"):
            out.append(f"{'#' * int(kind[1])} {body}")
        elif kind == "p":
            out.append(body)
        elif kind == "ul":
            out.append("\n".join(f"- {_md_cell(item)}" for item in body))
        elif kind == "table":
            out.append("\n".join(
                [f"| {' | '.join(_md_cell(h) for h in body.header)} |",
                 f"| {' | '.join('---' for _ in body.header)} |"]
                + [f"| {' | '.join(_md_table_cell(body, i, j) for j in range(len(row)))} |"
                   for i, row in enumerate(body.rows)]))
        elif kind == "link":
            text, href = body
            out.append(f"[{_md_cell(text)}]({href})")
        elif kind == "img":
            alt, path = body
            out.append(f"![{alt}]({path})")
        else:
            raise AssertionError(f"unknown block {kind}")
    return "\n\n".join(out) + "\n"


def _md_table_cell(table: Table, i: int, j: int) -> str:
    text = _md_cell(table.rows[i][j])
    href = table.links[i][j] if table.links else None
    if href:
        text = f"[{text}]({href})"
    if j == 0 and table.row_ids and table.row_ids[i]:
        text = f'<a id="{table.row_ids[i]}"></a>{text}'
    return text


def _html_table(table: Table) -> str:
    # The answer's tables (a CSS class of their own) break names at spaces
    # only; the wide tables also at underscores.
    escape = html.escape if table.css else _html_text_breakable
    head = "".join(f"<th>{escape(h)}</th>" for h in table.header)
    rows = []
    for i, row in enumerate(table.rows):
        row_id = table.row_ids[i] if table.row_ids else None
        cells = []
        for j, text in enumerate(row):
            href = table.links[i][j] if table.links else None
            cls = table.classes[i][j] if table.classes else ""
            body = "<br>".join(escape(line) for line in text.split("\n"))
            if href:
                body = f'<a href="{html.escape(href)}">{body}</a>'
            cells.append(f'<td class="{cls}">{body}</td>' if cls else f"<td>{body}</td>")
        rows.append((f'<tr id="{row_id}">' if row_id else "<tr>") + "".join(cells) + "</tr>")
    css = f' class="{table.css}"' if table.css else ""
    return f"<table{css}><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


# Severity colours of the tables; no table may be wider than a 900 px window,
# and the answer must fit the first screen of a 1400 x 1000 one
# (tests/chaos/test_report_browser.py measures both in Chromium).
CSS = [
    "body{font-family:sans-serif;max-width:80rem;margin:1rem auto;padding:0 1rem}",
    "table{border-collapse:collapse;font-size:.8rem;margin:.5rem 0}",
    "td,th{border:1px solid #ccc;padding:.2rem .35rem;text-align:right;"
    "overflow-wrap:break-word}",
    "th{background:#f4f4f4;vertical-align:bottom;overflow-wrap:normal}",
    "td:first-child,th:first-child{text-align:left}img{max-width:100%}",
    "td.violation{background:#f4c7cd}td.stranded{background:#e0cdf7}",
    "td.loss{background:#fbe3b0}td.ok{background:#cfe9d9}td.none{color:#999}",
    "td.violation,td.stranded,td.loss,td.ok,td.none{text-align:center}",
    # The answer and by-scenario tables: a figure a line, read left to right.
    "table.answer td,table.scenarios td{text-align:left;vertical-align:top}",
    "table.answer th,table.scenarios th{text-align:left}",
    # The backends' columns get the room: the answer's lines stay whole.
    "table.answer{width:100%}table.answer td:first-child{width:12%}",
    "table.answer.agreement td:last-child{width:24%}",
]


def _html_text(text: str) -> str:
    # The only inline markup the document uses is **bold**.
    parts = html.escape(text).split("**")
    return "".join(f"<strong>{p}</strong>" if i % 2 else p for i, p in enumerate(parts))


def render_html(blocks: Sequence[Block]) -> str:
    out = ["<!doctype html>", '<html lang="en"><head><meta charset="utf-8">',
           "<title>Durability report</title><style>", *CSS, "</style></head><body>"]
    for kind, body in blocks:
        if kind in ("h1", "h2", "h3"):
            out.append(f'<{kind} id="{_slug(body)}">{_html_text(body)}</{kind}>')
        elif kind == "p":
            out.append(f"<p>{_html_text(body)}</p>")
        elif kind == "ul":
            out.append("<ul>" + "".join(f"<li>{_html_text(i)}</li>" for i in body) + "</ul>")
        elif kind == "table":
            out.append(_html_table(body))
        elif kind == "link":
            text, href = body
            out.append(f'<p><a href="{html.escape(href)}">{html.escape(text)}</a></p>')
        elif kind == "img":
            alt, path = body
            out.append(f'<p><img src="{html.escape(path)}" alt="{html.escape(alt)}"></p>')
        else:
            raise AssertionError(f"unknown block {kind}")
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def _with_coverage(doc: list[Block], coverage: Sequence[PlanCoverage]) -> list[Block]:
    """The document with, for each matrix missing planned runs, a warning
    under the first line (how many of the planned runs it covers) and,
    before the glossary, every missing run by name: a report over an
    interrupted matrix must not read as the whole of it."""
    incomplete = [c for c in coverage if c.missing]
    if not incomplete:
        return doc
    warning = [("p", f"**Warning: {c.summary(max_named=5)}.** The figures below cover only "
                     "the runs found (the missing ones are listed at the end).")
               for c in incomplete]
    listed: list[Block] = [("h2", "Planned runs missing")]
    for c in incomplete:
        listed += [("p", f"{c.plan.path}: {c.found} of {c.planned} planned runs found; "
                         f"no run directory for:"), ("ul", list(c.missing))]
    glossary = next(i for i, (kind, text) in enumerate(doc)
                    if kind == "h2" and text == "Glossary")
    return [*doc[:2], *warning, *doc[2:glossary], *listed, *doc[glossary:]]


def write_report(out_dir: str, *, verdicts: pd.DataFrame, comparison: pd.DataFrame,
                 timeline: pd.DataFrame, runs: Sequence[RunInfo],
                 problems: Sequence[Problem], lost: pd.DataFrame | None = None,
                 coverage: Sequence[PlanCoverage] = (),
                 agreement: answer.Agreement | None = None,
                 progress: Progress | None = None) -> list[str]:
    """Write the plots, the run pages, report.md and report.html; returns
    their paths. `agreement`: compare-backends' verdict over these runs
    (chaos/report/answer.py find_agreement)."""
    progress = progress or QuietProgress()
    os.makedirs(os.path.join(out_dir, plots.PLOTS), exist_ok=True)
    if lost is None:
        lost = pd.DataFrame(columns=["run_id", "msg_id", "acked_offset", "held_by",
                                     "lost_everywhere", "stranded", "violation"])
    plot_files = [
        ("Outcome of every put, per mode and backend", plots.plot_outcomes(out_dir, verdicts)),
        ("Slave ahead of the recovered master, per mode and backend",
         plots.plot_slave_ahead(out_dir, verdicts)),
    ]
    drawn = run_pages.to_draw(verdicts)
    progress.step(f"writing {_plural(len(verdicts), 'run page')}, "
                  f"{_plural(len(drawn.draw), 'timeline')} among them")
    with progress.items(len(verdicts), "run pages") as tick:
        pages = run_pages.write_run_pages(out_dir, verdicts, runs, lost, drawn, tick)
    featured = run_pages.featured(verdicts)[:FEATURED_RUNS]
    lost_plots = [(run_id, pages.plots[run_id], run_page(run_id)) for run_id in featured
                  if run_id in pages.plots]
    doc = _document(verdicts, comparison, problems, plot_files, lost_plots, agreement,
                    drawn.note())
    doc = _with_coverage(doc, coverage)
    paths = [os.path.join(out_dir, rel) for _, rel in plot_files] + pages.paths
    for name, text in (("report.md", render_markdown(doc)),
                       ("report.html", render_html(doc))):
        path = os.path.join(out_dir, name)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        paths.append(path)
    return paths
