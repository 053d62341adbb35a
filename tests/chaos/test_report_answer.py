"""The report's first screen and its plots, from verdict tables as the
pipeline builds them (chaos/report/answer.py, chaos/report/plots.py,
chaos/report/run_pages.py): no Spark here, each backend in its own column,
the agreement of compare-backends read from its file, a timeline for every
run that lost messages or stayed unwritable, and plots that can be read."""

from __future__ import annotations

import json
import os
from typing import Any

import pandas as pd
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from support.pipeline_fixtures import fault, make_run, op, rec

from chaos.check.run_dirs import load_run
from chaos.report import answer, plots, run_pages

SYNC = ("SYNC_MASTER", "SYNC_FLUSH")


def _run(run_id: str, backend: str, *, role: str = SYNC[0], flush: str = SYNC[1],
         scenario: str = "master-crash", **over: Any) -> dict[str, Any]:
    """A verdict row with what the answer and the plots read."""
    row: dict[str, Any] = {
        "run_id": run_id, "backend": backend, "role": role, "flush": flush,
        "scenario": scenario, "faults": "kill:master,start:master", "puts": 1000,
        "duration_s": 10.0, "acked": 900, "failed": 100, "indeterminate": 10,
        "allowed_loss": 0, "acked_lost_master": 0, "acked_lost_everywhere": 0,
        "acked_stranded": 0, "promise_violations": 0, "evidence_breaches": 0,
        "slave_ahead": False, "slave_ahead_at_restart_bytes": 0,
        "slave_ahead_at_end_bytes": 0, "unwritable_s": 1.0, "unwritable_until_end": False,
        "failed_after_fault_share": 0.1, "failed_after_fault_per_s": 10.0,
    }
    return {**row, **over}


def _verdicts(*rows: dict[str, Any]) -> pd.DataFrame:
    return pd.DataFrame(list(rows))


MIXED = _verdicts(
    _run("a-sim-1", "sim"), _run("a-sim-2", "sim", unwritable_s=3.0),
    _run("a-local", "local", acked_lost_master=5, unwritable_s=4.0, unwritable_until_end=True,
         puts=12_000, duration_s=6.0, slave_ahead=True, slave_ahead_at_restart_bytes=2_942),
)


def test_each_backend_answers_in_its_own_column() -> None:
    table = answer.answer_table(MIXED, None)
    assert table.header == ["mode", "sim", "local", "agreement"]
    (row,) = table.rows
    sim, local = row[1].split("\n"), row[2].split("\n")
    # The sim's two runs lost nothing; the local one lost 5: not pooled.
    assert sim[0] == "lost: 0/2 runs (0–66 %) · msgs/run median 0, max 0"
    assert local[0] == "lost: 1/1 runs (21–100 %) · msgs/run median 5, max 5"
    assert sim[2].startswith("stranded: 0/2 runs (0–66 %)")
    # Time without a writable master, per run; the sim's is simulated.
    assert sim[4] == "unwritable/run: median 2, max 3 simulated s"
    assert local[4] == "unwritable/run: median 4, max 4 s · 1 to the end"
    assert local[5] == "refused after fault: 10.0% of puts · 10 per second"
    assert sim[5] == "refused after fault: 10.0% of puts · 10 per simulated second"
    assert table.classes is not None and table.classes[0][1:3] == ["ok", "loss"]


def test_without_an_agreement_the_differences_are_named_not_judged() -> None:
    text, cls = answer.mode_agreement(None, "SYNC_MASTER + SYNC_FLUSH", {
        b: answer.figures(MIXED[MIXED["backend"] == b], b) for b in ("sim", "local")})
    lines = text.split("\n")
    assert "lost: seen on local only (sim 0/2, local 1/1)" in lines
    assert "slave ahead: seen on local only (sim 0/2, local 1/1)" in lines
    assert "not judged: no agreement.json (dlab chaos compare-backends)" in lines
    # Why they may differ: the two sides' runs carried different loads.
    assert lines[-1] == ("their runs: sim: 100 puts per simulated second, runs of 10 simulated "
                         "s, n = 2; local: 2,000 puts per second, runs of 6 s, n = 1")
    assert cls == ""


def _agreement(tmp_path: Any, **slave_ahead: Any) -> str:
    out = tmp_path / "cmp"
    for backend in ("local", "sim"):
        os.makedirs(out / backend / f"run-{backend}")
        (out / backend / f"run-{backend}" / "params.json").write_text("{}")
    rates = {"SYNC_MASTER + SYNC_FLUSH": {"sim": {"k": 0, "n": 2, "cell": "0/2 (0–66 %)"},
                                          "local": {"k": 1, "n": 1, "cell": "1/1 (21–100 %)"}}}
    (out / "agreement.json").write_text(json.dumps({"agree": False, "questions": {
        "lost_master": {"question": "which modes lose acknowledged messages",
                        "verdict": "agree", "rates": {"SYNC_MASTER + SYNC_FLUSH": {
                            "sim": {"k": 0, "n": 2}, "local": {"k": 0, "n": 1}}}},
        "slave_ahead": {"question": "which modes can leave a slave ahead",
                        "verdict": "differ", "rates": rates, **slave_ahead}}}))
    return str(out)


