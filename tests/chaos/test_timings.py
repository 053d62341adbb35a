"""This machine's timings for the sim (chaos/harness/timings.py) and the
statistics compare-backends decides with (chaos/check/rates.py): Fisher's
exact test and the runs that would decide an open question."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from chaos.check.rates import fisher_exact_p, runs_to_decide
from chaos.harness.timings import (
    MachineTimings,
    measure_fsync_us,
    put_us_from_history,
    quantiles,
    start_us_from_faults,
)


def test_fisher_exact_matches_known_tables() -> None:
    # 3/6 vs 0/60: R's fisher.test gives 0.000437.
    assert fisher_exact_p(3, 6, 0, 60) == pytest.approx(0.000437, abs=1e-6)
    assert fisher_exact_p(1, 1, 0, 10) == pytest.approx(1 / 11)
    # 1/3 vs 3/20, by hand: of C(23,4) = 8855 tables, a = 0..3 on the first
    # side have 4845, 3420, 570, 20; the seen one (3420) and the less
    # likely ones sum to 4010.
    assert fisher_exact_p(1, 3, 3, 20) == pytest.approx(4010 / 8855)
    assert fisher_exact_p(5, 10, 5, 10) == 1.0
    assert fisher_exact_p(0, 10, 0, 3) == 1.0
    with pytest.raises(ValueError):
        fisher_exact_p(4, 3, 0, 1)


def test_runs_to_decide_is_where_none_seen_becomes_unlikely() -> None:
    # 4 of 40: the low end of the interval is 3.96 %; 75 runs of none have a
    # chance of 4.8 % at that rate, 74 of 5.0 %.
    assert runs_to_decide(4, 40) == 75
    assert runs_to_decide(20, 20) == 2
    with pytest.raises(ValueError):
        runs_to_decide(0, 10)


def test_fsync_draws_follow_the_measured_quantiles() -> None:
    t = MachineTimings(fsync_us=(100.0, 200.0, 400.0), put_us=150.0)
    rng = random.Random(1)
    draws = [t.fsync_s(rng) * 1e6 for _ in range(4000)]
    assert min(draws) >= 100.0 and max(draws) <= 400.0
    below = sum(d < 200.0 for d in draws) / len(draws)
    assert 0.45 < below < 0.55  # the median quantile splits the draws in two
    assert t.put_s == pytest.approx(150e-6)
    assert MachineTimings.from_record(t.as_record()) == t
    # A record from before start times were measured reads as 0.
    older = {k: v for k, v in t.as_record().items() if k != "start_us"}
    assert MachineTimings.from_record(older).start_us == 0.0


@pytest.mark.parametrize("fields", [
    {"fsync_us": (5.0,), "put_us": 1.0},
    {"fsync_us": (5.0, 4.0), "put_us": 1.0},
    {"fsync_us": (1.0, 2.0), "put_us": -1.0},
    {"fsync_us": (1.0, 2.0), "put_us": 1.0, "start_us": -5.0},
    {"fsync_us": (1.0, 2.0), "put_us": 1.0, "net_us": (3.0, 2.0)},
])
def test_impossible_timings_are_refused(fields: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        MachineTimings(**fields)  # type: ignore[arg-type]


def test_fsync_is_measured_on_the_real_disk(tmp_path: Path) -> None:
    q = measure_fsync_us(str(tmp_path), samples=30, max_s=5.0)
    assert len(q) == 11 and list(q) == sorted(q) and q[0] > 0
    assert os.listdir(tmp_path) == []  # the probe file is gone
    assert quantiles([3.0, 1.0, 2.0], n=3) == (1.0, 2.0, 3.0)


def test_put_time_is_the_median_round_trip_before_the_fault() -> None:
    rows = [{"status": "PUT_OK", "invoke_us": 0, "complete_us": us, "invoke_ms": ms}
            for us, ms in ((100, 1), (300, 2), (200, 3), (9000, 50))]
    rows.append({"status": "SLAVE_NOT_AVAILABLE", "invoke_us": 0, "complete_us": 5,
                 "invoke_ms": 1})
    assert put_us_from_history(rows, before_ms=10) == 200.0
    assert put_us_from_history(rows, before_ms=None) == 250.0
    assert put_us_from_history(rows, before_ms=0) is None


def test_start_time_is_each_start_steps_duration() -> None:
    rows = [{"kind": "kill", "start_ms": 0, "end_ms": None},
            {"kind": "start", "start_ms": 100, "end_ms": 1190},
            {"kind": "start", "start_ms": 5000, "end_ms": None}]
    assert start_us_from_faults(rows) == [1_090_000.0]
    # The failover scenarios start no node: their promotions are measured.
    rows.append({"kind": "promote", "start_ms": 7000, "end_ms": 8300})
    assert start_us_from_faults(rows, "promote") == [1_300_000.0]
