"""The reference pages of the tables and figures (docs/reference/tables.md, figures.md) as the tests
read them: which columns a table's section names (`documented_columns`), and which columns of a
folder of tables it does not (`undocumented_columns`: tests/test_docs_reference.py on constructed
tables, tests/test_workflow.py on the demo's own)."""

from __future__ import annotations

import csv
import re
from pathlib import Path

from tests.conftest import REPO

TABLES_PAGE = REPO / "docs/reference/tables.md"
FIGURES_PAGE = REPO / "docs/reference/figures.md"
CODE = re.compile(r"`([^`]+)`")
STATISTICS = ("_mean", "_std", "_ci_low", "_ci_high")


def documented_columns(text: str) -> dict[str, set[str]]:
    """{table file name: the names in code under its `## ` heading} of tables.md's text."""
    found: dict[str, set[str]] = {}
    for section in re.split(r"\n(?=## )", text):
        heading, _, body = section.partition("\n")
        if heading.startswith("## "):
            names = set(CODE.findall(body)) | set(CODE.findall(heading))
            for table in CODE.findall(heading):
                found[table] = names
    return found


def is_documented(column: str, names: set[str]) -> bool:
    """A column is named as it is, as a listed measure with a statistic's suffix, by a template
    whose placeholder stands for another listed name (`<part>_s`, `<metric>_a`), or by a dotted
    prefix (`config.<key>`, `startup_parts_s.<part>`)."""
    if column in names:
        return True
    if any(column.endswith(suffix) and column[: -len(suffix)] in names for suffix in STATISTICS):
        return True
    for name in names:
        match = re.fullmatch(r"([^<]*)<[^>]+>(.*)", name)
        if not match:
            continue
        before, after = match.groups()
        if before.endswith(".") and not after and column.startswith(before):
            return True
        if column.startswith(before) and column.endswith(after):
            middle = column[len(before) : len(column) - len(after)]
            if middle in names:
                return True
    return False


def undocumented_columns(tables_dir: Path, text: str | None = None) -> dict[str, list[str]]:
    """{table: its columns tables.md does not name}, for every CSV in `tables_dir`; a table the page
    has no heading for is listed with all its columns."""
    documented = documented_columns(TABLES_PAGE.read_text() if text is None else text)
    missing = {}
    for path in sorted(tables_dir.glob("*.csv")):
        with path.open(newline="") as file:
            columns = next(csv.reader(file), [])
        names = documented.get(path.name, set())
        left = [column for column in columns if not is_documented(column, names)]
        if left:
            missing[path.name] = left
    return missing
