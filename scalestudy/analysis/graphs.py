"""CUDA graphs in the tables (issue 51): a point whose compiled step should have run as CUDA graphs
and did not never passes as the fast step.

The trainer reports, per run, whether its compile mode asked for CUDA graphs on a GPU and whether
Inductor skipped any (summary.json `cuda_graphs`, runs.csv `cuda_graphs.expected`,
`cuda_graphs.skips`, `cuda_graphs.skip_reasons`, `cuda_graphs.skipped`: scalestudy.train.compiled).
Here a run with `cuda_graphs.skipped` is marked `cuda_graphs_skipped` (a column of the run metrics,
the sensitivity table and, counted over repeats, the scaling table: `repeats_graphs_skipped`) and its
note says so with Inductor's reason; the report and the paper read that column. Eager runs, runs
in a mode without graphs and runs on the CPU expect none: never marked.
"""

from __future__ import annotations

import pandas as pd

from scalestudy.analysis.contention import flags

COLUMN = "cuda_graphs_skipped"
EXPECTED = "cuda_graphs.expected"
SOURCE = "cuda_graphs.skipped"
REASONS = "cuda_graphs.skip_reasons"
NOTE = "CUDA graphs skipped (not the fast step)"


def skipped(runs: pd.DataFrame) -> pd.Series:
    """True where a run expected CUDA graphs and Inductor skipped some (absent or empty: False)."""
    return flags(runs, SOURCE)


def expected(runs: pd.DataFrame) -> pd.Series:
    """True where a run's compiled step should have run as CUDA graphs (compiled, a graph mode, a GPU)."""
    return flags(runs, EXPECTED)


def note(row: pd.Series) -> str:
    """The note of a marked run: NOTE, with Inductor's reason where it logged one."""
    reason = row.get(REASONS)
    return f"{NOTE}: {reason}" if isinstance(reason, str) and reason else NOTE


def mark(runs: pd.DataFrame) -> pd.DataFrame:
    """runs with COLUMN set and the marked runs' note extended (runs already has a `note` column)."""
    runs = runs.copy()
    runs[COLUMN] = skipped(runs)
    for index, row in runs[runs[COLUMN]].iterrows():
        text = str(row["note"] or "")
        runs.at[index, "note"] = f"{text}; {note(row)}" if text else note(row)
    return runs
