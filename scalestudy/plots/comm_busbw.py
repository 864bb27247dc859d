"""The collective benchmark: bus bandwidth against message size, a line per world size (one panel
per collective), with the DDP gradient bucket sizes of the sensitivity sweep marked."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from scalestudy.plan.runfiles import NOT_MEASURED
from scalestudy.plots import style

MIB = 1 << 20
SIZE_TICKS = [8 * 32**k for k in range(7)]
PLACEMENT_LINES = {"intra-node": "-", "inter-node": "--"}


def size_label(nbytes: float, _pos=None) -> str:
    """8 -> '8 B', 4096 -> '4 KiB', 268435456 -> '256 MiB' (binary units, as nccl-tests sizes)."""
    for unit, size in (("GiB", 1 << 30), ("MiB", MIB), ("KiB", 1 << 10)):
        if nbytes >= size:
            return f"{nbytes / size:g} {unit}"
    return f"{nbytes:g} B"


def busbw_figure(busbw: pd.DataFrame, png, pdf=None, bucket_mb: Sequence[float] = ()) -> None:
    collectives = list(dict.fromkeys(busbw["collective"])) if len(busbw) else ["all_reduce"]
    fig, axes = style.new_figure(wide=True, aspect=0.32, ncols=len(collectives))
    worlds = sorted(busbw["world_size"].unique()) if len(busbw) else []
    colours = dict(zip(worlds, style.series_colours(len(worlds)), strict=True))
    for ax, collective in zip(axes[0], collectives, strict=True):
        rows = busbw[(busbw["collective"] == collective) & busbw["time_s"].notna()] if len(busbw) else busbw
        if rows.empty:
            notes = busbw.loc[busbw["collective"] == collective, "note"] if len(busbw) else []
            style.placeholder_note(ax, next((str(n) for n in notes if str(n)), NOT_MEASURED), width=40)
            ax.set_title(collective.replace("_", "-"))
            continue
        _panel(ax, rows, colours, bucket_mb)
        ax.set_title(collective.replace("_", "-"))
    axes[0, 0].set_ylabel("Bus bandwidth (GB/s)")
    legend = {}
    for ax in axes[0]:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            legend.setdefault(label, handle)
    if legend:
        fig.legend(legend.values(), legend.keys(), loc="outside lower center", ncols=min(len(legend), 4))
    style.save_figure(fig, png, pdf)


def _panel(ax, rows: pd.DataFrame, colours: dict, bucket_mb: Sequence[float]) -> None:
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    for (world, placement), group in rows.groupby(["world_size", "placement"], sort=True):
        group = group.sort_values("bytes")
        ax.plot(
            group["bytes"],
            group["busbw_gb_s"],
            color=colours[world],
            linestyle=PLACEMENT_LINES.get(placement, ":"),
            marker="o",
            markersize=style.MARKER_SIZE - 1.5,
            linewidth=1.0,
            label=f"{style.count(int(world))}, {placement}",
        )
    for index, bucket in enumerate(bucket_mb):
        ax.axvline(
            bucket * MIB, **style.THRESHOLD_STYLE, label="DDP bucket sizes (sweep)" if index == 0 else None
        )
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(SIZE_TICKS))  # 8 B .. 256 MiB, every 32x: labels fit
    ax.xaxis.set_major_formatter(FuncFormatter(size_label))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_yscale("log")
    ax.set_xlabel("Message size")
