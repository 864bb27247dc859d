"""The study-level verdict: is B slower or faster than A over the whole study, not point by point?

A study usually runs each grid point once, and one run's interval is wide: a slowdown that touches
every point can pass each point's test. The points together say more. Each pooled point gives one
log-ratio d_i = log(B / A) of its throughput (the ratio of geometric means where it has repeats);
the study's effect is their mean, B / A = exp(mean d_i), with a Student-t interval across the points
(df n - 1, the standard error s_d / sqrt(n)): a one-sample t-test of the paired points. Its spread is
the points' own: run-to-run noise and any real difference between points' effects, with no
assumption about either (not the within-run spread one repeat's verdict rests on). What it
estimates is the mean effect over the study's configurations, each point weighted alike; it treats
the points as independent (a shared cause, the same noisy neighbour at every point, narrows it
falsely). A copy whose every point moved by the same factor has no spread: its interval is that
factor alone.

Beside it, a sign test: how many points are slower and how many faster (a point at exactly 1 left
out), with the exact two-sided binomial p-value against even odds; it assumes nothing about sizes.

Pooled: the matched points with the same run config (up to the compared axes) and a finite ratio
whose windows were filled on both sides (a whole-run rate carries one-off costs). Verdict: "slower"
/ "faster" where the interval lies below / above 1; "no difference" where every pooled ratio is
exactly 1 (the same measurements); else "no significant difference". With one pooled point, the
point's own interval and verdict; with none, "not tested".

The smallest change it could detect (scalestudy.compare.spread.detectable_ratio, as for each point):
the ratio B / A below 1 that a test with this standard error and df calls slower with 80 % power.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

import pandas as pd

from scalestudy.analysis.stats import t_cdf, t_quantile
from scalestudy.compare import points
from scalestudy.compare.spread import detectable_ratio

IDENTICAL = "no difference"
NO_SPREAD = 1e-12  # a standard error of the log-ratio below this is rounding: no spread
METHOD = (
    "mean of the pooled points' log throughput ratios with a Student-t interval across the points "
    "(one-sample t-test, df n - 1), and an exact two-sided sign test on their directions"
)


def sign_test(slower: int, faster: int) -> float:
    """The exact two-sided binomial p-value of `slower` against `faster` at even odds (1 for none)."""
    n = slower + faster
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(slower, faster) + 1)) / 2.0**n
    return min(1.0, 2.0 * tail)


def pooled_points(table: pd.DataFrame) -> pd.DataFrame:
    """The rows of the comparison table that enter the study-level verdict."""
    return table[table["pooled"].astype(bool)] if "pooled" in table else table.iloc[0:0]


def verdict(table: pd.DataFrame, confidence: float) -> dict[str, Any]:
    """The study-level verdict over the pooled points (the module's docstring)."""
    rows = pooled_points(table)
    logs = [math.log(r) for r in rows["throughput_ratio"]]
    slower, faster = sum(d < 0 for d in logs), sum(d > 0 for d in logs)
    out: dict[str, Any] = {
        "method": METHOD,
        "points": len(logs),
        "left_out": int(len(table) - len(rows)),
        "ratio": math.nan,
        "ci_low": math.nan,
        "ci_high": math.nan,
        "p_value": math.nan,
        "df": math.nan,
        "detectable_ratio": math.nan,
        "slower_points": slower,
        "faster_points": faster,
        "equal_points": len(logs) - slower - faster,
        "sign_p_value": sign_test(slower, faster),
    }
    if not logs:
        return out | {"verdict": points.NOT_TESTED + " (no matched point with a filled window)"}
    if len(logs) == 1:
        row = rows.iloc[0]
        own = {key: float(row[key]) for key in ("p_value", "detectable_ratio")}
        own |= {key: float(row[f"throughput_ratio_{key}"]) for key in ("ci_low", "ci_high")}
        verdict = IDENTICAL if logs[0] == 0.0 else str(row["verdict"])
        return out | own | {"ratio": math.exp(logs[0]), "verdict": verdict}
    mean, df = statistics.fmean(logs), len(logs) - 1
    se = statistics.stdev(logs) / math.sqrt(len(logs))
    se = 0.0 if se < NO_SPREAD else se  # equal factors, unequal in the last bits of their logarithms
    half = t_quantile(0.5 + confidence / 2.0, df) * se
    p_value = (1.0 if mean == 0.0 else 0.0) if se == 0.0 else 2.0 * (1.0 - t_cdf(abs(mean) / se, df))
    out |= {
        "ratio": math.exp(mean),
        "ci_low": math.exp(mean - half),
        "ci_high": math.exp(mean + half),
        "p_value": p_value,
        "df": float(df),
        "detectable_ratio": detectable_ratio(se, df, confidence),
    }
    if all(d == 0.0 for d in logs):
        return out | {"verdict": IDENTICAL}
    if out["ci_high"] < 1.0:
        return out | {"verdict": points.SLOWER}
    if out["ci_low"] > 1.0:
        return out | {"verdict": points.FASTER}
    return out | {"verdict": points.SAME}


def sentence(study: dict[str, Any], confidence: float) -> str:
    """The study-level verdict as the comparison's first line."""
    if not study["points"]:
        return f"Study-level verdict: {study['verdict']}."
    low, high, detectable = study["ci_low"], study["ci_high"], study["detectable_ratio"]
    interval = f", {confidence:.0%} interval [{low:.3f}, {high:.3f}]" if math.isfinite(low) else ""
    if math.isfinite(low) and low == high and study["points"] > 1 and study["verdict"] != IDENTICAL:
        interval += " (every point moved by this same factor: no spread across the points)"
    smallest = ""
    if math.isfinite(detectable) and detectable < 1.0:
        smallest = f"; it would detect a slowdown to {detectable:.3f} or below (80 % power)"
    return (
        f"Study-level verdict: {study['verdict']}: B / A {study['ratio']:.3f}{interval} over "
        f"{study['points']} pooled point(s){smallest}. Sign test: {study['slower_points']} slower, "
        f"{study['faster_points']} faster, {study['equal_points']} equal (p = {study['sign_p_value']:.2g})."
    )
