"""docs/architecture.md is a true map: every path in its recipes ("Where to look for the five most
common changes") and its rules table exists, the rules table names every rule file, and its package
map names every folder of the package and no other. A bare file name is looked for in the folder
named before it in the same row; `<name>` stands for any one name."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import REPO

CODE = re.compile(r"`([^`]+)`")
FILE = re.compile(r"^[\w.<>/-]+(\.(py|smk|yaml|yml|rst|md|sh|txt|def|sbatch|tex|bib)|/)$")
GENERATED = {"results/"}  # what the workflow writes (git-ignored): not in a checkout


def section_rows(text: str, heading: str) -> list[str]:
    """The table rows (`| ... |`) under `heading`, up to the next heading."""
    body = text.split(heading, 1)[1]
    body = re.split(r"\n#+ ", body, maxsplit=1)[0]
    return [line for line in body.splitlines() if line.startswith("| ") and not line.startswith("|---")]


def matches(pattern: str, roots: list[Path]) -> bool:
    glob = re.sub(r"<[^>]+>", "*", pattern.rstrip("/"))
    return any(any(root.glob(glob)) for root in roots)


def missing_in(rows: list[str], roots: list[Path], folder_rows: tuple[str, ...] = ()) -> list[str]:
    """The paths named in `rows` that exist under none of `roots`; a bare name (no inner `/`) may be in
    any folder the row named before it. In a row that starts with one of `folder_rows` a bare word
    is a folder in it (`profiles/`: `local`, `slurm`)."""
    missing = []
    for row in rows:
        tokens = [token for token in CODE.findall(row) if token not in GENERATED]
        folders: list[Path] = []
        bare_folders = bool(tokens) and tokens[0] in folder_rows
        for token in tokens:
            nested = "/" in token.rstrip("/")
            if not (FILE.match(token) or (bare_folders and re.fullmatch(r"[a-z][\w-]*", token))):
                continue
            found = [root for root in (roots if nested else [*folders, *roots]) if matches(token, [root])]
            if not found:
                missing.append(token)
                continue
            parent = token.rstrip("/") if token.endswith("/") or bare_folders else token.rsplit("/", 1)[0]
            if parent != token or token.endswith("/") or bare_folders:
                glob = re.sub(r"<[^>]+>", "*", parent)
                folders += [path for root in found for path in root.glob(glob) if path.is_dir()]
    return missing


def test_every_file_of_the_architecture_recipes_exists():
    rows = section_rows((REPO / "docs/architecture.md").read_text(), "### Where to look for")
    assert len(rows) >= 5
    assert missing_in(rows[1:], [REPO, REPO / "scalestudy"]) == []


ARCHITECTURE = REPO / "docs/architecture.md"


def test_every_rule_file_is_in_the_architectures_rules_table_and_exists():
    rows = section_rows(ARCHITECTURE.read_text(), "## The rules")
    assert len(rows) >= 6
    assert missing_in(rows[1:], [REPO]) == []
    named = set(CODE.findall("\n".join(rows)))
    files = {str(path.relative_to(REPO)) for path in (REPO / "rules").glob("*.smk")} - {"rules/common.smk"}
    assert files - named == set(), "rule files the architecture's table does not name"


def test_the_package_map_names_every_folder_of_the_package_and_no_other():
    rows = section_rows(ARCHITECTURE.read_text(), "## Package map")
    named = {CODE.findall(row)[0] for row in rows[1:]}
    package = REPO / "scalestudy"
    folders = {f"{path.name}/" for path in package.iterdir() if (path / "__init__.py").is_file()}
    assert named == folders | {"scalestudy/"}


def test_a_missing_file_is_named(tmp_path):
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules/a.smk").write_text("")
    rows = ["| x | `rules/a.smk` (`f()`), `b.smk`, `rules/<name>.smk`, `plan/gone.py` |"]
    assert missing_in(rows, [tmp_path]) == ["b.smk", "plan/gone.py"]
