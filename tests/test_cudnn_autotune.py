"""cuDNN autotuning as asked (issue 41): `train.cudnn_benchmark` (default true, as before the key) sets
torch.backends.cudnn.benchmark for the run, never under `deterministic`, and the process's own
setting comes back afterwards; the key reaches a run config only where it differs from its
default, so the run configs (and their hashes) of a study that does not set it stay as they were."""

from __future__ import annotations

import pytest
import torch

from scalestudy.plan import grid, runconfig
from scalestudy.train import process


def _run_config(**changes) -> dict:
    return {**runconfig.DEFAULTS, "precision": "fp32", **changes}


@pytest.mark.parametrize(
    "changes, autotuned",
    [
        ({}, True),  # the schema's default (deterministic false)
        ({"cudnn_benchmark": True}, True),
        ({"cudnn_benchmark": False}, False),
        ({"cudnn_benchmark": True, "deterministic": True}, False),
    ],
)
def test_the_run_autotunes_as_asked_and_the_setting_comes_back(changes, autotuned, monkeypatch):
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", not autotuned)  # what the process had before
    with process.process_settings(_run_config(**changes)):
        assert torch.backends.cudnn.benchmark is autotuned
    assert torch.backends.cudnn.benchmark is (not autotuned)


def test_the_default_is_the_schemas():
    assert runconfig.DEFAULTS["cudnn_benchmark"] is runconfig.schema_default(("train", "cudnn_benchmark"))
    assert runconfig.DEFAULTS["cudnn_benchmark"] is True  # what every run did before the key existed


def test_a_value_that_is_not_a_boolean_is_refused_naming_the_key():
    config = {**runconfig.DEFAULTS, "data_dir": "d", "checkpoint_dir": "c", "world_size": 1}
    config.update(per_gpu_batch=8, global_batch=8, epochs=1)
    with pytest.raises(runconfig.RunConfigError, match="cudnn_benchmark"):
        runconfig.validate({**config, "cudnn_benchmark": "yes"})


def test_the_run_config_carries_the_key_only_where_it_is_not_the_default(demo_config):
    point = grid.scaling_points(demo_config)[0]
    assert "cudnn_benchmark" not in grid.run_config(demo_config, point)
    demo_config["train"]["cudnn_benchmark"] = False
    assert grid.run_config(demo_config, point)["cudnn_benchmark"] is False
