"""Which series a row of runs.csv or scaling.csv belongs to, and what its throughput counts.

A series is one parallelism (DDP, FSDP) of the scaling study; a table written before FSDP existed
(no parallelism column, or an empty cell: the run config leaves the default out) is DDP. The
throughput columns keep their names (images_per_s, ...) and count the rows' sample_unit: images for
the ResNet, tokens for an LM; a table without the column counts images.
"""

from __future__ import annotations

import pandas as pd

from scalestudy.analysis.metrics import SERIES_DEFAULTS

DDP = SERIES_DEFAULTS["parallelism"]


def parallelism_of(table: pd.DataFrame) -> pd.Series:
    """Each row's parallelism, DDP where the table has none."""
    return _column_or(table, "parallelism", DDP)


def _column_or(table: pd.DataFrame, column: str, default: str) -> pd.Series:
    if column not in table:
        return pd.Series(default, index=table.index, dtype=object)
    return table[column].astype(object).fillna(default).astype(str)


def ddp_only(table: pd.DataFrame) -> pd.DataFrame:
    return table[parallelism_of(table) == DDP]


def by_parallelism(table: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """(label, rows) per parallelism, DDP first; the label (" (FSDP)") is "" for a single series."""
    names = parallelism_of(table)
    order = sorted(set(names), key=lambda name: (name != DDP, name)) or [DDP]
    if len(order) == 1:
        return [("", table)]
    return [(f" ({name.upper()})", table[names == name]) for name in order]


def unit_of(table: pd.DataFrame) -> pd.Series:
    """Each row's sample_unit, images where the table has none."""
    return _column_or(table, "sample_unit", SERIES_DEFAULTS["sample_unit"])


def sample_unit(table: pd.DataFrame) -> str:
    """What the throughput columns count (images, tokens, ...; several joined by '/')."""
    units = table["sample_unit"].dropna().astype(str).unique() if "sample_unit" in table else []
    return "/".join(sorted(units)) or SERIES_DEFAULTS["sample_unit"]
