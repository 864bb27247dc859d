"""One look for every figure: sized for a two-column paper, saved as PNG (report) and PDF (paper)."""

from __future__ import annotations

import math
import os
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from scalestudy.analysis.series import DDP  # noqa: E402
from scalestudy.atomic import atomic_path  # noqa: E402

# Widths of a two-column paper (inches): one column, and the full text width.
COLUMN_WIDTH_IN = 3.4
TEXT_WIDTH_IN = 7.0
PNG_DPI = 200

RC = {
    "font.size": 8,
    "axes.titlesize": 8,
    "axes.labelsize": 8,
    "legend.fontsize": 7,
    "xtick.labelsize": 7,
    "ytick.labelsize": 7,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "figure.constrained_layout.use": True,
    "pdf.fonttype": 42,  # embed TrueType: journals reject Type 3 fonts
    "ps.fonttype": 42,
    "savefig.bbox": "tight",
}


def new_figure(wide: bool = False, aspect: float = 0.75, ncols: int = 1, nrows: int = 1):
    """A figure one column (or, `wide`, the full text) wide; `aspect` is height/width."""
    plt.rcParams.update(RC)
    width = TEXT_WIDTH_IN if wide else COLUMN_WIDTH_IN
    return plt.subplots(nrows, ncols, figsize=(width, width * aspect), squeeze=False)


def save_figure(fig, png_path: str | os.PathLike, pdf_path: str | os.PathLike | None = None) -> None:
    """Write the figure atomically as PNG and, when asked, as vector PDF; then close it."""
    try:
        with atomic_path(png_path, suffix=".png") as tmp:
            fig.savefig(tmp, dpi=PNG_DPI, format="png")
        if pdf_path is not None:
            with atomic_path(pdf_path, suffix=".pdf") as tmp:
                fig.savefig(tmp, format="pdf")
    finally:
        plt.close(fig)


def placeholder_note(ax, text: str, width: int = 50) -> None:
    """Say on the axes why there is nothing to draw, rather than drawing an empty frame.

    The text is wrapped at `width` characters per line (matplotlib's own wrapping ignores the box
    drawn around the text, which then runs off the figure).
    """
    wrapped = "\n".join(textwrap.fill(paragraph, width) for paragraph in text.split("\n"))
    ax.text(
        0.5,
        0.5,
        wrapped,
        ha="center",
        va="center",
        transform=ax.transAxes,
        fontsize=7,
        bbox={"boxstyle": "round,pad=0.6", "facecolor": "0.96", "edgecolor": "0.6"},
    )
    ax.set_xticks([])
    ax.set_yticks([])
    ax.grid(False)
    for spine in ax.spines.values():
        spine.set_visible(False)


def png_and_pdf(stem: str | os.PathLike) -> tuple[Path, Path]:
    stem = Path(stem)
    return stem.with_suffix(".png"), stem.with_suffix(".pdf")


# Okabe-Ito: distinguishable with the common colour-vision deficiencies and in greyscale by marker.
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000")
MODE_STYLE = {
    "strong": {"color": PALETTE[0], "marker": "o", "label": "strong scaling"},
    "weak": {"color": PALETTE[1], "marker": "s", "label": "weak scaling"},
}
IDEAL_STYLE = {"color": "0.45", "linestyle": "--", "linewidth": 0.9}
THRESHOLD_STYLE = {"color": "#B22222", "linestyle": ":", "linewidth": 1.0}
MARKER_SIZE = 4


def mode_style(mode: str) -> dict:
    return MODE_STYLE.get(mode, {"color": PALETTE[2], "marker": "^", "label": mode})


# A second parallelism (FSDP beside DDP) keeps its mode's colour, with its own marker and line.
PARALLELISM_STYLE = {"fsdp": {"marker": "D", "linestyle": "-."}}


def series_style(mode: str, parallelism: str = DDP, named: bool = False) -> dict:
    """The look of one (mode, parallelism) series; `named`: the label names the parallelism (the
    study has more than one), else it reads as the mode alone."""
    look = {**mode_style(mode), "linestyle": "-", **PARALLELISM_STYLE.get(parallelism, {})}
    if named:
        look["label"] = f"{look['label']}, {parallelism.upper()}"
    return look


DEFAULT_SAMPLE_UNIT = "images"


def sample_unit(frame) -> str:
    """What a table's throughput counts (its sample_unit column: images, tokens, ...); images where
    the table predates workloads."""
    if frame is not None and "sample_unit" in frame:
        values = frame["sample_unit"].dropna().astype(str)
        if len(values):
            return values.iloc[0]
    return DEFAULT_SAMPLE_UNIT


