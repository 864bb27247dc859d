"""Grid points of two studies, matched by their run configs, and compared metric by metric.

A point is a stage's runs that share a run config up to the repeat: the config.* columns of
runs.csv, without the fields that only say where or which repeat (IGNORED) and without the axis
the studies are meant to differ in (compare.axis). Points of A and B with equal configs are
matched; what is left is paired by grid point name (stage and point without its _r<repeat>), and
the run-config keys that differ are named for the point; the rest is listed as in one study only.

Per matched point and metric: the mean of each side, B / A as the ratio of geometric means with
a Welch-t interval (scalestudy.analysis.stats.ratio_interval), and for throughput a verdict:
"faster" / "slower" where the interval lies above / below 1, "no significant difference" where
it holds 1, and, with fewer than two repeats on a side, "not tested": one run has no spread, so
its ratio says how far apart two single runs are, not whether the difference is real.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence

import pandas as pd

from scalestudy.analysis.stats import ratio_interval
from scalestudy.compare.study import Study, clean

# Run-config keys that only say where a run wrote or which repeat it is (never what was measured).
IGNORED = ("repeat", "seed", "point", "checkpoint_dir", "data_dir", "inductor_cache_dir")
# metric -> runs.csv column; energy: the first column named energy_j (or ending in it), where measured.
METRICS = {
    "throughput": "images_per_s",
    "efficiency": "efficiency",
    "step_time": "time_per_step_s",
    "accuracy": "final_test_acc",
    "energy": None,
}
FASTER, SLOWER, SAME, NOT_TESTED = "faster", "slower", "no significant difference", "not tested"
ONLY_A, ONLY_B = "only in A", "only in B"
TEST = "Welch's two-sided t-test on log throughput (ratio of geometric means, Welch-Satterthwaite df)"
_REPEAT = re.compile(r"_r\d+$")


def energy_column(runs: pd.DataFrame) -> str | None:
    """The first energy column that holds a measurement (runs.csv has energy_j on every study since
    energy was measured, empty where nothing measured it: then None, "not measured")."""
    for column in runs.columns:
        named = column == "energy_j" or column.endswith(("_energy_j", ".energy_j"))
        if named and pd.to_numeric(runs[column], errors="coerce").notna().any():
            return column
    return None


def point_name(row: pd.Series) -> str:
    return f"{row['stage']}/{_REPEAT.sub('', str(row['point']))}"


def config_of(row: pd.Series, axis: Sequence[str]) -> dict:
    skipped = {f"config.{key}" for key in (*IGNORED, *axis)}
    return {
        column.removeprefix("config."): clean(row[column])
        for column in row.index
        if column.startswith("config.") and column not in skipped and clean(row[column]) is not None
    }


def points(study: Study, axis: Sequence[str]) -> dict[str, dict]:
    """{config key: {"name", "config", "rows"}} of one study (the key: stage + filtered run config)."""
    found: dict[str, dict] = {}
    for index, row in study.runs.iterrows():
        config = config_of(row, axis)
        key = json.dumps({"stage": row["stage"], **config}, sort_keys=True, default=str)
        entry = found.setdefault(key, {"name": point_name(row), "config": config, "rows": []})
        entry["rows"].append(index)
    return found


def differences(a: dict, b: dict) -> str:
    keys = sorted(set(a) | set(b))
    return "; ".join(f"{k} {a.get(k)} vs {b.get(k)}" for k in keys if a.get(k) != b.get(k))


def match(a: Study, b: Study, axis: Sequence[str] = ()) -> list[tuple[dict | None, dict | None, str]]:
    """(point of A or None, point of B or None, how they matched) for every point of either."""
    points_a, points_b = points(a, axis), points(b, axis)
    pairs = [(points_a[key], points_b[key], "same run config") for key in points_a if key in points_b]
    left_a = {p["name"]: p for key, p in points_a.items() if key not in points_b}
    left_b = {p["name"]: p for key, p in points_b.items() if key not in points_a}
    for name in sorted(left_a):
        if name in left_b:
            point_b = left_b.pop(name)
            pairs.append(
                (
                    left_a[name],
                    point_b,
                    "run configs differ: " + differences(left_a[name]["config"], point_b["config"]),
                )
            )
        else:
            pairs.append((left_a[name], None, ONLY_A))
    pairs += [(None, point_b, ONLY_B) for point_b in left_b.values()]
    return sorted(pairs, key=lambda pair: (pair[0] or pair[1])["name"])


def verdict(stats: dict) -> str:
    if math.isnan(stats["ci_low"]):
        return NOT_TESTED + f" ({min(stats['n_a'], stats['n_b'])} repeat(s) on a side)"
    if stats["ci_low"] > 1.0:
        return FASTER
    if stats["ci_high"] < 1.0:
        return SLOWER
    return SAME


def compare(a: Study, b: Study, confidence: float = 0.95, axis: Sequence[str] = ()) -> pd.DataFrame:
    """One row per point of either study: both sides' means, ratios with intervals, the verdict."""
    energy_a, energy_b = energy_column(a.runs), energy_column(b.runs)
    rows = []
    for point_a, point_b, how in match(a, b, axis):
        name = (point_a or point_b)["name"]
        stage, _, point = name.partition("/")
        row = {"stage": stage, "point": point, "match": how}
        row["repeats_a"] = len(point_a["rows"]) if point_a else 0
        row["repeats_b"] = len(point_b["rows"]) if point_b else 0
        for metric, column in METRICS.items():
            col_a, col_b = (energy_a, energy_b) if metric == "energy" else (column, column)
            values_a = _values(a, point_a, col_a)
            values_b = _values(b, point_b, col_b)
            stats = ratio_interval(values_a, values_b, confidence)
            row[f"{metric}_a"] = _mean(values_a)
            row[f"{metric}_b"] = _mean(values_b)
            row[f"{metric}_ratio"] = stats["ratio"]
            row[f"{metric}_ratio_ci_low"] = stats["ci_low"]
            row[f"{metric}_ratio_ci_high"] = stats["ci_high"]
            if metric == "throughput":
                row["p_value"] = stats["p_value"]
                row["verdict"] = verdict(stats) if point_a and point_b else how
        row["energy_measured"] = bool(energy_a and energy_b)
        rows.append(row)
    table = pd.DataFrame(rows)
    table["test"] = TEST
    table["confidence"] = confidence
    return table


def _values(study: Study, point: dict | None, column: str | None) -> list[float]:
    if point is None or column is None or column not in study.runs:
        return []
    values = pd.to_numeric(study.runs.loc[point["rows"], column], errors="coerce")
    return [float(v) for v in values if math.isfinite(v)]


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")
