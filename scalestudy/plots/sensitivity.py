"""Sensitivity heatmaps: per-GPU throughput over bucket size x per-GPU batch, one panel per precision.

A cell whose run did not fill its measurement window (sensitivity.csv's window_filled false: its
throughput is the whole run's) is hatched, with a legend entry "window not filled".
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.patches import Patch, Rectangle

from scalestudy.analysis.metrics import window_filled
from scalestudy.plots import style

PRECISION_ORDER = ("fp32", "fp16", "bf16")
UNFILLED_LABEL = "window not filled"
UNFILLED_STYLE = {"fill": False, "hatch": "////", "edgecolor": "0.85", "linewidth": 0}


def _grid(frame: pd.DataFrame, batches, buckets) -> np.ndarray:
    table = frame.pivot_table(index="per_gpu_batch", columns="bucket_cap_mb", values="images_per_s_per_gpu")
    return table.reindex(index=batches, columns=buckets).to_numpy(float)


def _hatch_unfilled(ax, frame: pd.DataFrame, batches, buckets) -> bool:
    """Hatch the cells of runs without a filled window; True if there was one."""
    unfilled = frame[~window_filled(frame)]
    for _, r in unfilled.iterrows():
        i, j = batches.index(r["per_gpu_batch"]), buckets.index(r["bucket_cap_mb"])
        ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, **UNFILLED_STYLE))
    return not unfilled.empty


def _annotate(ax, values: np.ndarray, norm) -> None:
    for (i, j), value in np.ndenumerate(values):
        if np.isfinite(value):
            dark = norm(value) < 0.55
            ax.text(
                j,
                i,
                style.compact_number(float(f"{value:.3g}")),  # 3 significant digits
                ha="center",
                va="center",
                fontsize=6,
                color="white" if dark else "black",
            )
        else:
            ax.text(j, i, "missing", ha="center", va="center", fontsize=5, color="0.4")


def heatmaps(sensitivity: pd.DataFrame, png, pdf=None) -> None:
    """Images/s per GPU; the best point of the whole sweep is outlined."""
    precisions = [p for p in PRECISION_ORDER if p in set(sensitivity["precision"])] or sorted(
        sensitivity["precision"].unique()
    )
    batches = sorted(sensitivity["per_gpu_batch"].unique())
    buckets = sorted(sensitivity["bucket_cap_mb"].unique())
    fig, axes = style.new_figure(wide=True, aspect=0.34, ncols=max(len(precisions), 1))
    if sensitivity.empty:
        style.placeholder_note(axes[0, 0], "No sensitivity runs.")
        style.save_figure(fig, png, pdf)
        return
    vmin, vmax = sensitivity["images_per_s_per_gpu"].min(), sensitivity["images_per_s_per_gpu"].max()
    filled = sensitivity[window_filled(sensitivity)]
    judged = filled if len(filled) else sensitivity  # the best point is one with a filled window
    best = judged.loc[judged["images_per_s_per_gpu"].idxmax()]
    image, any_unfilled = None, False
    for ax, precision in zip(axes[0], precisions, strict=True):
        frame = sensitivity[sensitivity["precision"] == precision]
        values = _grid(frame, batches, buckets)
        image = ax.imshow(values, cmap="viridis", vmin=vmin, vmax=vmax, aspect="auto", origin="lower")
        _annotate(ax, values, image.norm)
        any_unfilled |= _hatch_unfilled(ax, frame, batches, buckets)
        ax.set_xticks(range(len(buckets)), [f"{b:g}" for b in buckets])
        ax.set_yticks(range(len(batches)), [str(int(b)) for b in batches])
        ax.set_xlabel("DDP bucket size (MB)")
        ax.set_title(precision)
        ax.grid(False)
        if best["precision"] == precision:
            i, j = batches.index(best["per_gpu_batch"]), buckets.index(best["bucket_cap_mb"])
            ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="#D55E00", linewidth=2))
    axes[0, 0].set_ylabel(f"Per-{style.UNIT['word']} batch")
    world = int(sensitivity["world_size"].iloc[0])
    fig.colorbar(
        image, ax=list(axes[0]), label=f"Images/s per {style.UNIT['word']} ({style.count(world)})", shrink=0.9
    )
    if any_unfilled:
        handle = Patch(**{**UNFILLED_STYLE, "edgecolor": "0.3", "linewidth": 0.5}, label=UNFILLED_LABEL)
        fig.legend(handles=[handle], loc="outside lower right", fontsize=6, frameon=False)
    style.save_figure(fig, png, pdf)
