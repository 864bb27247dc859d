"""One home for each constant and fallback (issue 44, point 3): the package's code (docstrings left
out) spells each of them in its home module only, and the modules that used to restate a schema
default read it from the schema. Each check walks the syntax trees of scalestudy/*.py, so a copy that
comes back fails here naming its file and line."""

from __future__ import annotations

import ast
import functools
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from scalestudy import contract
from scalestudy.analysis import metrics, series
from scalestudy.plan import cluster, grid, paths, runfiles, schema
from tests.conftest import REPO

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


def probe_package(tmp_path: Path, code: str, folder: str = "") -> Path:
    """A package `scalestudy` under tmp_path holding one module, <folder>/probe.py, of `code`: what a
    finder is tried on (its root)."""
    package = tmp_path / "scalestudy"
    (package / folder).mkdir(parents=True)
    (package / folder / "probe.py").write_text(code)
    return package


def _code_string(node: ast.AST, module: Module) -> bool:
    """A string constant of the code (a docstring is not)."""
    return (
        isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in module.docstrings
    )


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


def fallbacks(word: str, root: Path = PACKAGE, compared: bool = True) -> list[tuple[str, int]]:
    """Where the code says that a missing value means `word`: as a fallback (x or "ddp", a default
    argument, .fillna("ddp"), .isin(["ddp", ""]), {"parallelism": "ddp"}, and with `compared` also
    p == "ddp", ...)."""
    found = []
    for where, line, node, module in strings(word, root=root):
        parent = module.parents.get(id(node))
        if isinstance(parent, ast.List | ast.Tuple):
            parent = module.parents.get(id(parent))
        if (
            isinstance(parent, ast.BoolOp | ast.IfExp | ast.arguments)
            or (compared and isinstance(parent, ast.Compare))
            or (isinstance(parent, ast.Dict) and any(value is node for value in parent.values))
            or _called(parent) in FALLBACK_CALLS
        ):
            found.append((where, line))
    return found


def test_a_missing_parallelism_means_ddp_in_one_place():
    found = fallbacks("ddp")
    bad = outside(found, "scalestudy/plan/grid.py")
    assert not bad, f"DDP fallbacks outside plan/grid.py: {bad}"
    assert "scalestudy/plan/grid.py" in {where for where, *_ in strings("ddp")}  # DEFAULT_PARALLELISM
    assert series.DDP == metrics.SERIES_DEFAULTS["parallelism"] == grid.DEFAULT_PARALLELISM


def test_the_fallback_finder_finds_the_old_spellings(tmp_path):
    package = probe_package(
        tmp_path,
        'def f(t, p="ddp"):\n'
        '    """A docstring may say "ddp"."""\n'
        '    rows = t["parallelism"].fillna("ddp").isin(["ddp", ""])\n'
        '    return rows, p or "ddp", {"parallelism": "ddp"}, ("ddp", "fsdp")\n',
    )
    assert sorted(fallbacks("ddp", package)) == [("scalestudy/probe.py", line) for line in (1, 3, 3, 4, 4)]


def test_a_workload_without_an_optimizer_of_its_own_trains_with_the_specs_default_only():
    """The optimizer of a run config without one is its workload's (WorkloadSpec.default_optimizer,
    whose own default is the one "sgd" fallback): no `or "sgd"` after it."""
    from scalestudy.plan.workload_spec import WorkloadSpec
    from scalestudy.train import optim

    assert fallbacks("sgd", compared=False) == []  # `name == "sgd"` asks which optimizer it is
    assert WorkloadSpec.__dataclass_fields__["default_optimizer"].default == "sgd"
    assert optim.optimizer_name({"workload": "no-such-workload", "optimizer": None}) == "sgd"  # the default's


def test_the_default_sensitivity_axes_are_the_schemas():
    """The literal (precision, per_gpu_batch, bucket_cap_mb) is only grid.NAME_ORDER: the order of a
    point's name, which must not follow the schema (a changed default would rename every point)."""
    axes = tuple(schema.node("sensitivity", "axes")["default"])
    assert axes == metrics.DEFAULT_AXES
    assert outside(collections_equal_to(axes), "scalestudy/plan/grid.py") == []


