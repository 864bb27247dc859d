"""The comparison written down: the table (CSV), a summary (JSON, for the paper's macros), a text
report (Markdown: stdout and the report) and the figure (throughput ratio per point)."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import pandas as pd

from scalestudy.compare import points
from scalestudy.compare.study import PROVENANCE_AXES, Study


def what_differs(a: Study, b: Study) -> dict[str, dict[str, list[str]]]:
    """{axis: {"a": values, "b": values}} of every provenance axis whose values differ (the commit,
    the partition, the GPU, the image, the software): what the comparison compares."""
    found = {}
    for axis, column in PROVENANCE_AXES.items():
        values_a, values_b = a.distinct(column), b.distinct(column)
        if values_a != values_b:
            found[axis] = {"a": values_a, "b": values_b}
    return found


def summary(table: pd.DataFrame, a: Study, b: Study) -> dict[str, Any]:
    verdicts = Counter(table["verdict"])
    matched = table[table["repeats_a"].gt(0) & table["repeats_b"].gt(0)]
    ratios = matched["throughput_ratio"].dropna()
    return {
        "a": {"label": a.label, "source": a.source, "runs": len(a.runs)},
        "b": {"label": b.label, "source": b.source, "runs": len(b.runs)},
        "differs_in": what_differs(a, b),
        "test": points.TEST,
        "confidence": float(table["confidence"].iloc[0]) if len(table) else math.nan,
        "points": int(len(table)),
        "matched": int(len(matched)),
        "faster": int(verdicts.get(points.FASTER, 0)),
        "slower": int(verdicts.get(points.SLOWER, 0)),
        "same": int(verdicts.get(points.SAME, 0)),
        "not_tested": int(sum(n for v, n in verdicts.items() if v.startswith(points.NOT_TESTED))),
        "only_a": int(verdicts.get(points.ONLY_A, 0)),
        "only_b": int(verdicts.get(points.ONLY_B, 0)),
        "configs_differ": int(matched["match"].str.startswith("run configs differ").sum()),
        "throughput_ratio_median": float(ratios.median()) if len(ratios) else math.nan,
        "throughput_ratio_min": float(ratios.min()) if len(ratios) else math.nan,
        "throughput_ratio_max": float(ratios.max()) if len(ratios) else math.nan,
        "energy_measured": bool(table["energy_measured"].any()) if len(table) else False,
    }


def _ratio(row: pd.Series, metric: str) -> str:
    ratio = row[f"{metric}_ratio"]
    if not math.isfinite(ratio):
        return "not measured" if metric == "energy" else "-"
    low, high = row[f"{metric}_ratio_ci_low"], row[f"{metric}_ratio_ci_high"]
    return f"{ratio:.3f}" + (f" [{low:.3f}, {high:.3f}]" if math.isfinite(low) else "")


def markdown(table: pd.DataFrame, info: dict[str, Any]) -> str:
    a, b = info["a"]["label"], info["b"]["label"]
    lines = [
        f"# {b} (B) against {a} (A)",
        "",
        f"A: {info['a']['source']} ({info['a']['runs']} runs); "
        f"B: {info['b']['source']} ({info['b']['runs']} runs).",
        "What differs: "
        + (
            "; ".join(
                f"{axis} {v['a'] or ['-']} vs {v['b'] or ['-']}" for axis, v in info["differs_in"].items()
            )
            or "no recorded provenance axis (commit, partition, GPU, image, versions)"
        ),
        f"Ratios are B / A with {info['confidence']:.0%} intervals; verdict: {info['test']}. One repeat on a "
        "side gives a ratio but no verdict (not tested): a single run has no spread to test against.",
        f"Energy: {'measured on both sides' if info['energy_measured'] else 'not measured'}.",
        "",
        f"Points: {info['points']} ({info['matched']} matched; faster {info['faster']}, "
        f"slower {info['slower']}, no significant difference {info['same']}, "
        f"not tested {info['not_tested']}; only in A {info['only_a']}, only in B {info['only_b']}; "
        f"run configs differ {info['configs_differ']}).",
        "",
        "| point | repeats A/B | throughput | efficiency | step time | accuracy | energy | verdict | match |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for _, row in table.iterrows():
        cells = [_ratio(row, m) for m in ("throughput", "efficiency", "step_time", "accuracy", "energy")]
        lines.append(
            f"| {row['stage']}/{row['point']} | {row['repeats_a']}/{row['repeats_b']} | "
            + " | ".join(cells)
            + f" | {row['verdict']} | {row['match']} |"
        )
    return "\n".join(lines) + "\n"


COLOURS = {points.FASTER: "tab:green", points.SLOWER: "tab:red", points.SAME: "0.35"}


def figure(table: pd.DataFrame, info: dict[str, Any], png: str, pdf: str | None = None) -> None:
    """Throughput B / A per matched point with its interval; a line at 1."""
    from scalestudy.plots import style

    matched = table[table["repeats_a"].gt(0) & table["repeats_b"].gt(0)].reset_index(drop=True)
    fig, axes = style.new_figure(wide=True, aspect=max(0.3, 0.06 * len(matched) + 0.15))
    ax = axes[0][0]
    if matched.empty:
        style.placeholder_note(ax, "No grid point is in both studies: nothing to compare.")
    for y, row in matched.iterrows():
        colour = COLOURS.get(row["verdict"], "0.6")
        ratio, low, high = (
            row["throughput_ratio"],
            row["throughput_ratio_ci_low"],
            row["throughput_ratio_ci_high"],
        )
        if math.isfinite(low):
            ax.errorbar(ratio, y, xerr=[[ratio - low], [high - ratio]], fmt="o", color=colour, capsize=2)
        else:
            ax.plot(ratio, y, "o", mfc="none", color=colour)
    ax.axvline(1.0, color="0.5", lw=0.8, ls="--")
    ax.set_yticks(range(len(matched)), [f"{r.stage}/{r.point}" for r in matched.itertuples()])
    ax.invert_yaxis()
    ax.set_xlabel(
        f"throughput {info['b']['label']} / {info['a']['label']} ({info['confidence']:.0%} interval)"
    )
    style.save_figure(fig, png, pdf)
