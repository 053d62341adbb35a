"""A page per run (runs/RUN.html, beside the report): the run's parameters
and verdict, its faults and observations, the acknowledged messages it lost
(with offsets and the nodes still holding them), links to its raw files, and
a timeline figure (runs/RUN.png):

- lanes     every producer's operations at their invoke time (PUT_OK, each
            failed status, INDETERMINATE), the consumer's deliveries, and
            per named node its faults: a span from start to end, an
            instant one (a kill) as a line; slave-ahead and
            replication-stalled markers on the node they concern
- latency   every put's latency (ms, log axis, measured in µs), with the
            PUT_OK p50 and p99 per half second
- rate      puts per second, PUT_OK and failed

The timeline reads the run's history again in Python (about half a second
a figure), so not every run gets one (to_draw): every run that lost
acknowledged messages, broke a promise or stayed unwritable to the end
does, up to MUST_DRAW_MAX of them (worst first); the rest, up to
TIMELINE_RUNS_MAX in all, go to the runs with the most faults. A run whose
timeline was left out says on its page why. Every run gets its page.
"""

from __future__ import annotations

import html
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

from chaos.check.run_dirs import RunInfo
from chaos.report import blocks
from chaos.report.blocks import plural
from chaos.schema import read_jsonl
from store.status import INDETERMINATE, PutStatus

RUNS = "runs"
TIMELINE_RUNS_MAX = 40
MUST_DRAW_MAX = 200
BIN_S = 0.5
STATUS_COLORS = {PutStatus.PUT_OK: "#4c9f70", INDETERMINATE: "#2b2d42"}
OTHER_COLORS = ["#d1495b", "#edae49", "#00798c", "#6a4c93", "#8d6a9f", "#f46036", "#8d99ae"]
FAULT_COLORS = {"kill": "#d1495b", "stop": "#8d99ae", "start": "#4c9f70", "restart": "#4c9f70",
                "pause": "#f2b134", "resume": "#f2b134", "partition": "#00798c",
                "heal": "#00798c", "torn_tail": "#6a4c93", "bit_flip": "#6a4c93",
                "failpoint": "#edae49"}
FAILED_COLOR = "#f46036"  # failed puts per second (the fault lines are the red ones)
FAULT_LINESTYLES: dict[str, Any] = {
    "kill": "--", "stop": "--", "start": ":", "restart": ":", "torn_tail": "-.",
    "bit_flip": "-.", "failpoint": (0, (1, 1)), "refused": (0, (5, 1, 1, 1)),
    "rogue_peer": (0, (3, 1, 1, 1, 1, 1))}


@dataclass
class Pages:
    paths: list[str] = field(default_factory=list)
    plots: dict[str, str] = field(default_factory=dict)  # run_id -> runs/RUN.png


def featured(verdicts: pd.DataFrame) -> list[str]:
    """The runs that lost acknowledged messages on the master, worst first
    (violations, stranded, lost); if none did, the run with the most faults."""
    order = _by_interest(verdicts)
    lost = order[order["acked_lost_master"] > 0]
    return list(lost["run_id"]) if len(lost) else list(order["run_id"][:1])


def _by_interest(verdicts: pd.DataFrame) -> pd.DataFrame:
    n_faults = verdicts["faults"].map(lambda s: len(s.split(",")) if s else 0)
    return verdicts.assign(n_faults=n_faults).sort_values(
        ["promise_violations", "acked_stranded", "acked_lost_master", "n_faults", "run_id"],
        ascending=[False, False, False, False, True])