PRECISIONS = {"fp32", "fp16", "bf16"}


def precision_lists(root: Path = PACKAGE) -> list[str]:
    """Where the code spells the precisions out: a tuple, list or dict whose items or string keys
    include fp32, fp16 and bf16 (whatever its values), or one string listing them ("fp32,bf16,fp16")."""
    found = []
    for where, module in parsed(root).items():
        for node in ast.walk(module.tree):
            if isinstance(node, ast.Tuple | ast.List | ast.Set):
                items = [literal(item) for item in node.elts]
            elif isinstance(node, ast.Dict):
                items = [literal(key) for key in node.keys if key is not None]
            elif _code_string(node, module):
                items = re.split(r"[\s,;/]+", node.value)
            else:
                continue
            if {item for item in items if isinstance(item, str)} >= PRECISIONS:
                found.append(f"{where}:{node.lineno}")
    return found


def test_the_precision_order_is_the_schemas_enum_with_tf32():
    assert tuple(schema.definition("precision")["enum"]) == metrics.PRECISION_ORDER
    assert metrics.PRECISION_ORDER.index("tf32") == metrics.PRECISION_ORDER.index("fp32") + 1
    assert precision_lists() == []


def test_the_precision_finder_sees_keys_items_and_joined_strings(tmp_path):
    package = probe_package(
        tmp_path,
        "DTYPES = {'fp32': None, 'tf32': None, 'bf16': torch.bfloat16, 'fp16': torch.float16}\n"
        "ORDER = ('fp32', 'fp16', 'bf16')\n"
        "DEFAULT = 'fp32,bf16,fp16'\n"
        "AUTOCAST = {'bf16': torch.bfloat16, 'fp16': torch.float16}\n",
    )
    assert precision_lists(package) == [f"scalestudy/probe.py:{line}" for line in (1, 2, 3)]


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


def stop_signal_names(root: Path = PACKAGE) -> list[tuple[str, int]]:
    """signal.SIGUSR1 (an attribute), or USR1 in a string (sbatch's --signal=USR1@N)."""
    found = []
    for where, module in parsed(root).items():
        for node in ast.walk(module.tree):
            attribute = isinstance(node, ast.Attribute) and node.attr == "SIGUSR1"
            if attribute or (_code_string(node, module) and re.search(r"\bUSR1\b", node.value)):
                found.append((where, node.lineno))
    return found


def test_the_stop_signals_are_named_in_the_contract_only():
    assert outside(stop_signal_names(), "scalestudy/contract.py") == []
    assert "--signal=USR1@90" in cluster.slurm_extra(
        {**cluster.settings({"cluster": {"gpus_per_node": 1}}), "signal_lead_s": 90}, 1
    )


def test_the_stop_signal_finder_sees_the_attribute_and_the_string(tmp_path):
    package = probe_package(
        tmp_path,
        '"""USR1 in a docstring"""\nimport signal\nSTOP = signal.SIGUSR1\noption = f"--signal=USR1@{lead}"\n',
    )
    assert stop_signal_names(package) == [("scalestudy/probe.py", 3), ("scalestudy/probe.py", 4)]


def schema_enums() -> dict[frozenset, str]:
    """Every enum of the schema (two values or more, null left out) -> the setting that has it."""
    found: dict[frozenset, str] = {}

    def walk(node, path: tuple[str, ...]) -> None:
        node = schema.resolved(node)
        values = frozenset(value for value in node.get("enum") or () if value is not None)
        if len(values) > 1:
            found.setdefault(values, ".".join(path))
        for key, entry in (node.get("properties") or {}).items():
            walk(entry, (*path, key))
        if isinstance(node.get("items"), dict):
            walk(node["items"], path)

    walk(schema.load(), ())
    return found


