"""Reading tool CSVs strictly: find the header, check the columns, parse numbers; name file and column.

Tool CSVs may carry lines before the table (`==PROF==` progress lines of ncu, a report title of
`nsys stats` written to the console), numbers with thousands separators (`"1,234"`) and `n/a`.
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from scalestudy.atomic import write_csv


class TableError(ValueError):
    """A tool CSV that does not have the expected shape; the message names file and column."""


def header_index(lines: Sequence[str], required: Sequence[str]) -> int | None:
    """Index of the first line whose CSV fields include every required column, else None."""
    wanted = set(required)
    for index, line in enumerate(lines):
        if not line.strip():
            continue
        fields = {field.strip() for field in next(csv.reader([line]), [])}
        if wanted <= fields:
            return index
    return None


def read_table(path: str | os.PathLike, required: Sequence[str], what: str) -> pd.DataFrame:
    """The table in `path` (all columns as strings) from its header line on."""
    path = Path(path)
    if not path.is_file():
        raise TableError(f"{path}: missing ({what})")
    lines = path.read_text(errors="replace").splitlines()
    start = header_index(lines, required)
    if start is None:
        first = next((line for line in lines if line.strip()), "<empty file>")
        raise TableError(
            f"{path}: no header line with the columns {list(required)} ({what}); first line: {first[:200]!r}"
        )
    frame = pd.read_csv(io.StringIO("\n".join(lines[start:])), dtype=str, keep_default_na=False)
    frame.columns = [str(column).strip() for column in frame.columns]
    return frame


def numeric(frame: pd.DataFrame, column: str, path: str | os.PathLike) -> pd.Series:
    """A column as floats: thousands separators removed, empty or n/a -> NaN; junk is an error."""
    if column not in frame.columns:
        raise TableError(f"{path}: no column {column!r} (columns: {list(frame.columns)})")
    text = frame[column].astype(str).str.replace(",", "", regex=False).str.strip()
    blank = text.str.lower().isin(["", "n/a", "nan"])
    values = pd.to_numeric(text.where(~blank), errors="coerce")
    bad = values.isna() & ~blank
    if bad.any():
        row = int(bad.idxmax())
        raise TableError(
            f"{path}: column {column!r} row {row + 1}: not a number: {frame[column].iloc[row]!r}"
        )
    return values.astype(float)


def frame_of(rows: list[dict], columns: Sequence[str]) -> pd.DataFrame:
    """Rows in the schema's column order (a header-only table when there are no rows)."""
    return pd.DataFrame(rows, columns=list(columns))


def write_table(path: str | os.PathLike, rows: list[dict] | pd.DataFrame, columns: Sequence[str]) -> None:
    frame = rows if isinstance(rows, pd.DataFrame) else frame_of(rows, columns)
    missing = [column for column in columns if column not in frame.columns]
    if missing:
        raise TableError(f"{path}: rows lack the columns {missing}")
    write_csv(path, frame[list(columns)])


def top_rows(frame: pd.DataFrame, identity: dict, kind: str, top: int) -> list[dict]:
    """The `top` heaviest rows of a frame with columns name, category, total_time_s, instances.

    `fraction_of_busy` is each row's share of the whole frame's time (not only the top rows').
    """
    busy = float(frame["total_time_s"].sum())
    heaviest = frame.sort_values(["total_time_s", "name"], ascending=[False, True]).head(top)
    return [
        {
            **identity,
            "kind": kind,
            "position": position,
            "name": row.name,
            "category": row.category,
            "total_time_s": float(row.total_time_s),
            "instances": int(row.instances),
            "avg_time_s": float(row.total_time_s) / row.instances if row.instances else float("nan"),
            "fraction_of_busy": float(row.total_time_s) / busy if busy > 0 else float("nan"),
        }
        for position, row in enumerate(heaviest.itertuples(index=False), start=1)
    ]
