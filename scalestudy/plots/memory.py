"""Memory per rank against the world size (scaling.csv), one line per (mode, parallelism): the peak
memory of the busiest rank (left: CUDA's peak allocation on a GPU, the peak RSS on a CPU, whose
libraries dominate it) and the bytes of parameters, gradients and optimizer state one rank holds
(right: what FSDP shards and DDP replicates). Medians over repeats; a table without the columns (runs
recorded before memory was) says so on the figure."""

from __future__ import annotations

import pandas as pd

from scalestudy.plots import style
from scalestudy.plots.scaling import series, series_line

MIB = 1 << 20
PANELS = (
    ("peak_memory_bytes", "Peak memory per {word} (MiB)"),
    ("model_state_bytes_per_rank", "Model state per {word} (MiB)"),
)
PEAK_SOURCES = {
    "cuda_max_memory_allocated": "peak allocated (CUDA)",
    "cpu_peak_rss": "peak RSS (CPU)",
}


def _source(scaling: pd.DataFrame) -> str:
    if "peak_memory_source" not in scaling:
        return ""
    sources = sorted({str(s) for s in scaling["peak_memory_source"].dropna()})
    return ", ".join(PEAK_SOURCES.get(s, s) for s in sources)


def memory(scaling: pd.DataFrame, png, pdf=None) -> None:
    fig, axes = style.new_figure(wide=True, aspect=0.34, ncols=len(PANELS))
    for ax, (column, label) in zip(axes[0], PANELS, strict=True):
        values = pd.to_numeric(scaling[column], errors="coerce") if column in scaling else None
        if values is None or values.dropna().empty:
            style.placeholder_note(ax, f"{column} not recorded by these runs.", width=40)
            continue
        frame = scaling.assign(**{column: values / MIB})
        for _, _, group, look in series(frame):
            group = group.dropna(subset=[column])
            series_line(ax, group["world_size"], group[column], look)
        style.world_axis(ax, scaling["world_size"])
        ax.set_ylabel(label.format(word=style.UNIT["word"]))
        ax.set_ylim(bottom=0)
        ax.legend(loc="best")
    source = _source(scaling)
    axes[0, 0].set_title(f"Peak memory: {source}" if source else "Peak memory")
    axes[0, -1].set_title("Parameters + gradients + optimizer state")
    style.save_figure(fig, png, pdf)
