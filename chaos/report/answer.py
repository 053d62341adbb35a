"""The report's first screen: the answer, per mode (and per mode and
scenario), with each backend (sim, local, compose) in a column of its own —
runs of two backends are never pooled in one cell.

A backend's cell says, over its n runs of the row:
- lost           runs where some acknowledged message was missing from the
                 recovered master, k/n with the 95 % Wilson interval
                 (chaos/check/rates.py), and the messages lost per run
                 (median, max);
- broke promise  runs with a promise violation or a PUT_OK its evidence did
                 not cover (chaos/check/evidence.py);
- stranded       runs where some acknowledged message was held only by slaves
                 the master rejects or ignores, and the most in one run;
- slave ahead    runs where a slave held more than the master;
- unwritable     the time without a writable master per run (median, max)
                 and the runs that stayed unwritable to the end; the puts
                 refused from the first fault on, as a share and per second
                 of load (chaos/check/outage.py) — figures per unit of time,
                 so runs of different lengths compare; the sim's are
                 simulated time and say so;
- load           the puts per second the runs carried, and their length.

Beside them, when the runs come with the agreement.json of `dlab chaos
compare-backends` (found by find_agreement), its verdict for the mode, and
where the backends differ, why: the agreement's own explanation where it
gives one (a question's "why", text or per mode), and what differs between
the two sides' runs (load, length, n).

Below it, for the master-fault scenarios: restart in place beside fail
over (restart_vs_failover_table), and what a failover left behind
(failover_table): per mode and failover scenario, the runs with a PUT_OK
answered by a node no longer master (split brain) and how many such acks,
and the runs whose old and new master's logs hold different records at one
offset, with where each run's logs part (its first divergent offset).

Pure pandas over the verdicts (a row per run, chaos/report/tables.py),
except find_agreement, which reads the file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import median
from typing import Any

import pandas as pd

from chaos.check import promises, rates
from chaos.harness.scenarios import CONTROLLER_MATRIX, FAILOVER_MATRIX
from chaos.report.blocks import Table, group_anchor, modes_in, plural, run_page, severity

BACKENDS = ("sim", "local", "compose")
AGREEMENT_FILE = "agreement.json"
# agreement.json's questions answered per mode (rates[mode][backend] = {k, n, cell}).
PER_MODE_QUESTIONS = {"lost_master": "lost", "slave_ahead": "slave ahead"}


def backends(verdicts: pd.DataFrame) -> list[str]:
    """The backends of the runs, in BACKENDS order (any other after them)."""
    present = {str(b) for b in verdicts["backend"]}
    return [b for b in BACKENDS if b in present] + sorted(present - set(BACKENDS))


def _seconds(backend: str) -> str:
    """Seconds, of simulated time on the sim backend (docs/simulation.md)."""
    return "simulated s" if backend == "sim" else "s"


def _median(values: pd.Series) -> float | None:
    clean = [float(v) for v in values if v is not None and not pd.isna(v)]
    return median(clean) if clean else None


@dataclass(frozen=True)
class Figures:
    """One backend's runs of a row, as the answer gives them (module doc)."""

    backend: str
    n: int
    lost: int
    violated: int
    stranded: int
    slave_ahead: int
    lost_median: float
    lost_max: int
    stranded_max: int
    slave_ahead_max_bytes: int
    unwritable_median_s: float | None
    unwritable_max_s: float | None
    unwritable_to_end: int
    refused_share: float | None  # median over the runs with a fault
    refused_per_s: float | None
    puts_per_s: float | None
    duration_s: float | None

    @property
    def severity(self) -> str:
        return severity(self.violated, self.stranded, self.lost)


def figures(runs: pd.DataFrame, backend: str) -> Figures:
    """The answer's figures over `runs` (verdict rows of one backend)."""
    violated = (runs["promise_violations"] > 0) | (runs["evidence_breaches"] > 0)
    unwritable = runs["unwritable_s"].dropna()
    load = runs["puts"] / runs["duration_s"].where(runs["duration_s"] > 0)
    return Figures(
        backend=backend, n=len(runs),
        lost=int((runs["acked_lost_master"] > 0).sum()), violated=int(violated.sum()),
        stranded=int((runs["acked_stranded"] > 0).sum()),
        slave_ahead=int(runs["slave_ahead"].sum()),
        lost_median=float(runs["acked_lost_master"].median()),
        lost_max=int(runs["acked_lost_master"].max()),
        stranded_max=int(runs["acked_stranded"].max()),
        slave_ahead_max_bytes=int(max(runs["slave_ahead_at_restart_bytes"].max(),
                                      runs["slave_ahead_at_end_bytes"].max())),
        unwritable_median_s=_median(unwritable),
        unwritable_max_s=float(unwritable.max()) if len(unwritable) else None,
        unwritable_to_end=int(runs["unwritable_until_end"].sum()),
        refused_share=_median(runs["failed_after_fault_share"]),
        refused_per_s=_median(runs["failed_after_fault_per_s"]),
        puts_per_s=_median(load), duration_s=_median(runs["duration_s"]))


