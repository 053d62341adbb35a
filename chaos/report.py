"""report.md, report.html and the plots of a report, from the pipeline's
small tables (pandas). The document is built once as a list of blocks and
rendered twice, so the Markdown and the HTML always say the same thing.

Plots (PNG, matplotlib's object API: no pyplot, no global backend):
- outcomes.png      per mode, the share of puts: acknowledged and kept,
                    allowed loss, stranded, promise violation, failed,
                    indeterminate
- slave_ahead.png   per mode, each run's slave-ahead bytes at the master's
                    restart
- latency.png       per mode, PUT_OK latency (p50, p99 per second) of one
                    run — the one with the most violations, else the most
                    faults — with its fault windows shaded
- failed_share.png  per mode, the share of failed puts per second since the
                    run's start, over all its runs, a line per scenario
"""

from __future__ import annotations

import html
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import ScalarFormatter

from chaos import promises
from chaos.runs import Problem, RunInfo

PLOTS = "plots"
OUTCOME_COLORS = {
    "acknowledged, kept": "#4c9f70",
    "allowed loss": "#f2b134",
    "stranded": "#9b5de5",
    "promise violation": "#d1495b",
    "failed": "#8d99ae",
    "indeterminate": "#2b2d42",
}
FAULT_COLORS = {"kill": "#d1495b", "stop": "#8d99ae", "pause": "#f2b134",
                "partition": "#00798c", "torn_tail": "#6a4c93", "bit_flip": "#6a4c93",
                "failpoint": "#edae49"}


@dataclass(frozen=True)
class Table:
    header: list[str]
    rows: list[list[str]]


# ("h1"|"h2"|"p"|"ul", text or items) | ("table", Table) | ("img", (alt, path))
Block = tuple[str, Any]


def mode_label(role: str, flush: str) -> str:
    return f"{role} + {flush}"


def _modes(verdicts: pd.DataFrame) -> list[tuple[str, str]]:
    present = set(zip(verdicts["role"], verdicts["flush"], strict=True))
    return [m for m in promises.PROMISES if m in present]


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


def _comparison_block(comparison: pd.DataFrame) -> Table:
    cols = ["role", "flush", "scenario"]
    # Run conditions appear only when the sweep varied them.
    cols += [c for c in ("backend", "crash_model", "slave_ahead_policy", "ha_ship_limit",
                         "corruption_policy")
             if comparison[c].nunique() > 1]
    cols += ["runs", "acked", "acked_distinct", "acked_lost_master", "acked_lost_everywhere",
             "promise_violations", "allowed_loss", "acked_stranded", "slave_ahead_runs",
             "slave_ahead_at_restart_bytes_max", "slave_ahead_at_end_bytes_max",
             "divergence_runs", "duplicates", "indeterminate", "put_ok_p50_ms",
             "put_ok_p99_ms", "failed_put_share"]
    # Consume-side figures appear when some run consumed (empty for the rest).
    cols += [c for c in ("duplicates_delivered", "stored_never_delivered",
                         "delivered_then_lost") if comparison[c].notna().any()]
    return Table(cols, [[_fmt(row[c]) for c in cols] for _, row in comparison.iterrows()])


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"


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
                f"{int(ahead[f'slave_ahead_at_{when}_messages'].max()):,} messages).")
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


