"""GPU monitor timelines (SM %, power, PCIe) of the scaling runs, against the health thresholds.

Per run, the median over its GPUs at each sample time is drawn, with the range over GPUs shaded. With
no GPU samples at all (a CPU run: gpu_monitor.csv has its header only) the figure says so, with the
reason from gpu_monitor.json, instead of drawing empty axes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
from matplotlib.lines import Line2D

from scalestudy.analysis.tableio import read_csv
from scalestudy.plots import style

REQUIRED = ("time_s", "host", "gpu_index", "sm_util_pct", "power_w", "pcie_rx_mb_s", "pcie_tx_mb_s")
RUN_NAME = re.compile(r"runs/(?P<name>.+)/gpu_monitor\.csv$")


def run_label(path: str | Path) -> str:
    match = RUN_NAME.search(Path(path).as_posix())
    return match["name"] if match else Path(path).parent.name


def select(paths: Sequence[str | Path]) -> list[str]:
    """The strong-scaling repeat-0 runs (one per world size) if there are any, else every repeat 0."""
    paths = [str(p) for p in paths]
    chosen = [p for p in paths if "/strong/" in p and "_r0/" in p] or [p for p in paths if "_r0/" in p]
    return chosen or paths


def load(paths: Sequence[str | Path]) -> tuple[pd.DataFrame, list[str]]:
    """Samples of every file (with a `run` column), and the reasons files gave for having none."""
    frames, reasons = [], []
    for path in paths:
        frame = read_csv(path, REQUIRED)
        if frame.empty:
            reasons.append(_no_gpu_reason(Path(path)))
            continue
        frame["pcie_gb_s"] = (frame["pcie_rx_mb_s"] + frame["pcie_tx_mb_s"]) / 1000.0
        frames.append(frame.assign(run=run_label(path)))
    samples = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    return samples, sorted(set(reasons))


def _no_gpu_reason(csv_path: Path) -> str:
    note = csv_path.with_suffix(".json")
    try:
        return str(json.loads(note.read_text()).get("reason") or "no reason given")
    except (OSError, ValueError):
        return "no samples and no gpu_monitor.json"


PANELS = (
    ("sm_util_pct", "SM util. (%)", "sm_util_pct_min", "\u2265 {:g}"),
    ("power_w", "Power (W)", "power_w_min", "\u2265 {:g}"),
    ("pcie_gb_s", "PCIe rx+tx (GB/s)", "pcie_gb_s_max", "\u2264 {:g}"),
)


def short_label(run: str) -> str:
    """'scaling/strong/w8_r0' -> 'strong, 8 GPUs'."""
    match = re.search(r"(strong|weak)/w(\d+)_r(\d+)", run)
    if not match:
        return run
    mode, world, repeat = match.groups()
    return f"{mode}, {style.count(int(world))}" + (f" (r{repeat})" if repeat != "0" else "")


def _world_of(run: str) -> int:
    match = re.search(r"w(\d+)", run)
    return int(match.group(1)) if match else 0


def timelines(
    samples: pd.DataFrame, png, pdf=None, thresholds: dict | None = None, reasons: Sequence[str] = ()
) -> None:
    if samples.empty:
        fig, axes = style.new_figure(aspect=0.45)
        why = "; ".join(reasons) if reasons else "no monitor files were given"
        style.placeholder_note(axes[0, 0], f"No GPU monitor data: these runs had no GPU.\nReason: {why}")
        style.save_figure(fig, png, pdf)
        return
    runs = sorted(samples["run"].unique(), key=lambda r: (_world_of(r), r))
    colours = dict(zip(runs, style.series_colours(len(runs)), strict=True))
    fig, axes = style.new_figure(aspect=1.1, nrows=len(PANELS))
    for ax, (column, label, key, text) in zip(axes[:, 0], PANELS, strict=True):
        for run in runs:
            per_time = samples[samples["run"] == run].groupby("time_s")[column].agg(["median", "min", "max"])
            ax.plot(
                per_time.index, per_time["median"], color=colours[run], linewidth=0.9, label=short_label(run)
            )
            ax.fill_between(
                per_time.index, per_time["min"], per_time["max"], color=colours[run], alpha=0.15, linewidth=0
            )
        if thresholds:
            style.threshold(ax, thresholds[key], text.format(thresholds[key]), where="margin")
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
    axes[0, 0].set_ylim(0, 105)
    axes[-1, 0].set_xlabel("Time since run start (s)")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    handles.append(Line2D([], [], **style.THRESHOLD_STYLE))
    labels.append("health threshold")
    fig.legend(handles, labels, loc="outside upper center", ncols=3, fontsize=6)
    style.save_figure(fig, png, pdf)
