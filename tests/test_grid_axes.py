"""The grid's axes: workloads, parallelism as a scaling axis, sensitivity over any run-config keys,
and the run configs of the existing studies, which must not change (no re-runs of their results)."""

from __future__ import annotations

import copy
import hashlib
import json
import subprocess
import sys

import pytest
import yaml

from scalestudy.plan import configcheck, grid, runconfig
from tests.conftest import REPO

SCHEMA = REPO / "config/schema.yaml"

# sha256 of json.dumps({run_dir: run_config}, sort_keys=True) over every grid point, computed with
# the grid before workloads and axes existed, as the jobs saw them (the sweep's bucket sizes were
# parsed from the wildcards, hence floats): the run configs of these studies must stay as they were.
RUN_CONFIG_DIGESTS = {
    "demo": (15, "da21346357dfefa442b9e5b030b6fad93eae2e15c50c724c7d2d7c1618d8fbb1"),
    # issue 51 changed the compiled study's: each run its own cache folder and its compile key's
    # artifacts (compile_cache_load), the baseline eager (baseline.compile)
    "config": (81, "19542f9fa9a5c32a8f91bbcd52e1b1907b7992be9ad3915e3836ab321471d391"),
}
DEMO_WEAK_W2 = {
    "backend": "gloo", "base_batch": 64, "bucket_cap_mb": 25, "channels_last": True,
    "checkpoint_dir": "results/checkpoints/scaling/weak/w2_r0", "checkpoint_every_steps": 20,
    "comm_hook": "none", "compile": False, "data_dir": "results/data/packed", "deterministic": False,
    "device": "cpu", "epochs": 3, "eval_max_batches": None, "global_batch": 64, "label_smoothing": 0.0,
    "loader": "tensor", "log_every_steps": 2, "lr": 0.05, "lr_scaling": "linear", "max_steps_per_epoch": 25,
    "measure_intervals": 4, "measure_steps": 16, "measure_warmup_steps": 5, "mode": "weak", "momentum": 0.9,
    "monitor_interval_s": 0.1, "nesterov": True, "nodes": 1, "num_workers": 1, "per_gpu_batch": 32,
    "pg_timeout_s": 120, "point": "weak/w2_r0", "precision": "fp32", "profile": None, "repeat": 0, "seed": 0,
    "stage": "scaling", "step_timing_every": 2, "target_accuracy": 0.25, "warmup_epochs": 0,
    "weight_decay": 0.0005, "width": 8, "world_size": 2,
}  # fmt: skip
STUDY_FP16_BS512_BUCKET5 = {
    "backend": "nccl", "base_batch": 128, "bucket_cap_mb": 5.0, "channels_last": True,
    "checkpoint_dir": "results/checkpoints/sensitivity/fp16/bs512_bucket5", "checkpoint_every_steps": 200,
    "comm_hook": "none", "compile": True, "data_dir": "results/data/packed", "deterministic": False,
    "device": "cuda", "epochs": 25, "eval_max_batches": None, "global_batch": 4096,
    "inductor_cache_dir": "results/inductor-cache/sensitivity/fp16/bs512_bucket5",
    "compile_cache_load": "results/compile/bs512_fp16_auto_ddp-bucket5_74dbe8fda0/artifacts.bin",
    "label_smoothing": 0.0, "loader": "tensor",
    "log_every_steps": 50, "lr": 0.1, "lr_scaling": "linear", "max_steps_per_epoch": None,
    "measure_intervals": 4, "measure_steps": 200, "measure_warmup_steps": 50, "mode": None, "momentum": 0.9,
    "monitor_interval_s": 0.1, "nesterov": True, "nodes": 2, "num_workers": 4, "per_gpu_batch": 512,
    "pg_timeout_s": 600, "point": "fp16/bs512_bucket5", "precision": "fp16", "profile": None, "repeat": 0,
    "seed": 0, "stage": "sensitivity", "step_timing_every": 20, "target_accuracy": 0.85, "warmup_epochs": 1,
    "weight_decay": 0.0005, "width": 64, "world_size": 8,
}  # fmt: skip


def study(name: str = "demo", **sections) -> dict:
    """config/<name>.yaml with sections replaced, validated (the schema's defaults filled in)."""
    from snakemake.utils import validate

    config = yaml.safe_load((REPO / f"config/{name}.yaml").read_text())
    config.update(copy.deepcopy(sections))
    validate(config, str(SCHEMA))
    return config


def gpt_study(**model) -> dict:
    config = study(workload={"name": "gpt"}, model={"compile": False, "gpt": model})
    config["data"]["synthetic_text"] = {"bytes": 600_000, "seed": 1}
    return config


def runs_of(config: dict) -> dict[str, dict]:
    return {point.run_dir: grid.run_config(config, point) for point in grid.all_points(config)}


# --------------------------------------------------------------------------- the existing studies


@pytest.mark.parametrize("name", RUN_CONFIG_DIGESTS)
def test_the_run_configs_of_the_existing_studies_are_unchanged(name):
    runs = runs_of(study(name))
    count, digest = RUN_CONFIG_DIGESTS[name]
    assert len(runs) == count
    assert hashlib.sha256(json.dumps(runs, sort_keys=True).encode()).hexdigest() == digest
    assert not {key for run in runs.values() for key in run} & set(grid.OMITTED_AT_DEFAULT)


