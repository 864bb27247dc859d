"""GPU monitor timelines of the scaling runs (SM activity, power, PCIe) against the health thresholds.

Per run, the median over its GPUs at each sample time is drawn, with the range over GPUs shaded.
The top panel shows SM activity from NVML GPM (`sm_active_pct`, solid: the share of SMs busy) and
NVML's utilization (`kernel_active_pct`, dashed: the share of time any kernel ran, which reads
~100 % on a GPU with few SMs busy). Power is drawn as a fraction of each GPU's enforced power limit.
Where a run's summary.json gives its measurement window, the samples outside it are drawn faint:
the thresholds apply to the window (scalestudy.analysis.monitor_window). With no GPU samples at all (a
CPU run: gpu_monitor.csv has its header only) the figure says so, with the reason from
gpu_monitor.json, instead of drawing empty axes.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import pandas as pd
from matplotlib.lines import Line2D

from scalestudy.analysis import monitor_window
from scalestudy.plots import style

OUTSIDE_WINDOW_ALPHA = 0.3


def select(paths: Sequence) -> list[str]:
    """The strong-scaling repeat-0 runs (one per world size) if there are any, else every repeat 0."""
    paths = [str(p) for p in paths]
    chosen = [p for p in paths if "/strong/" in p and "_r0/" in p] or [p for p in paths if "_r0/" in p]
    return chosen or paths


# (columns drawn with their line styles, y label, threshold key, threshold text, y scale)
PANELS = (
    (
        (("sm_active_pct", "-"), ("kernel_active_pct", "--")),
        "Active (%)",
        "sm_active_pct_min",
        "SM \u2265 {:g} %",
        1.0,
    ),
    ((("power_fraction", "-"),), "Power / limit (%)", "power_fraction_min", "\u2265 {:.0%}", 100.0),
    ((("pcie_gb_s", "-"),), "PCIe rx+tx (GB/s)", "pcie_gb_s_max", "\u2264 {:g}", 1.0),
)


def short_label(run: str) -> str:
    """'scaling/strong/w8_r0' -> 'strong, 8 GPUs'; 'scaling/strong/fsdp-w8_r0' -> 'strong FSDP, 8 GPUs'."""
    match = re.search(r"(strong|weak)/(?:([a-z]+)-)?w(\d+)_r(\d+)", run)
    if not match:
        return run
    mode, parallelism, world, repeat = match.groups()
    series = f"{mode} {parallelism.upper()}" if parallelism else mode
    return f"{series}, {style.count(int(world))}" + (f" (r{repeat})" if repeat != "0" else "")


def _draw(ax, run_samples: pd.DataFrame, column: str, linestyle: str, colour, scale: float, label) -> None:
    values = run_samples.dropna(subset=[column])
    if values.empty:
        return
    for inside, alpha, name in ((False, OUTSIDE_WINDOW_ALPHA, None), (True, 1.0, label)):
        part = values.assign(value=values[column] * scale)
        if inside:  # the faint line runs under the whole timeline, the full one over the window only
            part.loc[~part["in_window"], "value"] = float("nan")
        per_time = part.groupby("time_s")["value"].agg(["median", "min", "max"])
        ax.plot(
            per_time.index,
            per_time["median"],
            color=colour,
            linestyle=linestyle,
            linewidth=0.9,
            alpha=alpha,
            label=name,
        )
        if linestyle == "-":
            ax.fill_between(
                per_time.index,
                per_time["min"],
                per_time["max"],
                color=colour,
                alpha=0.15 * alpha,
                linewidth=0,
            )


def timelines(
    samples: pd.DataFrame, png, pdf=None, thresholds: dict | None = None, reasons: Sequence[str] = ()
) -> None:
    if samples.empty:
        fig, axes = style.new_figure(aspect=0.45)
        why = "; ".join(reasons) if reasons else "no monitor files were given"
        style.placeholder_note(axes[0, 0], f"No GPU monitor data: these runs had no GPU.\nReason: {why}")
        style.save_figure(fig, png, pdf)
        return
    runs = sorted(samples["run"].unique(), key=lambda r: (monitor_window.world_of(r), r))
    colours = dict(zip(runs, style.series_colours(len(runs)), strict=True))
    fig, axes = style.new_figure(aspect=1.1, nrows=len(PANELS))
    for ax, (columns, label, key, text, scale) in zip(axes[:, 0], PANELS, strict=True):
        for run in runs:
            run_samples = samples[samples["run"] == run]
            for column, linestyle in columns:
                name = short_label(run) if column == columns[0][0] else None
                _draw(ax, run_samples, column, linestyle, colours[run], scale, name)
        if thresholds and thresholds.get(key) is not None:
            value = thresholds[key]
            style.threshold(ax, value * scale, text.format(value), where="margin")
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
    if samples["sm_active_pct"].isna().all():
        axes[0, 0].text(
            0.02, 0.04, "SM activity not measured (no NVML GPM)", transform=axes[0, 0].transAxes, fontsize=6
        )
    axes[0, 0].set_ylim(0, 105)
    axes[1, 0].set_ylim(0, 105)
    axes[-1, 0].set_xlabel("Time since run start (s)")
    _legend(fig, axes[0, 0], windowed=bool(samples["windowed"].any()))
    style.save_figure(fig, png, pdf)


def _legend(fig, ax, windowed: bool) -> None:
    handles, labels = ax.get_legend_handles_labels()
    extra = [
        (Line2D([], [], color="0.3", linestyle="-"), "SM active (GPM)"),
        (Line2D([], [], color="0.3", linestyle="--"), "kernel active (NVML util.)"),
        (Line2D([], [], **style.THRESHOLD_STYLE), "health threshold"),
    ]
    if windowed:
        extra.append(
            (Line2D([], [], color="0.3", alpha=OUTSIDE_WINDOW_ALPHA), "outside the measurement window")
        )
    for handle, label in extra:
        handles.append(handle)
        labels.append(label)
    fig.legend(handles, labels, loc="outside upper center", ncols=3, fontsize=6)
