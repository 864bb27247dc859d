"""Grid points of two studies, matched by their run configs, and compared metric by metric.

A point is a stage's runs that share a run config up to the repeat: the config.* columns of
runs.csv (a key left out is the trainer's default, scalestudy.plan.runconfig.DEFAULTS), without the
fields that only say where or which repeat (IGNORED) and without the axes the studies are meant to
differ in (compare.axis). Points of A and B with equal configs are matched; what is left is paired
by grid point name (stage and point without its _r<repeat>), with the run-config keys that differ
(`config_differences`: such a pair is not the same experiment, and the comparison refuses it unless
told otherwise: differing_keys); the rest is listed as in one study only.

Per matched point and metric: the mean of each side and B / A as the ratio of geometric means with
a Welch-t interval (scalestudy.analysis.stats.ratio_interval). Throughput gets a verdict: "faster" /
"slower" where its interval lies above / below 1, "no significant difference" where it holds 1.
Its interval (scalestudy.compare.spread) rests on the repeats where both sides have two or more
(`verdict_basis` "repeats"), else on the one run's own window, its sub-interval rates ("within-run
spread, one repeat"); "not tested" where neither is there (a single run without sub-interval rates).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence

import pandas as pd

from scalestudy.analysis.stats import ratio_interval
from scalestudy.compare import spread
from scalestudy.compare.study import Study, clean
from scalestudy.plan import runconfig

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
INTERVALS, FILLED = "interval_images_per_s", "window_filled"
FASTER, SLOWER, SAME, NOT_TESTED = "faster", "slower", "no significant difference", "not tested"
ONLY_A, ONLY_B = "only in A", "only in B"
SAME_CONFIG, CONFIGS_DIFFER = "same run config", "run configs differ"
TEST = (
    "Welch's two-sided t-test on log throughput (ratio of geometric means, Welch-Satterthwaite df): "
    "on the repeats where both sides have two or more, else on each single run's window sub-interval "
    "rates (within-run spread, one repeat)"
)
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
    """The run config that says what was measured: recorded keys, the trainer's defaults for the
    keys left out, without IGNORED and the axes."""
    skipped = {*IGNORED, *axis}
    recorded = {
        column.removeprefix("config."): clean(row[column])
        for column in row.index
        if column.startswith("config.") and column.removeprefix("config.") not in skipped
    }
    defaults = {key: clean(v) for key, v in runconfig.DEFAULTS.items() if not isinstance(v, dict | list)}
    config = {key: v for key, v in defaults.items() if key not in skipped and recorded.get(key) is None}
    config.update({key: v for key, v in recorded.items() if v is not None})
    return {key: v for key, v in config.items() if v is not None}


def points(study: Study, axis: Sequence[str]) -> dict[str, dict]:
    """{config key: {"name", "config", "rows"}} of one study (the key: stage + filtered run config)."""
    found: dict[str, dict] = {}
    for index, row in study.runs.iterrows():
        config = config_of(row, axis)
        key = json.dumps({"stage": row["stage"], **config}, sort_keys=True, default=str)
        entry = found.setdefault(key, {"name": point_name(row), "config": config, "rows": []})
        entry["rows"].append(index)
    return found


def differences(a: dict, b: dict) -> dict[str, tuple]:
    """{key: (A's value, B's value)} of every run-config key whose values differ."""
    return {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}


def describe(found: dict[str, tuple]) -> str:
    return "; ".join(f"{key} {a} vs {b}" for key, (a, b) in found.items())


def match(a: Study, b: Study, axis: Sequence[str] = ()) -> list[tuple[dict | None, dict | None, str, dict]]:
    """(point of A or None, point of B or None, how they matched, the differing keys) for every
    point of either study."""
    points_a, points_b = points(a, axis), points(b, axis)
    pairs = [(points_a[key], points_b[key], SAME_CONFIG, {}) for key in points_a if key in points_b]
    left_a = {p["name"]: p for key, p in points_a.items() if key not in points_b}
    left_b = {p["name"]: p for key, p in points_b.items() if key not in points_a}
    for name in sorted(left_a):
        if name in left_b:
            point_b = left_b.pop(name)
            found = differences(left_a[name]["config"], point_b["config"])
            pairs.append((left_a[name], point_b, CONFIGS_DIFFER, found))
        else:
            pairs.append((left_a[name], None, ONLY_A, {}))
    pairs += [(None, point_b, ONLY_B, {}) for point_b in left_b.values()]
    return sorted(pairs, key=lambda pair: (pair[0] or pair[1])["name"])


def differing_keys(table: pd.DataFrame) -> dict[str, tuple]:
    """{key: (A's value, B's value) at the first point where it differs} over the matched points whose
    run configs differ beyond the axes: why A and B are not the same experiment ({} where they are)."""
    found: dict[str, tuple] = {}
    for cell in table.loc[table["match"].eq(CONFIGS_DIFFER), "config_differences_json"]:
        for key, values in json.loads(cell).items():
            found.setdefault(key, tuple(values))
    return dict(sorted(found.items()))


def verdict(stats: dict) -> str:
    if math.isnan(stats["ci_low"]):
        n = min(stats["n_a"], stats["n_b"])
        return NOT_TESTED + f" ({n} repeat(s) on a side and no window sub-interval rates)"
    if stats["ci_low"] > 1.0:
        return FASTER
    if stats["ci_high"] < 1.0:
        return SLOWER
    return SAME


def compare(a: Study, b: Study, confidence: float = 0.95, axis: Sequence[str] = ()) -> pd.DataFrame:
    """One row per point of either study: both sides' means, ratios with intervals, the verdict."""
    energy_a, energy_b = energy_column(a.runs), energy_column(b.runs)
    rows = []
    for point_a, point_b, how, found in match(a, b, axis):
        name = (point_a or point_b)["name"]
        stage, _, point = name.partition("/")
        row = {"stage": stage, "point": point, "match": how, "config_differences": describe(found)}
        row["config_differences_json"] = json.dumps(found, default=str)
        row["repeats_a"] = len(point_a["rows"]) if point_a else 0
        row["repeats_b"] = len(point_b["rows"]) if point_b else 0
        for metric, column in METRICS.items():
            col_a, col_b = (energy_a, energy_b) if metric == "energy" else (column, column)
            values_a, values_b = _values(a, point_a, col_a), _values(b, point_b, col_b)
            if metric == "throughput":
                stats = spread.throughput_interval(
                    values_a, values_b, _intervals(a, point_a), _intervals(b, point_b), confidence
                )
            else:
                stats = ratio_interval(values_a, values_b, confidence)
            row[f"{metric}_a"] = _mean(values_a)
            row[f"{metric}_b"] = _mean(values_b)
            row[f"{metric}_ratio"] = stats["ratio"]
            row[f"{metric}_ratio_ci_low"] = stats["ci_low"]
            row[f"{metric}_ratio_ci_high"] = stats["ci_high"]
            if metric == "throughput":
                row["p_value"] = stats["p_value"]
                row["verdict"] = verdict(stats) if point_a and point_b else how
                row["verdict_basis"] = stats["basis"] if point_a and point_b else ""
                row["detectable_ratio"] = spread.detectable_ratio(stats["se"], stats["df"], confidence)
        row["contended"] = _contended(a, point_a) or _contended(b, point_b)
        row["pooled"] = how == SAME_CONFIG and _filled(a, point_a) and _filled(b, point_b)
        row["pooled"] = (
            row["pooled"] and math.isfinite(row["throughput_ratio"]) and row["throughput_ratio"] > 0
        )
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


def _intervals(study: Study, point: dict | None) -> list[float]:
    """The sub-interval rates of a point's one run ([] for several runs, or none recorded)."""
    if point is None or len(point["rows"]) != 1 or INTERVALS not in study.runs:
        return []
    row = study.runs.loc[point["rows"][0]]
    return spread.interval_rates(row[INTERVALS], row[FILLED] if FILLED in row.index else True)


def _filled(study: Study, point: dict | None) -> bool:
    """Every run of the point filled its measurement window (a whole-run rate has one-off costs)."""
    if point is None:
        return False
    return "window_filled" not in study.runs or bool(study.runs.loc[point["rows"], "window_filled"].all())


def _contended(study: Study, point: dict | None) -> bool:
    """A run of the point shared its GPUs with a foreign process while it measured."""
    if point is None or "contended" not in study.runs:
        return False
    return bool(study.runs.loc[point["rows"], "contended"].astype(bool).any())


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")