def test_two_run_configs_in_full():
    assert grid.run_config(study(), grid.point_by_name(study(), "scaling", "weak/w2_r0")) == DEMO_WEAK_W2
    config = study("config")
    run = grid.run_config(config, grid.point_by_name(config, "sensitivity", "fp16/bs512_bucket5"))
    assert run == STUDY_FP16_BS512_BUCKET5
    assert json.dumps(run["bucket_cap_mb"]) == "5.0"  # as the wildcards made it: the params stay the same


def test_the_default_axes_name_the_points_as_before():
    names = [point.name for point in grid.sensitivity_points(study())]
    assert names == [
        f"{precision}/bs{batch}_bucket{bucket}"
        for precision in ("fp32", "bf16")
        for batch in (16, 32)
        for bucket in (1, 25)
    ]


def test_the_omitted_keys_are_keys_the_trainer_accepts_at_their_defaults():
    assert all(runconfig.RULES[key].accepts(runconfig.DEFAULTS[key]) for key in grid.OMITTED_AT_DEFAULT)


def test_the_run_config_rules_name_the_models_norms():
    from scalestudy.workloads.resnet_cifar import model

    assert runconfig.RULES["norm"].choices == model.NORMS


# --------------------------------------------------------------------------- train settings


def test_train_settings_away_from_the_defaults_reach_every_run_config():
    config = study()
    config["train"].update(optimizer="adamw", grad_clip=1.0, reshard_after_forward=False)
    for run in runs_of(config).values():
        assert (run["optimizer"], run["grad_clip"], run["reshard_after_forward"]) == ("adamw", 1.0, False)
        assert "workload" not in run and "parallelism" not in run


def test_train_parallelism_is_the_default_of_the_points_outside_the_scaling_axis():
    config = study()
    config["train"]["parallelism"] = "fsdp"
    runs = runs_of(config)
    ddp_scaling = {path for path in runs if path.startswith("results/runs/scaling/")}
    assert ddp_scaling and all("parallelism" not in runs[path] for path in ddp_scaling)  # scaling: [ddp]
    assert all(run["parallelism"] == "fsdp" for path, run in runs.items() if path not in ddp_scaling)


# --------------------------------------------------------------------------- parallelism axis


def test_fsdp_is_an_axis_of_the_scaling_grid():
    before = study()
    config = study(scaling={**before["scaling"], "parallelism": ["ddp", "fsdp"]})
    points = {point.name: point for point in grid.scaling_points(config)}
    assert sorted(points) == sorted(
        f"{mode}/{prefix}w{world}_r0"
        for mode in ("strong", "weak")
        for prefix in ("", "fsdp-")
        for world in (1, 2)
    )
    for name, point in points.items():
        run = grid.run_config(config, point)
        if "fsdp-" in name:
            assert run["parallelism"] == "fsdp" and run["point"] == name
            twin = grid.run_config(config, grid.point_by_name(config, "scaling", name.replace("fsdp-", "")))
            assert {key for key in run if run[key] != twin.get(key)} == {
                "parallelism",
                "point",
                "checkpoint_dir",
            }
        else:  # the ddp points are the study's as it was
            assert run == grid.run_config(before, grid.point_by_name(before, "scaling", name))


# --------------------------------------------------------------------------- sensitivity axes


def sweep_of(axes: dict, world_size: int = 2) -> list[tuple[str, dict]]:
    config = study(sensitivity={"world_size": world_size, "epochs": 1, "axes": axes})
    configcheck.check(config, SCHEMA)
    return [(point.name, grid.run_config(config, point)) for point in grid.sensitivity_points(config)]


def test_any_run_config_keys_are_axes_in_the_order_of_the_names():
    axes = {
        "optimizer": ["sgd", "adamw"],
        "per_gpu_batch": [16],
        "grad_clip": [None, 0.5],
        "nesterov": [True],
    }
    sweep = sweep_of(axes, world_size=4)
    assert [name for name, _ in sweep] == [
        "bs16/grad_clip-null_nesterov-true_optimizer-sgd",
        "bs16/grad_clip-null_nesterov-true_optimizer-adamw",
        "bs16/grad_clip-0.5_nesterov-true_optimizer-sgd",
        "bs16/grad_clip-0.5_nesterov-true_optimizer-adamw",
    ]
    for name, run in sweep:
        assert run["point"] == name and run["global_batch"] == 16 * 4 and run["world_size"] == 4
        assert run["optimizer"] == name.rsplit("optimizer-", 1)[1]
        assert run.get("grad_clip") == (0.5 if "clip-0.5" in name else None)  # null: the default, left out


def test_one_axis_names_its_points_by_its_label_alone():
    sweep = sweep_of({"per_gpu_batch": [8, 16]})
    assert [(name, run["per_gpu_batch"], run["global_batch"]) for name, run in sweep] == [
        ("bs8", 8, 16),
        ("bs16", 16, 32),
    ]


