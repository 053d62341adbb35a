"""`dlab chaos compare-backends`: the same scenarios on the local and sim
backends, and whether they agree on which modes lose acknowledged messages
from the recovered master, which leave a slave ahead, and that SYNC_FLUSH
loses nothing acknowledged; rates printed for both sides."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.pipeline_fixtures import make_run, op, rec

from chaos.check.summary import run_outcome
from chaos.commands.compare_backends import compare, conclude
from chaos.harness import scenarios
from chaos.harness.runner import RunConfig
from chaos.matrix.sweep import SweepRun, judge

MODES = [("SYNC_MASTER", "SYNC_FLUSH"), ("SYNC_MASTER", "ASYNC_FLUSH"),
         ("ASYNC_MASTER", "SYNC_FLUSH"), ("ASYNC_MASTER", "ASYNC_FLUSH")]


def _runs(backend: str, n: int, lost: dict[str, int], ahead: dict[str, int] | None = None
          ) -> list[tuple[RunConfig, SweepRun]]:
    """n runs per mode; the first lost[mode] of them lose a message from
    the master, the first ahead[mode] leave a slave ahead."""
    out = []
    for role, flush in MODES:
        mode = f"{role} + {flush}"
        for k in range(n):
            cfg = RunConfig(scenario=scenarios.get("master-crash"), role=role, flush=flush,
                            seed=k, out_dir="", backend=backend)
            out.append((cfg, SweepRun(cfg.run_id, "d", None, "", False, 0.0,
                                      acked_lost_master=int(k < lost.get(mode, 0)),
                                      slave_ahead_bytes=int(k < (ahead or {}).get(mode, 0)),
                                      promise_violations=0)))
    return out


ASYNC = {"SYNC_MASTER + ASYNC_FLUSH": 99, "ASYNC_MASTER + ASYNC_FLUSH": 99}


def test_the_same_modes_on_both_sides_agree() -> None:
    cmp = compare({"sim": _runs("sim", 20, ASYNC, ASYNC), "local": _runs("local", 2, ASYNC)})
    q = cmp["questions"]
    assert q["lost_master"]["verdict"] == "agree"
    assert q["lost_master"]["sim"] == q["lost_master"]["local"] == list(ASYNC)
    assert q["lost_master"]["rates"]["SYNC_MASTER + ASYNC_FLUSH"]["sim"]["cell"] == \
        "20/20 (84–100 %)"
    # Local left no slave ahead in 2 runs; the sim did in all 20: Fisher's
    # p is 1/231 (0.4 %), below 5 % shared by the 8 comparisons (0.6 %)...
    slave = q["slave_ahead"]["rates"]["SYNC_MASTER + ASYNC_FLUSH"]
    assert slave["verdict"] == "differ" and slave["p"] == pytest.approx(1 / 231, rel=1e-4)
    assert q["slave_ahead"]["verdict"] == "differ" and not cmp["agree"]
    # ... one run cannot (p = 1/21): that question stays open, and says
    # what would decide it (the low end of 20/20 is 84 %: 2 runs of none).
    cmp1 = compare({"sim": _runs("sim", 20, ASYNC, ASYNC), "local": _runs("local", 1, ASYNC)})
    open1 = cmp1["questions"]["slave_ahead"]
    assert open1["verdict"] == "open"
    assert open1["rates"]["SYNC_MASTER + ASYNC_FLUSH"]["verdict"] == "open"
    assert "local in none of 1" in open1["rates"]["SYNC_MASTER + ASYNC_FLUSH"]["why"]
    assert "(2 in all) would decide" in open1["rates"]["SYNC_MASTER + ASYNC_FLUSH"]["why"]
    assert q["sync_flush_keeps"]["verdict"] == "agree" and cmp1["agree"]


def test_a_rare_outcome_one_side_missed_is_open_not_a_disagreement() -> None:
    rare = {"SYNC_MASTER + SYNC_FLUSH": 0, "SYNC_MASTER + ASYNC_FLUSH": 2}
    cmp = compare({"sim": _runs("sim", 20, {}, rare), "local": _runs("local", 3, {})})
    assert cmp["questions"]["slave_ahead"]["verdict"] == "open" and cmp["agree"]
    assert cmp["questions"]["slave_ahead"]["sim"] == ["SYNC_MASTER + ASYNC_FLUSH"]
    assert cmp["questions"]["slave_ahead"]["local"] == []


def test_rates_seen_on_both_sides_agree_unless_they_differ_beyond_chance() -> None:
    # 3 of 20 and 1 of 3: both saw it, rates no test tells apart.
    cmp = compare({"sim": _runs("sim", 20, {}, {"ASYNC_MASTER + SYNC_FLUSH": 3}),
                   "local": _runs("local", 3, {}, {"ASYNC_MASTER + SYNC_FLUSH": 1})})
    assert cmp["questions"]["slave_ahead"]["verdict"] == "agree" and cmp["agree"]
    # The shape of the 2026-11-27 fresh-clone disagreement: 3 of 6 local
    # SYNC_FLUSH crash runs left a slave ahead, none of 60 sim runs did.
    cmp = compare({"sim": _runs("sim", 60, {}, {}),
                   "local": _runs("local", 6, {}, {"SYNC_MASTER + SYNC_FLUSH": 3})})
    v = cmp["questions"]["slave_ahead"]["rates"]["SYNC_MASTER + SYNC_FLUSH"]
    assert v["verdict"] == "differ" and v["p"] < 0.001 and not cmp["agree"]
    assert "0/60" in v["why"] and "3/6" in v["why"]


def test_a_sync_flush_loss_on_one_backend_is_a_disagreement() -> None:
    cmp = compare({"sim": _runs("sim", 5, ASYNC),
                   "local": _runs("local", 5, {**ASYNC, "ASYNC_MASTER + SYNC_FLUSH": 1})})
    q = cmp["questions"]["sync_flush_keeps"]
    assert q["verdict"] == "differ" and not cmp["agree"]
    assert q["sim"] == {"holds": True, "runs_losing": 0, "runs": 10}
    assert q["local"] == {"holds": False, "runs_losing": 1, "runs": 10}


@pytest.mark.timeout(900)  # the main job in small, with Spark twice: margin for a loaded machine
def test_compare_backends_runs_both_backends_and_prints_both_rates(tmp_path: Path) -> None:
    """A small version: one crash scenario, one local run and two sim runs
    per mode at a light load (2 producers x 25 puts/s, the scenario's 6 s
    on both sides), and the report over both, its steps shown as they go."""
    out = tmp_path / "cmp"
    r = subprocess.run(
        [sys.executable, "-m", "chaos.cli", "chaos", "compare-backends", "--scenarios",
         "master-crash-unflushed", "--runs", "2", "--producers", "2", "--rate", "25",
         "--out", str(out)],
        capture_output=True, text=True, timeout=600)
    assert r.returncode in (0, 1, 3), r.stdout[-3000:] + r.stderr[-3000:]
    with open(out / "agreement.json", encoding="utf-8") as f:
        cmp = json.load(f)
    assert cmp["failed_runs"] == 0
    lost = cmp["questions"]["lost_master"]
    for mode in ("SYNC_MASTER + SYNC_FLUSH", "ASYNC_MASTER + SYNC_FLUSH"):
        assert lost["rates"][mode]["sim"]["n"] == 2 and lost["rates"][mode]["local"]["n"] == 1
        assert mode not in lost["sim"] and mode not in lost["local"]
    assert "ASYNC_MASTER + ASYNC_FLUSH" in lost["sim"]  # a crash before the flush, every seed
    keeps = cmp["questions"]["sync_flush_keeps"]
    assert keeps["sim"]["holds"] and keeps["local"]["holds"]
    assert keeps["verdict"] == "agree"
    assert r.returncode == (3 if not cmp["agree"] else 1 if cmp["violation_runs"] else 0)
    # The report's steps as they go, and the page to open at the end.
    assert "dlab report: [" in r.stdout and "checking 12 runs (Spark)" in r.stdout
    assert f"report: {out / 'report' / 'report.html'}" in r.stdout
    assert "report.md" not in r.stdout
    assert "1. which modes lose acknowledged messages from the recovered master:" in r.stdout
    # Both sides ran the same load, and the sim this machine's timings.
    assert "workload on both sides: 2 producers x 25 puts/s (50 puts/s offered)" in r.stdout
    assert "this machine, for the sim side: fsync median" in r.stdout
    assert cmp["experiment"]["offered_puts_per_s"] == 50.0
    assert cmp["experiment"]["timings"]["put_us"] > 0
    assert "master-crash-unflushed" in r.stdout and "0/2 (0–" in r.stdout and "/1 (" in r.stdout
    # One report can read both sides: no run id is on both.
    assert not {d.name for d in (out / "local" / "runs").iterdir()} & {
        d.name for d in (out / "sim" / "runs").iterdir()}
    # Every rate counts what each run's own outcome says.
    for backend, n in (("local", 4), ("sim", 8)):
        outcomes = [run_outcome(str(d)) for d in (out / backend / "runs").iterdir()]
        assert len(outcomes) == n
        for key, figure in (("lost_master", "acked_lost_master"),
                            ("slave_ahead", "slave_ahead_bytes")):
            for mode, rates in cmp["questions"][key]["rates"].items():
                mine = [getattr(o, figure) for o in outcomes if o.mode == mode]
                assert rates[backend]["k"] == sum(1 for v in mine if v > 0), (backend, key, mode)
                assert rates[backend]["n"] == len(mine)
        sync = [o for o in outcomes if o.mode.endswith("+ SYNC_FLUSH")]
        assert keeps[backend]["runs_losing"] == sum(1 for o in sync if o.acked_lost_master)


# Exit statuses, from run directories judged by the real checker
# (chaos.matrix.sweep.judge reads each one's outcome, as after a run).
LOSS_HISTORY = [op(i + 1, f"m{i + 1}", i * 100, at=i * 10) for i in range(4)]
THREE = [rec(0, "m1"), rec(100, "m2"), rec(200, "m3")]
FOUR = [*THREE, rec(300, "m4")]


def _judged(root: Path, backend: str, role: str, flush: str, n: int, *, lose: bool
            ) -> list[tuple[RunConfig, SweepRun]]:
    """n planted runs of one mode: four PUT_OKs; when `lose`, the master and
    its slave hold only the first three (the checker calls that a violation
    under SYNC_FLUSH, an allowed loss under ASYNC_MASTER + ASYNC_FLUSH)."""
    out = []
    for seed in range(n):
        cfg = RunConfig(scenario=scenarios.get("master-crash"), role=role, flush=flush,
                        seed=seed, out_dir=str(root / backend), backend=backend)
        held = THREE if lose else FOUR
        run_dir = make_run(str(root / backend), cfg.run_id, role=role, flush=flush,
                           scenario="master-crash", seed=seed, backend=backend,
                           history=LOSS_HISTORY, records={"m": held, "s": held})
        out.append((cfg, judge(cfg.run_id, run_dir, None, 0.0)))
    return out


def test_exit_3_when_the_backends_disagree_without_a_broken_promise(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The sim lost an acknowledged message from the master in each of 4
    # ASYNC_MASTER + ASYNC_FLUSH runs (allowed); 6 local runs lost none:
    # not within chance (Fisher's p is 1/210, below 5 % shared by 2 comparisons).
    results = {"sim": _judged(tmp_path, "sim", "ASYNC_MASTER", "ASYNC_FLUSH", 4, lose=True),
               "local": _judged(tmp_path, "local", "ASYNC_MASTER", "ASYNC_FLUSH", 6, lose=False)}
    assert not any(r.violated for runs in results.values() for _, r in runs)
    assert conclude(str(tmp_path), results, failed=0) == 3
    with open(tmp_path / "agreement.json", encoding="utf-8") as f:
        cmp = json.load(f)
    assert cmp["questions"]["lost_master"]["verdict"] == "differ" and not cmp["agree"]
    assert "DISAGREE" in capsys.readouterr().out


def test_exit_1_for_a_broken_promise_both_backends_agree_on(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    results = {b: _judged(tmp_path, b, "SYNC_MASTER", "SYNC_FLUSH", 1, lose=True)
               for b in ("sim", "local")}
    assert conclude(str(tmp_path), results, failed=0) == 1
    with open(tmp_path / "agreement.json", encoding="utf-8") as f:
        cmp = json.load(f)
    assert cmp["agree"] and cmp["questions"]["sync_flush_keeps"]["verdict"] == "agree"
    assert set(cmp["violation_runs"]) == {"sim", "local"}
    assert "run(s) broke a promise" in capsys.readouterr().out
    # The same loss under ASYNC_MASTER + ASYNC_FLUSH breaks no promise: 0.
    allowed = {b: _judged(tmp_path / "allowed", b, "ASYNC_MASTER", "ASYNC_FLUSH", 1, lose=True)
               for b in ("sim", "local")}
    assert conclude(str(tmp_path), allowed, failed=0) == 0
    # A run that did not finish fails the self-check.
    assert conclude(str(tmp_path), allowed, failed=1) == 3


def test_help_names_every_exit_status() -> None:
    r = subprocess.run([sys.executable, "-m", "chaos.cli", "chaos", "compare-backends", "--help"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0
    text = " ".join(r.stdout.split())
    for part in ("0 when the backends agree", "1 when one did (a broken promise)",
                 "2 for bad input", "3 when the lab's self-check failed"):
        assert part in text
