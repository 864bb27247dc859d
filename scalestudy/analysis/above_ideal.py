"""Efficiency above 100 %: flagged once here and read everywhere else, as a point to check.

E(N) = X(N) / (N X(1)) above 1 has two explanations, and the numbers alone do not tell them apart:
a measurement problem (a noisy or slow 1-rank reference: one repeat, a shared GPU, a cold cache;
windows of unequal length) or, in strong scaling, a real superlinear gain (each rank's smaller share
of the batch and its activations fitting a cache that the one rank's did not). Every place that
flags it says both (`CHECK`) and gives no acceptance verdict on it until it is re-measured.

metrics.scaling_table marks scaling.csv's rows (`efficiency_above_ideal`, and a note), the
waterfall its rows (it splits no loss there: there is none to split); the efficiency table, the
figures, the acceptance verdicts and the paper read that flag, or `flagged` where a table predates
it, and say so with `NOTE` / `words`.
"""

from __future__ import annotations

import logging

import pandas as pd

log = logging.getLogger("scalestudy.analysis.above_ideal")

COLUMN = "efficiency_above_ideal"
IDEAL = 1.0  # E(N) of a perfect scaling point
WHY = "a noisy or slow 1-rank reference, or unequal measurement windows"
GAIN = "a real superlinear gain (in strong scaling, each rank's smaller share of the work fitting its caches)"
CHECK = f"check it: either a measurement problem ({WHY}) or {GAIN}"  # what every place that flags it says
BRIEFLY = "above 100 %: check it, a measurement problem or a superlinear gain"  # beside the number
NOTE = f"efficiency above 100 %: {CHECK}"
REMEASURE = (
    "re-measure the 1-rank reference and this point with more repeats or a longer train.measure"
    " to tell them apart"
)


def above(efficiency) -> bool:
    """True where an efficiency (a fraction, 1 = ideal) is above the ideal; False where missing."""
    return bool(_above(pd.Series([efficiency])).iloc[0])


def _above(values: pd.Series) -> pd.Series:
    """The one comparison: above IDEAL (a missing or non-numeric value is not)."""
    return pd.to_numeric(values, errors="coerce").gt(IDEAL)


def flagged(table: pd.DataFrame, column: str = "efficiency_mean") -> pd.Series:
    """Each row's flag: the table's COLUMN where it has one, else computed from `column`."""
    if COLUMN in table:
        marks = table[COLUMN].map({True: True, False: False, "True": True, "False": False})
        return marks.fillna(False).astype(bool)
    if column not in table:
        return pd.Series(False, index=table.index)
    return _above(table[column])


def row_flagged(row: pd.Series, column: str = "efficiency_mean") -> bool:
    """`flagged` of one row."""
    return bool(flagged(row.to_frame().T, column).iloc[0])


def mark(table: pd.DataFrame, column: str = "efficiency_mean") -> pd.DataFrame:
    """The table with COLUMN (from `column`) and NOTE joined to the flagged rows' `note`."""
    table = table.copy()
    table[COLUMN] = flagged(table.drop(columns=[COLUMN], errors="ignore"), column)
    if "note" not in table:
        table["note"] = ""
    notes = table["note"].fillna("").astype(str)
    joined = notes.where(notes == "", notes + "; ") + NOTE
    table["note"] = joined.where(table[COLUMN], notes)
    for _, row in table[table[COLUMN]].iterrows():
        log.warning("%s", words(row[column], row.get("world_size", 0), str(row.get("mode", ""))))
    return table


def words(efficiency: float, world: int, mode: str = "") -> str:
    """'efficiency 126.6 % at N=2 (weak) is above the ideal; check it: either a measurement problem
    (...) or a real superlinear gain (...)'."""
    where = f"N={int(world)}" + (f" ({mode})" if mode else "")
    return f"efficiency {100 * float(efficiency):.1f} % at {where} is above the ideal; {CHECK}"
