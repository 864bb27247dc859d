"""The scaling-loss waterfall (results/tables/waterfall.csv, scalestudy.analysis.waterfall): one
panel per series (mode, and parallelism where the study has several), one stacked bar per world size
of the points of efficiency lost, split into exposed communication, data-loader wait, host and
launch overhead, straggler wait and the remainder (hatched; below zero where the parts over-explain
the loss, as a part below zero is: the point spends less on it than its share of the reference).
A black bar marks the loss itself; a remainder beyond the table's unexplained_share_max is labelled
with its share. A part not measured is named under the panels, with the reason. A point with no
loss is not split (analysis.waterfall leaves its remainder empty): no bar, but its efficiency and
why, in words; above 100 % that is a measurement problem (scalestudy.analysis.above_ideal), never a
negative loss drawn as parts. A table of 1-rank rows only (a one-GPU study) says that one rank has
no scaling loss to split."""

from __future__ import annotations

import textwrap

import numpy as np
import pandas as pd

from scalestudy.analysis import above_ideal
from scalestudy.analysis.waterfall import PARTS, REMAINDER
from scalestudy.plan.runfiles import NOT_MEASURED
from scalestudy.plots import style
from scalestudy.plots.scaling import parallelisms

COLOURS = dict(zip(PARTS, style.PALETTE, strict=False)) | {REMAINDER: "0.75"}
LABELS = PARTS | {REMAINDER: "remainder (unexplained)"}
BAR_WIDTH = 0.6
NOTE_WIDTH = 120  # characters of the not-measured note per line (7 pt across a wide figure)
NO_POINT = "No multi-rank scaling point with a 1-rank reference: no loss to split."
ONE_RANK = "One {} only: no scaling loss to split (the waterfall splits what N > 1 ranks lose)."


def waterfall(table: pd.DataFrame, png, pdf=None) -> None:
    frame = table.assign(parallelism=parallelisms(table))
    frame = frame[frame["world_size"] > 1]
    panels = list(frame.groupby(["mode", "parallelism"], sort=True))
    fig, axes = style.new_figure(wide=True, aspect=0.42, ncols=max(1, len(panels)))
    if not panels:
        style.placeholder_note(axes[0, 0], ONE_RANK.format(style.UNIT["word"]) if len(table) else NO_POINT)
        style.save_figure(fig, png, pdf)
        return
    named = frame["parallelism"].nunique() > 1
    split = frame[frame["remainder_points"].notna()]  # the points with a loss to split
    measured = {term for term in (*PARTS, REMAINDER) if split[f"{term}_points"].notna().any()}
    for ax, ((mode, parallelism), group) in zip(axes[0], panels, strict=True):
        _panel(ax, group.sort_values("world_size"), measured)
        title = style.mode_style(mode)["label"]
        ax.set_title(f"{title}, {parallelism.upper()}" if named else title)
    axes[0, 0].set_ylabel("Points of efficiency lost")
    missing = _not_measured(frame)
    # wrapped to the figure's width: one long line would widen the saved (tight) figure around it
    note = "\n".join(textwrap.wrap(missing, NOTE_WIDTH))
    fig.supxlabel(style.world_label() + (f"\n{note}" if note else ""), fontsize=7)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside right center", frameon=False)
    style.save_figure(fig, png, pdf)


def _panel(ax, group: pd.DataFrame, measured: set[str]) -> None:
    """One series' bars; the legend names the `measured` terms (a part measured nowhere is named
    under the panels instead)."""
    x = np.arange(len(group))
    split = group["remainder_points"].notna().to_numpy()  # a point with no loss is not split
    above, below = np.zeros(len(group)), np.zeros(len(group))
    for term in (*PARTS, REMAINDER):
        values = group[f"{term}_points"].to_numpy(float)
        shown = np.where(split, np.nan_to_num(values), 0.0)
        bottom = np.where(shown >= 0, above, below)
        hatch = "///" if term == REMAINDER else None
        ax.bar(
            x,
            shown,
            BAR_WIDTH,
            bottom=bottom,
            color=COLOURS[term],
            hatch=hatch,
            edgecolor="white",
            label=LABELS[term] if term in measured else "_nolegend_",
        )
        above += np.where(shown >= 0, shown, 0.0)
        below += np.where(shown < 0, shown, 0.0)
    ax.hlines(
        group["loss_points"][split],
        x[split] - BAR_WIDTH / 1.6,
        x[split] + BAR_WIDTH / 1.6,
        colors="black",
        linewidth=1.4,
        label="points lost",
    )
    for position, (_, row) in zip(x, group.iterrows(), strict=True):
        if not split[position]:
            _not_split(ax, position, row)
        elif bool(row["unexplained_flagged"]):
            ax.annotate(
                f"remainder {100 * row['remainder_share']:.0f} %",
                (position, max(above[position], row["loss_points"])),
                xytext=(0, 3),
                textcoords="offset points",
                ha="center",
                fontsize=6,
                color=style.THRESHOLD_STYLE["color"],
            )
    ax.axhline(0.0, color="0.3", linewidth=0.6)
    if not split.any():  # nothing drawn to a scale: no scale
        ax.set_ylim(-1.0, 1.0)
        ax.set_yticks([])
    ax.set_xticks(x)
    ax.set_xticklabels([str(int(w)) for w in group["world_size"]])


def _not_split(ax, position: int, row: pd.Series) -> None:
    """A point with no loss to split: its efficiency and why, where its bar would stand."""
    efficiency = f"E = {100 * float(row['efficiency']):.1f} %"
    if above_ideal.row_flagged(row, "efficiency"):
        text, colour = f"{efficiency}\nabove the ideal:\na measurement\nproblem, not split", "firebrick"
    else:
        text, colour = f"{efficiency}\nno loss to split", "0.3"
    ax.annotate(
        text,
        (position, 0.0),
        xytext=(0, 4),
        textcoords="offset points",
        ha="center",
        va="bottom",
        fontsize=6,
        color=colour,
    )
    ax.plot([position], [0.0], marker="v", color=colour, linestyle="none", markersize=5)


def _not_measured(group: pd.DataFrame) -> str:
    """'Not measured: host and launch overhead (on the CPU: no device timeline)' for the parts
    empty in some bar."""
    named = []
    for part, label in PARTS.items():
        if group[f"{part}_points"].isna().any():
            reasons = group.loc[group[f"{part}_points"].isna(), f"{part}_how"].astype(str)
            reason = "; ".join(dict.fromkeys(r.removeprefix(NOT_MEASURED).lstrip(" :") for r in reasons))
            named.append(f"{label} ({reason})")
    return "Not measured: " + ", ".join(named) if named else ""
