"""Test-accuracy curves of the scaling runs: 1 vs N GPUs, one panel per scaling mode."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from scalestudy.analysis.tableio import read_csv
from scalestudy.plots import style

# results/runs/scaling/{mode}/w{world}_r{repeat}/metrics.csv (docs/architecture.md)
RUN_PATH = re.compile(r"scaling/(?P<mode>strong|weak)/w(?P<world>\d+)_r(?P<repeat>\d+)/[^/]+$")


def load_curves(paths: Sequence[str | Path]) -> pd.DataFrame:
    """All epochs of all scaling runs, with mode, world and repeat from each run folder's name."""
    frames = []
    for path in paths:
        match = RUN_PATH.search(Path(path).as_posix())
        if not match:
            raise ValueError(
                f"{path}: not a scaling run's file (expected .../scaling/<mode>/w<N>_r<R>/metrics.csv)"
            )
        frame = read_csv(path, ["epoch", "test_acc"])
        frames.append(
            frame.assign(mode=match["mode"], world=int(match["world"]), repeat=int(match["repeat"]))
        )
    if not frames:
        return pd.DataFrame(columns=["epoch", "test_acc", "mode", "world", "repeat"])
    return pd.concat(frames, ignore_index=True)


def accuracy(curves: pd.DataFrame, png, pdf=None, target: float | None = None) -> None:
    """Mean test accuracy over repeats per epoch (band: min to max over repeats)."""
    modes = sorted(curves["mode"].unique()) or ["strong"]
    fig, axes = style.new_figure(wide=True, aspect=0.32, ncols=len(modes))
    worlds = sorted(curves["world"].unique())
    colours = dict(zip(worlds, style.series_colours(len(worlds)), strict=True))
    for ax, mode in zip(axes[0], modes, strict=True):
        subset = curves[curves["mode"] == mode]
        if subset.empty:
            style.placeholder_note(ax, "No scaling runs.")
            continue
        for world, group in subset.groupby("world"):
            stats = group.groupby("epoch")["test_acc"].agg(["mean", "min", "max"])
            epochs = stats.index  # metrics.csv counts epochs from 1
            ax.plot(
                epochs,
                stats["mean"],
                marker="o",
                markersize=2.5,
                color=colours[world],
                label=style.count(world),
            )
            if group["repeat"].nunique() > 1:
                ax.fill_between(
                    epochs, stats["min"], stats["max"], color=colours[world], alpha=0.15, linewidth=0
                )
        if target is not None:
            style.threshold(ax, target, f"target {target:.0%}")
        ax.set_title(style.mode_style(mode)["label"])
        ax.set_xlabel("Epoch")
        style.integer_axis(ax)
        ax.set_ylim(0.0, 1.0)
        style.percent_axis(ax)
        ax.legend(loc="best", ncols=2)
    axes[0, 0].set_ylabel("Test accuracy")
    style.save_figure(fig, png, pdf)
