"""The reference pages name every table and figure the study can write (docs/reference/tables.md,
figures.md): each report caption (`report/table_<name>.rst`, `report/<figure>.rst`) has its entry.
Every column of the tables is checked against tables.md on the demo's own tables
(tests/test_workflow.py, `documented_columns` and `undocumented_columns` here)."""

from __future__ import annotations

import csv
import re
from pathlib import Path

from tests.conftest import REPO

TABLES_PAGE = REPO / "docs/reference/tables.md"
FIGURES_PAGE = REPO / "docs/reference/figures.md"
CODE = re.compile(r"`([^`]+)`")
STATISTICS = ("_mean", "_std", "_ci_low", "_ci_high")
NOT_FIGURES = {"workflow"}  # report/workflow.rst is the report's front page


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


def caption_names() -> tuple[set[str], set[str]]:
    """(tables, figures) the report has captions for."""
    stems = {path.stem for path in (REPO / "report").glob("*.rst")} - NOT_FIGURES
    tables = {stem.removeprefix("table_") + ".csv" for stem in stems if stem.startswith("table_")}
    return tables, {stem for stem in stems if not stem.startswith("table_")}


def test_every_table_with_a_report_caption_has_its_section():
    tables, _ = caption_names()
    assert len(tables) >= 10
    assert tables - set(documented_columns(TABLES_PAGE.read_text())) == set()


def test_every_figure_with_a_report_caption_has_its_row():
    _, figures = caption_names()
    rows = {CODE.findall(line)[0] for line in FIGURES_PAGE.read_text().splitlines() if line.startswith("| `")}
    assert len(figures) >= 12
    assert figures - rows == set(), "figures without a row in docs/reference/figures.md"


def test_a_new_column_is_named_as_undocumented(tmp_path):
    page = "# Tables\n\n## `a.csv`\n\n`x`, `y` as `_mean`; parts `p`, `q` as `<part>_s`; `config.<key>`.\n"
    (tmp_path / "a.csv").write_text("x,y_mean,y_std,p_s,q_s,config.lr,config.profile.tool,r_s,z\n1\n")
    (tmp_path / "b.csv").write_text("x\n1\n")
    assert undocumented_columns(tmp_path, page) == {"a.csv": ["r_s", "z"], "b.csv": ["x"]}