def _rate(k: int, n: int) -> str:
    return rates.rate_cell(k, n, *rates.wilson_interval(k, n))


def _runs_rate(k: int, n: int) -> str:
    """'2/10 runs (6–51 %)': k of n runs, with the 95 % Wilson interval."""
    low, high = rates.wilson_interval(k, n)
    return f"{k}/{n} runs ({100 * low:.0f}–{100 * high:.0f} %)"


def _num(v: float | None) -> str:
    if v is None:
        return "–"
    return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"


def unwritable_text(f: Figures) -> str:
    """Time without a writable master per run, in the backend's seconds."""
    if f.unwritable_median_s is None:
        return "unwritable: no fault"
    to_end = f" · {f.unwritable_to_end} to the end" if f.unwritable_to_end else ""
    return (f"unwritable/run: median {_num(f.unwritable_median_s)}, max "
            f"{_num(f.unwritable_max_s)} {_seconds(f.backend)}{to_end}")


def refused_text(f: Figures) -> str:
    if f.refused_share is None:
        return "refused after fault: no fault"
    per = "simulated second" if f.backend == "sim" else "second"
    per_s = "" if f.refused_per_s is None else f" · {_num(f.refused_per_s)} per {per}"
    return f"refused after fault: {f.refused_share:.1%} of puts{per_s}"


def cell_text(f: Figures) -> str:
    """A backend's cell of the answer table, a figure a line."""
    return "\n".join([
        f"lost: {_runs_rate(f.lost, f.n)} · msgs/run median {_num(f.lost_median)}, "
        f"max {f.lost_max:,}",
        f"broke promise: {_runs_rate(f.violated, f.n)}",
        f"stranded: {_runs_rate(f.stranded, f.n)} · max {f.stranded_max:,} msgs",
        f"slave ahead: {_runs_rate(f.slave_ahead, f.n)} · max {f.slave_ahead_max_bytes:,} B",
        unwritable_text(f),
        refused_text(f),
    ])


def short_cell_text(f: Figures) -> str:
    """A backend's cell of the by-scenario table."""
    lost = f"lost {_rate(f.lost, f.n)}" + (f", max {f.lost_max:,}" if f.lost_max else "")
    stranded = f"stranded {f.stranded}/{f.n}" + (f", max {f.stranded_max:,}"
                                                  if f.stranded_max else "")
    unwritable = ("" if not f.unwritable_max_s else
                  f"\nunwritable ≤ {_num(f.unwritable_max_s)} {_seconds(f.backend)}"
                  + (f" ({f.unwritable_to_end} to the end)" if f.unwritable_to_end else ""))
    return f"{lost}\nbroke promise {f.violated}/{f.n} · {stranded}{unwritable}"


def load_text(f: Figures) -> str:
    """The load the backend's runs carried: puts per second of run, run length, n."""
    per = "simulated second" if f.backend == "sim" else "second"
    return (f"{f.backend}: {_num(f.puts_per_s)} puts per {per}, runs of "
            f"{_num(f.duration_s)} {_seconds(f.backend)}, n = {f.n}")


# ------------------------------------------------------------ agreement
@dataclass(frozen=True)
class Agreement:
    """compare-backends' agreement.json, and where it was found."""

    path: str
    data: Mapping[str, Any]

    def questions(self) -> Mapping[str, Any]:
        q = self.data.get("questions")
        return q if isinstance(q, Mapping) else {}