@dataclass(frozen=True)
class Drawn:
    """Which runs get a timeline (module doc): `draw`; `must`: how many runs
    lost messages, broke a promise or stayed unwritable; `skipped`: those
    of them left out by MUST_DRAW_MAX."""

    draw: list[str]
    must: int
    skipped: list[str]

    def note(self) -> str:
        """What the report says about the timelines it drew."""
        text = (f"Timelines are drawn for every run that lost acknowledged messages, broke a "
                f"promise or stayed unwritable ({self.must:,})")
        if self.skipped:
            text += (f" up to {MUST_DRAW_MAX:,}: {len(self.skipped):,} of them were left "
                     "out (their pages say so; report one alone to draw it)")
        return text + f", and for the runs with the most faults, {TIMELINE_RUNS_MAX} in all."

    def why_not(self, run_id: str) -> str:
        """A run page's sentence for a run without a timeline."""
        if run_id in self.skipped:
            return (f"No timeline drawn: {self.must:,} runs of this report lost messages, "
                    f"broke a promise or stayed unwritable, and it draws the worst "
                    f"{MUST_DRAW_MAX:,} of them (a figure takes about half a second); report "
                    "this run alone (dlab report RUN_DIR) to see it.")
        return ("No timeline drawn: this run lost no acknowledged message and stayed "
                f"writable, and the report draws such runs only up to {TIMELINE_RUNS_MAX} in "
                "all, those with the most faults; report this run alone (dlab report "
                "RUN_DIR) to see it.")


def needs_timeline(verdicts: pd.DataFrame) -> pd.Series:
    """Per run: it lost acknowledged messages, broke a promise or stayed
    unwritable to the end."""
    return ((verdicts["acked_lost_master"] > 0) | (verdicts["promise_violations"] > 0)
            | (verdicts["evidence_breaches"] > 0) | (verdicts["acked_stranded"] > 0)
            | verdicts["unwritable_until_end"].astype(bool))


def to_draw(verdicts: pd.DataFrame) -> Drawn:
    order = _by_interest(verdicts)
    must = list(order.loc[needs_timeline(order), "run_id"])
    rest = [r for r in order["run_id"] if r not in set(must)]
    draw = must[:MUST_DRAW_MAX]
    draw += rest[:max(0, TIMELINE_RUNS_MAX - len(draw))]
    return Drawn(draw=draw, must=len(must), skipped=must[MUST_DRAW_MAX:])


def write_run_pages(out_dir: str, verdicts: pd.DataFrame, runs: Sequence[RunInfo],
                    lost: pd.DataFrame, drawn: Drawn | None = None,
                    tick: Callable[[], None] = lambda: None) -> Pages:
    """A page per run, with its timeline for the runs `drawn` says
    (to_draw's, by default); `tick` after each page."""
    runs_dir = os.path.join(out_dir, RUNS)
    os.makedirs(runs_dir, exist_ok=True)
    pages = Pages()
    by_id = {r.run_id: r for r in runs}
    drawn = drawn or to_draw(verdicts)
    plotted = set(drawn.draw)
    lost_by_run = {k: g for k, g in lost.groupby("run_id")}
    for v in verdicts.to_dict("records"):
        run = by_id[v["run_id"]]
        plot = None
        if run.run_id in plotted:
            fig = timeline_figure(run)
            name = f"{run.run_id}.png"
            fig.savefig(os.path.join(runs_dir, name), dpi=90)
            plot = name
            pages.plots[run.run_id] = f"{RUNS}/{quote(name)}"
            pages.paths.append(os.path.join(runs_dir, name))
        path = os.path.join(runs_dir, f"{run.run_id}.html")
        with open(path, "w", encoding="utf-8") as f:
            f.write(run_page_html(run, v, lost_by_run.get(run.run_id), plot, runs_dir,
                                  no_plot_why=drawn.why_not(run.run_id)))
        pages.paths.append(path)
        tick()
    return pages


# ------------------------------------------------------------------ figure
def _history(run: RunInfo) -> pd.DataFrame:
    h = pd.DataFrame(read_jsonl(run.history_path),
                     columns=["producer", "status", "invoke_ms", "complete_ms", "invoke_us",
                              "complete_us"])
    start_us = run.params["started_ms"] * 1000
    invoke_us = h["invoke_us"].fillna(h["invoke_ms"] * 1000)
    complete_us = h["complete_us"].fillna(h["complete_ms"] * 1000)
    return h.assign(t=(invoke_us - start_us) / 1e6,
                    latency_ms=((complete_us - invoke_us) / 1000).clip(lower=0.001))


