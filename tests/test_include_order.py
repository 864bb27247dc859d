"""The Snakefile includes the rule files in an order that is true: a rule file that names another
file's rule (`rules.X.output`, evaluated when the file is read) comes after that file, and the
shared helpers (rules/common/) come first, in the order the Snakefile states."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import REPO

RULE = re.compile(r"^\s*(?:rule|checkpoint)\s+(\w+)\s*:", re.M)
REFERENCE = re.compile(r"\brules\.(\w+)\b")
COMMON = [f"rules/common/{role}.smk" for role in ("values", "paths", "resources", "report", "hooks")]


def included(snakefile: Path = REPO / "Snakefile") -> list[str]:
    return re.findall(r'^include:\s*"([^"]+)"', snakefile.read_text(), re.M)


def code_of(path: Path) -> str:
    """The file without its comments (a comment may name a rule as an example)."""
    return "\n".join(line.split("#", 1)[0] for line in path.read_text().splitlines())


def order_problems(files: list[str], root: Path = REPO) -> list[str]:
    """`file: rules.X` for each reference to a rule not defined before it in the include order."""
    problems, defined = [], set()
    for name in files:
        code = code_of(root / name)
        for line in code.splitlines():
            defined.update(RULE.findall(line))
            problems += [f"{name}: rules.{rule}" for rule in REFERENCE.findall(line) if rule not in defined]
    return problems


def test_every_rule_a_rule_file_names_is_defined_before_it():
    files = included()
    assert len(files) > 15 and set(files) >= {str(p.relative_to(REPO)) for p in REPO.glob("rules/*.smk")}
    assert order_problems(files) == []


def test_the_shared_helpers_come_first_in_the_stated_order():
    files = included()
    assert files[: len(COMMON)] == COMMON
    assert set(files) >= {str(p.relative_to(REPO)) for p in REPO.glob("rules/common/*.smk")}


def test_a_reference_to_a_later_rule_is_found(tmp_path):
    (tmp_path / "a.smk").write_text("rule a:\n    input: rules.b.output  # rules.c\n")
    (tmp_path / "b.smk").write_text("rule b:\n    output: 'x'\n")
    assert order_problems(["a.smk", "b.smk"], tmp_path) == ["a.smk: rules.b"]
    assert order_problems(["b.smk", "a.smk"], tmp_path) == []
