"""Scaling figures from results/tables/scaling.csv: throughput, efficiency, time per epoch.

One series per (mode, parallelism): strong and weak scaling in their colours; where the study has
more than one parallelism (DDP and FSDP), FSDP keeps its mode's colour with its own marker and line
and the labels name it. Throughput is in the table's unit (sample_unit: images, tokens, ...).

A point where some repeat did not fill its measurement window (scaling.csv's window_filled false:
its throughput is the whole run's) is drawn hollow, with a legend entry "window not filled"; a point
where some repeat was contended (scaling.csv's contended: a foreign process on its GPUs while it
measured, scalestudy.analysis.contention) is drawn as a cross, with a legend entry "GPU shared
(contended)", in every figure (its epoch time is the shared GPU's too). In the efficiency figure a
point above 100 % (scaling.csv's efficiency_above_ideal: to check, a measurement problem or a
superlinear gain; scalestudy.analysis.above_ideal) is ringed in red with its value, the axis reaching it.
"""

from __future__ import annotations

import pandas as pd

from scalestudy.analysis import above_ideal
from scalestudy.analysis.contention import contended
from scalestudy.analysis.metrics import window_filled
from scalestudy.analysis.series import parallelism_of
from scalestudy.plots import style

UNFILLED_LABEL = "window not filled"
CONTENDED_LABEL = "GPU shared (contended)"
ABOVE_IDEAL_LABEL = "above 100 %: check (measurement or superlinear)"
ABOVE_IDEAL_COLOUR = "firebrick"


def parallelisms(scaling: pd.DataFrame) -> pd.Series:
    """Each row's parallelism (ddp where the table predates the column)."""
    return parallelism_of(scaling)


def series(scaling: pd.DataFrame):
    """(mode, parallelism, rows by world size, look) of every series."""
    frame = scaling.assign(parallelism=parallelisms(scaling)).sort_values("world_size")
    named = frame["parallelism"].nunique() > 1
    for (mode, parallelism), group in frame.groupby(["mode", "parallelism"], sort=True):
        yield mode, parallelism, group, style.series_style(mode, parallelism, named)


def series_line(ax, x, y, look: dict, linewidth: float = 1.2) -> None:
    """One series' points joined by its line, in its look (colour, marker, line style, label)."""
    ax.plot(
        x,
        y,
        color=look["color"],
        marker=look["marker"],
        linestyle=look["linestyle"],
        markersize=style.MARKER_SIZE,
        linewidth=linewidth,
        label=look["label"],
    )


def _stat(ax, group, stem, look, windowed: bool = True):
    """Mean and interval over repeats of `stem` in the series' look; `windowed`: the quantity comes
    from the measurement window, so points without a filled one are drawn hollow; contended points
    are drawn as crosses."""
    filled = window_filled(group) if windowed else pd.Series(True, index=group.index)
    shared = contended(group)
    style.errorbar(
        ax,
        group["world_size"],
        group[f"{stem}_mean"],
        group[f"{stem}_ci_low"],
        group[f"{stem}_ci_high"],
        color=look["color"],
        marker=look["marker"],
        linestyle=look["linestyle"],
        label=look["label"],
        markevery=(filled & ~shared).tolist(),
    )
    if not filled.all():
        _hollow(ax, group.loc[~filled, "world_size"], group.loc[~filled, f"{stem}_mean"], look)
    if shared.any():
        _crossed(ax, group.loc[shared, "world_size"], group.loc[shared, f"{stem}_mean"], look)


def _hollow(ax, x, y, s) -> None:
    """Points without a filled window, and (once per axes) their legend entry."""
    hollow = {"linestyle": "none", "markerfacecolor": "white", "markeredgewidth": 1.2, "zorder": 3}
    ax.plot(x, y, marker=s["marker"], markeredgecolor=s["color"], markersize=style.MARKER_SIZE + 1, **hollow)
    if UNFILLED_LABEL not in ax.get_legend_handles_labels()[1]:
        ax.plot([], [], marker="o", markeredgecolor="0.35", label=UNFILLED_LABEL, **hollow)


def _crossed(ax, x, y, s) -> None:
    """Contended points, and (once per axes) their legend entry."""
    cross = {
        "linestyle": "none",
        "marker": "X",
        "markeredgecolor": "black",
        "markeredgewidth": 0.6,
        "zorder": 4,
    }
    ax.plot(x, y, color=s["color"], markersize=style.MARKER_SIZE + 3, **cross)
    if CONTENDED_LABEL not in ax.get_legend_handles_labels()[1]:
        ax.plot([], [], color="0.6", label=CONTENDED_LABEL, markersize=style.MARKER_SIZE + 3, **cross)


