"""Repeat statistics: mean, standard deviation and a Student-t confidence interval.

No SciPy: the t quantile comes from the regularized incomplete beta function (continued fraction,
Numerical Recipes 6.4) inverted by bisection; accurate to ~1e-10, plenty for a CI.
"""

from __future__ import annotations

import math
from collections.abc import Iterable


def _betacf(a: float, b: float, x: float) -> float:
    tiny, eps = 1e-300, 1e-15
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        for num in (
            m * (b - m) * x / ((qam + m2) * (a + m2)),
            -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2)),
        ):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < eps:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The p-quantile of Student's t with df degrees of freedom (0 < p < 1, df > 0)."""
    if not 0.0 < p < 1.0 or df <= 0:
        raise ValueError(f"t_quantile needs 0 < p < 1 and df > 0, got p={p}, df={df}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


def repeat_stats(values: Iterable[float], confidence: float = 0.95) -> dict[str, float]:
    """n, mean, sample std and the t confidence interval of the finite values.

    One value: std and the interval are NaN (there is no spread to estimate), never zero.
    """
    xs = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    n = len(xs)
    nan = float("nan")
    if n == 0:
        return {"n": 0, "mean": nan, "std": nan, "ci_low": nan, "ci_high": nan}
    mean = math.fsum(xs) / n
    if n == 1:
        return {"n": 1, "mean": mean, "std": nan, "ci_low": nan, "ci_high": nan}
    std = math.sqrt(math.fsum((x - mean) ** 2 for x in xs) / (n - 1))
    half = t_quantile(0.5 + confidence / 2.0, n - 1) * std / math.sqrt(n)
    return {"n": n, "mean": mean, "std": std, "ci_low": mean - half, "ci_high": mean + half}


def ratio_interval(a: Iterable[float], b: Iterable[float], confidence: float = 0.95) -> dict[str, float]:
    """B relative to A: the ratio of geometric means, its Welch-t interval and the two-sided p-value
    (with `se`, the standard error of the log-ratio, and `df`).

        Welch's t-test on the logarithms (the spreads of A and B need not be equal; the
        Welch-Satterthwaite degrees of freedom), so a ratio and its interval are symmetric in log space:
        a copy of A scaled by 0.8 gives exactly 0.8, inside its interval. Non-positive or non-finite
        values are left out. Fewer than two values on a side: the ratio alone, the interval and p NaN
        (one run has no spread to test against). Both spreads zero: an interval of the ratio itself, p 1
        for equal means and 0 otherwise.
    """
    logs = [
        [math.log(float(v)) for v in side if v is not None and math.isfinite(float(v)) and float(v) > 0]
        for side in (a, b)
    ]
    nan = float("nan")
    (na, nb) = (len(logs[0]), len(logs[1]))
    if not na or not nb:
        return {
            "n_a": na,
            "n_b": nb,
            "ratio": nan,
            "ci_low": nan,
            "ci_high": nan,
            "p_value": nan,
            "df": nan,
            "se": nan,
        }
    stats = [repeat_stats(side) for side in logs]
    diff = stats[1]["mean"] - stats[0]["mean"]
    out = {
        "n_a": na,
        "n_b": nb,
        "ratio": math.exp(diff),
        "ci_low": nan,
        "ci_high": nan,
        "p_value": nan,
        "df": nan,
        "se": nan,
    }
    if na < 2 or nb < 2:
        return out
    var = [s["std"] ** 2 / s["n"] for s in stats]
    se = math.sqrt(var[0] + var[1])
    if se == 0.0:
        return out | {
            "ci_low": out["ratio"],
            "ci_high": out["ratio"],
            "p_value": 1.0 if diff == 0 else 0.0,
            "se": 0.0,
        }
    df = se**4 / sum(v**2 / (s["n"] - 1) for v, s in zip(var, stats, strict=True))
    half = t_quantile(0.5 + confidence / 2.0, df) * se
    p_value = 2.0 * (1.0 - t_cdf(abs(diff) / se, df))
    return out | {
        "ci_low": math.exp(diff - half),
        "ci_high": math.exp(diff + half),
        "p_value": p_value,
        "df": df,
        "se": se,
    }