def rate_label(unit: str, per_rank: bool = True) -> str:
    """'Images/s per GPU' (or 'Tokens/s per rank'); per_rank False: 'images/s'."""
    if not per_rank:
        return f"{unit}/s"
    return f"{unit[:1].upper()}{unit[1:]}/s per {UNIT['word']}"


def series_colours(n: int) -> list:
    """n colours of one sequential map (dark to light, stopping before the hard-to-see yellow end)."""
    cmap = plt.get_cmap("viridis")
    return [cmap(0.85 * i / max(n - 1, 1)) for i in range(n)]


# What one rank drives: "GPU" in the real study, "rank" in a CPU study (the demo); set once per
# figure by `python -m scalestudy.plots --unit` (the workflow passes it from train.device).
UNIT = {"word": "GPU"}


def set_unit(word: str) -> None:
    UNIT["word"] = word


def count(n: int) -> str:
    """'1 GPU', '8 GPUs' (or '2 ranks')."""
    return f"{n} {UNIT['word']}{'s' if int(n) != 1 else ''}"


def world_label() -> str:
    return f"{UNIT['word']}s (world size)"


def world_axis(ax, worlds, label: str | None = None) -> None:
    """A log2 x axis with the world sizes as plain integer ticks."""
    worlds = sorted({int(w) for w in worlds})
    ax.set_xscale("log", base=2)
    ax.set_xticks(worlds)
    ax.set_xticklabels([str(w) for w in worlds])
    ax.minorticks_off()
    ax.set_xlabel(label or world_label())
    if len(worlds) == 1:
        ax.set_xlim(worlds[0] / 1.5, worlds[0] * 1.5)


def sparse_world_ticks(ax, max_world: int) -> None:
    """Powers of two up to max_world, every other one labelled when there are many."""
    ticks = [2**i for i in range(int(math.log2(max_world)) + 1)]
    step = 2 if len(ticks) > 7 else 1
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks[::step])
    ax.set_xticklabels([str(t) for t in ticks[::step]])
    ax.minorticks_off()


def errorbar(ax, x, mean, low=None, high=None, **style) -> None:
    """Means with their confidence interval as whiskers, where there is one (n=1: marker only)."""
    x, mean = np.asarray(x, float), np.asarray(mean, float)
    style = {"markersize": MARKER_SIZE, "linewidth": 1.2, "capsize": 2, **style}
    if low is None or high is None:
        ax.plot(x, mean, **{k: v for k, v in style.items() if k != "capsize"})
        return
    low, high = np.asarray(low, float), np.asarray(high, float)
    yerr = np.vstack([mean - low, high - mean])
    yerr = np.where(np.isfinite(yerr), yerr, 0.0)
    ax.errorbar(x, mean, yerr=yerr, **style)


def threshold(ax, y: float, text: str, where: str = "legend") -> None:
    """A dotted threshold line. Its text goes into the legend (`where="legend"`, then call ax.legend
    afterwards) or just outside the right spine (`"margin"`), never on top of the data."""
    if where == "legend":
        ax.axhline(y, label=text, **THRESHOLD_STYLE)
        return
    ax.axhline(y, **THRESHOLD_STYLE)
    ax.annotate(
        text,
        xy=(1.0, y),
        xycoords=("axes fraction", "data"),
        xytext=(3, 0),
        textcoords="offset points",
        ha="left",
        va="center",
        fontsize=6,
        color=THRESHOLD_STYLE["color"],
        annotation_clip=False,
    )


def compact_number(value: float, _pos=None) -> str:
    """12000 -> '12k', 1.5e6 -> '1.5M', 0.25 -> '0.25' (tick labels, cell annotations)."""
    for size, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= size:
            return f"{value / size:g}{suffix}"
    return f"{value:g}"


def log_y_axis(ax) -> None:
    """A log y axis labelled at 1-2-5 steps in plain numbers (no lone 10^5 tick)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(compact_number))
    ax.yaxis.set_minor_formatter(NullFormatter())


def integer_axis(ax, axis: str = "x") -> None:
    from matplotlib.ticker import MaxNLocator

    (ax.xaxis if axis == "x" else ax.yaxis).set_major_locator(MaxNLocator(integer=True))


def percent_axis(ax, axis: str = "y") -> None:
    from matplotlib.ticker import PercentFormatter

    (ax.yaxis if axis == "y" else ax.xaxis).set_major_formatter(PercentFormatter(xmax=1.0, decimals=0))