def find_agreement(paths: Sequence[str], run_dirs: Sequence[str]
                   ) -> tuple[Agreement | None, str | None]:
    """The agreement.json of the compare-backends result a report is over:
    in a directory given, else in the directory holding all its runs or the
    one above it (compare-backends' OUT holds OUT/local/RUN and OUT/sim/RUN).
    Returns it, or None and why it could not be read (None, None: none)."""
    candidates = [os.path.join(p, AGREEMENT_FILE) for p in paths if os.path.isdir(p)]
    if run_dirs:
        common = os.path.commonpath([os.path.abspath(d) for d in run_dirs])
        candidates += [os.path.join(common, AGREEMENT_FILE),
                       os.path.join(os.path.dirname(common), AGREEMENT_FILE)]
    for path in candidates:
        if not os.path.isfile(path):
            continue
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            return None, f"{path}: not read ({exc}); the report has no agreement verdict"
        if not isinstance(data, dict) or not isinstance(data.get("questions"), dict):
            return None, (f"{path}: not an agreement of dlab chaos compare-backends (no "
                          "questions); the report has no agreement verdict")
        return Agreement(os.path.abspath(path), data), None
    return None, None


def _why(question: Mapping[str, Any], mode: str) -> str | None:
    """The agreement's own explanation of a difference, if it gives one."""
    for key in ("why", "explanation"):
        why = question.get(key)
        if isinstance(why, Mapping):
            why = why.get(mode)
        if isinstance(why, str) and why:
            return why
    return None


def _seen_by(per_backend: Mapping[str, Any]) -> dict[str, bool]:
    return {b: int(r.get("k", 0)) > 0 for b, r in per_backend.items()
            if isinstance(r, Mapping) and r.get("n")}


def _agreement_lines(agreement: Agreement, mode: str) -> tuple[list[str], bool, bool]:
    """Per question of PER_MODE_QUESTIONS: agree, or how the sides differ.
    Also whether some differ, and whether every difference is within chance."""
    lines, differs, chance = [], False, True
    for key, label in PER_MODE_QUESTIONS.items():
        q = agreement.questions().get(key)
        per = q.get("rates", {}).get(mode) if isinstance(q, Mapping) else None
        if not isinstance(per, Mapping) or not per:
            continue
        assert isinstance(q, Mapping)
        seen = _seen_by(per)
        # The mode's own verdict (agree / differ / open, by Fisher's test),
        # where the agreement gives one; else whether both saw it.
        verdict = per.get("verdict") if isinstance(per.get("verdict"), str) else None
        if verdict == "agree" or (verdict is None and len(set(seen.values())) <= 1):
            lines.append(f"{label}: agree")
            continue
        sides = ", ".join(f"{b} {per[b].get('cell') or _rate(per[b]['k'], per[b]['n'])}"
                          for b in seen)
        if verdict == "open":
            lines.append(f"{label}: open (within chance, not a finding): {sides}")
        else:
            differs = True
            within = str(q.get("verdict", "")).startswith("differ, within chance")
            chance = chance and within
            lines.append(f"{label}: DIFFER{' (within chance)' if within else ''}: {sides}")
        why = per.get("why") if isinstance(per.get("why"), str) else None
        why = why or _why(q, mode)
        if why:
            lines.append(f"why: {why}")
    return lines, differs, chance


def _own_difference(figs: Mapping[str, Figures]) -> list[str]:
    """Without an agreement: the outcomes some backends saw and others not."""
    out = []
    for label, attr in (("lost", "lost"), ("broke promise", "violated"),
                        ("stranded", "stranded"), ("slave ahead", "slave_ahead")):
        seen = [b for b, f in figs.items() if getattr(f, attr)]
        if seen and len(seen) < len(figs):
            out.append(f"{label}: seen on {', '.join(seen)} only ("
                       + ", ".join(f"{b} {getattr(f, attr)}/{f.n}" for b, f in figs.items())
                       + ")")
    return out


def mode_agreement(agreement: Agreement | None, mode: str,
                   figs: Mapping[str, Figures]) -> tuple[str, str]:
    """The agreement cell of a mode and its class: the verdict per question,
    and where the backends differ, why (module doc)."""
    if agreement is not None:
        lines, differs, chance = _agreement_lines(agreement, mode)
        cls = "" if not lines else "ok" if not differs else "loss" if chance else "violation"
    else:
        lines = _own_difference(figs)
        differs, cls = bool(lines), ""
        lines = lines or ["no outcome seen on one backend only"]
        lines.append("not judged: no agreement.json (dlab chaos compare-backends)")
    if differs and len(figs) > 1:
        lines.append("their runs: " + "; ".join(load_text(f) for f in figs.values()))
    return "\n".join(lines) or "–", cls


