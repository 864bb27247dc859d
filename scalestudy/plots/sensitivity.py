"""Sensitivity heatmaps: per-GPU throughput (the table's unit) over two axes of the sweep, one panel
per combination of the others.

The sweep's axes are run-config keys (config sensitivity.axes, default precision, per_gpu_batch,
bucket_cap_mb; sensitivity.csv has a column for each). The heatmap's rows and columns are the last
two axes unless `rows`/`cols` name others; the remaining axes are faceted, so the default is the
per-GPU batch x DDP bucket size, one panel per precision. A cell whose run did not fill its
measurement window (window_filled false: its throughput is the whole run's) is hatched, with a legend
entry "window not filled"; a cell whose run was contended (a foreign process on its GPUs while it
measured) is cross-hatched, with a legend entry "GPU shared (contended)"; a cell whose compiled step
ran without the CUDA graphs it should have replayed (cuda_graphs_skipped) is dotted, with a legend
entry "CUDA graphs skipped"; the best point of the whole sweep, among the cells with a filled,
unshared window, is outlined.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence

import numpy as np
import pandas as pd
from matplotlib.patches import Patch, Rectangle

from scalestudy.analysis import graphs
from scalestudy.analysis.contention import contended
from scalestudy.analysis.metrics import DEFAULT_AXES, PRECISION_ORDER, window_filled
from scalestudy.plots import style

UNFILLED_LABEL = "window not filled"
UNFILLED_STYLE = {"fill": False, "hatch": "////", "edgecolor": "0.85", "linewidth": 0}
CONTENDED_LABEL = "GPU shared (contended)"
CONTENDED_STYLE = {"fill": False, "hatch": "xxx", "edgecolor": "#D55E00", "linewidth": 1.2}
GRAPHS_SKIPPED_LABEL = "CUDA graphs skipped"
GRAPHS_SKIPPED_STYLE = {"fill": False, "hatch": "..", "edgecolor": "#CC79A7", "linewidth": 1.2}
AXIS_LABELS = {
    "bucket_cap_mb": "DDP bucket size (MB)",
    "per_gpu_batch": "Per-{word} batch",
    "precision": "Precision",
    "comm_hook": "DDP communication hook",
    "parallelism": "Parallelism",
}
VALUE = "images_per_s_per_gpu"
PANELS_PER_ROW = 4


def axis_label(key: str) -> str:
    return AXIS_LABELS.get(key, key).format(word=style.UNIT["word"])


def choose_axes(
    axes: Sequence[str], rows: str | None = None, cols: str | None = None
) -> tuple[str | None, str, list[str]]:
    """(rows, columns, faceted axes): the last two axes by default; ValueError naming a bad choice."""
    axes = list(axes)
    if not axes:
        raise ValueError("sensitivity: no axes")
    for name, choice in (("--rows", rows), ("--cols", cols)):
        if choice is not None and choice not in axes:
            raise ValueError(f"sensitivity {name} {choice!r}: not an axis of the sweep ({', '.join(axes)})")
    if rows is not None and rows == cols:
        raise ValueError(f"sensitivity --rows and --cols are both {rows!r}")
    cols = cols or next(a for a in reversed(axes) if a != rows)
    rows = rows or next((a for a in reversed(axes) if a != cols), None)
    return rows, cols, [a for a in axes if a not in (rows, cols)]


def ordered(values: pd.Series, key: str) -> list:
    """The distinct values of an axis: precisions in PRECISION_ORDER (then any other), else sorted."""
    distinct = list(pd.unique(values.dropna()))
    if key == "precision":
        known = [p for p in PRECISION_ORDER if p in distinct]
        return known + sorted(v for v in distinct if v not in known)
    return sorted(distinct)


def tick(value) -> str:
    if isinstance(value, int | float | np.integer | np.floating):
        return str(int(value)) if float(value).is_integer() else f"{value:g}"
    return str(value)


def facet_title(keys: Sequence[str], values: Sequence) -> str:
    """'fp32' for the precision alone (today's look), else 'key=value', one line per faceted axis."""
    return "\n".join(
        tick(v) if k == "precision" else f"{k}={tick(v)}" for k, v in zip(keys, values, strict=True)
    )


def _grid(frame: pd.DataFrame, rows: str | None, cols: str, row_values, col_values) -> np.ndarray:
    if rows is None:
        frame = frame.assign(_row=0)
        rows, row_values = "_row", [0]
    table = frame.pivot_table(index=rows, columns=cols, values=VALUE, aggfunc="mean")
    return table.reindex(index=row_values, columns=col_values).to_numpy(float)


def _cell(r: pd.Series, rows, cols, row_values, col_values) -> tuple[int, int]:
    return (row_values.index(r[rows]) if rows else 0), col_values.index(r[cols])


def _hatch(ax, cells: pd.DataFrame, place, look: dict) -> bool:
    """Hatch `cells` in `look`; True if there was one."""
    for _, r in cells.iterrows():
        i, j = place(r)
        ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, **look))
    return not cells.empty


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