def enum_copies(folders: tuple[str, ...], root: Path = PACKAGE) -> list[str]:
    """Tuples, lists and sets of strings under `folders` (scalestudy/launch, ...) equal to a schema
    enum, whatever their order: ("auto", "local", "srun") beside cluster.launcher's enum."""
    enums = schema_enums()
    found = []
    for where, module in parsed(root).items():
        if not where.startswith(folders):
            continue
        for node in ast.walk(module.tree):
            value = literal(node) if isinstance(node, ast.Tuple | ast.List | ast.Set) else None
            if value and all(isinstance(item, str) for item in value) and frozenset(value) in enums:
                found.append(f"{where}:{node.lineno} {enums[frozenset(value)]}")
    return found


def test_the_launcher_the_cluster_and_the_data_commands_read_their_choices_from_the_schema():
    """cluster.launcher's and train.device's choices were spelled in plan/cluster.py, launch/launcher.py
    and launch/distributed.py; the cluster's minimums, tokenize's (0, 1) likewise (schema.Rule now)."""
    folders = (
        "scalestudy/launch/",
        "scalestudy/data/",
        "scalestudy/plan/cluster.py",
        "scalestudy/preflight/site.py",
    )
    assert enum_copies(folders) == []


def test_the_enum_finder_sees_a_copy_in_any_order(tmp_path):
    code = 'LAUNCHERS = ("local", "auto", "srun")\nOTHER = ("auto", "local")\n'
    assert enum_copies(("scalestudy/launch/",), probe_package(tmp_path, code, "launch")) == [
        "scalestudy/launch/probe.py:1 cluster.launcher"
    ]


