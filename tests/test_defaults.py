"""One home for every default: the schema (scalestudy/plan/schema.yaml). The trainer's defaults for
the study settings are read from it, no module gives a run-config key a default of its own, and a
run gets the same effective config however it is started: through Snakemake (the grid's run
config), `python -m scalestudy.train` with only the keys it requires, or the benchmark."""

from __future__ import annotations

import ast
import json
from pathlib import Path

from scalestudy.benchmark import project
from scalestudy.plan import grid, runconfig, schema
from scalestudy.train import program
from tests.conftest import REPO


def schema_default(path: tuple[str, ...]):
    node = schema.load()
    for part in path:
        node = node["properties"][part]
    assert "default" in node, f"schema.yaml gives {'.'.join(path)} no default"
    return node["default"]


def test_every_study_setting_of_the_trainer_takes_the_schemas_default():
    assert len(runconfig.STUDY_KEYS) > 30
    for key, path in runconfig.STUDY_KEYS.items():
        assert runconfig.DEFAULTS[key] == schema_default(path), key
    assert not set(runconfig.OWN_DEFAULTS) & set(runconfig.STUDY_KEYS)  # no key has two
    assert set(runconfig.DEFAULTS) == set(runconfig.OWN_DEFAULTS) | set(runconfig.STUDY_KEYS)


def test_every_key_the_grid_copies_from_the_study_config_is_a_study_key(demo_config):
    """A run config holds labels, the point's layout and the study's settings; every setting is one
    whose default the schema gives (a key added to the grid but not to STUDY_KEYS fails here)."""
    set_by_the_grid = {
        "stage",
        "point",
        "mode",
        "repeat",
        "profile",
        "nodes",
        "workload",
        "inductor_cache_dir",
    }
    for point in grid.all_points(demo_config):
        run = grid.run_config(demo_config, point)
        settings = set(run) - set(runconfig.REQUIRED) - set_by_the_grid - {"per_gpu_batch"}
        assert settings <= set(runconfig.STUDY_KEYS), sorted(settings - set(runconfig.STUDY_KEYS))


def literal_defaults(keys: set[str], root: Path = REPO / "scalestudy") -> list[str]:
    """`x.get("<key>", <literal>)` / `x.setdefault(...)` of a run-config key anywhere under root."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            if node.func.attr not in ("get", "setdefault") or len(node.args) != 2:
                continue
            key, default = node.args
            literal = isinstance(default, ast.Constant | ast.List | ast.Tuple | ast.Dict)
            none = isinstance(default, ast.Constant) and default.value is None
            if isinstance(key, ast.Constant) and key.value in keys and literal and not none:
                found.append(f"{path.relative_to(root)}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_module_gives_a_run_config_setting_a_default_of_its_own():
    assert literal_defaults(set(runconfig.STUDY_KEYS)) == []


def test_the_literal_default_finder_finds_one(tmp_path):
    (tmp_path / "planted.py").write_text(
        'def f(run):\n    return run.get("precision", "fp32"), run.get("lr"), run.get("seed", None)\n'
    )
    assert literal_defaults({"precision", "lr", "seed"}, tmp_path) == [
        "planted.py:2: run.get('precision', 'fp32')"
    ]


def effective(run: dict) -> dict:
    return {key: value for key, value in {**runconfig.DEFAULTS, **run}.items() if key in runconfig.STUDY_KEYS}


def test_a_run_started_each_way_gets_the_same_effective_config(tmp_path):
    """The schema's defaults as the study (the smallest valid config), a scaling point started through
    the grid (Snakemake), by `python -m scalestudy.train` with only the keys the trainer requires, and
    by the benchmark (which starts from the baseline point and changes what it says it changes):
    one effective config of the study's settings."""
    from scalestudy.plan.studyconfig import load as study_config

    path = tmp_path / "defaults.yaml"
    required = schema.load()["required"]
    given = {"study": "{name: defaults}", "data": "{source: synthetic}"}
    path.write_text("".join(f"{section}: {given.get(section, '{}')}\n" for section in required))
    config = study_config(path)
    through_snakemake = grid.run_config(config, grid.scaling_points(config)[0])

    minimal = {key: through_snakemake[key] for key in runconfig.REQUIRED}
    args = program.parse_args(["--run-config-json", json.dumps(minimal), "--out-dir", str(tmp_path / "out")])
    _, through_the_cli = runconfig.load_run_config(args)
    assert effective(through_snakemake) == effective(through_the_cli)
    assert effective(through_the_cli)["precision"] == schema_default(("train", "precision"))

    through_the_benchmark = project.run_config(config, minimal["data_dir"], minimal["checkpoint_dir"])
    # the baseline's own settings (schema section baseline), and what the benchmark says it changes
    baseline = set(schema.defaults("baseline")) | {"loader", "warmup_epochs", "eval_max_batches", "compile"}
    same = {key: value for key, value in effective(through_snakemake).items() if key not in baseline}
    assert same == {key: effective(through_the_benchmark)[key] for key in same}
    assert len(same) > 25


def test_a_module_that_reads_the_schema_is_the_only_copy_of_it():
    assert Path(schema.PATH).resolve() == (REPO / "config/schema.yaml").resolve()