def _document(verdicts: pd.DataFrame, comparison: pd.DataFrame, problems: Sequence[Problem],
              plots: list[tuple[str, str]]) -> list[Block]:
    n_v = int(verdicts["promise_violations"].sum())
    blocks: list[Block] = [
        ("h1", "Durability report"),
        ("p", f"{_plural(len(verdicts), 'run')} reported"
              + (f", {len(problems):,} left out (see the end)" if problems else "")
              + f"; {_plural(n_v, 'promise violation')} in all."),
        ("h2", "What a PUT_OK promises"),
        ("table", Table(["mode", "promise"], [
            [mode_label(r, f), promises.describe(r, f)] for r, f in promises.PROMISES])),
        ("p", "A violation is a promised message that is gone from where it was promised; an "
              "allowed loss is an acknowledged message missing from the recovered master that "
              "no promise covered; a stranded one is missing from it and held only by slaves "
              "it rejects or ignores (found ahead of it under the reject or trust policy). "
              "A promise is void for a node whose disk the scenario "
              "damaged, or (for a slave's copy) that crashed under the power crash model. "
              "Exact definitions: chaos/promises.py and chaos/pipeline.py."),
        ("h2", "Comparison"),
        ("table", _comparison_block(comparison)),
        ("h2", "Findings"),
    ]
    for role, flush in _modes(verdicts):
        runs = verdicts[(verdicts["role"] == role) & (verdicts["flush"] == flush)]
        blocks += [("h3", mode_label(role, flush)), ("p", finding(role, flush, runs))]
    blocks.append(("h2", "Plots"))
    blocks += [("img", plot) for plot in plots]
    bad = verdicts[verdicts["promise_violations"] > 0]
    if len(bad):
        blocks += [("h2", "Runs with promise violations"), ("table", Table(
            ["run_id", "mode", "scenario", "violations", "disk", "replica", "lost everywhere"],
            [[r.run_id, mode_label(r.role, r.flush), r.scenario, _fmt(r.promise_violations),
              _fmt(r.disk_violations), _fmt(r.replica_violations),
              _fmt(r.acked_lost_everywhere)] for r in bad.head(50).itertuples()]))]
        if len(bad) > 50:
            blocks.append(("p", f"… and {len(bad) - 50:,} more in verdicts.csv."))
    disk = [(r, node, off, "damaged on disk at") for r in verdicts.itertuples()
            for node, off in json.loads(r.disk_damage_by_node).items()]
    disk += [(r, node, off, "kept store differs from the run's read-back from")
             for r in verdicts.itertuples()
             for node, off in json.loads(r.store_changed_by_node).items()]
    if disk:
        blocks += [("h2", "Stores damaged or changed on disk"), (
            "p", "Per node, read from the store the run kept where it did (the verdicts are "
                 "judged from what the store holds now), else from the run's read-back."),
            ("ul", [f"{r.run_id}: {node} {what} offset {off:,}"
                    for r, node, off, what in disk])]
    if problems:
        blocks += [("h2", "Runs left out"), ("ul", [str(p) for p in problems])]
    return blocks


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


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
                + [f"| {' | '.join(_md_cell(c) for c in row)} |" for row in body.rows]))
        elif kind == "img":
            alt, path = body
            out.append(f"![{alt}]({path})")
        else:
            raise AssertionError(f"unknown block {kind}")
    return "\n\n".join(out) + "\n"


def _html_text(text: str) -> str:
    # The only inline markup the document uses is **bold**.
    parts = html.escape(text).split("**")
    return "".join(f"<strong>{p}</strong>" if i % 2 else p for i, p in enumerate(parts))


