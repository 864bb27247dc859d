"""The scaling-loss waterfall (results/tables/waterfall.csv, scalestudy.analysis.waterfall): one
panel per series (mode, and parallelism where the study has several), one stacked bar per world size
of the points of efficiency lost, split into exposed communication, data-loader wait, host and
launch overhead, straggler wait and the remainder (hatched; below zero where the parts over-explain
the loss, as a part below zero is: the point spends less on it than its share of the reference).
A black bar marks the loss itself; a remainder beyond the table's unexplained_share_max is labelled
with its share, and the figure says under its panels that such a bar's parts are not the
explanation of its loss (they add to more than the loss, or leave much of it unexplained). Every
panel keeps a y-axis scale (one scale for all panels), a panel without a split bar too. A part not
measured is named under the panels, with the reason. A point with no loss is not split
(analysis.waterfall leaves its remainder empty): no bar, but its efficiency and why, in words; above
100 % that is a point to check (scalestudy.analysis.above_ideal), never a negative loss drawn as
parts. A table of 1-rank rows only (a one-GPU study) says that one rank has no scaling loss to
split."""

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
    _one_scale(axes[0][: len(panels)])
    said = [_unexplained(split), _not_measured(frame)]
    # wrapped to the figure's width: one long line would widen the saved (tight) figure around it
    note = "\n".join(line for text in said if text for line in textwrap.wrap(text, NOTE_WIDTH))
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
        label="points lost" if split.any() else "_nolegend_",
    )
    for position, (_, row) in zip(x, group.iterrows(), strict=True):
        if not split[position]:
            _not_split(ax, position, row)
        elif bool(row["unexplained_flagged"]):
            ax.annotate(
                _unexplained_label(row["remainder_share"]),
                (position, max(above[position], row["loss_points"])),
                xytext=(0, 3),
                textcoords="offset points",
                ha="center",
                fontsize=6,
                color=style.THRESHOLD_STYLE["color"],
            )
    ax.axhline(0.0, color="0.3", linewidth=0.6)
    ax.set_xticks(x)
    ax.set_xticklabels([str(int(w)) for w in group["world_size"]])


def _unexplained_label(share: float) -> str:
    """A flagged bar's label: its remainder's share, and what that means for its parts."""
    return f"parts > loss\n{100 * share:.0f} %" if share < 0 else f"{100 * share:.0f} %\nunexplained"


def _unexplained(split: pd.DataFrame) -> str:
    """Under the panels, where some bar's remainder is beyond the table's bound: its named parts are
    not the explanation of its loss (they add to more than it, or leave most of it unexplained)."""
    flagged = split[split["unexplained_flagged"].astype(str).str.lower() == "true"]
    said = []
    for over, words in ((True, "add to more than the loss"), (False, "leave most of the loss unexplained")):
        rows = flagged[(flagged["remainder_share"] < 0) == over]
        where = ", ".join(
            f"{row['mode']} N={int(row['world_size'])} ({100 * row['remainder_share']:.0f} %)"
            for _, row in rows.iterrows()
        )
        if where:
            said.append(f"at {where}, the named parts {words}")
    return f"Not the explanation of the loss: {'; '.join(said)}." if said else ""


def _one_scale(axes) -> None:
    """Every panel on one y scale, with its ticks: a panel without a split bar (a point above 100 %)
    reads against the others' scale; with no bar anywhere, a scale of a few points around zero."""
    low = min(ax.get_ylim()[0] for ax in axes)
    high = max(ax.get_ylim()[1] for ax in axes)
    if high - low < 2.0:
        low, high = min(low, -1.0), max(high, 1.0)
    for ax in axes:
        ax.set_ylim(low, high)


def _not_split(ax, position: int, row: pd.Series) -> None:
    """A point with no loss to split: its efficiency and why, where its bar would stand."""
    efficiency = f"E = {100 * float(row['efficiency']):.1f} %"
    if above_ideal.row_flagged(row, "efficiency"):
        text = f"{efficiency}\nabove the ideal: check\n(measurement or\nsuperlinear), not split"
        colour = "firebrick"
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
