"""The comparison written down: the table (CSV), a summary (JSON, for the paper's macros) and a text
report (Markdown: stdout and the report). The figure: scalestudy.compare.figure.

The text opens with what a reader must know first: a warning line where the two studies are not the
same experiment (run configs that differ beyond the compared axes, allowed with --allow-different),
then the study-level verdict (scalestudy.compare.pooled: all points together, with its interval and a
sign test), the headline that names the slower and the faster points, the points 10 % or more apart
without a verdict, what the verdicts rest on (repeats, or one run's within-run spread) and the
smallest slowdown each point could have detected. Table cells are short; the run-config differences
are footnotes.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import pandas as pd

from scalestudy.compare import points, pooled, spread
from scalestudy.compare.study import PROVENANCE_AXES, Study
from scalestudy.plan.runfiles import NOT_MEASURED

APART = 0.10  # a ratio this far from 1 (either way) without a verdict is named in the headline


def what_differs(a: Study, b: Study) -> dict[str, dict[str, list[str]]]:
    """{axis: {"a": values, "b": values}} of every provenance axis whose values differ (the commit,
    the partition, the GPU, the image, the software): what the comparison compares."""
    found = {}
    for axis, column in PROVENANCE_AXES.items():
        values_a, values_b = a.distinct(column), b.distinct(column)
        if values_a != values_b:
            found[axis] = {"a": values_a, "b": values_b}
    return found


def not_the_same(table: pd.DataFrame, a: str, b: str) -> str:
    """One line saying that A and B are not the same experiment, naming the keys; "" where they are."""
    keys = points.differing_keys(table)
    if not keys:
        return ""
    matched = table["repeats_a"].gt(0) & table["repeats_b"].gt(0)
    differ = int(table["match"].eq(points.CONFIGS_DIFFER).sum())
    named = ", ".join(f"{key} ({va} vs {vb})" for key, (va, vb) in keys.items())
    return (
        f"{a} and {b} are not the same experiment: run configs differ at {differ} of {int(matched.sum())} "
        f"matched points in {named}"
    )


def apart(matched: pd.DataFrame) -> pd.DataFrame:
    """The matched points APART or more from 1 (either way) whose throughput has no verdict."""
    undecided = matched[~matched["verdict"].astype(str).isin([points.FASTER, points.SLOWER])]
    ratio = pd.to_numeric(undecided["throughput_ratio"], errors="coerce")
    return undecided[(ratio >= 1 + APART) | (ratio <= 1 / (1 + APART))]


def _named(table: pd.DataFrame) -> list[dict[str, Any]]:
    return [
        {"point": f"{r.stage}/{r.point}", "ratio": float(r.throughput_ratio), "basis": r.verdict_basis}
        for r in table.itertuples()
    ]


def summary(table: pd.DataFrame, a: Study, b: Study, allowed_different: bool = False) -> dict[str, Any]:
    verdicts = Counter(table["verdict"])
    matched = table[table["repeats_a"].gt(0) & table["repeats_b"].gt(0)]
    ratios = matched["throughput_ratio"].dropna()
    confidence = float(table["confidence"].iloc[0]) if len(table) else math.nan
    detectable = matched["detectable_ratio"].dropna() if len(matched) else pd.Series(dtype=float)
    return {
        "a": {"label": a.label, "source": a.source, "runs": len(a.runs)},
        "b": {"label": b.label, "source": b.source, "runs": len(b.runs)},
        "differs_in": what_differs(a, b),
        "not_the_same_experiment": not_the_same(table, a.label, b.label),
        "config_differences": {k: list(v) for k, v in points.differing_keys(table).items()},
        "allowed_different": allowed_different,
        "test": points.TEST,
        "confidence": confidence,
        "study": pooled.verdict(table, confidence),
        "points": int(len(table)),
        "matched": int(len(matched)),
        "faster": int(verdicts.get(points.FASTER, 0)),
        "slower": int(verdicts.get(points.SLOWER, 0)),
        "same": int(verdicts.get(points.SAME, 0)),
        "not_tested": int(sum(n for v, n in verdicts.items() if v.startswith(points.NOT_TESTED))),
        "on_repeats": int(matched["verdict_basis"].eq(spread.REPEATS).sum()),
        "on_within_run_spread": int(matched["verdict_basis"].eq(spread.WITHIN).sum()),
        "slower_points": _named(matched[matched["verdict"].eq(points.SLOWER)]),
        "faster_points": _named(matched[matched["verdict"].eq(points.FASTER)]),
        "apart_without_verdict": _named(apart(matched)),
        "contended_points": [f"{r.stage}/{r.point}" for r in matched[matched["contended"]].itertuples()],
        "only_a": int(verdicts.get(points.ONLY_A, 0)),
        "only_b": int(verdicts.get(points.ONLY_B, 0)),
        "configs_differ": int(matched["match"].eq(points.CONFIGS_DIFFER).sum()),
        "throughput_ratio_median": float(ratios.median()) if len(ratios) else math.nan,
        "throughput_ratio_min": float(ratios.min()) if len(ratios) else math.nan,
        "throughput_ratio_max": float(ratios.max()) if len(ratios) else math.nan,
        "detectable_ratio_median": float(detectable.median()) if len(detectable) else math.nan,
        "detectable_ratio_worst": float(detectable.min()) if len(detectable) else math.nan,
        "without_detectable": int(len(matched) - len(detectable)),
        "energy_measured": bool(table["energy_measured"].any()) if len(table) else False,
    }


NAMED = 16  # points named in a headline list; the rest counted


def _list(named: list[dict[str, Any]]) -> str:
    shown = ", ".join(f"{p['point']} {p['ratio']:.3f}" for p in named[:NAMED]) or "none"
    return shown + (f" and {len(named) - NAMED} more (the table)" if len(named) > NAMED else "")


def headline(info: dict[str, Any]) -> list[str]:
    """The lines a reader needs first: the slower and faster points named, what the verdicts rest on."""
    lines = [
        pooled.sentence(info["study"], info["confidence"]),
        f"Points: {info['points']} ({info['matched']} in both studies). "
        f"Slower in B: {info['slower']} ({_list(info['slower_points'])}). "
        f"Faster in B: {info['faster']} ({_list(info['faster_points'])}). "
        f"No significant difference: {info['same']}. Not tested: {info['not_tested']}. "
        f"Only in A: {info['only_a']}; only in B: {info['only_b']}.",
    ]
    if info["apart_without_verdict"]:
        lines.append(
            f"{APART:.0%} or more apart without a verdict (the interval holds 1, or no interval): "
            + _list(info["apart_without_verdict"])
            + "."
        )
    if info["on_within_run_spread"]:
        lines.append(
            f"{info['on_within_run_spread']} verdict(s) rest on one repeat per side: each run's own "
            "steady-state window (the spread of its sub-interval rates, taken as the uncertainty of a "
            "run; within-run spread, one repeat). Run-to-run variation is not measured there: repeats "
            "would show it."
        )
    if info["on_repeats"]:
        lines.append(f"{info['on_repeats']} verdict(s) rest on the repeats (two or more on each side).")
    if info["contended_points"]:
        lines.append(
            "Contended (a foreign process on the GPUs while measuring, in A or B; their throughput may "
            "be lower for it): " + ", ".join(info["contended_points"]) + "."
        )
    if math.isfinite(info["detectable_ratio_median"]):
        lines.append(
            "Smallest slowdown a point could detect (80 % power): median "
            f"{info['detectable_ratio_median']:.3f}, least sensitive point "
            f"{info['detectable_ratio_worst']:.3f} (the table's 'detects' column; "
            f"none at {info['without_detectable']} point(s) without an interval)."
        )
    return lines


def _ratio(row: pd.Series, metric: str, interval: bool = False) -> str:
    ratio = row[f"{metric}_ratio"]
    if not math.isfinite(ratio):
        return NOT_MEASURED if metric == "energy" else "-"
    low, high = row[f"{metric}_ratio_ci_low"], row[f"{metric}_ratio_ci_high"]
    return f"{ratio:.3f}" + (f" [{low:.3f}, {high:.3f}]" if interval and math.isfinite(low) else "")


def _detects(row: pd.Series) -> str:
    """The smallest slowdown the point's test could detect (80 % power), "-" without an interval."""
    value = row.get("detectable_ratio", math.nan)
    return f"<= {value:.3f}" if math.isfinite(value) else "-"


