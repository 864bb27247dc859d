"""One look for every figure: sized for a two-column paper, saved as PNG (report) and PDF (paper)."""

from __future__ import annotations

import os
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

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


def placeholder_note(ax, text: str) -> None:
    """Say on the axes why there is nothing to draw, rather than drawing an empty frame."""
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, wrap=True)
    ax.set_xticks([])
    ax.set_yticks([])


def png_and_pdf(stem: str | os.PathLike) -> tuple[Path, Path]:
    stem = Path(stem)
    return stem.with_suffix(".png"), stem.with_suffix(".pdf")