def _status_colors(statuses: Sequence[str]) -> dict[str, str]:
    others = sorted(s for s in set(statuses) if s not in STATUS_COLORS)
    return {**STATUS_COLORS,
            **{s: OTHER_COLORS[i % len(OTHER_COLORS)] for i, s in enumerate(others)}}


def _marker(status: str, lane: bool = False) -> str:
    """Shape as well as colour: PUT_OK a tick (a dot in the latency panel),
    INDETERMINATE a diamond, any failed status a cross."""
    if status == PutStatus.PUT_OK:
        return "|" if lane else "."
    return "d" if status == INDETERMINATE else "x"


def _ms_label(v: float, _pos: Any = None) -> str:
    return f"{v:g}"


def timeline_figure(run: RunInfo) -> Figure:
    """A run's timeline: each producer's operations, the consumer's pulls and
    the faults per node in lanes; PUT latency; puts per second. Every panel
    has its own tick labels; a sim run says in its title and axes that its
    times are simulated, and its panels have a tinted background."""
    h = _history(run)
    start = run.params["started_ms"]
    end_s = (run.params["ended_ms"] - start) / 1000
    colors = _status_colors(list(h["status"].unique()))
    producers = sorted(int(p) for p in h["producer"].unique())
    consumed_path = os.path.join(run.run_dir, "consumed.jsonl")
    consumed = (pd.DataFrame(read_jsonl(consumed_path), columns=["incarnation", "time_ms"])
                if os.path.isfile(consumed_path) else None)
    lanes = [f"producer {p}" for p in producers]
    if consumed is not None:
        lanes.append("consumer")
    lanes += [n.name for n in run.nodes]
    y = {name: len(lanes) - 1 - i for i, name in enumerate(lanes)}

    fig = Figure(figsize=(12, 3.0 + 0.35 * len(lanes) + 4.5), layout="constrained")
    ax_lanes, ax_lat, ax_rate = fig.subplots(
        3, 1, sharex=True, height_ratios=[0.6 + 0.35 * len(lanes), 2.6, 1.6])
    sim = run.params["backend"] == "sim"
    clock = "simulated " if sim else ""
    fig.suptitle(f"{run.run_id}: {_mode(run)}, "
                 f"scenario {run.params['scenario']}, seed {run.params['seed']} — "
                 + ("SIM backend, simulated time" if sim
                    else f"{run.params['backend']} backend, wall-clock time"), fontsize=10)
    ax_lanes.set_xlim(0, max(end_s, float(h["t"].max()) if len(h) else 0.0, 0.001))

    for status, g in h.groupby("status"):
        ys = g["producer"].map(lambda p: y[f"producer {int(p)}"])
        ax_lanes.scatter(g["t"], ys, marker=_marker(str(status), lane=True),
                         s=60 if status == PutStatus.PUT_OK else 24,
                         color=colors[str(status)], linewidths=0.6, label=str(status))
    if consumed is not None and len(consumed):
        ax_lanes.scatter((consumed["time_ms"] - start) / 1000, [y["consumer"]] * len(consumed),
                         marker="|", s=60, color="#00798c", linewidths=0.6, label="delivered")
    kinds = _draw_faults(ax_lanes, run, y, start, ax_lanes.get_xlim())
    _draw_observations(ax_lanes, run, y, start)
    ax_lanes.set_yticks(list(y.values()), list(y))
    ax_lanes.set_ylim(-0.8, len(lanes) - 0.2)
    ax_lanes.set_ylabel("operations and faults", fontsize=8)
    ax_lanes.legend(handles=_lane_legend(ax_lanes, kinds, run), fontsize=7, loc="upper left",
                    bbox_to_anchor=(1.0, 1.0))
    _draw_latency(ax_lat, h, colors, clock)
    _draw_rate(ax_rate, h, end_s, clock)
    for ax in (ax_lat, ax_rate):
        _mark_faults(ax, run, start)
    for ax in (ax_lanes, ax_lat, ax_rate):
        ax.tick_params(labelsize=8, labelbottom=True)
        ax.set_xlabel(f"{clock}seconds since the run started", fontsize=8)
        if sim:
            ax.set_facecolor("#f2f6fa")
    ax_rate.legend(handles=[*ax_rate.get_legend_handles_labels()[0],
                            *_fault_handles(kinds)], fontsize=7, loc="upper left",
                   bbox_to_anchor=(1.0, 1.0))
    return fig


