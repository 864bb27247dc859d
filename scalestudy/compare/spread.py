"""B / A throughput of one grid point with an interval, also where a side ran once.

With at least two repeats on each side, the interval is Welch's on the logarithms of the repeats'
throughputs (scalestudy.analysis.stats.ratio_interval): it rests on run-to-run variation.

A side with one repeat has no run-to-run variation to show, but its steady-state window was split
into sub-intervals (train.measure.intervals) whose rates (`interval_images_per_s` in runs.csv) vary.
That side's uncertainty is then the spread of one sub-interval, the standard deviation of the log
sub-interval rates, NOT divided by the square root of their count (the standard error of the
window's mean would be): the repeat that was not run could have landed anywhere one sub-interval
did. This is an assumption, stated with every such verdict ("within-run spread, one repeat"): that
a second run would differ from the first by no more than the run's own sub-intervals differ from
one another. It is conservative against the standard error (by sqrt(k), 2 with the demo's four
sub-intervals) and can still miss a slower machine, a different host or a noisy neighbour that
only a repeat shows. Degrees of freedom: k - 1 for such a side, n - 1 for a side with repeats,
combined by Welch-Satterthwaite.

The smallest change a point could have detected (`detectable_ratio`, the minimum detectable effect):
the ratio B / A below 1 that its test, with its standard error se of the log-ratio and its df, calls
slower with 80 % power at the comparison's confidence c: exp(-(t_{(1+c)/2, df} + t_{0.8, df}) se).
A faster B is detected at the reciprocal. Where the point's interval holds 1, a slowdown to this
ratio would most likely have been seen; a smaller one could pass.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence

from scalestudy.analysis.stats import ratio_interval, t_cdf, t_quantile

POWER = 0.8  # of the smallest detectable change
REPEATS = "repeats"
WITHIN = "within-run spread, one repeat"


def interval_rates(cell, filled=True) -> list[float]:
    """A run's sub-interval rates from its runs.csv cell (a JSON list); [] for a window that was not
    filled (its rates are the partial window's) or a cell that holds none."""
    if filled is False or str(filled).lower() == "false" or not isinstance(cell, str | list):
        return []
    try:
        values = json.loads(cell) if isinstance(cell, str) else cell
    except ValueError:
        return []
    if not isinstance(values, list):
        return []
    return [float(v) for v in values if isinstance(v, int | float) and math.isfinite(v) and v > 0]


def _side(values: Sequence[float], intervals: Sequence[float]) -> tuple[float, float, int, str] | None:
    """(mean log throughput, variance of that mean, degrees of freedom, basis) of one side."""
    logs = [math.log(v) for v in values if math.isfinite(v) and v > 0]
    if len(logs) >= 2:
        return statistics.fmean(logs), statistics.variance(logs) / len(logs), len(logs) - 1, REPEATS
    if len(logs) == 1 and len(intervals) >= 2:
        spread = statistics.variance([math.log(v) for v in intervals])
        return logs[0], spread, len(intervals) - 1, WITHIN
    return None


def throughput_interval(
    values_a: Sequence[float],
    values_b: Sequence[float],
    intervals_a: Sequence[float],
    intervals_b: Sequence[float],
    confidence: float = 0.95,
) -> dict:
    """stats.ratio_interval's keys plus `basis`: REPEATS (both sides repeated: that function's
    result), WITHIN (a side ran once: its sub-interval spread, above) or "" (no interval: a side ran
    once without sub-interval rates, or did not run)."""
    plain = ratio_interval(values_a, values_b, confidence)
    if not (plain["n_a"] and plain["n_b"]):
        return plain | {"basis": ""}
    if plain["n_a"] >= 2 and plain["n_b"] >= 2:
        return plain | {"basis": REPEATS}
    a, b = _side(values_a, intervals_a), _side(values_b, intervals_b)
    if a is None or b is None:
        return plain | {"basis": ""}
    diff, variance = b[0] - a[0], a[1] + b[1]
    out = plain | {"ratio": math.exp(diff), "basis": WITHIN}
    if variance == 0.0:
        return out | {
            "ci_low": out["ratio"],
            "ci_high": out["ratio"],
            "p_value": float(diff == 0.0),
            "se": 0.0,
        }
    df = variance**2 / (a[1] ** 2 / a[2] + b[1] ** 2 / b[2])
    se = math.sqrt(variance)
    half = t_quantile(0.5 + confidence / 2.0, df) * se
    return out | {
        "ci_low": math.exp(diff - half),
        "ci_high": math.exp(diff + half),
        "p_value": 2.0 * (1.0 - t_cdf(abs(diff) / se, df)),
        "df": df,
        "se": se,
    }


def detectable_ratio(se: float, df: float, confidence: float, power: float = POWER) -> float:
    """The ratio below 1 a test with this standard error of the log-ratio and df detects as slower
    with `power`; 1.0 for a test without spread; NaN where there is no test."""
    if not (math.isfinite(se) and se >= 0.0):
        return math.nan
    if se == 0.0:
        return 1.0
    if not (math.isfinite(df) and df > 0):
        return math.nan
    return math.exp(-(t_quantile(0.5 + confidence / 2.0, df) + t_quantile(power, df)) * se)
