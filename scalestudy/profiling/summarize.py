"""One world size's profile -> breakdown, top kernels and overlap tables; all world sizes combined.

    python -m scalestudy.profiling.summarize world --record RUN/profile_tool.json \
        --nsys-stats results/profile/w2/nsys_stats --out-dir results/profile/w2 [--top 15]
    python -m scalestudy.profiling.summarize combine --out-dir results/profile \
        results/profile/w1 results/profile/w2

The record says which tool ran (scalestudy.profiling.run); nsys runs are parsed from the
`nsys stats` CSVs of every rank (parse_nsys), torch runs from the trainer's profile_ops.csv
(parse_torch). Every row carries the tool and the method (schema.METHODS).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

import pandas as pd

from scalestudy.profiling import parse_nsys, parse_torch
from scalestudy.profiling.breakdown import breakdown_rows, overlap_row
from scalestudy.profiling.schema import (
    BREAKDOWN_COLUMNS,
    BREAKDOWN_FILE,
    OVERLAP_COLUMNS,
    OVERLAP_FILE,
    TOP_KERNEL_COLUMNS,
    TOP_KERNELS_FILE,
)
from scalestudy.profiling.tables import TableError, read_table, write_table
from scalestudy.progress import setup_logging

log = logging.getLogger("scalestudy.profiling.summarize")

TABLES = {
    BREAKDOWN_FILE: BREAKDOWN_COLUMNS,
    TOP_KERNELS_FILE: TOP_KERNEL_COLUMNS,
    OVERLAP_FILE: OVERLAP_COLUMNS,
}


def world_tables(record: dict, nsys_stats: Path, top: int) -> dict[str, list[dict]]:
    """The three tables of one profiled world size, from whichever tool the run used."""
    world, tool = int(record["world_size"]), record["tool"]
    if tool == "nsys":
        ranks = parse_nsys.summarize(nsys_stats, world, int(record["steps"]), top)
    elif tool == "torch":
        ranks = parse_torch.summarize(Path(record["run_dir"]), world, top)
    else:
        raise ValueError(f"the run record names tool {tool!r}; only nsys and torch runs are parsed")
    tables: dict[str, list[dict]] = {name: [] for name in TABLES}
    for totals, labels, top_kernels in ranks:
        tables[BREAKDOWN_FILE] += breakdown_rows(totals, labels)
        tables[OVERLAP_FILE].append(overlap_row(totals, labels))
        tables[TOP_KERNELS_FILE] += top_kernels
    return tables


def write_world(record_path: Path, nsys_stats: Path, out_dir: Path, top: int) -> None:
    record = json.loads(record_path.read_text())
    for name, rows in world_tables(record, nsys_stats, top).items():
        write_table(out_dir / name, rows, TABLES[name])
    log.info("w%s (%s): wrote %s", record["world_size"], record["tool"], ", ".join(TABLES))


def combine(world_dirs: list[Path], out_dir: Path) -> None:
    """Concatenate each table over the world sizes' folders."""
    for name, columns in TABLES.items():
        frames = [read_table(folder / name, columns, f"profile {name}") for folder in world_dirs]
        combined = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=list(columns))
        if combined.empty and frames:
            log.warning("%s: no rows in any world size", name)
        write_table(out_dir / name, combined, columns)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m scalestudy.profiling.summarize", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    world = sub.add_parser("world", help="the tables of one profiled world size")
    world.add_argument("--record", required=True, type=Path, help="profile_tool.json of the profile run")
    world.add_argument(
        "--nsys-stats", required=True, type=Path, help="the nsys export folder (unused for torch)"
    )
    world.add_argument("--out-dir", required=True, type=Path)
    world.add_argument("--top", type=int, default=15, help="kernels/ops per rank in top_kernels.csv")
    both = sub.add_parser("combine", help="the tables of all world sizes in one")
    both.add_argument("--out-dir", required=True, type=Path)
    both.add_argument("world_dirs", nargs="+", type=Path)
    for command in (world, both):
        command.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    setup_logging(getattr(logging, args.log_level.upper()))
    try:
        if args.command == "world":
            write_world(args.record, args.nsys_stats, args.out_dir, args.top)
        else:
            combine(args.world_dirs, args.out_dir)
    except (TableError, FileNotFoundError) as error:
        log.error("%s", error)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