# (module, name, key path of its value, schema path): a default the module takes from the schema.
SCHEMA_DEFAULTS = [
    ("scalestudy.preflight.collectives", "SETTINGS_DEFAULTS", ("iters",), ("comm_bench", "iters")),
    ("scalestudy.preflight.collectives", "SETTINGS_DEFAULTS", ("max_bytes",), ("comm_bench", "max_bytes")),
    ("scalestudy.preflight.collectives", "SETTINGS_DEFAULTS", ("timeout_s",), ("train", "pg_timeout_s")),
    ("scalestudy.train.gpu_monitor", "DEFAULT_INTERVAL_S", (), ("train", "monitor_interval_s")),
    ("scalestudy.data.tokenize", "DEFAULT_TEST_FRACTION", (), ("data", "test_fraction")),
    *(("scalestudy.data.fetch", "DEFAULTS", (key,), ("data", key)) for key in ("url", "md5", "size_bytes")),
    ("scalestudy.data.fetch", "SYNTHETIC_TEXT", ("bytes",), ("data", "synthetic_text", "bytes")),
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


def schema_scalar_defaults() -> dict[str, list]:
    """Every scalar default the schema gives (not null), by its key's name, over every section."""
    found: dict[str, list] = {}

    def walk(node: dict) -> None:
        for key, entry in (node.get("properties") or {}).items():
            entry = schema.resolved(entry)
            default = entry.get("default")
            if default is not None and not isinstance(default, dict | list):
                found.setdefault(key, []).append(default)
            walk(entry)

    walk(schema.load())
    return found


def get_fallbacks(root: Path = PACKAGE) -> list[tuple[str, int]]:
    """`x.get("<key>", <literal>)` whose literal is the schema's default of a key of that name: a
    schema default restated as a fallback (tracking's .get("timeout_s", 5), the grid's
    .get("test_fraction", 0.1)); the code reads schema.setting() or a filled-in section instead."""
    defaults = schema_scalar_defaults()
    found = []
    for where, module in parsed(root).items():
        for node in ast.walk(module.tree):
            if not (isinstance(node, ast.Call) and _called(node) == "get" and len(node.args) == 2):
                continue
            key, value = (literal(arg) for arg in node.args)
            if any(type(value) is type(default) and value == default for default in defaults.get(key, [])):
                found.append((where, node.lineno))
    return found


def test_no_module_restates_a_schema_default_as_a_get_fallback():
    assert get_fallbacks() == []


def test_the_get_fallback_finder_finds_the_old_spellings(tmp_path):
    package = probe_package(
        tmp_path,
        'timeout = float(section.get("timeout_s", 5))\n'
        'live = section.get("live", True)\n'
        'corpus = data.get("synthetic_text", {}).get("bytes", 600_000)\n'
        'other = section.get("timeout_s", 7)\n',  # not the schema's default: another thing,
    )
    assert sorted(get_fallbacks(package)) == [("scalestudy/probe.py", line) for line in (1, 2, 3)]


# The command lines whose options give a study setting: each option's default is the schema's, read
# from it (module -> {option: setting}); an option with a literal default that names a setting of these
# sections fails too (a new --retries 5 beside the schema's 3).
COMMAND_SETTINGS = {
    "scalestudy/data/fetch.py": {
        "--timeout": ("data", "timeout_s"),
        "--retries": ("data", "retries"),
        "--train-per-class": ("data", "synthetic", "train_per_class"),
        "--test-per-class": ("data", "synthetic", "test_per_class"),
        "--seed": ("data", "synthetic", "seed"),
        "--text-bytes": ("data", "synthetic_text", "bytes"),
    },
    "scalestudy/data/tokenize.py": {"--test-fraction": ("data", "test_fraction")},
    "scalestudy/preflight/site.py": {
        "--backend": ("train", "backend"),
        "--device": ("train", "device"),
        "--timeout-s": ("site_check", "timeout_s"),
    },
    "scalestudy/profiling/ncu.py": {
        "--top-kernels": ("profiling", "ncu", "top_kernels"),
        "--launch-count": ("profiling", "ncu", "launch_count"),
    },
}


def option_defaults(where: str, root: Path = PACKAGE) -> dict[str, ast.AST | None]:
    """{option: its default's expression (None: no default)} of every add_argument in a module."""
    found = {}
    for node in ast.walk(parsed(root)[where].tree):
        if _called(node) == "add_argument" and node.args and isinstance(node.args[0], ast.Constant):
            default = next((keyword.value for keyword in node.keywords if keyword.arg == "default"), None)
            found[str(node.args[0].value)] = default
    return found


def literal_setting_defaults(where: str, sections: set[tuple[str, ...]], root: Path = PACKAGE) -> list[str]:
    """The options of a module with a literal default (not an empty one) whose name is a key of one
    of `sections` (--retries: retries; --timeout: timeout_s)."""
    keys = {key for section in sections for key in schema.node(*section)["properties"]}
    found = []
    for option, default in option_defaults(where, root).items():
        name = option.removeprefix("--").replace("-", "_")
        value = literal(default) if default is not None else None
        named = option in COMMAND_SETTINGS.get(where, {}) or {name, f"{name}_s"} & keys
        if named and value not in (None, False, "", [], ()):
            found.append(f"{where}: {option} default={ast.unparse(default)}")
    return found


@pytest.mark.parametrize("where", sorted(COMMAND_SETTINGS))
def test_a_command_lines_defaults_of_study_settings_are_read_from_the_schema(where):
    options = option_defaults(where)
    assert set(COMMAND_SETTINGS[where]) <= set(options), where
    sections = {setting[:-1] for setting in COMMAND_SETTINGS[where].values()}
    assert literal_setting_defaults(where, sections) == []


def test_the_fetch_commands_defaults_are_the_schemas():
    """--retries was 5 beside the schema's 3."""
    from scalestudy.data import fetch

    args = fetch.build_parser().parse_args(["--source", "cifar10", "--out", "x"])
    for option, setting in COMMAND_SETTINGS["scalestudy/data/fetch.py"].items():
        assert getattr(args, option.removeprefix("--").replace("-", "_")) == schema.node(*setting)["default"]
    assert args.retries == 3


def test_the_option_default_finder_finds_a_literal_one(tmp_path):
    package = probe_package(
        tmp_path,
        'parser.add_argument("--retries", type=int, default=5)\n'
        'parser.add_argument("--timeout", type=float, default=60.0)\n'
        'parser.add_argument("--mirror", action="append", default=[])\n'
        'parser.add_argument("--seed", type=int, default=SEED)\n',
    )
    found = literal_setting_defaults("scalestudy/probe.py", {("data",)}, package)
    assert found == [
        "scalestudy/probe.py: --retries default=5",
        "scalestudy/probe.py: --timeout default=60.0",
    ]


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