def _fault_style(kind: str) -> tuple[str, Any]:
    """A fault kind's colour and line style (the legend tells them apart)."""
    return FAULT_COLORS.get(kind, "#999999"), FAULT_LINESTYLES.get(kind, "-")


def _is_span(f: dict[str, Any]) -> bool:
    """A fault that lasts (a pause, a partition, a start) is drawn as a band."""
    return f["end_ms"] is not None and f["end_ms"] > f["start_ms"]


def _fault_handles(kinds: dict[str, bool]) -> list[Any]:
    """Legend entries for the fault kinds drawn: a line, or a band for a span."""
    handles: list[Any] = []
    for kind, span in kinds.items():
        color, style = _fault_style(kind)
        handles.append(Patch(color=color, alpha=0.3, label=f"{kind} (span)") if span
                       else Line2D([], [], color=color, linestyle=style, linewidth=1.5,
                                   label=f"{kind} (fault)"))
    return handles


def _lane_legend(ax: Any, kinds: dict[str, bool], run: RunInfo) -> list[Any]:
    """The lanes' statuses, the fault kinds and the observations drawn."""
    handles = list(ax.get_legend_handles_labels()[0]) + _fault_handles(kinds)
    if any(o["kind"] == "slave_ahead" and o["slave_offset"] > o["master_offset"]
           for o in run.observations):
        handles.append(Line2D([], [], marker="^", color="#9b5de5", linestyle="",
                              label="slave ahead"))
    if any(o["kind"] == "settle" and "stalled" in (o.get("detail") or "")
           for o in run.observations):
        handles.append(Line2D([], [], marker="s", color="#d1495b", linestyle="",
                              label="replication stalled"))
    return handles


def _draw_faults(ax: Any, run: RunInfo, y: dict[str, int], start: int,
                 xlim: tuple[float, float]) -> dict[str, bool]:
    """Each fault in its node's lane: a bar for one that lasts, a line for
    an instant one, labelled where the label does not run into the one
    before it in the lane (the legend names every kind). Returns the kinds
    drawn, each with whether it was drawn as a span."""
    kinds: dict[str, bool] = {}
    # A label's width in seconds: 7 pt characters (about 0.06 in) on an
    # axis about 8.5 in wide.
    char_s = (xlim[1] - xlim[0]) * 0.06 / 8.5
    label_end: dict[int, float] = {}
    for f in sorted(run.faults, key=lambda f: f["start_ms"]):
        node = f["node"]
        begin = (f["start_ms"] - start) / 1000
        label = f["kind"] + (f" ↔ {f['peer']}" if f.get("peer") else "")
        color, style = _fault_style(f["kind"])
        lane = y.get(node) if node is not None else None
        span = _is_span(f)
        kinds.setdefault(f["kind"], span)
        if lane is None:
            continue
        if span:
            width = (f["end_ms"] - f["start_ms"]) / 1000
            ax.broken_barh([(begin, width)], (lane - 0.35, 0.7), color=color, alpha=0.6)
        else:
            ax.plot([begin, begin], [lane - 0.45, lane + 0.45], color=color, linewidth=2,
                    linestyle=style)
        if begin >= label_end.get(lane, float("-inf")):
            ax.text(begin, lane + 0.38, label, fontsize=7, va="bottom", clip_on=True)
            label_end[lane] = begin + (len(label) + 1) * char_s
    return kinds