def test_the_agreement_of_compare_backends_is_found_and_says_why(tmp_path: Any) -> None:
    out = _agreement(tmp_path, why={"SYNC_MASTER + SYNC_FLUSH": "an fsync in flight"})
    run_dirs = [os.path.join(out, b, f"run-{b}") for b in ("local", "sim")]
    found, problem = answer.find_agreement(run_dirs, run_dirs)
    assert problem is None and found is not None
    assert found.path == os.path.join(out, "agreement.json")
    table = answer.answer_table(MIXED, found)
    text = table.rows[0][3].split("\n")
    assert text[:3] == ["lost: agree", "slave ahead: DIFFER: sim 0/2 (0–66 %), local 1/1 "
                        "(21–100 %)", "why: an fsync in flight"]
    assert text[3].startswith("their runs: sim: 100 puts per simulated second")
    assert table.classes is not None and table.classes[0][3] == "violation"
    assert answer.agreement_sentence(found, MIXED) == (
        "The backends **DISAGREE** on what matters (agreement.json): 1. which modes lose "
        "acknowledged messages: AGREE; 2. which modes can leave a slave ahead: DIFFER.")


def test_an_agreement_that_cannot_be_read_is_named(tmp_path: Any) -> None:
    out = _agreement(tmp_path)
    with open(os.path.join(out, "agreement.json"), "w", encoding="utf-8") as f:
        f.write("{not json")
    found, problem = answer.find_agreement([out], [])
    assert found is None and problem is not None
    assert problem.startswith(os.path.join(out, "agreement.json") + ": not read")


def test_the_scenario_table_keeps_backends_apart_and_links_the_runs() -> None:
    v = _verdicts(*MIXED.to_dict("records"), _run("b-sim", "sim", scenario="slave-crash"))
    table = answer.scenario_table(v)
    assert table.header == ["mode", "scenario", "sim", "local"]
    assert [r[:2] for r in table.rows] == [["SYNC_MASTER + SYNC_FLUSH", "master-crash"],
                                           ["SYNC_MASTER + SYNC_FLUSH", "slave-crash"]]
    assert table.rows[0][3] == ("lost 1/1 (21–100 %), max 5\nbroke promise 0/1 · stranded 0/1"
                                "\nunwritable ≤ 4 s (1 to the end)")
    assert table.rows[1][3] == "–"
    assert table.links == [[None, None, "#runs-sync-master-sync-flush-master-crash",
                            "runs/a-local.html"], [None, None, "runs/b-sim.html", None]]


def test_every_run_that_lost_or_stayed_unwritable_gets_a_timeline(
        monkeypatch: pytest.MonkeyPatch) -> None:
    rows = [_run(f"quiet-{i}", "local", faults="kill:master," * (i % 3)) for i in range(50)]
    rows += [_run("lost", "local", acked_lost_master=1),
             _run("unwritable", "sim", unwritable_until_end=True),
             _run("breach", "sim", evidence_breaches=1)]
    v = _verdicts(*rows)
    drawn = run_pages.to_draw(v)
    assert {"lost", "unwritable", "breach"} <= set(drawn.draw)
    assert len(drawn.draw) == run_pages.TIMELINE_RUNS_MAX and drawn.skipped == []
    # Over the bound, the runs left out are named, and their pages say why.
    monkeypatch.setattr(run_pages, "MUST_DRAW_MAX", 2)
    drawn = run_pages.to_draw(v)
    assert drawn.must == 3 and drawn.skipped == ["unwritable"]
    assert "unwritable" not in drawn.draw
    assert drawn.why_not("unwritable").startswith(
        "No timeline drawn: 3 runs of this report lost messages, broke a promise or stayed "
        "unwritable, and it draws the worst 2 of them")
    assert "1 of them were left out" in drawn.note()


def test_outcomes_are_drawn_on_linear_axes_with_failed_as_in_the_tables() -> None:
    fig = plots.outcomes_figure(MIXED)
    axes = fig.axes
    assert len(axes) == len(plots.OUTCOMES)
    assert all(ax.get_xscale() == "linear" and ax.get_xlim()[0] == 0 for ax in axes)
    failed = axes[list(plots.OUTCOMES).index("failed (not PUT_OK, incl. indeterminate)")]
    # The tables' failed counts INDETERMINATE too: 100 a run, sim then local.
    assert [t.get_text() for t in failed.texts] == ["200", "100"]
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == ["sim (2 runs), simulated time", "local (1 runs)"]


