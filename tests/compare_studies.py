"""Studies edited for the comparison tests (tests/test_compare.py, and the real demo of
tests/test_workflow.py): a study's run catalog copied and edited, points' throughput scaled, a run's
within-window spread."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pandas as pd

from scalestudy.compare import spread


def scale_throughput(runs: pd.DataFrame, rows: pd.Series, factor: float) -> pd.DataFrame:
    """`runs` with the throughput of `rows` times `factor`: the window's rate, its sub-intervals' and
    the whole run's (a study that ran that much slower or faster there)."""
    for column in ("images_per_s", "images_per_s_per_gpu", "whole_run_images_per_s"):
        if column in runs:
            runs.loc[rows, column] = pd.to_numeric(runs.loc[rows, column], errors="coerce") * factor
    if "interval_images_per_s" in runs:
        runs["interval_images_per_s"] = runs["interval_images_per_s"].astype(object)
        runs.loc[rows, "interval_images_per_s"] = [
            json.dumps([factor * r for r in json.loads(cell)]) if isinstance(cell, str) else cell
            for cell in runs.loc[rows, "interval_images_per_s"]
        ]
    return runs


def catalog_copy(results: Path, dest: Path, edit) -> Path:
    """A study holding `results`' run catalog edited by `edit` (nothing else: the comparison reads
    only runs.csv): dest/results."""
    (dest / "results/tables").mkdir(parents=True)
    runs = edit(pd.read_csv(results / "tables/runs.csv"))
    runs.to_csv(dest / "results/tables/runs.csv", index=False)
    return dest / "results"


def log_spread(cell) -> float:
    """The standard deviation of a run's log sub-interval rates (its runs.csv cell); NaN for none."""
    rates = spread.interval_rates(cell)
    return statistics.stdev(math.log(r) for r in rates) if len(rates) > 1 else math.nan
