"""Grid points and run configs: what each job trains, derived from config alone."""

import copy
import json
import re
from pathlib import Path

import pytest
import yaml

from scalestudy.plan import grid, schema
from tests.conftest import REPO


def test_the_schema_ships_with_the_package_and_the_repository_links_to_it():
    import tomllib

    assert Path(schema.PATH) == REPO / "scalestudy/plan/schema.yaml"
    assert (REPO / "config/schema.yaml").resolve() == Path(schema.PATH).resolve()
    package_data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert {"schema.yaml", "schema/*.yaml"} <= set(package_data["scalestudy.plan"])
    assert (
        schema.defaults("cluster")["gpus_per_node"]
        == yaml.safe_load((Path(schema.PATH).parent / "schema/cluster.yaml").read_text())["$defs"]["cluster"][
            "properties"
        ]["gpus_per_node"]["default"]
    )


def test_snakemakes_validate_gets_the_yaml_schema_as_json_and_the_file_goes_afterwards():
    as_written = schema.read(schema.PATH, yaml.SafeLoader)  # PyYAML's pure-Python loader
    with schema.as_json_file() as path:
        assert json.loads(Path(path).read_text()) == as_written
    assert not Path(path).exists()
    assert (
        schema.node() == as_written
        and schema.node("train", "epochs") == as_written["properties"]["train"]["properties"]["epochs"]
    )
    with pytest.raises(KeyError, match=r"schema\.yaml: no 'nosuch' under train's properties"):
        schema.node("train", "nosuch")


def test_strong_scaling_splits_the_global_batch(demo_config):
    point = grid.scaling_point(demo_config, "strong", 2, 0)
    run = grid.run_config(demo_config, point)
    assert run["global_batch"] == demo_config["scaling"]["strong_global_batch"]
    assert run["per_gpu_batch"] * 2 == run["global_batch"]
    assert run["world_size"] == 2 and run["mode"] == "strong"


def test_weak_scaling_keeps_the_per_gpu_batch(demo_config):
    runs = [grid.run_config(demo_config, grid.scaling_point(demo_config, "weak", w, 0)) for w in (1, 2)]
    assert {run["per_gpu_batch"] for run in runs} == {demo_config["scaling"]["weak_per_gpu_batch"]}
    assert [run["global_batch"] for run in runs] == [runs[0]["per_gpu_batch"], 2 * runs[0]["per_gpu_batch"]]


def test_repeats_get_their_own_seed(demo_config):
    seeds = {
        grid.run_config(demo_config, grid.scaling_point(demo_config, "weak", 1, r))["seed"] for r in range(3)
    }
    assert len(seeds) == 3


def test_indivisible_strong_batch_is_a_clear_error(demo_config):
    demo_config["scaling"]["strong_global_batch"] = 100
    with pytest.raises(ValueError, match="strong_global_batch=100.*3 ranks"):
        grid.scaling_point(demo_config, "strong", 3, 0)


def test_sensitivity_grid_is_the_full_product(demo_config):
    axes = demo_config["sensitivity"]["axes"]
    points = grid.sensitivity_points(demo_config)
    expected = len(axes["precision"]) * len(axes["per_gpu_batch"]) * len(axes["bucket_cap_mb"])
    assert len(points) == expected == len({p.run_dir for p in points})


def test_changing_one_sweep_value_changes_only_the_points_that_carry_it(demo_config):
    before = {p.run_dir: grid.run_config(demo_config, p) for p in grid.all_points(demo_config)}
    changed = copy.deepcopy(demo_config)
    changed["sensitivity"]["axes"]["bucket_cap_mb"] = [1, 50]
    after = {p.run_dir: grid.run_config(changed, p) for p in grid.all_points(changed)}
    unchanged = {k for k in before if k in after and before[k] == after[k]}
    assert unchanged == {k for k in before if "bucket25" not in k}
    assert {k for k in after if k not in before} == {
        k.replace("bucket25", "bucket50") for k in before if "bucket25" in k
    }


def test_bucket_sizes_have_one_spelling_in_paths():
    assert grid.format_number(1.0) == "1"
    assert grid.format_number(2.5) == "2.5"
    assert grid.format_number(25) == "25"


def test_a_point_is_found_by_its_name(demo_config):
    point = grid.point_by_name(demo_config, "sensitivity", "bf16/bs16_bucket25")
    assert point == grid.sensitivity_point(
        demo_config, {"precision": "bf16", "per_gpu_batch": 16, "bucket_cap_mb": 25}
    )
    assert point.run_dir == "results/runs/sensitivity/bf16/bs16_bucket25"
    assert grid.point_by_name(demo_config, "scaling", "weak/w2_r0") == grid.scaling_point(
        demo_config, "weak", 2, 0
    )
    assert grid.point_by_name(demo_config, "profile", "w2") == grid.profile_point(demo_config, 2)
    assert grid.point_by_name(demo_config, "baseline", "default") == grid.baseline_point(demo_config)


@pytest.mark.parametrize(
    ("stage", "name"),
    [
        ("sensitivity", "bf16/bs16_bucket25.0"),  # one spelling only: the grid's
        ("sensitivity", "bf16/bs64_bucket25"),  # not in this config's sweep
        ("scaling", "strong/w3_r0"),
    ],
)
def test_a_name_outside_the_grid_is_a_clear_error(demo_config, stage, name):
    with pytest.raises(ValueError, match=rf"stage {stage} has no grid point '{re.escape(name)}'.*\(.+/.+\)"):
        grid.point_by_name(demo_config, stage, name)


def test_an_unknown_stage_is_a_clear_error(demo_config):
    with pytest.raises(ValueError, match="unknown stage 'sweep'"):
        grid.point_by_name(demo_config, "sweep", "x")


def test_profile_point_stops_after_the_window(demo_config):
    run = grid.run_config(demo_config, grid.profile_point(demo_config, 2))
    window = demo_config["profiling"]
    assert run["profile"] == {
        "tool": window["tool"],
        "start_step": window["start_step"],
        "steps": window["steps"],
    }
    assert run["max_steps_per_epoch"] > window["start_step"] + window["steps"]


def test_a_profile_point_whose_epoch_is_shorter_than_the_window_gets_whole_epochs():
    """config.yaml at 8 GPUs: 50,000 / 8 / 256 = 24 steps per epoch, the window ends at step 30."""
    from snakemake.utils import validate

    config = yaml.safe_load((REPO / "config/config.yaml").read_text())
    validate(config, str(REPO / "config/schema.yaml"))
    window = config["profiling"]
    needed = window["start_step"] + window["steps"] + 1
    for world in (1, 8, 16):
        run = grid.run_config(config, grid.profile_point(config, world))
        per_epoch = 50_000 // world // window["per_gpu_batch"]
        if run["max_steps_per_epoch"] is not None:
            per_epoch = min(per_epoch, run["max_steps_per_epoch"])
        assert per_epoch * run["epochs"] >= needed, (world, run["epochs"], per_epoch)