def render_html(blocks: Sequence[Block]) -> str:
    out = ["<!doctype html>", '<html lang="en"><head><meta charset="utf-8">',
           "<title>Durability report</title><style>",
           "body{font-family:sans-serif;max-width:72rem;margin:2rem auto;padding:0 1rem}",
           "table{border-collapse:collapse;font-size:.85rem}",
           "td,th{border:1px solid #ccc;padding:.2rem .4rem;text-align:right}",
           "td:first-child,th:first-child{text-align:left}img{max-width:100%}",
           "</style></head><body>"]
    for kind, body in blocks:
        if kind in ("h1", "h2", "h3"):
            out.append(f"<{kind}>{_html_text(body)}</{kind}>")
        elif kind == "p":
            out.append(f"<p>{_html_text(body)}</p>")
        elif kind == "ul":
            out.append("<ul>" + "".join(f"<li>{_html_text(i)}</li>" for i in body) + "</ul>")
        elif kind == "table":
            head = "".join(f"<th>{html.escape(h)}</th>" for h in body.header)
            rows = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row)
                           + "</tr>" for row in body.rows)
            out.append(f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>")
        elif kind == "img":
            alt, path = body
            out.append(f'<p><img src="{html.escape(path)}" alt="{html.escape(alt)}"></p>')
        else:
            raise AssertionError(f"unknown block {kind}")
    out.append("</body></html>")
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------ plots
def _save(fig: Figure, out_dir: str, name: str) -> str:
    rel = f"{PLOTS}/{name}"
    fig.savefig(os.path.join(out_dir, rel), dpi=100, bbox_inches="tight")
    return rel


def _mode_axes(fig: Figure, n: int) -> list[Any]:
    cols = 1 if n == 1 else 2
    rows = (n + cols - 1) // cols
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax in axes[n:]:
        ax.set_visible(False)
    return list(axes[:n])


def plot_outcomes(out_dir: str, verdicts: pd.DataFrame) -> str:
    modes = _modes(verdicts)
    shares: dict[str, list[float]] = {k: [] for k in OUTCOME_COLORS}
    for role, flush in modes:
        g = verdicts[(verdicts["role"] == role) & (verdicts["flush"] == flush)]
        puts = max(int(g["puts"].sum()), 1)
        viol, allowed = g["promise_violations"].sum(), g["allowed_loss"].sum()
        # A stranded message that is also a violation is drawn as a violation;
        # per run, stranded minus violations is a lower bound on the rest.
        stranded = (g["acked_stranded"] - g["promise_violations"]).clip(lower=0).sum()
        indet = g["indeterminate"].sum()
        values = [g["acked"].sum() - viol - allowed - stranded, allowed, stranded, viol,
                  g["failed"].sum() - indet, indet]
        for key, value in zip(OUTCOME_COLORS, values, strict=True):
            shares[key].append(value / puts)
    fig = Figure(figsize=(8, 1.2 + 0.7 * len(modes)))
    ax = fig.subplots()
    labels = [mode_label(r, f) for r, f in modes]
    left = np.zeros(len(modes))
    for key, color in OUTCOME_COLORS.items():
        ax.barh(labels, shares[key], left=left, color=color, label=key)
        left += np.array(shares[key])
    for i, (role, flush) in enumerate(modes):
        g = verdicts[(verdicts["role"] == role) & (verdicts["flush"] == flush)]
        ax.text(1.01, i, f"violations {int(g['promise_violations'].sum()):,}\n"
                f"allowed loss {int(g['allowed_loss'].sum()):,}", va="center", fontsize=8)
    ax.set_xlim(0, 1)
    ax.invert_yaxis()
    ax.set_xlabel("share of puts")
    ax.set_title("Outcome of every put, per mode")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=5, fontsize=8)
    return _save(fig, out_dir, "outcomes.png")


def plot_slave_ahead(out_dir: str, verdicts: pd.DataFrame) -> str:
    modes = _modes(verdicts)
    fig = Figure(figsize=(8, 4))
    ax = fig.subplots()
    rng = np.random.default_rng(0)  # jitter only; fixed so plots are reproducible
    for i, (role, flush) in enumerate(modes):
        g = verdicts[(verdicts["role"] == role) & (verdicts["flush"] == flush)]
        y = g["slave_ahead_at_restart_bytes"].to_numpy(dtype=float)
        ax.scatter(i + rng.uniform(-0.15, 0.15, len(y)), y, s=12, alpha=0.6)
        if len(y):
            ax.hlines(y.max(), i - 0.3, i + 0.3, color="black", linewidth=1)
    ax.set_xticks(range(len(modes)), [mode_label(r, f).replace(" + ", "\n") for r, f in modes])
    ax.set_yscale("symlog", linthresh=1024)
    ax.set_ylabel("bytes (0 = not ahead; line = max)")
    ax.set_title("Slave ahead of the recovered master, per run")
    return _save(fig, out_dir, "slave_ahead.png")


def _representative(g: pd.DataFrame) -> pd.Series:
    n_faults = g["faults"].map(lambda s: len(s.split(",")) if s else 0)
    order = g.assign(n_faults=n_faults).sort_values(
        ["promise_violations", "n_faults", "run_id"], ascending=[False, False, True])
    return order.iloc[0]


