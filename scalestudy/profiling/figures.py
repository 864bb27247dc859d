"""The profiling stage's figures (PNG for the report, PDF for the paper), in the study's style.

    python -m scalestudy.profiling.figures breakdown --breakdown results/profile/breakdown.csv \
        --png P --pdf F
    python -m scalestudy.profiling.figures top-kernels --top-kernels results/profile/top_kernels.csv \
        --png P --pdf F
    python -m scalestudy.profiling.figures ncu-throughput \
        (--status S.json --kernels K.csv | --not-run REASON) --png P --pdf F

- breakdown: stacked bars of the step time by category per profiled world size (mean over ranks);
- top-kernels: a table of the heaviest kernels (nsys) or ops (torch) of rank 0 per world size;
- ncu-throughput: achieved % of peak compute vs % of peak memory of each ncu-profiled kernel,
  or a note saying why ncu was not run.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import textwrap
from pathlib import Path

import pandas as pd

from scalestudy.plots.style import new_figure, placeholder_note, save_figure
from scalestudy.profiling.schema import (
    BREAKDOWN_COLUMNS,
    CATEGORIES,
    KERNEL_LABELS,
    LABELS,
    NCU_COLUMNS,
    TOP_KERNEL_COLUMNS,
)
from scalestudy.profiling.tables import numeric, read_table
from scalestudy.progress import setup_logging

log = logging.getLogger("scalestudy.profiling.figures")

COLORS = {
    "conv_gemm": "#4c72b0",
    "norm_elementwise": "#55a868",
    "communication": "#c44e52",
    "memory_copy": "#8172b2",
    "data_loading": "#ccb974",
    "idle_other": "#bbbbbb",
    "other": "#777777",
}
NAME_CHARS = 48


def step_time_by_category(breakdown: pd.DataFrame, path: Path) -> pd.DataFrame:
    """Mean seconds per step over ranks: rows world size (with tool), columns categories."""
    frame = breakdown.assign(
        world_size=numeric(breakdown, "world_size", path).astype(int),
        time_per_step_s=numeric(breakdown, "time_per_step_s", path),
    )
    per_rank = frame.groupby(["world_size", "tool", "category"])["time_per_step_s"].mean()
    table = per_rank.unstack("category").reindex(columns=list(CATEGORIES)).fillna(0.0)
    return table.sort_index()


def plot_breakdown(breakdown_csv: Path, png: Path, pdf: Path) -> None:
    breakdown = read_table(breakdown_csv, BREAKDOWN_COLUMNS, "profile breakdown")
    fig, axes = new_figure(aspect=0.8)
    ax = axes[0][0]
    if breakdown.empty:
        note(ax, "no profiled world size")
        save_figure(fig, png, pdf)
        return
    table = step_time_by_category(breakdown, breakdown_csv) * 1e3
    positions = range(len(table))
    bottom = [0.0] * len(table)
    for key in CATEGORIES:
        heights = table[key].tolist()
        ax.bar(positions, heights, bottom=bottom, color=COLORS[key], label=LABELS[key], width=0.6)
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    ax.set_xticks(
        list(positions), [f"{world} rank{'s' if world > 1 else ''}\n({tool})" for world, tool in table.index]
    )
    ax.set_ylabel("time per step (ms)")
    ax.set_title("Step time by category (mean over ranks)")
    ax.grid(axis="x", visible=False)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, frameon=False)
    save_figure(fig, png, pdf)


def note(ax, text: str) -> None:
    """Say on the (blank) axes why there is nothing to draw."""
    placeholder_note(ax, textwrap.fill(text, 48))
    ax.set_axis_off()


def shorten(name: str, limit: int = NAME_CHARS) -> str:
    name = " ".join(str(name).split())
    return name if len(name) <= limit else name[: limit - 1] + "\u2026"


def top_kernel_cells(top: pd.DataFrame, path: Path, per_world: int) -> list[list[str]]:
    frame = top.assign(
        world_size=numeric(top, "world_size", path).astype(int),
        rank=numeric(top, "rank", path).astype(int),
        position=numeric(top, "position", path).astype(int),
        avg_time_s=numeric(top, "avg_time_s", path),
        fraction_of_busy=numeric(top, "fraction_of_busy", path),
    )
    frame = frame[(frame["rank"] == 0) & (frame["position"] <= per_world)].sort_values(
        ["world_size", "position"]
    )
    return [
        [
            f"{row.world_size} ({row.tool})",
            str(row.position),
            shorten(row.name),
            KERNEL_LABELS.get(row.category, row.category),
            f"{100 * row.fraction_of_busy:.1f}",
            f"{1e6 * row.avg_time_s:.1f}",
        ]
        for row in frame.itertuples(index=False)
    ]


def plot_top_kernels(top_csv: Path, png: Path, pdf: Path, per_world: int) -> None:
    top = read_table(top_csv, TOP_KERNEL_COLUMNS, "profile top kernels")
    cells = top_kernel_cells(top, top_csv, per_world) if not top.empty else []
    fig, axes = new_figure(wide=True, aspect=max(0.2, 0.035 * (len(cells) + 2)))
    ax = axes[0][0]
    ax.axis("off")
    if not cells:
        note(ax, "no kernels or ops recorded")
    else:
        columns = ["ranks (tool)", "#", "kernel / op", "category", "% of busy", "avg (\u00b5s)"]
        table = ax.table(cellText=cells, colLabels=columns, loc="center", cellLoc="left", colLoc="left")
        table.auto_set_font_size(False)
        table.set_fontsize(6)
        table.auto_set_column_width(list(range(len(columns))))
        ax.set_title(f"Top {per_world} kernels (nsys) / ops (torch) of rank 0")
    save_figure(fig, png, pdf)


def ncu_note(status: dict) -> str | None:
    """What the figure says instead of a scatter, or None when there are kernels to draw."""
    if not status.get("ran"):
        return f"ncu not run: {status.get('reason') or 'unknown reason'}"
    if not status.get("kernels"):
        reason = status.get("reason")
        return "ncu ran but profiled no kernels" + (f": {reason}" if reason else "")
    return None


def plot_ncu(kernels_csv: Path | None, status: dict, png: Path, pdf: Path) -> None:
    fig, axes = new_figure(aspect=0.85)
    ax = axes[0][0]
    reason = ncu_note(status)
    if reason is not None:
        note(ax, reason)
        ax.set_title("Nsight Compute: achieved throughput")
        save_figure(fig, png, pdf)
        return
    kernels = read_table(kernels_csv, NCU_COLUMNS, "ncu kernels")
    memory = numeric(kernels, "memory_pct_of_peak", kernels_csv)
    compute = numeric(kernels, "compute_pct_of_peak", kernels_csv)
    duration = numeric(kernels, "duration_s", kernels_csv).fillna(0.0)
    longest = duration.max()
    sizes = 12 + 150 * duration / longest if longest > 0 else duration * 0 + 20
    for key in dict.fromkeys(kernels["category"]):
        mask = kernels["category"] == key
        ax.scatter(
            memory[mask],
            compute[mask],
            s=sizes[mask],
            color=COLORS.get(key, "#333333"),
            alpha=0.75,
            label=KERNEL_LABELS.get(key, key),
            edgecolors="none",
        )
    ax.plot([0, 100], [0, 100], color="#999999", lw=0.6, ls="--")
    ax.set_xlim(0, 100)
    ax.set_ylim(0, 100)
    ax.set_xlabel("memory throughput (% of peak)")
    ax.set_ylabel("compute (SM) throughput (% of peak)")
    ax.set_title(f"ncu: {len(kernels)} kernel launches (size ~ duration)")
    ax.legend(loc="upper left", frameon=False)
    save_figure(fig, png, pdf)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    setup_logging(getattr(logging, args.log_level.upper()))
    logging.getLogger("fontTools").setLevel(logging.WARNING)  # PDF font subsetting chatter
    if args.command == "breakdown":
        plot_breakdown(args.breakdown, args.png, args.pdf)
    elif args.command == "top-kernels":
        plot_top_kernels(args.top_kernels, args.png, args.pdf, args.per_world)
    else:
        status = (
            {"ran": False, "reason": args.not_run} if args.not_run else json.loads(args.status.read_text())
        )
        plot_ncu(args.kernels, status, args.png, args.pdf)
    log.info("wrote %s and %s", args.png, args.pdf)
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m scalestudy.profiling.figures", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    breakdown = sub.add_parser("breakdown", help="stacked step-time bars per world size")
    breakdown.add_argument("--breakdown", required=True, type=Path)
    top = sub.add_parser("top-kernels", help="table of the heaviest kernels/ops")
    top.add_argument("--top-kernels", required=True, type=Path)
    top.add_argument("--per-world", type=int, default=8)
    ncu = sub.add_parser("ncu-throughput", help="ncu achieved % of peak, compute vs memory")
    ncu.add_argument("--kernels", type=Path)
    source = ncu.add_mutually_exclusive_group(required=True)
    source.add_argument("--status", type=Path, help="ncu_status.json of the ncu rule")
    source.add_argument("--not-run", help="why ncu was not run (e.g. disabled in the config)")
    for command in (breakdown, top, ncu):
        command.add_argument("--png", required=True, type=Path)
        command.add_argument("--pdf", required=True, type=Path)
        command.add_argument("--log-level", default="INFO")
    return parser


if __name__ == "__main__":
    sys.exit(main())