def test_slave_ahead_starts_at_zero_and_shows_its_max() -> None:
    fig = plots.slave_ahead_figure(MIXED)
    (ax,) = fig.axes
    low, high = ax.get_ylim()
    assert ax.get_yscale() == "linear" and low == 0 and high > 2_942
    assert "max 2,942 B" in [t.get_text() for t in ax.texts]
    markers = {c.get_label(): c.get_paths()[0].vertices.tobytes() for c in ax.collections
               if not c.get_label().startswith("_")}  # not the max lines
    assert set(markers) == {"sim", "local"} and markers["sim"] != markers["local"]


def _timeline_run(root: str, backend: str) -> str:
    history = [op(i, f"m{i}", 100 * i, at=100 * i) for i in range(10)]
    history += [op(10 + i, f"f{i}", None, at=1000 + 50 * i, status="SLAVE_NOT_AVAILABLE")
                for i in range(10)]
    history += [op(20 + i, f"n{i}", 100 * (10 + i), at=1900 + 50 * i) for i in range(10)]
    master = [rec(h["offset"], h["msg_id"]) for h in history if h["offset"] is not None]
    return make_run(root, f"tl-{backend}", role="SYNC_MASTER", flush="SYNC_FLUSH",
                    history=history, records={"master": master, "slave1": master},
                    faults=[fault(0, "kill", "master", 1000),
                            fault(1, "start", "master", 1020, 1800)],
                    backend=backend, duration_ms=3000)


def test_a_timeline_can_be_read(tmp_path: Any) -> None:
    run = load_run(_timeline_run(str(tmp_path), "local"), 0)
    fig = run_pages.timeline_figure(run)
    FigureCanvasAgg(fig).draw()
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    lanes, latency, rate = fig.axes[:3]
    for ax in (lanes, latency, rate):  # ticks, labelled, on every axis
        assert sum(1 for t in ax.get_xticklabels() if t.get_visible() and t.get_text()) >= 3
        low, high = ax.get_ylim()
        shown = [t for t, at in zip(ax.get_yticklabels(), ax.get_yticks(), strict=True)
                 if low <= at <= high and t.get_text()]
        assert len(shown) >= 2, ax.get_ylabel()
    # The fault labels do not overlap: "start" 20 ms after "kill" is left to the legend.
    boxes = [t.get_window_extent(renderer) for t in lanes.texts]
    assert [t.get_text() for t in lanes.texts] == ["kill"]
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])
    legend = [t.get_text() for t in lanes.get_legend().get_texts()]
    assert {"kill (fault)", "start (span)", "PUT_OK", "SLAVE_NOT_AVAILABLE"} <= set(legend)
    assert {"kill (fault)", "start (span)"} <= {t.get_text() for t in
                                                rate.get_legend().get_texts()}
    assert run_pages._marker("PUT_OK") != run_pages._marker("SLAVE_NOT_AVAILABLE")
    assert "wall-clock time" in fig.get_suptitle()

    sim = run_pages.timeline_figure(load_run(_timeline_run(str(tmp_path), "sim"), 0))
    assert "simulated time" in sim.get_suptitle()
    assert sim.axes[0].get_facecolor() != fig.axes[0].get_facecolor()
    assert sim.axes[2].get_xlabel() == "simulated seconds since the run started"


def test_compare_backends_own_verdict_per_mode_is_shown_open_as_open(tmp_path: Any) -> None:
    """agreement.json as compare-backends writes it: each mode carries its
    verdict (agree / differ / open) and why; an open one is not a difference."""
    from chaos.commands.compare_backends import compare
    from chaos.harness import scenarios
    from chaos.harness.run_config import RunConfig
    from chaos.matrix.sweep import SweepRun

    def runs(backend: str, n: int, ahead: int) -> list[tuple[RunConfig, SweepRun]]:
        out = []
        for k in range(n):
            cfg = RunConfig(scenario=scenarios.get("master-crash"), role="SYNC_MASTER",
                            flush="SYNC_FLUSH", seed=k, out_dir="", backend=backend)
            out.append((cfg, SweepRun(cfg.run_id, "d", None, "", False, 0.0,
                                      acked_lost_master=0, slave_ahead_bytes=int(k < ahead),
                                      promise_violations=0)))
        return out

    cmp = compare({"sim": runs("sim", 20, 5), "local": runs("local", 1, 0)})
    out = tmp_path / "cmp"
    os.makedirs(out)
    (out / "agreement.json").write_text(json.dumps(cmp))
    found, problem = answer.find_agreement([str(out)], [])
    assert problem is None and found is not None
    text, cls = answer.mode_agreement(found, "SYNC_MASTER + SYNC_FLUSH", {})
    lines = text.split("\n")
    assert lines[0] == "lost: agree"
    assert lines[1].startswith("slave ahead: open (within chance, not a finding): sim 5/20")
    assert lines[2].startswith("why: sim saw it in 5 of 20 runs, local in none of 1")
    assert cls == "ok"  # open is not a disagreement