def _verdict_cell(row: pd.Series) -> str:
    if str(row["verdict"]).startswith(points.NOT_TESTED):
        return points.NOT_TESTED
    return f"{row['verdict']} (one repeat)" if row["verdict_basis"] == spread.WITHIN else str(row["verdict"])


def markdown(table: pd.DataFrame, info: dict[str, Any]) -> str:
    a, b = info["a"]["label"], info["b"]["label"]
    warning = info["not_the_same_experiment"]
    lines = [f"# {b} (B) against {a} (A)", ""]
    if warning:
        lines += [f"WARNING: {warning}; compared anyway (allowed: --allow-different).", ""]
    lines += [*headline(info), ""]
    differs = "; ".join(f"{k} {v['a'] or ['-']} vs {v['b'] or ['-']}" for k, v in info["differs_in"].items())
    lines += [
        f"A: {info['a']['source']} ({info['a']['runs']} runs); "
        f"B: {info['b']['source']} ({info['b']['runs']} runs).",
        "What differs: " + (differs or "no provenance axis (commit, partition, GPU, image, versions)"),
        f"Ratios are B / A; throughput with its {info['confidence']:.0%} interval. Test: {info['test']}.",
        f"Energy: {'measured on both sides' if info['energy_measured'] else NOT_MEASURED}.",
        "",
        f"| point | repeats A/B | throughput [{info['confidence']:.0%}] | verdict | detects | efficiency "
        "| step time | accuracy | energy | note |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    notes: dict[str, int] = {}
    for _, row in table.iterrows():
        note = row["match"] if row["match"] in (points.ONLY_A, points.ONLY_B) else ""
        if row["config_differences"]:
            number = notes.setdefault(row["config_differences"], len(notes) + 1)
            note = f"configs differ [{number}]"
        cells = [_ratio(row, m) for m in ("efficiency", "step_time", "accuracy", "energy")]
        lines.append(
            f"| {row['stage']}/{row['point']} | {row['repeats_a']}/{row['repeats_b']} | "
            f"{_ratio(row, 'throughput', interval=True)} | {_verdict_cell(row)} | {_detects(row)} | "
            + " | ".join(cells)
            + f" | {note} |"
        )
    if notes:
        lines.append("")
        lines += [f"[{number}] Run configs differ (A vs B): {text}." for text, number in notes.items()]
    return "\n".join(lines) + "\n"
