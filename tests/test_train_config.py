"""The trainer's run config checks, learning-rate rules and command-line failures (no training)."""

import json
import logging
import math

import pytest

from scalestudy import runconfig, train

VALID = {
    "data_dir": "d",
    "checkpoint_dir": "c",
    "world_size": 4,
    "per_gpu_batch": 128,
    "global_batch": 512,
    "epochs": 2,
}


def _validated(**changes):
    config = {**runconfig.DEFAULTS, **VALID, **changes}
    runconfig.validate(config)
    return config


def test_the_documented_example_run_config_is_accepted():
    example = {
        **VALID,
        "stage": "scaling",
        "point": "strong/w2_r0",
        "nodes": 1,
        "precision": "bf16",
        "comm_hook": "fp16",
        "profile": {"tool": "torch", "start_step": 20, "steps": 10},
    }
    assert set(example) <= set(runconfig.DEFAULTS) | set(runconfig.REQUIRED)
    _validated(**example)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"global_batch": 256}, "global_batch=256 is not per_gpu_batch=128 x world_size=4"),
        ({"precision": "fp8"}, "precision='fp8'"),
        ({"lr_scaling": "cubic"}, "lr_scaling='cubic'"),
        ({"loader": "dali"}, "loader='dali'"),
        ({"comm_hook": "powersgd"}, "comm_hook='powersgd'"),
        ({"norm": "layer"}, "norm='layer'"),
        ({"width": 0}, "width=0"),
        ({"epochs": 1.5}, "epochs=1.5"),
        ({"data_dir": None}, "data_dir is required"),
        ({"nesterov": True, "momentum": 0.0}, "momentum=0.0"),
        ({"profile": {"tool": "auto", "start_step": 2, "steps": 2}}, "tool='auto'"),
        ({"profile": {"tool": "torch", "start_step": 2, "steps": 0}}, "steps >= 1"),
    ],
)
def test_bad_run_configs_name_the_key_and_value(changes, message):
    with pytest.raises(runconfig.RunConfigError, match=message.replace("(", r"\(")):
        _validated(**changes)


def test_learning_rate_scaling_rules():
    assert train.lr_scale("linear", 1024, 128) == 8
    assert train.lr_scale("sqrt", 512, 128) == 2
    assert train.lr_scale("none", 1024, 128) == 1


def test_schedule_warms_up_linearly_then_decays_by_cosine_to_zero():
    factor = train.lr_schedule(warmup_steps=4, total_steps=14)
    assert [factor(s) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert factor(4) == 1.0
    assert factor(9) == pytest.approx(0.5)  # half-way through the decay
    assert factor(14) == pytest.approx(0.0, abs=1e-12)
    decay = [factor(s) for s in range(4, 15)]
    assert decay == sorted(decay, reverse=True)
    assert train.lr_schedule(0, 10)(0) == 1.0
    assert train.lr_schedule(0, 10)(5) == pytest.approx(0.5 * (1 + math.cos(math.pi / 2)))


def _main(tmp_path, config):
    return train.main(["--run-config-json", json.dumps(config), "--out-dir", str(tmp_path / "run")])


def test_a_world_size_that_the_environment_does_not_have_is_refused(tmp_path, capsys, monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_STEP_NUM_TASKS"):
        monkeypatch.delenv(name, raising=False)
    assert _main(tmp_path, VALID) == train.EXIT_BAD_CONFIG
    assert "world_size=4" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("argument", "message"), [("[1, 2]", "must be a JSON object"), ("{'a': 1}", "not valid JSON")]
)
def test_unreadable_run_configs_are_refused(tmp_path, capsys, argument, message):
    # main() sets up logging to stderr itself (replacing caplog's handler), so read stderr
    code = train.main(["--run-config-json", argument, "--out-dir", str(tmp_path)])
    assert code == train.EXIT_BAD_CONFIG and message in capsys.readouterr().err


def test_unknown_keys_are_named_in_a_warning(tmp_path, caplog):
    path = tmp_path / "run.json"
    path.write_text(json.dumps({**VALID, "world_size": 1, "global_batch": 128, "lerning_rate": 1}))
    args = train.parse_args(["--run-config", str(path), "--out-dir", str(tmp_path)])
    with caplog.at_level(logging.WARNING):
        given, config = runconfig.load_run_config(args)
    assert "lerning_rate" in caplog.text
    assert given["global_batch"] == 128 and config["precision"] == "fp32"