def _mark_faults(ax: Any, run: RunInfo, start: int) -> None:
    """The faults across a panel: a band for one that lasts, a line for an
    instant one, styled as in the legend."""
    for f in run.faults:
        color, style = _fault_style(f["kind"])
        begin = (f["start_ms"] - start) / 1000
        if _is_span(f):
            ax.axvspan(begin, (f["end_ms"] - start) / 1000, color=color, alpha=0.15)
        else:
            ax.axvline(begin, color=color, linewidth=1.2, linestyle=style)


def _draw_observations(ax: Any, run: RunInfo, y: dict[str, int], start: int) -> None:
    """A slave seen ahead of its master, and replication that stalled."""
    for o in run.observations:
        at = (o["time_ms"] - start) / 1000
        if o["kind"] == "slave_ahead" and o["slave_offset"] > o["master_offset"]:
            lane = y.get(o["slave"])
            if lane is not None:
                ax.plot(at, lane, marker="^", color="#9b5de5", markersize=8)
                gap = o["slave_offset"] - o["master_offset"]
                ax.text(at, lane - 0.42, f" ahead {gap:,} B", fontsize=7, va="top",
                        color="#6a2ca5")
        elif o["kind"] == "settle" and "stalled" in (o.get("detail") or ""):
            lane = y.get(o.get("master") or run.nodes[0].name, 0)
            ax.plot(at, lane, marker="s", color="#d1495b", markersize=7)
            ax.text(at, lane - 0.42, " replication stalled", fontsize=7, va="top",
                    color="#d1495b")


def _log_ticks(ax: Any, values: pd.Series) -> None:
    """A log axis over whole decades (at least one) with ticks at 1, 2 and 5
    of each decade (1 only over more than three), every tick labelled."""
    lo = float(values.min()) if len(values) else 1.0
    hi = float(values.max()) if len(values) else 1.0
    lo_exp, hi_exp = int(np.floor(np.log10(lo))), int(np.ceil(np.log10(hi)))
    hi_exp = max(hi_exp, lo_exp + 1)
    ax.set_ylim(10.0 ** lo_exp, 10.0 ** hi_exp)
    subs = (1.0, 2.0, 5.0) if hi_exp - lo_exp <= 3 else (1.0,)
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=subs))
    ax.yaxis.set_major_formatter(FuncFormatter(_ms_label))
    ax.yaxis.set_minor_formatter(NullFormatter())


def _draw_latency(ax: Any, h: pd.DataFrame, colors: dict[str, str], sim: str) -> None:
    """Each put's latency by status (a shape per kind of status), with
    PUT_OK's p50 and p99 per bin (`sim`: "simulated " on a sim run)."""
    for status, g in h.groupby("status"):
        ok = status == PutStatus.PUT_OK
        ax.scatter(g["t"], g["latency_ms"], s=4 if ok else 14, marker=_marker(str(status)),
                   alpha=0.35 if ok else 0.8, color=colors[str(status)],
                   label=f"{status} ({len(g):,})", linewidths=0 if ok else 0.8)
    ok = h[h["status"] == PutStatus.PUT_OK]
    if len(ok):
        bins = np.floor(ok["t"] / BIN_S) * BIN_S + BIN_S / 2
        q = ok.groupby(bins)["latency_ms"].quantile([0.5, 0.99]).unstack()
        ax.plot(q.index, q[0.5], color="black", linewidth=1, label="PUT_OK p50")
        ax.plot(q.index, q[0.99], color="#d1495b", linewidth=1, label="PUT_OK p99")
    ax.set_yscale("log")
    _log_ticks(ax, h["latency_ms"])
    ax.set_ylabel(f"latency, {sim}ms (log)", fontsize=8)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))


