"""The comparison's figure: throughput B / A per point in both studies, with its interval.

Colour: the verdict (faster, slower, no significant difference; hollow: not tested). Marker: what the
interval rests on (circle: repeats; square: one run's within-run spread); the study-level verdict
(all points pooled, scalestudy.compare.pooled) is the last row, a diamond. A legend names both; a
red line over the axes says when the studies are not the same experiment. The ratio axis is
logarithmic (0.5 and 2 lie equally far from 1) and labelled in plain numbers.
"""

from __future__ import annotations

import math
import textwrap
from typing import Any

import pandas as pd

from scalestudy.compare import points, spread

COLOURS = {points.FASTER: "#009E73", points.SLOWER: "#D55E00", points.SAME: "0.35"}
MARKERS = {spread.REPEATS: "o", spread.WITHIN: "s"}
BASIS_LABEL = {spread.REPEATS: "repeats", spread.WITHIN: "within-run spread, one repeat"}


def _style(row) -> tuple[str, str, str, str]:
    """(colour, marker, face colour, legend label) of one point."""
    verdict = str(row.verdict)
    if verdict.startswith(points.NOT_TESTED):
        return "0.55", "D", "none", "not tested (one run, no window sub-interval rates)"
    colour = COLOURS.get(verdict, "0.55")
    basis = row.verdict_basis if row.verdict_basis in MARKERS else spread.REPEATS
    return colour, MARKERS[basis], colour, f"{verdict} ({BASIS_LABEL[basis]})"


# Ratio ticks by the axis' span (high / low): up to 2.5, up to 25; wider: 1-2-5 per decade.
TICKS = (
    (2.5, (0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0)),
    (25.0, (0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 1.0, 1.5, 2.0, 3.0, 5.0, 7.0, 10.0, 20.0)),
)


def _ratio_axis(ax, matched: pd.DataFrame) -> None:
    """A log axis from the lowest to the highest interval end (1 always shown), in plain numbers."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullFormatter

    ends = pd.concat([matched[f"throughput_ratio{end}"] for end in ("", "_ci_low", "_ci_high")])
    ends = ends[ends.apply(math.isfinite) & ends.gt(0)]
    low = min(0.9, float(ends.min()) / 1.05) if len(ends) else 0.9
    high = max(1.1, float(ends.max()) * 1.05) if len(ends) else 1.1
    ax.set_xscale("log")
    ax.set_xlim(low, high)
    ticks = next((ticks for span, ticks in TICKS if high / low <= span), None)
    if ticks is None:
        ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    else:
        ax.xaxis.set_major_locator(FixedLocator([t for t in ticks if low <= t <= high]))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _pos: f"{value:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())


def figure(table: pd.DataFrame, info: dict[str, Any], png: str, pdf: str | None = None) -> None:
    """Throughput B / A per matched point with its interval; a line at 1; a legend."""
    from scalestudy.plots import style

    matched = table[table["repeats_a"].gt(0) & table["repeats_b"].gt(0)].reset_index(drop=True)
    fig, axes = style.new_figure(wide=True, aspect=max(0.3, 0.035 * len(matched) + 0.25))
    ax = axes[0][0]
    if matched.empty:
        style.placeholder_note(ax, "No grid point is in both studies: nothing to compare.")
    seen: dict[str, Any] = {}
    for y, row in enumerate(matched.itertuples()):
        colour, marker, face, label = _style(row)
        ratio, low, high = row.throughput_ratio, row.throughput_ratio_ci_low, row.throughput_ratio_ci_high
        xerr = [[ratio - low], [high - ratio]] if math.isfinite(low) else None
        handle = ax.errorbar(
            ratio, y, xerr=xerr, fmt=marker, color=colour, mfc=face, capsize=2, markersize=style.MARKER_SIZE
        )
        seen.setdefault(label, handle)
    labels = [f"{r.stage}/{r.point}" for r in matched.itertuples()]
    study = info["study"]
    if study["points"] > 1 and math.isfinite(study["ci_low"]):
        ratio, low, high = study["ratio"], study["ci_low"], study["ci_high"]
        colour = COLOURS.get(study["verdict"], "0.35")
        handle = ax.errorbar(
            ratio, len(labels), xerr=[[ratio - low], [high - ratio]], fmt="D", color=colour, capsize=3
        )
        seen.setdefault(f"study-level: {study['verdict']} (all points pooled)", handle)
        labels.append(f"STUDY ({study['points']} points pooled)")
    if not matched.empty:
        ax.axvline(1.0, color="0.5", lw=0.8, ls="--")
        ax.set_yticks(range(len(labels)), labels)
        ax.invert_yaxis()
        _ratio_axis(ax, matched)
        title = f"verdict ({info['confidence']:.0%} interval)"
        ax.legend(
            seen.values(), seen.keys(), title=title, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncols=2
        )
    a, b = info["a"]["label"], info["b"]["label"]
    ax.set_xlabel(f"throughput {b} / {a} (B / A; left of 1: B slower)")
    if info.get("not_the_same_experiment"):
        text = "NOT THE SAME EXPERIMENT: " + info["not_the_same_experiment"].split(": ", 1)[-1]
        ax.set_title(textwrap.fill(text, 100), color="#B22222", loc="left")
    style.save_figure(fig, png, pdf)
