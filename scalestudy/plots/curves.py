"""The quality curves of the scaling runs (figure `accuracy`, file accuracy.png): 1 vs N GPUs, one
panel per scaling mode (and parallelism, where the study has more than one).

The workload's metric chooses what is drawn: `accuracy` (the ResNet) the test accuracy per epoch,
with the target; `perplexity` (the LM) or `none` (a user's script) the train (dashed) and test
(solid) loss per epoch, and for perplexity exp(loss) on the right axis.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from scalestudy.analysis.series import DDP
from scalestudy.analysis.tableio import read_csv
from scalestudy.plots import style

# results/runs/scaling/{mode}/[fsdp-]w{world}_r{repeat}/metrics.csv (docs/reference/files.md)
RUN_PATH = re.compile(
    r"scaling/(?P<mode>strong|weak)/(?:(?P<parallelism>[a-z]+)-)?w(?P<world>\d+)_r(?P<repeat>\d+)/[^/]+$"
)
CURVE_COLUMNS = ["epoch", "test_acc", "train_loss", "test_loss", "mode", "parallelism", "world", "repeat"]
METRICS = ("accuracy", "perplexity", "none")


def load_curves(paths: Sequence[str | Path]) -> pd.DataFrame:
    """All epochs of all scaling runs, with mode, parallelism, world and repeat from each run folder's
    name (a point without a parallelism prefix is DDP)."""
    frames = []
    for path in paths:
        match = RUN_PATH.search(Path(path).as_posix())
        if not match:
            raise ValueError(
                f"{path}: not a scaling run's file (expected .../scaling/<mode>/[fsdp-]w<N>_r<R>/metrics.csv)"
            )
        frame = read_csv(path, ["epoch", "test_acc"])
        for column in ("train_loss", "test_loss"):
            if column not in frame:
                frame[column] = np.nan
        frames.append(
            frame.assign(
                mode=match["mode"],
                parallelism=match["parallelism"] or DDP,
                world=int(match["world"]),
                repeat=int(match["repeat"]),
            )
        )
    if not frames:
        return pd.DataFrame(columns=CURVE_COLUMNS)
    return pd.concat(frames, ignore_index=True)


def _panels(curves: pd.DataFrame) -> list[tuple[str, str]]:
    keys = sorted(set(zip(curves["mode"], curves["parallelism"], strict=True)))
    return keys or [("strong", DDP)]


def _title(mode: str, parallelism: str, named: bool) -> str:
    return style.series_style(mode, parallelism, named)["label"]


def _draw(ax, group: pd.DataFrame, column: str, colour, label, linestyle="-") -> None:
    """Mean over repeats per epoch (metrics.csv counts from 1), band: min to max over repeats."""
    stats = group.groupby("epoch")[column].agg(["mean", "min", "max"])
    ax.plot(
        stats.index,
        stats["mean"],
        marker="o",
        markersize=2.5,
        color=colour,
        linestyle=linestyle,
        label=label,
    )
    if group["repeat"].nunique() > 1:
        ax.fill_between(stats.index, stats["min"], stats["max"], color=colour, alpha=0.15, linewidth=0)


def quality(curves: pd.DataFrame, png, pdf=None, metric: str = "accuracy", target: float | None = None):
    """The workload's quality curves: test accuracy (metric accuracy) or the losses (else)."""
    if metric not in METRICS:
        raise ValueError(f"--metric {metric!r}: one of {', '.join(METRICS)}")
    if metric == "accuracy":
        return accuracy(curves, png, pdf, target)
    return losses(curves, png, pdf, perplexity=metric == "perplexity")


PANELS_PER_ROW = 2


def _figure(curves: pd.DataFrame):
    """Panels two to a row (mode x parallelism); axes left over are hidden."""
    panels = _panels(curves)
    ncols = min(PANELS_PER_ROW, len(panels))
    nrows = -(-len(panels) // ncols)
    fig, axes = style.new_figure(wide=True, aspect=0.32 * nrows, ncols=ncols, nrows=nrows)
    for ax in axes.flat[len(panels) :]:
        ax.set_visible(False)
    worlds = sorted(curves["world"].unique())
    colours = dict(zip(worlds, style.series_colours(len(worlds)), strict=True))
    named = curves["parallelism"].nunique() > 1
    return fig, axes, list(zip(axes.flat, panels, strict=False)), colours, named


def _filled_panels(curves: pd.DataFrame, panels, named: bool):
    """(axes, the panel's runs, its title) for each panel with runs; the others say they have none."""
    for ax, (mode, parallelism) in panels:
        subset = curves[(curves["mode"] == mode) & (curves["parallelism"] == parallelism)]
        if subset.empty:
            style.placeholder_note(ax, "No scaling runs.")
            continue
        yield ax, subset, _title(mode, parallelism, named)


def accuracy(curves: pd.DataFrame, png, pdf=None, target: float | None = None) -> None:
    """Mean test accuracy over repeats per epoch (band: min to max over repeats)."""
    fig, axes, panels, colours, named = _figure(curves)
    for ax, subset, title in _filled_panels(curves, panels, named):
        for world, group in subset.groupby("world"):
            _draw(ax, group, "test_acc", colours[world], style.count(world))
        if target is not None:
            style.threshold(ax, target, f"target {target:.0%}")
        ax.set_title(title)
        ax.set_xlabel("Epoch")
        style.integer_axis(ax)
        ax.set_ylim(0.0, 1.0)
        style.percent_axis(ax)
        ax.legend(loc="best", ncols=2)
    axes[0, 0].set_ylabel("Test accuracy")
    style.save_figure(fig, png, pdf)


def losses(curves: pd.DataFrame, png, pdf=None, perplexity: bool = False) -> None:
    """Train (dashed) and test (solid) loss per epoch, mean over repeats; perplexity = exp(test
    loss) on the right axis where the workload reports it."""
    fig, axes, panels, colours, named = _figure(curves)
    for ax, subset, title in _filled_panels(curves, panels, named):
        for world, group in subset.groupby("world"):
            _draw(ax, group, "test_loss", colours[world], f"{style.count(world)}, test")
            _draw(ax, group, "train_loss", colours[world], f"{style.count(world)}, train", linestyle="--")
        ax.set_title(title)
        ax.set_xlabel("Epoch")
        style.integer_axis(ax)
        if perplexity:
            right = ax.secondary_yaxis("right", functions=(np.exp, _log))
            if ax.get_subplotspec().is_last_col():
                right.set_ylabel("Perplexity (exp loss)")
    panels[0][0].legend(loc="best", ncols=2, fontsize=6)  # the same lines in every panel
    for row in axes:
        row[0].set_ylabel("Loss (nats per token)" if perplexity else "Loss")
    style.save_figure(fig, png, pdf)


def _log(values):
    return np.log(np.clip(values, 1e-12, None))