def agreement_sentence(agreement: Agreement | None, verdicts: pd.DataFrame) -> str:
    """The line above the answer: the agreement's verdict per question, or
    why there is none."""
    present = backends(verdicts)
    if len(present) < 2:
        return f"All {plural(len(verdicts), 'run')} on the {present[0]} backend."
    if agreement is None:
        return ("Runs of " + ", ".join(present) + " side by side; they came without an "
                "agreement.json (dlab chaos compare-backends writes one), so no agreement "
                "verdict.")
    questions = [(k, q) for k, q in agreement.questions().items() if isinstance(q, Mapping)]
    agree = agreement.data.get("agree")
    head = ("The backends **AGREE** on what matters" if agree is True else
            "The backends **DISAGREE** on what matters" if agree is False else
            "The backends' agreement")
    return (f"{head} ({os.path.basename(agreement.path)}): "
            + "; ".join(f"{i}. {q.get('question', k)}: {str(q.get('verdict', '?')).upper()}"
                        for i, (k, q) in enumerate(questions, 1)) + ".")


# ------------------------------------------------------------ tables
def load_sentence(verdicts: pd.DataFrame) -> str:
    """Which load the answer is for: per backend, what its runs carried."""
    return ("The answer is for the load these runs carried — " + "; ".join(
        load_text(figures(verdicts[verdicts["backend"] == b], b))
        for b in backends(verdicts)) + ".")


def answer_table(verdicts: pd.DataFrame, agreement: Agreement | None) -> Table:
    """A row per mode, a column per backend (cell_text), and the agreement."""
    present = backends(verdicts)
    header = ["mode", *present, *(["agreement"] if len(present) > 1 else [])]
    rows, classes = [], []
    for m in modes_in(verdicts):
        role, flush, mode = m.role, m.flush, m.label
        runs = verdicts[m.select(verdicts)]
        figs = {b: figures(runs[runs["backend"] == b], b) for b in present
                if (runs["backend"] == b).any()}
        row, cls = [f"{mode}\n{promises.describe(role, flush)}"], [""]
        for b in present:
            row.append(cell_text(figs[b]) if b in figs else "no runs")
            cls.append(figs[b].severity if b in figs else "none")
        if len(present) > 1:
            text, c = mode_agreement(agreement, mode, figs)
            row.append(text)
            cls.append(c)
        rows.append(row)
        classes.append(cls)
    return Table(header, rows, classes=classes,
                 css="answer agreement" if len(present) > 1 else "answer")


def scenario_table(verdicts: pd.DataFrame) -> Table:
    """A row per mode and scenario, a column per backend (short_cell_text),
    linking to the run's page or the runs' rows."""
    present = backends(verdicts)
    rows, links, classes = [], [], []
    for m in modes_in(verdicts):
        runs = verdicts[m.select(verdicts)]
        for scenario in sorted(runs["scenario"].unique()):
            cell = runs[runs["scenario"] == scenario]
            row, cls = [m.label, str(scenario)], ["", ""]
            link: list[str | None] = [None, None]
            for b in present:
                g = cell[cell["backend"] == b]
                if not len(g):
                    row.append("–")
                    cls.append("none")
                    link.append(None)
                    continue
                f = figures(g, b)
                row.append(short_cell_text(f))
                cls.append(f.severity)
                link.append(run_page(g["run_id"].iloc[0]) if len(g) == 1
                            else "#" + group_anchor(m.role, m.flush, str(scenario), m.ha))
            rows.append(row)
            links.append(link)
            classes.append(cls)
    return Table(["mode", "scenario", *present], rows, links=links, classes=classes,
                 css="scenarios")


# ------------------------------------------------- restart vs fail over
# The master-fault scenarios that restart the crashed master on its own
# disk, beside those that promote its slave instead (FAILOVER_MATRIX).
# The scenarios whose master is replaced: by hand (classic) or by election.
FAILOVER_SCENARIOS = (*FAILOVER_MATRIX, *CONTROLLER_MATRIX)
RESTART_IN_PLACE = ("master-crash", "master-crash-unflushed", "master-crash-mid-flush",
                    "master-crash-consuming", "master-crash-after-ship")


def _operator_cell(runs: pd.DataFrame, backend: str) -> tuple[str, str]:
    """What one way of handling a dead master cost over `runs` (one
    backend's), and its severity: the answer's Figures, with a loss by
    failover counted as lost and divergence beside them."""
    if not len(runs):
        return "–", "none"
    f = figures(runs, backend)
    none = pd.Series(0, index=runs.index)
    lost = int(((runs["acked_lost_master"] > 0)
                | (runs.get("acked_lost_failover", none) > 0)).sum())
    diverged = int((runs.get("divergent_records", none) > 0).sum())
    unwritable = ("–" if f.unwritable_median_s is None else
                  f"{f.unwritable_median_s:.1f} s" + (" simulated" if backend == "sim" else "")
                  + " median")
    return "\n".join([
        f"lost {_runs_rate(lost, f.n)}",
        f"broke promise {_runs_rate(f.violated, f.n)}",
        f"stranded {_runs_rate(f.stranded, f.n)}",
        f"diverged {_runs_rate(diverged, f.n)}",
        f"unwritable {unwritable}, {f.unwritable_to_end} to the end",
    ]), f.severity