def _facets(sensitivity: pd.DataFrame, facets: list[str]) -> list[tuple]:
    return list(itertools.product(*(ordered(sensitivity[key], key) for key in facets)))


def _in_facet(frame: pd.DataFrame, facets: list[str], values: tuple) -> pd.DataFrame:
    mask = pd.Series(True, index=frame.index)
    for key, value in zip(facets, values, strict=True):
        mask &= frame[key] == value
    return frame[mask]


def heatmaps(
    sensitivity: pd.DataFrame,
    png,
    pdf=None,
    axes: Sequence[str] = DEFAULT_AXES,
    rows: str | None = None,
    cols: str | None = None,
) -> None:
    """Throughput per GPU in the table's unit; the best point of the whole sweep is outlined."""
    rows, cols, facets = choose_axes(axes, rows, cols)
    combos = _facets(sensitivity, facets) or [()]
    ncols = min(len(combos), PANELS_PER_ROW)
    nrows = math.ceil(len(combos) / ncols)
    fig, grid = style.new_figure(wide=True, aspect=0.34 * nrows, ncols=ncols, nrows=nrows)
    panels = list(grid.flat)
    if sensitivity.empty:
        style.placeholder_note(panels[0], "No sensitivity runs.")
        style.save_figure(fig, png, pdf)
        return
    row_values = ordered(sensitivity[rows], rows) if rows else [0]
    col_values = ordered(sensitivity[cols], cols)
    vmin, vmax = sensitivity[VALUE].min(), sensitivity[VALUE].max()
    filled = sensitivity[window_filled(sensitivity) & ~contended(sensitivity)]
    judged = filled if len(filled) else sensitivity  # the best point: a filled window, GPUs not shared
    best = judged.loc[judged[VALUE].idxmax()]
    place = functools.partial(_cell, rows=rows, cols=cols, row_values=row_values, col_values=col_values)
    image, any_unfilled, any_shared, any_lost = None, False, False, False
    for index, (ax, combo) in enumerate(zip(panels, combos, strict=False)):
        frame = _in_facet(sensitivity, facets, combo)
        values = _grid(frame, rows, cols, row_values, col_values)
        image = ax.imshow(values, cmap="viridis", vmin=vmin, vmax=vmax, aspect="auto", origin="lower")
        _annotate(ax, values, image.norm)
        any_unfilled |= _hatch(ax, frame[~window_filled(frame)], place, UNFILLED_STYLE)
        any_shared |= _hatch(ax, frame[contended(frame)], place, CONTENDED_STYLE)
        any_lost |= _hatch(ax, frame[graphs.flags(frame, graphs.COLUMN)], place, GRAPHS_SKIPPED_STYLE)
        ax.set_xticks(range(len(col_values)), [tick(v) for v in col_values])
        ax.set_yticks(range(len(row_values)), [tick(v) for v in row_values] if rows else [""])
        ax.set_xlabel(axis_label(cols))
        if rows and index % ncols == 0:
            ax.set_ylabel(axis_label(rows))
        title = facet_title(facets, combo)
        ax.set_title(title, fontsize=6 if max(map(len, title.split("\n"))) > 18 else None)
        ax.grid(False)
        if all(best[key] == value for key, value in zip(facets, combo, strict=True)):
            i, j = place(best)
            ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="#D55E00", linewidth=2))
    for ax in panels[len(combos) :]:
        ax.set_visible(False)
    world = int(sensitivity["world_size"].iloc[0])
    label = f"{style.rate_label(style.sample_unit(sensitivity))} ({style.count(world)})"
    fig.colorbar(image, ax=panels[: len(combos)], label=label, shrink=0.9)
    handles = []
    if any_unfilled:
        handles.append(
            Patch(**{**UNFILLED_STYLE, "edgecolor": "0.3", "linewidth": 0.5}, label=UNFILLED_LABEL)
        )
    if any_shared:
        handles.append(Patch(**CONTENDED_STYLE, label=CONTENDED_LABEL))
    if any_lost:
        handles.append(Patch(**GRAPHS_SKIPPED_STYLE, label=GRAPHS_SKIPPED_LABEL))
    if handles:
        fig.legend(handles=handles, loc="outside lower right", fontsize=6, frameon=False)
    style.save_figure(fig, png, pdf)
