"""The reference pages name every table and figure the study can write (docs/reference/tables.md,
figures.md): each report caption (`report/table_<name>.rst`, `report/<figure>.rst`) has its entry.
Every column of the tables is checked against tables.md on the demo's own tables
(tests/test_workflow.py, with tests/reference_pages.py's `undocumented_columns`)."""

from __future__ import annotations

from tests.conftest import REPO
from tests.reference_pages import CODE, FIGURES_PAGE, TABLES_PAGE, documented_columns, undocumented_columns

NOT_FIGURES = {"workflow"}  # report/workflow.rst is the report's front page


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