def test_point_names_do_not_depend_on_the_order_the_config_lists_the_axes_in():
    """A YAML tool that sorts the keys renames (and so re-runs) no point."""
    listed = {"precision": ["fp32"], "per_gpu_batch": [16], "bucket_cap_mb": [1], "lr": [0.1]}
    sorted_keys = dict(sorted(listed.items()))
    assert (
        [n for n, _ in sweep_of(listed)]
        == [n for n, _ in sweep_of(sorted_keys)]
        == ["fp32/bs16_bucket1_lr-0.1"]
    )


def test_the_sweep_keeps_the_stage_settings():
    sweep = sweep_of({"lr": [0.1, 0.025], "per_gpu_batch": [16], "channels_last": [False]})
    assert [name for name, _ in sweep] == [
        "bs16/channels_last-false_lr-0.1",
        "bs16/channels_last-false_lr-0.025",
    ]
    assert [(run["lr"], run["epochs"], run["channels_last"]) for _, run in sweep] == [
        (0.1, 1, False),
        (0.025, 1, False),
    ]


@pytest.mark.parametrize(
    ("value", "text"),
    [(1, "1"), (1.0, "1"), (2.5, "2.5"), (1e-05, "1e-05"), (True, "true"), (False, "false"), (None, "null")],
)
def test_values_in_names(value, text):
    assert grid.format_value(value) == text


def test_name_parts_are_single_safe_folders():
    assert grid.is_name_part("fsdp-w2_r0") and grid.is_name_part("1e-05")
    assert not any(map(grid.is_name_part, ["", ".", "..", "a/b", "a b", "x;y", "{x}"]))


# --------------------------------------------------------------------------- workloads


def test_a_gpt_run_config_carries_the_workload_and_its_model():
    config = gpt_study(preset="demo", layers=2)
    for run in runs_of(config).values():
        assert run["workload"] == "gpt"
        assert run["gpt"] == {"preset": "demo", "layers": 2, "vocab_size": None, "dropout": 0.0}
        assert not {"width", "channels_last"} & set(run)
        runconfig.validate({**runconfig.DEFAULTS, **run})


def test_a_command_run_config_carries_its_script_and_no_model():
    command = {"script": "examples/train_script.py", "args": ["--fast"], "sample_unit": "sequences"}
    config = study(workload={"name": "command", "command": command})
    for run in runs_of(config).values():
        assert run["workload"] == "command" and run["command"] == command
        assert not {"width", "channels_last", "compile", "gpt"} & set(run)
        runconfig.validate({**runconfig.DEFAULTS, **run})


def test_samples_per_epoch_known_answers():
    assert grid.samples_per_epoch(study()) == 10 * 160  # the demo's synthetic archive
    assert grid.samples_per_epoch(study("config")) == 50_000
    # 600,000 bytes, the last 10 % held out: 540,000 tokens in windows of 128 + 1
    assert grid.samples_per_epoch(gpt_study(seq_len=128)) == 540_000 // 129 == 4186
    # seq_len from the preset (demo: 128)
    assert grid.samples_per_epoch(gpt_study()) == grid.samples_per_epoch(gpt_study(seq_len=128))
    text = gpt_study(seq_len=128)
    text["data"]["source"] = "text"
    assert grid.samples_per_epoch(text) is None  # a downloaded corpus: known after preprocessing
    assert grid.samples_per_epoch(study(workload={"name": "command", "command": {"script": "s.py"}})) is None


def test_the_window_check_counts_sequences_for_the_lm():
    config = gpt_study(seq_len=128)
    config["data"]["synthetic_text"]["bytes"] = 20_000  # 18,000 // 129 = 139 sequences
    config["train"]["max_steps_per_epoch"] = None
    problems = grid.window_problems(config)
    # baseline: 139 // 64 = 2 steps x 3 epochs = 6 < 21 measured steps
    assert any(
        line.startswith("results/runs/baseline/default: 3 epochs x 2 steps = 6 steps") for line in problems
    )
    config["data"]["synthetic_text"]["bytes"] = 10_000_000
    assert grid.window_problems(config) == []


def test_an_epoch_of_unknown_length_gets_one_profiled_epoch():
    config = gpt_study()  # seq_len from the preset: unknown to the grid
    assert grid.window_problems(config) == []
    run = grid.run_config(config, grid.profile_point(config, 2))
    window = config["profiling"]
    assert (run["epochs"], run["max_steps_per_epoch"]) == (1, window["start_step"] + window["steps"] + 1)


# --------------------------------------------------------------------------- parse time


def test_the_config_check_and_the_grid_import_no_heavy_library():
    """The Snakefile runs both when it parses the workflow (docs/architecture.md: no torch there)."""
    code = (
        "import sys, yaml; from scalestudy.plan import configcheck, grid;"
        "config = yaml.safe_load(open('config/demo.yaml'));"
        "configcheck.check(config, 'config/schema.yaml'); grid.all_points;"
        "heavy = [m for m in ('torch', 'numpy', 'pandas') if m in sys.modules];"
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=60)