def _draw_rate(ax: Any, h: pd.DataFrame, end_s: float, sim: str) -> None:
    """PUT_OK (solid) and failed (dash-dotted) puts per second."""
    ok = h[h["status"] == PutStatus.PUT_OK]
    edges = np.arange(0, max(end_s, float(h["t"].max()) if len(h) else 0) + BIN_S, BIN_S)
    if len(edges) > 1:
        for name, g, color, style in (
                ("PUT_OK", ok, STATUS_COLORS[PutStatus.PUT_OK], "-"),
                ("failed", h[h["status"] != PutStatus.PUT_OK], FAILED_COLOR, "-.")):
            n, _ = np.histogram(g["t"], bins=edges)
            ax.step(edges[:-1], n / BIN_S, where="post", color=color, linestyle=style,
                    label=name)
    ax.set_ylim(bottom=0)
    ax.yaxis.set_major_locator(MaxNLocator(nbins=4))
    ax.set_ylabel(f"puts per {sim}second", fontsize=8)


# ------------------------------------------------------------------ page
def _rel(run_dir: str, runs_dir: str, *parts: str) -> str:
    return quote(os.path.relpath(os.path.join(run_dir, *parts), runs_dir).replace(os.sep, "/"))


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _s(ms: int | None, start: int) -> str:
    return "–" if ms is None else f"{(ms - start) / 1000:.3f}"


def _facts(run: RunInfo, v: dict[str, Any], sec: str, ms: str) -> list[tuple[str, str]]:
    """A run page's facts: what ran, and what it came to (`sec`, `ms`: the
    units, simulated on a sim run)."""
    return [
        ("mode", _mode(run)),
        ("scenario, seed", f"{run.params['scenario']}, {run.params['seed']}"),
        ("conditions", f"backend {run.params['backend']}, crash model "
                       f"{run.params['crash_model']}, slave-ahead policy "
                       f"{run.params['slave_ahead_policy']}, ship limit "
                       f"{run.params['ha_ship_limit']}"),
        ("nodes", ", ".join(f"{n.name} ({n.role})" for n in run.nodes)),
        ("duration", f"{v['duration_s']:.1f} {sec}"),
        ("PUT_OK latency p50 / p99",
         "–" if pd.isna(v["put_ok_p50_us"]) else
         f"{v['put_ok_p50_us'] / 1000:.3g} {ms} / {v['put_ok_p99_us'] / 1000:.3g} {ms}"),
        ("fault → PUT_OK", "unwritable until the end" if v["unwritable_until_end"]
         else "–" if pd.isna(v["fault_to_put_ok_s"]) else f"{v['fault_to_put_ok_s']:.3f} {sec}"),
        ("time without a writable master",
         "–" if pd.isna(v["unwritable_s"]) else f"{v['unwritable_s']:.3f} {sec}"),
        ("failed puts from the first fault",
         "–" if pd.isna(v["failed_after_fault_per_s"]) else
         f"{v['failed_after_fault_share']:.1%}, {v['failed_after_fault_per_s']:.3g} per {sec}"),
        ("failures by status", ", ".join(
            f"{k} {n:,}" for k, n in sorted(json.loads(v["failed_by_status"]).items(),
                                            key=lambda kv: -kv[1])) or "none"),
        ("split brain", _split_brain_fact(v)),
        ("divergence", _divergence_fact(v)),
        ("slave ahead", f"at the master's restart {v['slave_ahead_at_restart_bytes']:,} bytes, "
                        f"at the end {v['slave_ahead_at_end_bytes']:,} bytes"),
        ("judged from", v["judged_from"] + (
            f" (stores: {v['stores_kept_why']})"
            if isinstance(v.get("stores_kept_why"), str) else "")),
    ]


def _split_brain_fact(v: dict[str, Any]) -> str:
    n = int(v.get("split_brain_acks") or 0)
    return (plural(n, "PUT_OK") + " answered by a node the route no longer named as master"
            if n else "none")


def _divergence_fact(v: dict[str, Any]) -> str:
    n = int(v.get("divergent_records") or 0)
    first = v.get("first_divergent_offset")
    if not n:
        return "none"
    where = "" if first is None or pd.isna(first) else f", the first at offset {int(first):,}"
    return plural(n, "record") + " the master and another node hold differently" + where


