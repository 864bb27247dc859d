"""The package's import graph: no cycles (imports inside functions count), the modules the Snakefile
imports stay standard library at module level, and the old entry points keep working."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

PACKAGE = REPO / "scalestudy"
WORKFLOW_FILES = [REPO / "Snakefile", *sorted((REPO / "rules").rglob("*.smk"))]


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_of(name: str, module_level_only: bool) -> list[tuple[str, int]]:
    """(imported name, line) of every import statement in a module: `import a.b` gives a.b;
    `from a.b import c` gives a.b.c where that is a module, else a.b. With module_level_only (what
    importing the module runs), those in function bodies and under `if TYPE_CHECKING:` are left out
    (a class body runs at import, so its imports count); without, every import counts, a type-only
    one too (two modules that need each other's types are one idea split in two)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if module_level_only and isinstance(child, ast.If) and _is_type_checking(child):
                continue
            if module_level_only and isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                continue
            if isinstance(child, ast.Import):
                found.extend((alias.name, child.lineno) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")[: len(package.split(".")) - (child.level - 1)]
                    base = ".".join([*anchor, base] if base else anchor)
                for alias in child.names:
                    candidate = f"{base}.{alias.name}"
                    found.append((candidate if candidate in MODULES else base, child.lineno))
            visit(child)

    visit(ast.parse(path.read_text(), filename=str(path)))
    return found


def graph(module_level_only: bool = False) -> dict[str, set[str]]:
    """Module -> the scalestudy modules it imports (the nearest module of a dotted name)."""
    edges: dict[str, set[str]] = {}
    for name in MODULES:
        targets = set()
        for imported, _ in imports_of(name, module_level_only):
            while imported and imported not in MODULES:
                imported = imported.rpartition(".")[0]
            if imported.startswith("scalestudy") and imported != name:
                targets.add(imported)
        edges[name] = targets
    return edges


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph as [a, b, ..., a], or None (depth-first search, colours)."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for target in sorted(edges.get(node, ())):
            if state.get(target) == 1:
                return [*stack[stack.index(target) :], target]
            if target not in state and (cycle := visit(target)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_cycle_finder_finds_a_cycle_and_only_one_that_is_there():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_the_package_has_no_import_cycle_not_even_through_imports_inside_functions_or_for_types():
    edges = graph()
    assert len(edges) > 40 and edges["scalestudy.plan.grid"], "the graph was not built"
    cycle = find_cycle(edges)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_a_type_only_import_counts_for_cycles_but_not_at_import(tmp_path, monkeypatch):
    """The commmodel <-> commpredict (Fit) and crate build <-> lineage (CrateBuilder) circles were
    type-only: the graph sees such an import, what importing a module runs does not."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from scalestudy.plan.grid import Point\n"
    )
    monkeypatch.setitem(MODULES, "scalestudy.probe", probe)
    assert imports_of("scalestudy.probe", module_level_only=False) == [
        ("typing", 1),
        ("scalestudy.plan.grid", 3),
    ]
    assert imports_of("scalestudy.probe", module_level_only=True) == [("typing", 1)]


def workflow_imports() -> set[str]:
    """The scalestudy modules the Snakefile and rules/**/*.smk import (their `import` lines)."""
    found = set()
    pattern = re.compile(r"^\s*(?:from\s+(scalestudy[\w.]*)\s+import\s+(.+)|import\s+(scalestudy[\w.]*))")
    for path in WORKFLOW_FILES:
        for line in path.read_text().splitlines():
            match = pattern.match(line)
            if not match:
                continue
            if match.group(3):
                found.add(match.group(3))
                continue
            base = match.group(1)
            for item in match.group(2).strip("() ").split(","):
                name = item.split(" as ")[0].strip()
                if name:
                    found.add(f"{base}.{name}" if f"{base}.{name}" in MODULES else base)
    return found


def loaded_at_parse(roots: set[str]) -> set[str]:
    """The modules importing `roots` runs: their module-level scalestudy imports, transitively, and
    the packages (__init__) above each."""
    edges = graph(module_level_only=True)
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        parts = name.split(".")
        todo += [".".join(parts[:end]) for end in range(1, len(parts))]
        todo += edges[name]
    return seen


def third_party(name: str) -> list[str]:
    out = []
    for imported, line in imports_of(name, module_level_only=True):
        top = imported.split(".")[0]
        if top and top != "scalestudy" and top != "__future__" and top not in sys.stdlib_module_names:
            out.append(f"{MODULES[name].relative_to(REPO)}:{line} imports {imported}")
    return out


def test_the_modules_the_workflow_imports_import_no_third_party_package_at_module_level():
    roots = workflow_imports()
    assert {"scalestudy.plan.grid", "scalestudy.plan.cluster", "scalestudy.provenance"} <= roots, roots
    unknown = sorted(name for name in roots if name not in MODULES)
    assert not unknown, f"the workflow imports modules that do not exist: {unknown}"
    loaded = loaded_at_parse(roots)
    problems = [problem for name in sorted(loaded) for problem in third_party(name)]
    assert not problems, "\n".join(problems)


def test_the_third_party_check_sees_a_module_level_import():
    # scalestudy.paper.tables reads tables with pandas at module level: the check must see it.
    assert any("imports pandas" in problem for problem in third_party("scalestudy.paper.tables"))


def test_the_old_contract_path_still_works():
    from scalestudy import contract

    assert callable(contract.Reporter)
    assert isinstance(contract.EXIT_RESUMABLE, int)


@pytest.mark.parametrize("module", ["scalestudy.train", "scalestudy.launch"])
def test_the_old_entry_points_still_answer_help(module):
    result = subprocess.run(
        [sys.executable, "-m", module, "--help"], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "usage:" in result.stdout


def documented_modules() -> set[str]:
    """The modules docs/reference/modules.md names: a folder line `scalestudy/x/`, then one indented
    line per file of that folder."""
    text = (REPO / "docs/reference/modules.md").read_text()
    section = text.split("## Every module", 1)[1].split("\n## ", 1)[0]
    named, folder = set(), None
    for line in section.splitlines():
        if match := re.match(r"^(scalestudy/(?:\w+/)*)(?:\s|$)", line):
            folder = match.group(1)
        elif folder and (match := re.match(r"^  (\w+\.py)(?:\s|$)", line)):
            named.add(folder + match.group(1))
        elif not line.strip():
            folder = None
    return named


def test_the_package_map_names_every_module_and_no_other():
    modules = {str(path.relative_to(REPO)) for path in MODULES.values()}
    named = documented_modules()
    assert len(named) > 100, "the package map was not found or not parsed"
    missing, stale = sorted(modules - named), sorted(named - modules)
    assert not missing, f"modules missing from docs/reference/modules.md: {missing}"
    assert not stale, f"docs/reference/modules.md names modules that do not exist: {stale}"


# --- folders ---------------------------------------------------------------------------------------

FOLDERS = sorted(path.name for path in PACKAGE.iterdir() if (path / "__init__.py").is_file())


def unit_of(module: str) -> str:
    """A module's folder (`workloads` for scalestudy.workloads.command.runner); a top-level module is its own
    unit (`provenance`)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "scalestudy"


def folder_graph(edges: dict[str, set[str]] | None = None) -> dict[str, set[str]]:
    """Folder (or top-level module) -> those it imports from, every import counted (also those
    inside functions)."""
    folders: dict[str, set[str]] = {}
    for module, targets in (graph() if edges is None else edges).items():
        source = unit_of(module)
        folders.setdefault(source, set()).update(unit_of(t) for t in targets if unit_of(t) != source)
    return folders


def test_no_two_folders_import_each_other_not_even_through_others():
    """plan, workloads, train, tracking, preflight, analysis, paper, launch, ...: a folder may use the
    ones below it only; a loop (plan -> workloads -> train -> tracking -> plan) fails here."""
    folders = folder_graph()
    assert {"plan", "train", "tracking", "preflight", "analysis", "paper", "launch"} <= set(folders)
    cycle = find_cycle(folders)
    assert cycle is None, "folders that import each other: " + " -> ".join(cycle or [])


def test_the_folder_cycle_finder_counts_imports_inside_functions():
    edges = {
        "scalestudy.plan.grid": {"scalestudy.train.trainer"},
        "scalestudy.train.trainer": {"scalestudy.plan.grid"},
    }
    assert find_cycle(folder_graph(edges)) == ["plan", "train", "plan"]
    runner = "scalestudy.workloads.command.runner"  # imports the analysis inside a function
    inside = imports_of(runner, module_level_only=False)
    assert any(name == "scalestudy.analysis.contention" for name, _ in inside)
    at_import = imports_of(runner, module_level_only=True)
    assert not any(name == "scalestudy.analysis.contention" for name, _ in at_import)


HELPERS = ("atomic", "progress", "provenance", "contract", "commandline")  # top-level: every folder may use


def diagram() -> str:
    """The folders' import graph as the Mermaid flowchart docs/architecture.md shows (A --> B: A
    imports from B), the shared top-level helpers left out."""
    folders = folder_graph()
    lines = ["flowchart TD"]
    for source in sorted(folders):
        if source in HELPERS:
            continue
        for target in sorted(folders[source] - set(HELPERS) - {"scalestudy"}):
            lines.append(f"  {source} --> {target}")
    return "\n".join(lines)


DIAGRAM_START, DIAGRAM_END = "```mermaid\n", "\n```"


def documented_diagram(text: str) -> str:
    section = text.split("## Import graph", 1)[1]
    return section.split(DIAGRAM_START, 1)[1].split(DIAGRAM_END, 1)[0]


def test_the_architecture_pages_import_diagram_is_the_import_graph():
    """Redraw it with `python -m tests.test_import_graph --write` after an import between folders changes."""
    text = (REPO / "docs/architecture.md").read_text()
    assert documented_diagram(text) == diagram(), "run: python -m tests.test_import_graph --write"


def write_diagram() -> None:
    path = REPO / "docs/architecture.md"
    text = path.read_text()
    old = documented_diagram(text)
    path.write_text(
        text.replace(DIAGRAM_START + old + DIAGRAM_END, DIAGRAM_START + diagram() + DIAGRAM_END, 1)
    )


# --- the rule files --------------------------------------------------------------------------------

RULE_FILES = sorted((REPO / "rules").rglob("*.smk"))
# the helpers every rule file may use (snakemake-workflows' layout), split by role under rules/common/
SHARED_RULE_FILES = {f"rules/common/{p.name}" for p in (REPO / "rules/common").glob("*.smk")}


def rule_file_name(path: Path) -> str:
    return str(path.relative_to(REPO))


def top_level_names(path: Path) -> set[str]:
    """Names a rule file binds at its top level (assignments and functions)."""
    text = path.read_text()
    assigned = re.findall(r"^([A-Za-z_]\w*)\s*(?::[^=\n]+)?=(?!=)", text, re.M)
    return set(assigned) | set(re.findall(r"^def (\w+)", text, re.M))


def foreign_globals() -> list[str]:
    """`file: NAME (home)` for every name a rule file (or the Snakefile) uses that another rule file
    than the shared ones bind: rule files share outputs through provide()/provided(), rules.<name>,
    and the hooks and gates through one call each (rules/common/hooks.smk)."""
    homes = {name: rule_file_name(path) for path in RULE_FILES for name in top_level_names(path)}
    found = []
    for path in [*RULE_FILES, REPO / "Snakefile"]:
        text, own = path.read_text(), rule_file_name(path)
        for name, home in sorted(homes.items()):
            if home != own and home not in SHARED_RULE_FILES and re.search(rf"(?<![.\w]){name}\b", text):
                found.append(f"{own}: {name} ({home})")
    return found


def test_no_rule_file_reads_another_rule_files_globals():
    assert len(RULE_FILES) > 15 and len(SHARED_RULE_FILES) > 1
    assert foreign_globals() == []


def test_rule_files_change_the_environment_only_inside_functions():
    """Including a rule file defines rules and helpers; the environment the jobs inherit is set by
    prepare_workflow() and the start hooks, which the Snakefile calls explicitly."""
    for path in [*RULE_FILES, REPO / "Snakefile"]:
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if re.match(r"^(os\.environ|_launch\.put_interpreter_first|_submit_retry\.put_first)", line):
                raise AssertionError(f"{path.name}:{number} changes the environment on include: {line}")


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        write_diagram()
        print(f"wrote the import diagram of {REPO / 'docs/architecture.md'}")


def imports_of_test_modules(root: Path) -> list[tuple[str, str]]:
    """(file, test module) of every import of a test module (tests.test_*) under `root`."""
    found = []
    for path in sorted(root.glob("**/*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""] + [f"{node.module}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            found += [
                (str(path.relative_to(root)), name)
                for name in names
                if re.fullmatch(r"tests\.test_\w+", name)
            ]
    return found


def test_no_test_module_imports_another_test_modules_contents():
    """Tests share helpers through helper modules (tests/*.py not named test_*), never by importing
    a test module (its fixtures and tests would run twice; its helpers have no home)."""
    assert imports_of_test_modules(REPO / "tests") == []


def test_the_test_module_import_finder_finds_both_forms(tmp_path):
    (tmp_path / "a.py").write_text(
        "from tests.test_x import helper\nimport tests.test_y\nfrom tests import lm_runs, test_z\n"
    )
    assert imports_of_test_modules(tmp_path) == [
        ("a.py", "tests.test_x"),
        ("a.py", "tests.test_y"),
        ("a.py", "tests.test_z"),
    ]
