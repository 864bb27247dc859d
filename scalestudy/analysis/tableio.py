"""Reading the study's CSV and JSON files with errors that name the file and the missing piece."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd


def read_csv(path: str | os.PathLike, required: Iterable[str] = ()) -> pd.DataFrame:
    """A CSV as a DataFrame; ValueError naming the file and columns if any required one is missing."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    try:
        frame = pd.read_csv(path)
    except pd.errors.EmptyDataError as err:
        raise ValueError(f"{path}: empty file (not even a header)") from err
    require_columns(frame, required, path)
    return frame


def require_columns(frame: pd.DataFrame, required: Iterable[str], where: str | os.PathLike) -> None:
    missing = [column for column in required if column not in frame.columns]
    if missing:
        raise ValueError(
            f"{where}: missing column(s) {', '.join(missing)} (has: {', '.join(map(str, frame.columns))})"
        )


def read_json(path: str | os.PathLike) -> Any:
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError as err:
        raise FileNotFoundError(f"{path}: no such file") from err
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON ({err})") from err


def dig(record: dict, dotted: str, where: str | os.PathLike) -> Any:
    """record['a']['b'] for 'a.b'; KeyError naming the file and the key if it is absent."""
    value: Any = record
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            raise KeyError(f"{where}: missing key {dotted!r}")
        value = value[part]
    return value