def _lost_section(v: dict[str, Any], lost: pd.DataFrame | None) -> list[str]:
    """The lost acknowledged messages, with who still holds each."""
    e = html.escape
    out: list[str] = []
    n_lost = int(v["acked_lost_master"])
    out.append(f'<h2 id="lost">Lost acknowledged messages ({n_lost:,})</h2>')
    if lost is not None and len(lost):
        shown = "" if len(lost) >= n_lost else f" (the first {len(lost):,}; lost.csv)"
        out += [f"<p>Missing from the recovered master{shown}; held by: the nodes that still "
                "hold it.</p>", _table(
                    ["msg_id", "acked offset", "held by", "lost everywhere", "stranded",
                     "violation"],
                    [[e(r.msg_id), "–" if pd.isna(r.acked_offset) else f"{int(r.acked_offset):,}",
                      e(r.held_by or "none"), "yes" if r.lost_everywhere else "no",
                      "yes" if r.stranded else "no", "yes" if r.violation else "no"]
                     for r in lost.itertuples()])]
    else:
        out.append("<p>None: the recovered master holds every acknowledged message.</p>")
    return out


def _file_links(run: RunInfo, runs_dir: str) -> list[str]:
    """Links to the run's files, each node's log, read-back and kept store."""
    e = html.escape
    files = [("history", "history.jsonl"), ("faults", "faults.jsonl"),
             ("observations", "observations.jsonl"), ("parameters", "params.json")]
    if os.path.isfile(os.path.join(run.run_dir, "consumed.jsonl")):
        files.append(("consumed", "consumed.jsonl"))
    items = [f'<li><a href="{_rel(run.run_dir, runs_dir, rel)}">{e(name)}</a></li>'
             for name, rel in files]
    for n in run.nodes:
        links = [f'<a href="{_rel(run.run_dir, runs_dir, "nodes", n.name, rel)}">{what}</a>'
                 for rel, what in (("node.log", "node log"), ("records.jsonl", "records read back"))
                 if os.path.isfile(os.path.join(run.run_dir, "nodes", n.name, rel))]
        items.append(f"<li>{e(n.name)}: {', '.join(links)}")
        store = n.store_dir or os.path.join(run.run_dir, "cluster", "nodes", n.name, "data")
        if os.path.isdir(store):
            items[-1] += (f', <a href="{quote(os.path.relpath(store, runs_dir))}/">kept '
                          "store</a>")
        items[-1] += "</li>"
    return items


def crash_point_section(explore: Any, start: int, sec: str) -> list[str]:
    """A case of `dlab chaos explore` (chaos/explore/): where it crashed,
    in which disk state, and the run's events up to the crash."""
    if not isinstance(explore, dict) or not explore.get("trace") or "event" not in explore:
        return []
    e = html.escape
    state = explore.get("state") or {}
    kept = "; ".join(f"{node}: " + (", ".join(f"{path} keeps {w} whole" + (
        f" + {t} bytes torn" if t else "") for path, (w, t) in files.items())
        or "durable bytes only") for node, files in state.items())
    return ["<h2>Crash point</h2>",
            f"<p>Crashed {e(str(explore.get('target')))} right after event "
            f"{explore['event']} ({e(str(explore.get('expect', '')))}), disk state "
            f"{explore.get('state_index')}: {e(kept)}. The events of the run up to the "
            "crash:</p>",
            _table(["#", f"at {sec}", "node", "event", "file"],
                   [[str(t["index"]), _s(t["at_ms"], start), e(t["node"]), e(t["kind"]),
                     e(t["detail"] or "–")] for t in explore["trace"]])]


