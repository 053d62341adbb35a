"""Rates with their uncertainty (chaos/check/rates.py): the Wilson interval against
known values, and a cell of three runs through the whole report — its
comparison columns and its row of the report's Rates table. One report
build (Spark is slow); the Spark session is the shared one of
tests/support/pipeline_fixtures.py."""

from __future__ import annotations

import os
from typing import Any

import pandas as pd
import pytest
from support.pipeline_fixtures import make_run, op, rec, spark  # noqa: F401

from chaos.check.rates import rate_cell, wilson_interval
from chaos.report.pipeline import build_report

pytestmark = pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas")


@pytest.mark.parametrize(("k", "n", "low", "high"), [
    # Known values (z = 1.95996, the normal 97.5 % quantile).
    (0, 10, 0.0, 0.2775), (5, 10, 0.2366, 0.7634), (10, 10, 0.7225, 1.0),
    (1, 3, 0.0615, 0.7923), (2, 3, 0.2077, 0.9385), (0, 3, 0.0, 0.5615),
    (1, 1, 0.2065, 1.0), (0, 1, 0.0, 0.7935),
])
def test_wilson_interval_known_values(k: int, n: int, low: float, high: float) -> None:
    assert wilson_interval(k, n) == (pytest.approx(low, abs=1e-4),
                                     pytest.approx(high, abs=1e-4))
    if k == 0:
        assert wilson_interval(k, n)[0] == 0.0  # exactly, not 1e-17
    if k == n:
        assert wilson_interval(k, n)[1] == 1.0


def test_wilson_interval_narrows_with_n_and_refuses_nonsense() -> None:
    # The same rate over more runs: a narrower interval, still holding it.
    lo10, hi10 = wilson_interval(5, 10)
    lo100, hi100 = wilson_interval(50, 100)
    assert lo10 < lo100 < 0.5 < hi100 < hi10
    assert wilson_interval(5, 10, confidence=0.99)[0] < lo10
    for k, n in ((1, 0), (0, 0), (4, 3), (-1, 3)):
        with pytest.raises(ValueError, match="0 <= k <= n"):
            wilson_interval(k, n)
    with pytest.raises(ValueError, match="confidence"):
        wilson_interval(1, 2, confidence=1.0)


def test_rate_cell_in_whole_percent() -> None:
    assert rate_cell(2, 3, *wilson_interval(2, 3)) == "2/3 (21–94 %)"
    assert rate_cell(0, 10, *wilson_interval(0, 10)) == "0/10 (0–28 %)"


# Four PUT_OKs at offsets 0..300.
HISTORY = [op(i + 1, f"m{i + 1}", i * 100, at=i * 10) for i in range(4)]
ALL = [rec(i * 100, f"m{i + 1}") for i in range(4)]


def test_a_cell_of_three_runs_reports_rates_intervals_and_spread(
        spark: Any, tmp_path: Any) -> None:  # noqa: F811
    """ASYNC_MASTER + ASYNC_FLUSH, three seeds of one scenario: one run
    keeps everything, one loses m4 everywhere, one keeps only m1 on the
    master while the slave, ahead of it at the end and so rejected, holds
    m2 (stranded) — lost on the master in 2 of 3 runs (0, 1 and 3
    messages), everywhere in 2, stranded and slave ahead in 1, violated
    in none (the mode promises nothing)."""
    root = str(tmp_path / "runs")
    cell = {"role": "ASYNC_MASTER", "flush": "ASYNC_FLUSH", "scenario": "rates",
            "history": HISTORY}
    make_run(root, "rates-1", seed=1, records={"m": ALL, "s": ALL}, **cell)
    make_run(root, "rates-2", seed=2, records={"m": ALL[:3], "s": ALL[:3]}, **cell)
    make_run(root, "rates-3", seed=3, records={"m": ALL[:1], "s": ALL[:2]}, **cell)
    summary = build_report([root], str(tmp_path / "out"))

    assert summary.verdicts.set_index("run_id")["acked_lost_master"].to_dict() == {
        "rates-1": 0, "rates-2": 1, "rates-3": 3}
    assert len(summary.comparison) == 1
    row = summary.comparison.iloc[0].to_dict()
    assert row["runs"] == 3
    expected_k = {"lost_master": 2, "lost_everywhere": 2, "violation": 0, "stranded": 1,
                  "slave_ahead": 1, "divergence": 0}
    assert {o: row[f"runs_{o}"] for o in expected_k} == expected_k
    for outcome, k in expected_k.items():
        assert (row[f"runs_{outcome}_ci_low"], row[f"runs_{outcome}_ci_high"]) == \
            pytest.approx(wilson_interval(k, 3)), outcome
    assert (row["runs_lost_master_ci_low"], row["runs_lost_master_ci_high"]) == (
        pytest.approx(0.2077, abs=1e-4), pytest.approx(0.9385, abs=1e-4))
    assert (row["acked_lost_master_min"], row["acked_lost_master_median"],
            row["acked_lost_master_max"]) == (0, 1.0, 3)
    assert (row["acked_lost_everywhere_min"], row["acked_lost_everywhere_median"],
            row["acked_lost_everywhere_max"]) == (0, 1.0, 2)
    # The existing run counts keep their meaning beside the new ones.
    assert (row["violation_runs"], row["slave_ahead_runs"], row["divergence_runs"]) == (0, 1, 0)

    saved = pd.read_csv(os.path.join(summary.out_dir, "comparison.csv"))
    assert saved.loc[0, "runs_lost_master"] == 2
    assert saved.loc[0, "runs_lost_master_ci_high"] == pytest.approx(0.9385, abs=1e-4)

    with open(os.path.join(summary.out_dir, "report.md"), encoding="utf-8") as f:
        md = f.read()
    assert md.index("## Durability") < md.index("## Rates") < md.index(
        "## Availability and latency")
    assert ("| mode | scenario | n | runs lost on master | runs lost everywhere | "
            "runs violated | runs stranded | runs slave ahead | runs diverged | "
            "lost on master per run |") in md
    assert ("| ASYNC_MASTER + ASYNC_FLUSH | [rates](#runs-async-master-async-flush-rates) | 3 "
            "| 2/3 (21–94 %) | 2/3 (21–94 %) | 0/3 (0–56 %) | 1/3 (6–79 %) | 1/3 (6–79 %) "
            "| 0/3 (0–56 %) | 0 / 1 / 3 |") in md, md
    assert "- **k/n (lo–hi %)**: k of the row's n runs showed the outcome" in md
    with open(os.path.join(summary.out_dir, "report.html"), encoding="utf-8") as f:
        page = f.read()
    assert '<td class="loss">2/3 (21–94 %)</td>' in page
