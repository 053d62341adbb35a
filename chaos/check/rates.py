"""Rates with their uncertainty: per comparison group (a cell of mode x
scenario x run conditions, chaos/report/tables.py), how many of its n runs showed
each outcome, with a 95 % Wilson score interval for the rate, and the
min / median / max of the per-run counts behind the outcomes. Pure pandas
over the verdicts (a row per run); nothing here touches Spark or files.

Why Wilson and not k/n +- z*sqrt(p(1-p)/n) (the Wald interval): with the
few runs a cell has (often 1 to 20) and outcomes that are rare or certain,
Wald gives [0, 0] for 0/n and bounds outside [0, 1]; Wilson's interval stays
inside [0, 1], is never empty, and keeps close to its nominal coverage at
small n (Brown, Cai & DasGupta 2001, "Interval Estimation for a Binomial
Proportion").
"""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pandas is not in the node image, where `dlab` also loads this
    import pandas as pd

# An outcome a run shows or not: (its name in the comparison's columns
# runs_{name}..., the verdicts column that decides it (a count: shown when
# > 0; a bool: shown when true), what it means).
OUTCOMES: tuple[tuple[str, str, str], ...] = (
    ("lost_master", "acked_lost_master",
     "some acknowledged message is missing from the recovered master"),
    ("lost_everywhere", "acked_lost_everywhere",
     "some acknowledged message is missing from every node"),
    ("violation", "promise_violations",
     "some acknowledged message is gone from where the mode promised it"),
    ("stranded", "acked_stranded",
     "some acknowledged message is held only by slaves the master rejects or ignores"),
    ("slave_ahead", "slave_ahead",
     "a slave held more than the master, at its restart or at the end of the run"),
    ("divergence", "divergent_records",
     "master and slave hold different records at one offset"),
)

# Per-run counts whose spread over a group's runs is given as
# {count}_min, {count}_median and {count}_max.
SPREAD_COUNTS = ("acked_lost_master", "acked_lost_everywhere", "promise_violations",
                 "acked_stranded", "divergent_records")

CONFIDENCE = 0.95


def wilson_interval(k: int, n: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The Wilson score interval for a binomial rate seen as k successes in
    n trials: with p = k/n and z the normal quantile of (1 + confidence)/2,

        centre = (p + z^2 / 2n) / (1 + z^2 / n)
        half   = z * sqrt(p(1 - p)/n + z^2 / 4n^2) / (1 + z^2 / n)

    returns (centre - half, centre + half): exactly 0 below for k = 0 and
    1 above for k = n (where the float arithmetic leaves ~1e-17), clipped
    to [0, 1]. Raises ValueError unless 0 <= k <= n and n > 0."""
    if n <= 0 or not 0 <= k <= n:
        raise ValueError(f"a rate needs 0 <= k <= n and n > 0, got k={k}, n={n}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be between 0 and 1, got {confidence}")
    z = NormalDist().inv_cdf((1 + confidence) / 2)
    p, z2 = k / n, z * z
    denominator = 1 + z2 / n
    centre = (p + z2 / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / denominator
    low = 0.0 if k == 0 else max(0.0, centre - half)
    high = 1.0 if k == n else min(1.0, centre + half)
    return low, high


def shown(verdicts: pd.DataFrame, column: str) -> pd.Series:
    """Per run: whether it showed the outcome decided by `column`."""
    values = verdicts[column]
    return values if values.dtype == bool else values > 0


def group_rates(group: pd.DataFrame) -> dict[str, Any]:
    """The rate columns of one comparison group (its verdict rows): per
    outcome runs_{name} (k), runs_{name}_ci_low and _ci_high (the 95 %
    Wilson interval of k out of the group's n runs, as fractions); per
    count of SPREAD_COUNTS its min, median and max over the runs."""
    n = len(group)
    out: dict[str, Any] = {}
    for name, column, _ in OUTCOMES:
        k = int(shown(group, column).sum())
        low, high = wilson_interval(k, n)
        out |= {f"runs_{name}": k, f"runs_{name}_ci_low": low, f"runs_{name}_ci_high": high}
    for column in SPREAD_COUNTS:
        out |= {f"{column}_min": int(group[column].min()),
                f"{column}_median": float(group[column].median()),
                f"{column}_max": int(group[column].max())}
    return out


def rate_cell(k: int, n: int, low: float, high: float) -> str:
    """k/n and its interval in whole percent, e.g. '2/3 (21–94 %)'."""
    return f"{k}/{n} ({100 * low:.0f}–{100 * high:.0f} %)"


def fisher_exact_p(k1: int, n1: int, k2: int, n2: int) -> float:
    """Fisher's exact test, two-sided: the chance, if both sides had the
    same rate, of a split of the k1 + k2 outcomes between n1 and n2 runs at
    most as likely as the one seen (the hypergeometric tables of the same
    margins summed). 1.0 when nothing can differ (no outcome, or no runs)."""
    if not (0 <= k1 <= n1 and 0 <= k2 <= n2):
        raise ValueError("need 0 <= k <= n on each side")
    k, n = k1 + k2, n1 + n2
    if k in (0, n) or not n1 or not n2:
        return 1.0
    total = math.comb(n, k)

    def prob(a: int) -> float:
        return math.comb(n1, a) * math.comb(n2, k - a) / total

    seen = prob(k1)
    lo, hi = max(0, k - n2), min(k, n1)
    # Ties within float rounding count as "as likely" (R's fisher.test does the same).
    p = sum(q for a in range(lo, hi + 1) if (q := prob(a)) <= seen * (1 + 1e-7))
    return min(1.0, p)


def runs_to_decide(k: int, n: int, chance: float = 0.05) -> int:
    """How many runs showing an outcome in none of them would make that
    unlikely (below `chance`) at the lowest rate k of n runs are consistent
    with (the low end of their 95 % Wilson interval): the runs a side that
    saw nothing needs before its zero contradicts the other side's k/n."""
    low, _ = wilson_interval(k, n)
    if low <= 0:
        raise ValueError("k/n must show the outcome at a rate above zero")
    return math.ceil(math.log(chance) / math.log(1 - low))