def run_page_html(run: RunInfo, v: dict[str, Any], lost: pd.DataFrame | None,
                  plot: str | None, runs_dir: str, no_plot_why: str = "") -> str:
    e = html.escape
    start = run.params["started_ms"]
    # The sim backend's times are simulated time (docs/simulation.md).
    sec, ms = ("simulated s", "simulated ms") if run.params["backend"] == "sim" else ("s", "ms")
    verdict = (f"{v['acked_lost_master']:,} acknowledged messages lost on the master, "
               f"{v['acked_lost_everywhere']:,} everywhere, {v['acked_stranded']:,} stranded, "
               f"{v['promise_violations']:,} promise violations; "
               f"{v.get('evidence_breaches', 0):,} PUT_OKs not covered by their evidence; "
               f"{v['failed']:,} of {v['puts']:,} puts failed ({v['failed_put_share']:.1%})")
    facts = _facts(run, v, sec, ms)
    out = ["<!doctype html>", '<html lang="en"><head><meta charset="utf-8">',
           f"<title>{e(run.run_id)}</title><style>",
           "body{font-family:sans-serif;max-width:80rem;margin:1rem auto;padding:0 1rem}",
           "table{border-collapse:collapse;font-size:.8rem;margin:.5rem 0}",
           "td,th{border:1px solid #ccc;padding:.2rem .35rem;text-align:left;"
           "overflow-wrap:anywhere}th{background:#f4f4f4;overflow-wrap:normal}",
           "img{max-width:100%}",
           "</style></head><body>",
           '<p><a href="../report.html">← the report</a></p>',
           f"<h1>{e(run.run_id)}</h1>", f'<p id="verdict">{e(verdict)}.</p>',
           _table(["", ""], [[e(k), e(str(val))] for k, val in facts])]
    if plot:
        out += ["<h2>Timeline</h2>",
                "<p>Lanes: each producer's puts at their invoke time by status, the "
                "consumer's deliveries, each node's faults (a span from start to end; a line "
                "for an instant fault such as a kill), ▲ slave ahead, ■ replication stalled. "
                "Then every put's latency with the PUT_OK p50 and p99 per half second, and "
                "puts per second.</p>",
                f'<p><img src="{quote(plot)}" alt="timeline of {e(run.run_id)}"></p>']
    else:
        out.append(f'<p id="no-timeline">{e(no_plot_why or "No timeline drawn.")}</p>')
    if v.get("first_evidence_breaches"):
        out += ["<h2>PUT_OKs their evidence does not cover</h2>",
                "<p>The first few (seconds since the run started; chaos/check/evidence.py):"
                "</p>", "<pre>" + e(str(v["first_evidence_breaches"])) + "</pre>"]
    out += ["<h2>Faults</h2>", _table(
        ["#", "kind", "node", "peer", f"start {sec}", f"end {sec}", "damages disk", "detail"],
        [[str(f["fault_id"]), e(f["kind"]), e(f["node"] or "–"), e(f.get("peer") or "–"),
          _s(f["start_ms"], start), _s(f["end_ms"], start), "yes" if f["damages_disk"] else "no",
          e(f.get("detail") or "")] for f in run.faults]) if run.faults else "<p>None.</p>"]
    out += crash_point_section(run.params.get("explore"), start, sec)
    obs = [o for o in run.observations if o["kind"] in ("slave_ahead", "settle")]
    if obs:
        out += ["<h2>Observations</h2>", _table(
            [f"at {sec}", "kind", "master", "slave", "master offset", "slave offset", "detail"],
            [[_s(o["time_ms"], start), e(o["kind"]), e(o.get("master") or "–"),
              e(o.get("slave") or "–"), "–" if o.get("master_offset") is None
              else f"{o['master_offset']:,}", "–" if o.get("slave_offset") is None
              else f"{o['slave_offset']:,}", e(o.get("detail") or "")] for o in obs])]
    out += _lost_section(v, lost)
    items = _file_links(run, runs_dir)
    out += ["<h2>Files</h2>", "<ul>" + "".join(items) + "</ul>", "</body></html>"]
    return "\n".join(out) + "\n"


def _mode(run: RunInfo) -> str:
    """The run's mode as the report names it (blocks.mode_label)."""
    p = run.params
    return blocks.mode_label(p["role"], p["flush"], blocks.ha_label(p))
