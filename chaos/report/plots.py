"""The report's summary plots (PNG, matplotlib's object API: no pyplot, no
global backend), each backend drawn apart — a colour per outcome, a hatch
and a marker per backend:

- outcomes.png     per mode and backend, the puts by outcome, a panel per
                   outcome, each on its own linear axis (kept puts run to
                   hundreds of thousands, stranded ones to a few hundred: on
                   one axis, or a log one, the small counts cannot be read);
                   failed counts every put not answered PUT_OK, INDETERMINATE
                   included, as the tables do, and a panel of its own gives
                   the INDETERMINATE among them
- slave_ahead.png  per mode and backend, each run's largest slave-ahead gap
                   (at the master's restart or at the end), bytes on a
                   linear axis from 0 to above the largest, which is named

The run timelines are chaos/report/run_pages.py's.
"""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from chaos.report.answer import backends
from chaos.report.blocks import Mode, modes_in

PLOTS = "plots"
# Outcome -> (colour, what it counts).
OUTCOMES = {
    "acknowledged, kept": "#4c9f70",
    "allowed loss": "#f2b134",
    "stranded": "#9b5de5",
    "promise violation": "#d1495b",
    "failed (not PUT_OK, incl. indeterminate)": "#8d99ae",
    "of the failed: indeterminate": "#2b2d42",
}
BACKEND_HATCH = {"sim": "///", "local": "", "compose": ".."}
BACKEND_MARKER = {"sim": "o", "local": "^", "compose": "s"}
BACKEND_COLOR = {"sim": "#00798c", "local": "#d1495b", "compose": "#6a4c93"}


def _save(fig: Figure, out_dir: str, name: str) -> str:
    rel = f"{PLOTS}/{name}"
    fig.savefig(os.path.join(out_dir, rel), dpi=100, bbox_inches="tight")
    return rel


def _modes(verdicts: pd.DataFrame) -> list[Mode]:
    return modes_in(verdicts)


def outcome_counts(runs: pd.DataFrame) -> list[int]:
    """The puts of `runs` by outcome, in OUTCOMES order."""
    viol, allowed = runs["promise_violations"].sum(), runs["allowed_loss"].sum()
    # A stranded message that is also a violation is drawn as a violation;
    # per run, stranded minus violations is a lower bound on the rest.
    stranded = (runs["acked_stranded"] - runs["promise_violations"]).clip(lower=0).sum()
    return [int(v) for v in (runs["acked"].sum() - viol - allowed - stranded, allowed,
                             stranded, viol, runs["failed"].sum(), runs["indeterminate"].sum())]


def _backend_legend(verdicts: pd.DataFrame, present: list[str]) -> list[Patch]:
    return [Patch(facecolor="#dddddd", edgecolor="black", hatch=BACKEND_HATCH.get(b, "xx"),
                  label=f"{b} ({int((verdicts['backend'] == b).sum()):,} runs)"
                  + (", simulated time" if b == "sim" else ""))
            for b in present]


def plot_outcomes(out_dir: str, verdicts: pd.DataFrame) -> str:
    return _save(outcomes_figure(verdicts), out_dir, "outcomes.png")


def plot_slave_ahead(out_dir: str, verdicts: pd.DataFrame) -> str:
    return _save(slave_ahead_figure(verdicts), out_dir, "slave_ahead.png")


