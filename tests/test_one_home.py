"""One home for each constant and fallback (issue 44, point 3): the package's code (docstrings left
out) spells each of them in its home module only, and the modules that used to restate a schema
default read it from the schema. Each check walks the syntax trees of scalestudy/*.py, so a copy that
comes back fails here naming its file and line."""

from __future__ import annotations

import ast
import functools
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from scalestudy import contract
from scalestudy.analysis import metrics, series
from scalestudy.plan import grid, paths, runfiles, schema

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "scalestudy"


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


@dataclass(frozen=True)
class Module:
    tree: ast.Module
    parents: dict[int, ast.AST]  # id(child) -> its parent node
    docstrings: set[int]  # ids of the docstrings' constants


@functools.cache
def parsed(root: Path = PACKAGE) -> dict[str, Module]:
    """Every module under root by its path relative to root's parent ("scalestudy/plan/grid.py")."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        parents = {id(child): node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        modules[str(path.relative_to(root.parent))] = Module(tree, parents, _docstrings(tree))
    return modules


def strings(text: str, prefix: bool = False, root: Path = PACKAGE):
    """(path, line, node, module) of each string constant of the code equal to `text` (or starting
    with it: f-strings' literal parts included), docstrings left out."""
    for where, module in parsed(root).items():
        for node in ast.walk(module.tree):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
                continue
            if id(node) not in module.docstrings and (
                node.value.startswith(text) if prefix else node.value == text
            ):
                yield where, node.lineno, node, module


def literal(node: ast.AST):
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None


def collections_equal_to(value: tuple):
    """(path, line) of each tuple or list literal whose items are `value`."""
    for where, module in parsed().items():
        for node in ast.walk(module.tree):
            if isinstance(node, ast.Tuple | ast.List) and literal(node) in (value, list(value)):
                yield where, node.lineno


def outside(found, *homes: str) -> list[str]:
    return [f"{where}:{line}" for where, line, *_ in found if where not in homes]


def _called(call: ast.AST) -> str:
    return getattr(call.func, "attr", getattr(call.func, "id", "")) if isinstance(call, ast.Call) else ""


FALLBACK_CALLS = {"fillna", "Series", "isin", "eq", "get", "where", "assign"}


def ddp_fallbacks(root: Path = PACKAGE) -> list[tuple[str, int]]:
    """Where the code says that no parallelism means DDP: "ddp" as a fallback (x or "ddp", a default
    argument, .fillna("ddp"), .isin(["ddp", ""]), {"parallelism": "ddp"}, p == "ddp", ...)."""
    found = []
    for where, line, node, module in strings("ddp", root=root):
        parent = module.parents.get(id(node))
        if isinstance(parent, ast.List | ast.Tuple):
            parent = module.parents.get(id(parent))
        if (
            isinstance(parent, ast.BoolOp | ast.IfExp | ast.Compare | ast.arguments)
            or (isinstance(parent, ast.Dict) and any(value is node for value in parent.values))
            or _called(parent) in FALLBACK_CALLS
        ):
            found.append((where, line))
    return found


def test_a_missing_parallelism_means_ddp_in_one_place():
    found = ddp_fallbacks()
    bad = outside(found, "scalestudy/plan/grid.py")
    assert not bad, f"DDP fallbacks outside plan/grid.py: {bad}"
    assert "scalestudy/plan/grid.py" in {where for where, *_ in strings("ddp")}  # DEFAULT_PARALLELISM
    assert series.DDP == metrics.SERIES_DEFAULTS["parallelism"] == grid.DEFAULT_PARALLELISM


def test_the_fallback_finder_finds_the_old_spellings(tmp_path):
    package = tmp_path / "scalestudy"
    package.mkdir()
    (package / "probe.py").write_text(
        'def f(t, p="ddp"):\n'
        '    """A docstring may say "ddp"."""\n'
        '    rows = t["parallelism"].fillna("ddp").isin(["ddp", ""])\n'
        '    return rows, p or "ddp", {"parallelism": "ddp"}, ("ddp", "fsdp")\n'
    )
    assert sorted(ddp_fallbacks(package)) == [("scalestudy/probe.py", line) for line in (1, 3, 3, 4, 4)]


def test_the_default_sensitivity_axes_are_the_schemas():
    """The literal (precision, per_gpu_batch, bucket_cap_mb) is only grid.NAME_ORDER: the order of a
    point's name, which must not follow the schema (a changed default would rename every point)."""
    axes = tuple(schema.node("sensitivity", "axes")["default"])
    assert axes == metrics.DEFAULT_AXES
    assert outside(collections_equal_to(axes), "scalestudy/plan/grid.py") == []


def test_the_precision_order_is_the_schemas_enum_with_tf32():
    assert tuple(schema.definition("precision")["enum"]) == metrics.PRECISION_ORDER
    assert metrics.PRECISION_ORDER.index("tf32") == metrics.PRECISION_ORDER.index("fp32") + 1
    copies = []
    for where, module in parsed().items():
        for node in ast.walk(module.tree):
            value = literal(node) if isinstance(node, ast.Tuple | ast.List | ast.Dict) else None
            keys = list(value) if isinstance(value, tuple | list | dict) else []
            if {"fp32", "fp16", "bf16"} <= set(k for k in keys if isinstance(k, str)) and (
                not isinstance(value, dict) or all(isinstance(v, int) for v in value.values())
            ):
                copies.append(f"{where}:{node.lineno}")
    assert copies == []


@pytest.mark.parametrize(
    ("text", "prefix", "home", "value"),
    [
        ("manifest.json", False, "scalestudy/plan/paths.py", paths.PACKED_MANIFEST),
        ("finished.json", False, "scalestudy/plan/runfiles.py", runfiles.FINISHED_MARK),
        ("superseded", False, "scalestudy/plan/runfiles.py", runfiles.SUPERSEDED),
        ("not measured", True, "scalestudy/plan/runfiles.py", runfiles.NOT_MEASURED),
    ],
)
def test_each_file_name_and_word_is_spelt_in_its_home_only(text, prefix, home, value):
    """The literal (for "not measured" also a string or f-string starting with it) is in its home
    only; a key of a record (tracking's {"superseded": ...}) is another thing of the same name."""
    found = [
        (where, line)
        for where, line, node, module in strings(text, prefix)
        if not (isinstance(parent := module.parents.get(id(node)), ast.Dict) and node in parent.keys)
    ]
    assert value == text
    assert [where for where, _ in found] == [home], f"{text!r} at {found}"


@pytest.mark.parametrize("name", ["PROFILE_OPS_COLUMNS", "WHOLE_RUN_KEYS"])
def test_the_column_lists_are_in_runfiles_only(name):
    assert outside(collections_equal_to(getattr(runfiles, name)), "scalestudy/plan/runfiles.py") == []


def exit_values(node: ast.AST) -> list[ast.AST]:
    """The exit codes a node gives: return X, sys.exit(X), SystemExit(X), EXIT_... = X (also
    EXIT_A, EXIT_B = X, Y)."""
    if isinstance(node, ast.Return):
        return [node.value]
    if _called(node) in {"exit", "SystemExit", "_exit"}:
        return node.args[:1]
    if isinstance(node, ast.Assign):
        pairs = []
        for target in node.targets:
            if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                pairs += zip(target.elts, node.value.elts, strict=False)
            else:
                pairs.append((target, node.value))
        return [value for name, value in pairs if getattr(name, "id", "").startswith("EXIT_")]
    return []


def test_exit_code_2_has_one_name():
    """Bad input exits contract.EXIT_BAD_CONFIG (2): no module spells the 2 or names it again."""
    found = [
        (where, node.lineno)
        for where, module in parsed().items()
        for node in ast.walk(module.tree)
        for value in exit_values(node)
        if isinstance(value, ast.Constant) and type(value.value) is int and value.value == 2
    ]
    assert outside(found, "scalestudy/contract.py") == []
    assert contract.EXIT_BAD_CONFIG == 2


def test_the_exit_code_finder_sees_each_spelling():
    code = "def main():\n    return 2\nsys.exit(2)\nEXIT_A, EXIT_B = 2, 3\nEXIT_C = 2\nx = 2\n"
    found = [
        n.lineno for n in ast.walk(ast.parse(code)) for v in exit_values(n) if getattr(v, "value", 0) == 2
    ]
    assert sorted(found) == [2, 3, 4, 5]


def test_the_stop_signals_are_named_in_the_contract_only():
    found = []
    for where, module in parsed().items():
        for node in ast.walk(module.tree):
            if isinstance(node, ast.Attribute) and node.attr == "SIGUSR1":
                found.append((where, node.lineno))
    assert outside(found, "scalestudy/contract.py") == []


# (module, name, key path of its value, schema path): a default the module takes from the schema.
SCHEMA_DEFAULTS = [
    ("scalestudy.preflight.collectives", "SETTINGS_DEFAULTS", ("iters",), ("comm_bench", "iters")),
    ("scalestudy.preflight.collectives", "SETTINGS_DEFAULTS", ("max_bytes",), ("comm_bench", "max_bytes")),
    ("scalestudy.preflight.collectives", "SETTINGS_DEFAULTS", ("timeout_s",), ("train", "pg_timeout_s")),
    ("scalestudy.train.gpu_monitor", "DEFAULT_INTERVAL_S", (), ("train", "monitor_interval_s")),
    ("scalestudy.data.tokenize", "DEFAULT_TEST_FRACTION", (), ("data", "test_fraction")),
    ("scalestudy.paper.numbers", "CONTEXT_DEFAULTS", ("confidence",), ("analysis", "confidence")),
    ("scalestudy.paper.numbers", "CONTEXT_DEFAULTS", ("parallelism",), ("scaling", "parallelism")),
    (
        "scalestudy.paper.numbers",
        "CONTEXT_DEFAULTS",
        ("min_window_samples",),
        ("analysis", "monitor", "min_window_samples"),
    ),
]


@pytest.mark.parametrize(("module", "name", "keys", "setting"), SCHEMA_DEFAULTS)
def test_a_schema_default_is_read_from_the_schema(module, name, keys, setting):
    __import__(module)
    value = getattr(sys.modules[module], name)
    for key in keys:
        value = value[key]
    assert value == schema.node(*setting)["default"]
    where = module.replace(".", "/") + ".py"
    tree = parsed()[where].tree
    assigned = [
        node.value
        for node in tree.body
        if isinstance(node, ast.Assign | ast.AnnAssign)
        and name
        in [getattr(t, "id", None) for t in (node.targets if isinstance(node, ast.Assign) else [node.target])]
    ]
    assert len(assigned) == 1, f"{where}: {name} assigned {len(assigned)} times"
    node = assigned[0]
    for key in keys:  # the entry of a dict display, if the module spells the dict out
        if isinstance(node, ast.Dict):
            node = next((v for k, v in zip(node.keys, node.values, strict=True) if literal(k) == key), None)
    assert node is None or literal(node) is None, f"{where}:{node.lineno}: {name} restates the schema"


def test_the_sbatch_wrapper_waits_the_schemas_submit_retry_minutes_by_default(tmp_path):
    from scalestudy.launch import submit_retry

    wrapper = Path(submit_retry.install(str(tmp_path))) / "sbatch"
    minutes = schema.node("cluster", "submit_retry_minutes")["default"]
    assert f"--patience-minutes {minutes} " in wrapper.read_text()
    with pytest.raises(SystemExit):  # the wrapper's own default is install()'s, none of its own
        submit_retry.main(["--skip-dir", str(tmp_path), "--", "--wrap", "true"])


def test_the_lm_presets_live_in_the_gpt_workload_and_the_schema_names_them():
    """GPT's presets are the gpt workload's (workloads/gpt/presets.py): the schema's preset enum names
    them, nothing else spells their sizes, and tokenize takes the sequence length it is given (the
    spec's preprocess options: the config's, else its preset's) rather than a default of its own."""
    from scalestudy.data import tokenize
    from scalestudy.workloads.gpt import presets

    assert schema.node("model", "gpt", "preset")["enum"] == [*presets.PRESETS, None]
    assert (
        presets.seq_len(None) == presets.PRESETS[schema.node("model", "gpt", "preset")["default"]]["seq_len"]
    )
    found = [
        (where, node.lineno)
        for where, module in parsed().items()
        for node in ast.walk(module.tree)
        if isinstance(node, ast.Dict) and {"seq_len", "d_model", "heads"} <= {literal(k) for k in node.keys}
    ]
    assert [where for where, _ in found] == ["scalestudy/workloads/gpt/presets.py"] * len(presets.PRESETS)
    assert not hasattr(tokenize, "DEFAULT_SEQ_LEN")