def restart_vs_failover_table(verdicts: pd.DataFrame) -> Table | None:
    """Per mode and backend: the master-fault runs that restarted the old
    master in place beside those that promoted its slave; None unless the
    runs hold both."""
    restart = verdicts["scenario"].isin(RESTART_IN_PLACE)
    failover = verdicts["scenario"].isin(FAILOVER_SCENARIOS)
    if not restart.any() or not failover.any():
        return None
    rows, classes = [], []
    for m in modes_in(verdicts):
        mode = m.select(verdicts)
        for b in backends(verdicts):
            here = mode & (verdicts["backend"] == b)
            a, f = verdicts[here & restart], verdicts[here & failover]
            if not len(a) and not len(f):
                continue
            (a_text, a_cls), (f_text, f_cls) = _operator_cell(a, b), _operator_cell(f, b)
            rows.append([m.label, b, a_text, f_text])
            classes.append(["", "", a_cls, f_cls])
    return Table(["mode", "backend", "restart in place", "fail over to the slave"], rows,
                 classes=classes, css="scenarios")


# ------------------------------------------------------ after a failover
FIRST_OFFSETS_SHOWN = 4  # first divergent offsets named per cell; verdicts.csv has all


def _first_offsets(runs: pd.DataFrame) -> str:
    """The first divergent offset of each diverged run of `runs`, by seed."""
    firsts = [f"{int(offset):,} (seed {seed})" for seed, offset
              in zip(runs["seed"], runs["first_divergent_offset"], strict=True)
              if not pd.isna(offset)]
    if not firsts:
        return ""
    more = len(firsts) - FIRST_OFFSETS_SHOWN
    return ("\nfirst divergent at " + ", ".join(firsts[:FIRST_OFFSETS_SHOWN])
            + (f" and {more:,} more" if more > 0 else ""))


def failover_cell(runs: pd.DataFrame, backend: str) -> tuple[str, str]:
    """One backend's failover runs of a mode and scenario: the runs with an
    acknowledgement from a node no longer master (split brain) and those
    acknowledgements in all; the runs whose logs diverged, the divergent
    records in all, and where each run's logs part; coloured as the answer."""
    n = len(runs)
    split = runs["split_brain_acks"]
    diverged = runs[runs["divergent_records"] > 0]
    text = (f"split brain {_runs_rate(int((split > 0).sum()), n)} · "
            f"{plural(int(split.sum()), 'ack')} in all\n"
            f"diverged {_runs_rate(len(diverged), n)} · "
            f"{plural(int(diverged['divergent_records'].sum()), 'record')} in all"
            + _first_offsets(diverged.sort_values("seed")))
    return text, figures(runs, backend).severity


def failover_table(verdicts: pd.DataFrame) -> Table | None:
    """Per mode and failover scenario (FAILOVER_SCENARIOS), a column per
    backend (failover_cell), linking to the run's page or the runs' rows;
    None when no run failed over."""
    failover = verdicts[verdicts["scenario"].isin(FAILOVER_SCENARIOS)]
    if not len(failover):
        return None
    present = backends(failover)
    rows, links, classes = [], [], []
    for m in modes_in(failover):
        mode = failover[m.select(failover)]
        for scenario in [s for s in FAILOVER_SCENARIOS if (mode["scenario"] == s).any()]:
            cell = mode[mode["scenario"] == scenario]
            row, cls = [m.label, scenario], ["", ""]
            link: list[str | None] = [None, None]
            for b in present:
                g = cell[cell["backend"] == b]
                text, c = failover_cell(g, b) if len(g) else ("–", "none")
                row.append(text)
                cls.append(c)
                link.append(None if not len(g) else run_page(g["run_id"].iloc[0])
                            if len(g) == 1 else "#" + group_anchor(m.role, m.flush, scenario,
                                                                   m.ha))
            rows.append(row)
            links.append(link)
            classes.append(cls)
    return Table(["mode", "scenario", *present], rows, links=links, classes=classes,
                 css="scenarios")