def outcomes_figure(verdicts: pd.DataFrame) -> Figure:
    """Per mode and backend, the puts by outcome: a panel per outcome on a
    linear axis of its own, each bar labelled with its count."""
    modes, present = _modes(verdicts), backends(verdicts)
    counts = {(m, b): outcome_counts(verdicts[m.select(verdicts)
                                              & (verdicts["backend"] == b)])
              for m in modes for b in present}
    fig = Figure(figsize=(12, 1.6 + 2 * (0.5 + 0.28 * len(modes) * len(present))),
                 layout="constrained")
    axes = fig.subplots(2, 3, sharey=True).ravel()
    height = 0.8 / len(present)
    for k, (ax, (outcome, color)) in enumerate(zip(axes, OUTCOMES.items(), strict=True)):
        top = max(max(counts[key][k] for key in counts), 1)
        for j, b in enumerate(present):
            y = np.arange(len(modes)) + (j - (len(present) - 1) / 2) * height
            values = [counts[(m, b)][k] for m in modes]
            ax.barh(y, values, height=height * 0.9, color=color, edgecolor="black",
                    linewidth=0.5, hatch=BACKEND_HATCH.get(b, "xx"))
            for yi, n in zip(y, values, strict=True):
                ax.text(n + top * 0.02, yi, f"{n:,}", va="center", fontsize=7)
        ax.set_xlim(0, top * 1.3)
        ax.xaxis.set_major_locator(MaxNLocator(nbins=4, integer=True))
        ax.tick_params(labelsize=7)
        ax.set_title(outcome, fontsize=9, color="black")
        ax.set_xlabel("puts", fontsize=8)
        ax.set_yticks(range(len(modes)), [m.label.replace(" + ", "\n")
                                          for m in modes], fontsize=7)
    axes[0].invert_yaxis()
    fig.suptitle("Outcome of every put, per mode and backend (each panel its own linear axis)",
                 fontsize=10)
    fig.legend(handles=_backend_legend(verdicts, present), loc="outside lower center",
               ncols=len(present), fontsize=8)
    return fig


def slave_ahead_figure(verdicts: pd.DataFrame) -> Figure:
    """Per mode and backend, each run's largest slave-ahead gap in bytes."""
    modes, present = _modes(verdicts), backends(verdicts)
    fig = Figure(figsize=(9, 4.5), layout="constrained")
    ax = fig.subplots()
    rng = np.random.default_rng(0)  # jitter only; fixed so plots are reproducible
    gap = verdicts[["slave_ahead_at_restart_bytes", "slave_ahead_at_end_bytes"]].max(axis=1)
    top = max(float(gap.max()) if len(gap) else 0.0, 1.0)
    width = 0.7 / len(present)
    for i, m in enumerate(modes):
        for j, b in enumerate(present):
            sel = m.select(verdicts) & (verdicts["backend"] == b)
            y = gap[sel].to_numpy(dtype=float)
            if not len(y):
                continue
            x = i + (j - (len(present) - 1) / 2) * width
            ax.scatter(x + rng.uniform(-width / 4, width / 4, len(y)), y, s=22, alpha=0.7,
                       marker=BACKEND_MARKER.get(b, "D"), color=BACKEND_COLOR.get(b, "#444"),
                       clip_on=False, zorder=3, label=b if i == 0 else None)
            ahead = int((y > 0).sum())
            ax.text(x, top * 1.08, f"{ahead}/{len(y)}\nahead", ha="center", va="bottom",
                    fontsize=7)
            if ahead:
                ax.hlines(y.max(), x - width / 2.5, x + width / 2.5, color="black",
                          linewidth=1)
                ax.text(x, y.max() + top * 0.02, f"max {int(y.max()):,} B", ha="center",
                        va="bottom", fontsize=7)
    ax.set_xticks(range(len(modes)), [m.label.replace(" + ", "\n") for m in modes],
                  fontsize=8)
    ax.set_xlim(-0.6, len(modes) - 0.4)
    ax.set_ylim(0, top * 1.25)
    ax.yaxis.set_major_locator(MaxNLocator(nbins=6, integer=True))
    ax.tick_params(labelsize=8)
    ax.set_ylabel("bytes the slave held past the master\n(0 = not ahead; line = the max)",
                  fontsize=8)
    ax.set_title("Slave ahead of the master (at its restart or at the end), per run",
                 fontsize=10)
    handles, labels = ax.get_legend_handles_labels()
    ax.legend(handles, [f"{b} ({int((verdicts['backend'] == b).sum()):,} runs)"
                        + (", simulated time" if b == "sim" else "") for b in labels],
              fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return fig
