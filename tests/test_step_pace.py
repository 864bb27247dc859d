"""train.min_step_s, the pace of a run that must still be running when a signal comes (the time-limit
tests on Slurm, tests/test_slurm_array_faults.py, train a few paced steps instead of minutes of real
work): every step lasts at least that long (the steady window counts the wait), a SIGTERM still stops
the run after its step with a checkpoint, and the run config carries the key only where it is set.
In this process, on one thread (tests/inprocess.py), ResNet-18 at width 4."""

from __future__ import annotations

import json

import pytest

from scalestudy import contract
from scalestudy.plan import runconfig
from scalestudy.train.checkpoint import single_file as checkpoint
from tests.inprocess import SignalAtStep, one_process_one_thread, write_packed_cifar  # noqa: F401
from tests.trainer_runs import BASE, main

PACE_S = 0.6  # several times a step here (~0.05 s idle, 0.16 s beside two busy loops)
RUN = {  # tests/trainer_runs.py's run, smaller: 6 steps of 8 at width 4, one epoch
    **BASE,
    **{"per_gpu_batch": 8, "global_batch": 8, "base_batch": 8, "epochs": 1, "width": 4},
    **{"max_steps_per_epoch": 6, "eval_max_batches": 1, "checkpoint_every_steps": 0, "step_timing_every": 0},
    **{"measure_warmup_steps": 1, "measure_steps": 4, "measure_intervals": 1, "keep_checkpoints": False},
}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return write_packed_cifar(tmp_path_factory.mktemp("packed"), 8, 2)


def _run(folder, data_dir, **changes) -> int:
    config = {**RUN, "data_dir": str(data_dir), "checkpoint_dir": str(folder / "ckpt"), **changes}
    return main(folder / "run", config, log_level="INFO")


def _window(folder) -> dict:
    return json.loads((folder / "run" / "summary.json").read_text())["results"]


def test_every_step_lasts_at_least_the_pace_and_the_run_says_its_rate_is_the_pace(tmp_path, data_dir, capsys):
    assert _run(tmp_path / "paced", data_dir, min_step_s=PACE_S) == 0
    printed = capsys.readouterr().err
    paced = _window(tmp_path / "paced")
    assert paced["window_filled"] and paced["step_time_s"] >= PACE_S, paced["step_time_s"]
    assert f"min_step_s={PACE_S:g}" in printed and "not the machine's" in printed


def test_a_sigterm_in_a_paced_run_stops_after_that_step_with_its_checkpoint(tmp_path, data_dir):
    """SignalAtStep sends the signal when step 2's line is logged (after its wait): the handler only
    records it, and the run stops at step 2, checkpointed (exit 75), then resumes to the end."""
    with SignalAtStep(2):
        code = _run(tmp_path / "stopped", data_dir, min_step_s=PACE_S)
    assert code == contract.EXIT_RESUMABLE
    state, _ = checkpoint.load_latest(tmp_path / "stopped" / "ckpt")
    assert state["position"]["global_step"] == 2
    assert _run(tmp_path / "stopped", data_dir, min_step_s=PACE_S) == 0  # and it resumes to the end
    assert _window(tmp_path / "stopped")["resumed_from_step"] == 2


def test_the_run_config_carries_the_pace_only_where_the_study_sets_it():
    assert runconfig.DEFAULTS["min_step_s"] == 0
    assert "min_step_s" in runconfig.OPTIONAL_TRAIN_KEYS
    with pytest.raises(runconfig.RunConfigError, match="min_step_s"):
        runconfig.validate(
            {**runconfig.DEFAULTS, **RUN, "data_dir": "d", "checkpoint_dir": "c", "min_step_s": -1}
        )