def test_restart_in_place_beside_fail_over_per_mode_and_backend() -> None:
    """Issue 26's comparison: the master-fault runs that restarted the old
    master beside those that promoted its slave, each counted apart."""
    only_restart = _verdicts(_run("r1", "sim"), _run("r2", "sim"))
    assert answer.restart_vs_failover_table(only_restart) is None  # nothing to set beside
    asy = ("ASYNC_MASTER", "ASYNC_FLUSH")
    v = _verdicts(
        _run("r1", "sim", role=asy[0], flush=asy[1], acked_lost_master=3, acked_stranded=3,
             acked_lost_failover=0, divergent_records=0, unwritable_s=2.0),
        _run("r2", "sim", role=asy[0], flush=asy[1], acked_lost_failover=0,
             divergent_records=0, unwritable_s=4.0, unwritable_until_end=True),
        _run("f1", "sim", role=asy[0], flush=asy[1], scenario="master-lost",
             acked_lost_failover=2, divergent_records=0, unwritable_s=3.0),
        _run("f2", "sim", role=asy[0], flush=asy[1], scenario="isolated-master",
             acked_lost_failover=400, divergent_records=7, unwritable_s=0.5),
        _run("s1", "sim", scenario="master-lost", acked_lost_failover=0, divergent_records=0),
    )
    table = answer.restart_vs_failover_table(v)
    assert table is not None
    assert table.header == ["mode", "backend", "restart in place", "fail over to the slave"]
    rows = {tuple(r[:2]): r[2:] for r in table.rows}
    restart, failover = (cell.split("\n") for cell in rows[("ASYNC_MASTER + ASYNC_FLUSH",
                                                            "sim")])
    assert restart[0].startswith("lost 1/2 runs") and restart[2].startswith("stranded 1/2")
    assert restart[3].startswith("diverged 0/2") and restart[4] == (
        "unwritable 3.0 s simulated median, 1 to the end")
    assert failover[0].startswith("lost 2/2 runs") and failover[3].startswith("diverged 1/2")
    # A mode with failover runs only says so, not zero.
    assert rows[("SYNC_MASTER + SYNC_FLUSH", "sim")][0] == "–"
    assert rows[("SYNC_MASTER + SYNC_FLUSH", "sim")][1].startswith("lost 0/1 runs")


def test_after_a_failover_split_brain_and_divergence_per_mode_and_scenario() -> None:
    """Split-brain acks as k/n runs with the interval and in all; the runs
    that diverged and where each one's logs part, by seed, the first few."""
    assert answer.failover_table(_verdicts(_run("r1", "sim"))) is None  # no failover run
    asy = {"role": "ASYNC_MASTER", "flush": "ASYNC_FLUSH", "scenario": "isolated-master"}
    runs = [_run(f"i{seed}", "sim", seed=seed, split_brain_acks=seed % 2 * 3,
                 divergent_records=seed, first_divergent_offset=1000 * seed, **asy)
            for seed in (5, 4, 3, 2, 1)]
    runs.append(_run("i6", "sim", seed=6, split_brain_acks=0, divergent_records=0,
                     first_divergent_offset=None, **asy))
    runs.append(_run("l1", "local", seed=1, split_brain_acks=0, divergent_records=0,
                     first_divergent_offset=None, **asy))
    table = answer.failover_table(_verdicts(*runs))
    assert table is not None and table.header == ["mode", "scenario", "sim", "local"]
    (row,) = table.rows
    sim, local = row[2].split("\n"), row[3].split("\n")
    assert sim[0] == "split brain 3/6 runs (19–81 %) · 9 acks in all"
    assert sim[1] == "diverged 5/6 runs (44–97 %) · 15 records in all"
    assert sim[2] == ("first divergent at 1,000 (seed 1), 2,000 (seed 2), 3,000 (seed 3), "
                      "4,000 (seed 4) and 1 more")
    assert local == ["split brain 0/1 runs (0–79 %) · 0 acks in all",
                     "diverged 0/1 runs (0–79 %) · 0 records in all"]
    assert table.links is not None and table.links[0][2:] == [
        "#runs-async-master-async-flush-isolated-master", "runs/l1.html"]