def plot_latency(out_dir: str, verdicts: pd.DataFrame, timeline: pd.DataFrame,
                 runs: Sequence[RunInfo]) -> str:
    modes = _modes(verdicts)
    by_id = {r.run_id: r for r in runs}
    fig = Figure(figsize=(11, 3.2 * ((len(modes) + 1) // 2)), layout="constrained")
    for ax, (role, flush) in zip(_mode_axes(fig, len(modes)), modes, strict=True):
        pick = _representative(verdicts[(verdicts["role"] == role)
                                        & (verdicts["flush"] == flush)])
        run = by_id[pick["run_id"]]
        t = timeline[(timeline["run_id"] == run.run_id) & (timeline["status"] == "PUT_OK")]
        ax.plot(t["second"], t["latency_p50_ms"], label="p50", marker=".")
        ax.plot(t["second"], t["latency_p99_ms"], label="p99", marker=".")
        start = run.params["started_ms"]
        seen: set[str] = set()
        for f in run.faults:
            begin = (f["start_ms"] - start) / 1000
            end = (f["end_ms"] - start) / 1000 if f["end_ms"] is not None else begin + 0.5
            label = f["kind"] if f["kind"] not in seen else None
            seen.add(f["kind"])
            ax.axvspan(begin, max(end, begin + 0.2), alpha=0.2, label=label,
                       color=FAULT_COLORS.get(f["kind"], "#999999"))
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.yaxis.set_minor_formatter(ScalarFormatter())
        ax.set_title(f"{mode_label(role, flush)}\n{run.run_id} ({run.params['scenario']})",
                     fontsize=9)
        ax.set_xlabel("seconds since run start")
        ax.set_ylabel("PUT_OK latency, ms")
        ax.legend(fontsize=7)
    return _save(fig, out_dir, "latency.png")


def plot_failed_share(out_dir: str, verdicts: pd.DataFrame, timeline: pd.DataFrame) -> str:
    modes = _modes(verdicts)
    fig = Figure(figsize=(11, 3.2 * ((len(modes) + 1) // 2)), layout="constrained")
    run_info = verdicts.set_index("run_id")[["role", "flush", "scenario"]]
    t = timeline.join(run_info, on="run_id")
    t = t.assign(failed=np.where(t["status"] != "PUT_OK", t["ops"], 0))
    for ax, (role, flush) in zip(_mode_axes(fig, len(modes)), modes, strict=True):
        g = t[(t["role"] == role) & (t["flush"] == flush)]
        for scenario, s in g.groupby("scenario"):
            per_s = s.groupby("second")[["failed", "ops"]].sum()
            ax.plot(per_s.index, per_s["failed"] / per_s["ops"], label=str(scenario))
        ax.set_ylim(-0.02, 1.02)
        ax.set_title(mode_label(role, flush), fontsize=9)
        ax.set_xlabel("seconds since run start")
        ax.set_ylabel("failed share of puts")
        ax.legend(fontsize=7)
    return _save(fig, out_dir, "failed_share.png")


def write_report(out_dir: str, *, verdicts: pd.DataFrame, comparison: pd.DataFrame,
                 timeline: pd.DataFrame, runs: Sequence[RunInfo],
                 problems: Sequence[Problem]) -> list[str]:
    """Write the plots, report.md and report.html; returns their paths."""
    os.makedirs(os.path.join(out_dir, PLOTS), exist_ok=True)
    plots = [
        ("Outcome of every put, per mode", plot_outcomes(out_dir, verdicts)),
        ("Slave ahead of the recovered master, per mode", plot_slave_ahead(out_dir, verdicts)),
        ("PUT_OK latency over time, fault windows shaded",
         plot_latency(out_dir, verdicts, timeline, runs)),
        ("Share of failed puts over time", plot_failed_share(out_dir, verdicts, timeline)),
    ]
    blocks = _document(verdicts, comparison, problems, plots)
    paths = [os.path.join(out_dir, rel) for _, rel in plots]
    for name, text in (("report.md", render_markdown(blocks)),
                       ("report.html", render_html(blocks))):
        path = os.path.join(out_dir, name)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        paths.append(path)
    return paths
