"""A training job's start-up, launch to the end of its first step (scalestudy.train.startup): the
parts on constructed clocks, the launcher's stamp, and a CPU run's summary (tests/test_train.py)."""

from __future__ import annotations

import json
import time

import pytest

from scalestudy.launch import launcher as launch
from scalestudy.train import startup
from tests.launch_specs import NO_SLURM, TRAIN, spec

MARKS = {  # seconds since the epoch, as the trainer passes each stage
    "imports": 103.0,
    "config": 103.5,
    "settings": 103.75,
    "process_group": 104.0,
    "data": 106.0,
    "model": 107.0,
    "setup": 107.25,
    "resume": 107.5,
    "first_step": 111.5,
}


def test_the_parts_run_from_the_launch_through_the_process_start_to_the_first_steps_end():
    r = startup.report(MARKS, launched=100.0, process_start=101.0)
    assert r["startup_s"] == 11.5 and r["startup_from"] == "launch"
    parts = r["startup_parts_s"]
    assert parts == {
        "launch_s": 1.0,
        "imports_s": 2.0,
        "config_s": 0.5,
        "settings_s": 0.25,
        "process_group_s": 0.25,
        "data_s": 2.0,
        "model_s": 1.0,
        "setup_s": 0.25,
        "resume_s": 0.25,
        "first_step_s": 4.0,
    }
    assert sum(parts.values()) == pytest.approx(r["startup_s"])


def test_a_trainer_the_launcher_execd_counts_from_the_launch_not_its_earlier_start():
    """One local rank: the launcher execs the trainer, so the process started before the launch."""
    r = startup.report(MARKS, launched=100.0, process_start=99.0)
    assert r["startup_parts_s"]["launch_s"] == 0.0 and r["startup_parts_s"]["imports_s"] == 3.0
    assert sum(r["startup_parts_s"].values()) == pytest.approx(r["startup_s"]) == 11.5


def test_without_a_launch_it_counts_from_the_process_start_and_skips_stages_not_passed():
    marks = {key: value for key, value in MARKS.items() if key != "process_group"}
    r = startup.report(marks, launched=None, process_start=101.0)
    assert r["startup_from"] == "process start" and r["startup_s"] == 10.5
    assert "launch_s" not in r["startup_parts_s"] and "process_group_s" not in r["startup_parts_s"]
    assert r["startup_parts_s"]["data_s"] == 2.25  # settings to data: the missing stage's time included
    none = startup.report({}, launched=None, process_start=None)
    assert none == {"startup_s": None, "startup_from": None, "startup_parts_s": {}}


def test_the_launch_time_comes_from_the_environment_and_a_bad_one_is_ignored():
    assert startup.launch_time({startup.LAUNCH_TIME_ENV: "1700000000.25"}) == 1700000000.25
    assert startup.launch_time({startup.LAUNCH_TIME_ENV: "soon"}) is None
    assert startup.launch_time({}) is None
    with pytest.raises(ValueError, match="unknown start-up stage"):
        startup.mark("lunch")


def test_this_process_start_is_read_from_proc():
    started = startup.process_start_time()
    if started is None:
        pytest.skip("no /proc here")
    assert time.time() - 7 * 24 * 3600 < started <= time.time()


def test_the_launcher_stamps_the_launch_for_the_ranks_and_through_apptainer():
    before = time.time()
    argv = ["--launch-json", json.dumps(spec(2, launcher="local")), "--", *TRAIN]
    env = launch.prepare(argv, NO_SLURM)[1]
    assert before <= float(env[startup.LAUNCH_TIME_ENV]) <= time.time()
    dry = ["--dry-run", "--launch-json", json.dumps(spec(1, launcher="local")), "--", *TRAIN]
    assert startup.LAUNCH_TIME_ENV not in launch.prepare(dry, NO_SLURM)[1]  # nothing starts
    env = {}
    launch.stamp_launch({"image": "x.sif"}, env)
    assert env[f"APPTAINERENV_{startup.LAUNCH_TIME_ENV}"] == env[startup.LAUNCH_TIME_ENV]
