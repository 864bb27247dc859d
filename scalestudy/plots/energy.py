"""Time to accuracy against energy against GPU count (scaling.csv; scalestudy.analysis.energy).

Three panels, one line per (mode, parallelism), means over repeats: (a) time to the target accuracy
against the energy to reach it, each point labelled with its GPU count; (b) the energy to the target
against the GPU count; (c) the GPU-hours to the target against the GPU count. In (b) and (c) each
series' cheapest scale is ringed: the one that costs the fewest joules, and the one that costs the
fewest GPU-hours, which need not be the same. Energy comes from NVML's energy counter or the
power samples' integral (the table's energy_source); where nothing measured it (a CPU study: no
NVML, no RAPL) the energy panels say "not measured" and why, as where no point reached the target.
"""

from __future__ import annotations

import pandas as pd

from scalestudy.analysis import energy
from scalestudy.plots import style
from scalestudy.plots.scaling import series, series_line

ENERGY, HOURS, TIME = "energy_to_target_j_mean", "gpu_hours_to_target_mean", "time_to_target_s_mean"
CHEAPEST = {
    "marker": "o",
    "markersize": 9,
    "markerfacecolor": "none",
    "markeredgewidth": 1.1,
    "linestyle": "none",
}
TIME_UNITS = ((3600.0, "h"), (60.0, "min"), (1.0, "s"))  # of seconds
HOUR_UNITS = ((1.0, "hours"), (1 / 60, "minutes"), (1 / 3600, "seconds"))  # of hours


def unit_of(values: pd.Series, units) -> tuple[float, str]:
    """The unit the largest value reads best in (its size in the values' own unit, and its name)."""
    largest = float(values.max())
    return next(((size, name) for size, name in units if largest >= size), units[-1])


def _values(scaling: pd.DataFrame, column: str) -> pd.Series:
    if column not in scaling:
        return pd.Series(float("nan"), index=scaling.index)
    return pd.to_numeric(scaling[column], errors="coerce")


def why_no_energy(scaling: pd.DataFrame) -> str | None:
    """Why the energy panels are empty (None: there is something to draw)."""
    if _values(scaling, ENERGY).notna().any():
        return None
    if not energy.measured(scaling).any():
        text = energy.sources(scaling)
        return "Energy " + text if text.startswith(energy.NOT_MEASURED) else f"Energy not measured: {text}"
    return "Energy measured, but no point reached the target accuracy (no time to target)."


def figure(scaling: pd.DataFrame, png, pdf=None) -> None:
    fig, axes = style.new_figure(wide=True, aspect=0.34, ncols=3)
    frame = scaling.assign(**{column: _values(scaling, column) for column in (ENERGY, HOURS, TIME)})
    frame = frame.sort_values("world_size")
    missing = why_no_energy(frame)
    if missing:
        for ax in axes[0, :2]:
            style.placeholder_note(ax, missing, width=38)
    else:
        size, unit = energy.energy_unit(float(frame[ENERGY].max()))
        seconds, time_unit = unit_of(frame[TIME], TIME_UNITS)
        frame = frame.assign(energy_shown=frame[ENERGY] / size, time_shown=frame[TIME] / seconds)
        _time_against_energy(axes[0, 0], frame, unit, time_unit)
        _against_world(axes[0, 1], frame, "energy_shown", f"Energy to target ({unit})", "fewest joules")
    hours = f"{style.UNIT['word']}-hours"  # the panel's title names the unit its axis is in
    if frame[HOURS].notna().any():
        size, shown = unit_of(frame[HOURS], HOUR_UNITS)
        hours = f"{style.UNIT['word']}-{shown}"
        label = f"{hours} to target"
        _against_world(axes[0, 2], frame.assign(hours=frame[HOURS] / size), "hours", label, f"fewest {hours}")
    else:
        style.placeholder_note(
            axes[0, 2], "No point reached the target accuracy: no time to target.", width=38
        )
    axes[0, 0].set_title("(a) time vs energy to target")
    axes[0, 1].set_title("(b) energy to target")
    axes[0, 2].set_title(f"(c) {hours} to target")
    style.save_figure(fig, png, pdf)


def _time_against_energy(ax, frame: pd.DataFrame, unit: str, time_unit: str) -> None:
    for _, _, group, look in series(frame):
        group = group.dropna(subset=["energy_shown", "time_shown"])
        series_line(ax, group["energy_shown"], group["time_shown"], look, linewidth=1.0)
        for _, row in group.iterrows():
            ax.annotate(
                str(int(row["world_size"])),
                (row["energy_shown"], row["time_shown"]),
                xytext=(3, 3),
                textcoords="offset points",
                fontsize=6,
                color=look["color"],
            )
    ax.set_xlabel(f"Energy to target ({unit})")
    ax.set_ylabel(f"Time to target ({time_unit})")
    ax.legend(loc="best", title=f"labels: {style.UNIT['word']}s", title_fontsize=6)


def _against_world(ax, frame: pd.DataFrame, column: str, label: str, cheapest: str) -> None:
    for _, _, group, look in series(frame):
        group = group.dropna(subset=[column])
        if group.empty:
            continue
        series_line(ax, group["world_size"], group[column], look)
        best = group.loc[group[column].idxmin()]
        ax.plot([best["world_size"]], [best[column]], color=look["color"], **CHEAPEST)
    ax.plot([], [], color="0.35", label=f"cheapest: {cheapest}", **CHEAPEST)
    style.world_axis(ax, frame["world_size"])
    ax.set_ylabel(label)
    ax.set_ylim(bottom=0)
    ax.legend(loc="best")
