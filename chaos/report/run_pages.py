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

The timeline reads the run's history again in Python, so only the
TIMELINE_RUNS_MAX most interesting runs (promise violations, stranded, lost
on the master, then most faults) get one; every run gets its page.
"""

from __future__ import annotations

import html
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullFormatter

from chaos.check.run_dirs import RunInfo
from chaos.schema import read_jsonl
from store.status import INDETERMINATE, PutStatus

RUNS = "runs"
TIMELINE_RUNS_MAX = 40
BIN_S = 0.5
STATUS_COLORS = {PutStatus.PUT_OK: "#4c9f70", INDETERMINATE: "#2b2d42"}
OTHER_COLORS = ["#d1495b", "#edae49", "#00798c", "#6a4c93", "#8d6a9f", "#f46036", "#8d99ae"]
FAULT_COLORS = {"kill": "#d1495b", "stop": "#8d99ae", "start": "#4c9f70", "restart": "#4c9f70",
                "pause": "#f2b134", "resume": "#f2b134", "partition": "#00798c",
                "heal": "#00798c", "torn_tail": "#6a4c93", "bit_flip": "#6a4c93",
                "failpoint": "#edae49"}


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


def write_run_pages(out_dir: str, verdicts: pd.DataFrame, runs: Sequence[RunInfo],
                    lost: pd.DataFrame) -> Pages:
    runs_dir = os.path.join(out_dir, RUNS)
    os.makedirs(runs_dir, exist_ok=True)
    pages = Pages()
    by_id = {r.run_id: r for r in runs}
    plotted = set(_by_interest(verdicts)["run_id"][:TIMELINE_RUNS_MAX])
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
            f.write(run_page_html(run, v, lost_by_run.get(run.run_id), plot, runs_dir))
        pages.paths.append(path)
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


def _ms_label(v: float, _pos: Any = None) -> str:
    return f"{v:g}"


def timeline_figure(run: RunInfo) -> Figure:
    """A run's timeline: each producer's operations, the consumer's pulls and
    the faults per node in lanes; PUT latency; puts per second."""
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

    fig = Figure(figsize=(12, 3.0 + 0.3 * len(lanes) + 4.5), layout="constrained")
    ax_lanes, ax_lat, ax_rate = fig.subplots(
        3, 1, sharex=True, height_ratios=[0.6 + 0.3 * len(lanes), 2.6, 1.6])
    fig.suptitle(f"{run.run_id}: {run.params['role']} + {run.params['flush']}, "
                 f"scenario {run.params['scenario']}, seed {run.params['seed']}", fontsize=10)

    for status, g in h.groupby("status"):
        ys = g["producer"].map(lambda p: y[f"producer {int(p)}"])
        ax_lanes.scatter(g["t"], ys, marker="|", s=60, color=colors[str(status)],
                         linewidths=0.6)
    if consumed is not None and len(consumed):
        ax_lanes.scatter((consumed["time_ms"] - start) / 1000, [y["consumer"]] * len(consumed),
                         marker="|", s=60, color="#00798c", linewidths=0.6)
    spans, instants = _draw_faults(ax_lanes, run, y, start)
    _draw_observations(ax_lanes, run, y, start)
    ax_lanes.set_yticks(list(y.values()), list(y))
    ax_lanes.set_ylim(-0.8, len(lanes) - 0.2)
    ax_lanes.set_ylabel("operations and faults", fontsize=8)
    ax_lanes.tick_params(labelsize=8)
    sim = "simulated " if run.params["backend"] == "sim" else ""
    _draw_latency(ax_lat, h, colors, sim)
    _draw_rate(ax_rate, h, end_s, sim)
    for ax in (ax_lat, ax_rate):
        for begin, width, color in spans:
            ax.axvspan(begin, begin + width, color=color, alpha=0.15)
        for at, color in instants:
            ax.axvline(at, color=color, linewidth=1.2, linestyle="--")
    return fig


def _draw_faults(ax: Any, run: RunInfo, y: dict[str, int], start: int,
                 ) -> tuple[list[tuple[float, float, str]], list[tuple[float, str]]]:
    """Each fault in its node's lane: a bar for one with a duration, a line
    for an instant one. Returns both, for the other panels to mark."""
    instants: list[tuple[float, str]] = []
    spans: list[tuple[float, float, str]] = []
    for f in run.faults:
        node = f["node"]
        begin = (f["start_ms"] - start) / 1000
        label = f["kind"] + (f" ↔ {f['peer']}" if f.get("peer") else "")
        color = FAULT_COLORS.get(f["kind"], "#999999")
        lane = y.get(node) if node is not None else None
        if lane is None and node == "consumer":
            lane = y.get("consumer")
        if f["end_ms"] is not None and f["end_ms"] > f["start_ms"]:
            width = (f["end_ms"] - f["start_ms"]) / 1000
            spans.append((begin, width, color))
            if lane is not None:
                ax.broken_barh([(begin, width)], (lane - 0.35, 0.7), color=color, alpha=0.6)
                ax.text(begin, lane + 0.38, label, fontsize=7, va="bottom")
        else:
            instants.append((begin, color))
            if lane is not None:
                ax.plot([begin, begin], [lane - 0.45, lane + 0.45], color=color, linewidth=2)
                ax.text(begin, lane + 0.38, label, fontsize=7, va="bottom")
    return spans, instants


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


def _draw_latency(ax: Any, h: pd.DataFrame, colors: dict[str, str], sim: str) -> None:
    """Each put's latency by status, with PUT_OK's p50 and p99 per bin
    (`sim`: "simulated " on a sim run, whose times are simulated)."""
    for status, g in h.groupby("status"):
        ax.scatter(g["t"], g["latency_ms"], s=3 if status == PutStatus.PUT_OK else 8,
                   alpha=0.35 if status == PutStatus.PUT_OK else 0.8, color=colors[str(status)],
                   label=f"{status} ({len(g):,})", linewidths=0)
    ok = h[h["status"] == PutStatus.PUT_OK]
    if len(ok):
        bins = np.floor(ok["t"] / BIN_S) * BIN_S + BIN_S / 2
        q = ok.groupby(bins)["latency_ms"].quantile([0.5, 0.99]).unstack()
        ax.plot(q.index, q[0.5], color="black", linewidth=1, label="PUT_OK p50")
        ax.plot(q.index, q[0.99], color="#d1495b", linewidth=1, label="PUT_OK p99")
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(_ms_label))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_ylabel(f"latency, {sim}ms (log)", fontsize=8)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.tick_params(labelsize=8)


def _draw_rate(ax: Any, h: pd.DataFrame, end_s: float, sim: str) -> None:
    """PUT_OK and failed puts per second."""
    ok = h[h["status"] == PutStatus.PUT_OK]
    edges = np.arange(0, max(end_s, float(h["t"].max()) if len(h) else 0) + BIN_S, BIN_S)
    if len(edges) > 1:
        for name, g, color in (("PUT_OK", ok, STATUS_COLORS[PutStatus.PUT_OK]),
                               ("failed", h[h["status"] != PutStatus.PUT_OK], "#d1495b")):
            n, _ = np.histogram(g["t"], bins=edges)
            ax.step(edges[:-1], n / BIN_S, where="post", color=color, label=name)
    ax.set_ylabel(f"puts per {sim}second", fontsize=8)
    ax.set_xlabel(f"{sim}seconds since the run started", fontsize=8)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.tick_params(labelsize=8)


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
        ("mode", f"{run.params['role']} + {run.params['flush']}"),
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
        ("slave ahead", f"at the master's restart {v['slave_ahead_at_restart_bytes']:,} bytes, "
                        f"at the end {v['slave_ahead_at_end_bytes']:,} bytes"),
        ("judged from", v["judged_from"] + (
            f" (stores: {v['stores_kept_why']})"
            if isinstance(v.get("stores_kept_why"), str) else "")),
    ]


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
                  plot: str | None, runs_dir: str) -> str:
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
        out.append(f"<p>No timeline drawn: the report draws the {TIMELINE_RUNS_MAX} runs "
                   "that lost most; report this run alone to see it.</p>")
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