def _with_ideal(ax, scaling: pd.DataFrame, stem: str, ideal, windowed: bool = True) -> None:
    """Each series' measurements and, dashed in its colour, its ideal `ideal(value at 1 GPU, N)`."""
    for mode, parallelism, group, look in series(scaling):
        _stat(ax, group, stem, look, windowed)
        one = group.loc[group["world_size"] == 1, f"{stem}_mean"]
        if len(one):
            named = look["label"] != style.mode_style(mode)["label"]
            ax.plot(
                group["world_size"],
                ideal(float(one.iloc[0]), group["world_size"]),
                label=f"ideal, {mode}" + (f", {parallelism.upper()}" if named else ""),
                **{**style.IDEAL_STYLE, "color": look["color"], "alpha": 0.6},
            )


def throughput(scaling: pd.DataFrame, png, pdf=None) -> None:
    """Global throughput (the table's unit/s) vs GPUs (log-log), with the ideal N X(1) per series."""
    fig, axes = style.new_figure()
    ax = axes[0, 0]
    _with_ideal(ax, scaling, "images_per_s", lambda one, n: one * n)
    style.log_y_axis(ax)
    style.world_axis(ax, scaling["world_size"])
    unit = style.sample_unit(scaling)
    ax.set_ylabel(f"Throughput ({style.rate_label(unit, per_rank=False)}, all {style.UNIT['word']}s)")
    ax.legend(loc="best")
    style.save_figure(fig, png, pdf)


def efficiency(scaling: pd.DataFrame, png, pdf=None, criteria: dict | None = None) -> None:
    """E(N) = X(N) / (N X(1)) for every series; the strong-scaling acceptance threshold where the
    grid reaches its world size (a line at 70 % "at 8 GPUs" across a plot of 1 and 2 GPUs would
    judge points the criterion is not about)."""
    fig, axes = style.new_figure()
    ax = axes[0, 0]
    ax.axhline(1.0, **style.IDEAL_STYLE, label="ideal")
    for _, _, group, look in series(scaling):
        _stat(ax, group, "efficiency", look)
    if criteria and reaches(scaling, criteria["strong_efficiency_world"]):
        minimum, world = criteria["strong_efficiency_min"], criteria["strong_efficiency_world"]
        style.threshold(ax, minimum, f"acceptance: strong \u2265 {minimum:.0%} at {style.count(world)}")
    above_ideal_rings(ax, scaling)
    style.world_axis(ax, scaling["world_size"])
    ax.set_ylim(0.0, efficiency_top(scaling))
    style.percent_axis(ax)
    ax.set_ylabel("Parallel efficiency")
    ax.legend(loc="best")
    style.save_figure(fig, png, pdf)


def reaches(scaling: pd.DataFrame, world: int) -> bool:
    """Whether the plotted grid reaches `world` ranks (a criterion's size)."""
    sizes = pd.to_numeric(scaling["world_size"], errors="coerce") if len(scaling) else pd.Series()
    return bool(sizes.notna().any()) and float(sizes.max()) >= world


def efficiency_top(scaling: pd.DataFrame) -> float:
    """The efficiency axis' top: 112 %, or above the highest mean or interval end (with room for
    its label) where a point is above that."""
    columns = [c for c in ("efficiency_mean", "efficiency_ci_high") if c in scaling]
    values = pd.to_numeric(scaling[columns].stack(), errors="coerce") if columns else pd.Series()
    highest = float(values.max()) if values.notna().any() else 0.0
    return max(1.12, highest * 1.08 + 0.04)


def above_ideal_rings(ax, scaling: pd.DataFrame) -> None:
    """Points above 100 % ringed and labelled with their value, and (once) their legend entry."""
    flagged = scaling[above_ideal.flagged(scaling)]
    if flagged.empty:
        return
    ring = {"marker": "o", "markerfacecolor": "none", "linestyle": "none", "zorder": 5}
    ax.plot(
        flagged["world_size"],
        flagged["efficiency_mean"],
        markeredgecolor=ABOVE_IDEAL_COLOUR,
        markersize=style.MARKER_SIZE + 6,
        markeredgewidth=1.3,
        label=ABOVE_IDEAL_LABEL,
        **ring,
    )
    stacked = flagged.groupby("world_size").cumcount()  # labels of one world size stack upwards
    for (_, row), level in zip(flagged.iterrows(), stacked, strict=True):
        ax.annotate(
            f"{100 * row['efficiency_mean']:.1f} % ({row['mode']})",
            (row["world_size"], row["efficiency_mean"]),
            xytext=(-8, 5 + 8 * level),
            textcoords="offset points",
            ha="right",
            fontsize=6,
            color=ABOVE_IDEAL_COLOUR,
        )


def epoch_time(scaling: pd.DataFrame, png, pdf=None) -> None:
    """Measured time per epoch vs GPUs with the ideal T(1)/N (both modes split a fixed data set)."""
    fig, axes = style.new_figure()
    ax = axes[0, 0]
    _with_ideal(ax, scaling, "epoch_time_s", lambda one, n: one / n, windowed=False)
    style.log_y_axis(ax)
    style.world_axis(ax, scaling["world_size"])
    ax.set_ylabel("Time per epoch (s)")
    ax.legend(loc="best")
    style.save_figure(fig, png, pdf)
