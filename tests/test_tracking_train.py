"""The trainer with tracking on (rank 0's journal, scalestudy.train.journal, followed into MLflow by
the study's follower): a job stopped by SIGTERM and resumed is one MLflow run, KILLED then RUNNING
then FINISHED, each step once; with a server unreachable from the start the job never waits for it,
and the run folder is the one tracking off writes (plus the journal); the sync afterwards adds
only what the follower sent already."""

# ruff: noqa: F811 - the fixtures imported from tests/tracking_runs.py are the tests' parameters

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from scalestudy import tracking
from tests.processes import global_step
from tests.tracking_runs import (  # noqa: F401 - data_dir: a fixture, one_tracking_process: autouse
    BASE,
    clean_environ,
    data_dir,
    make_run,
    one_tracking_process,
    wait_for,
)
from tests.trainer_runs import main as train

pytest.importorskip("mlflow")

from scalestudy.tracking import store, sync  # noqa: E402
from scalestudy.train import journal  # noqa: E402
from tests.conftest import REPO

# summary.json results that are clocks or memory, not the training's outcome
# measured, not computed: times, rates, memory, GPU-hours and energy (wall time), the step parts
TIMING = re.compile(
    r"(_s|_per_s|per_gpu|_cv|_min|_max|_s_per_rank|memory.*|interval.*|compile.*|gpu_hours.*|step_parts)$"
)


def embedded(root: Path) -> dict:
    return tracking.settings({"study": {"name": "t"}}, root)


def test_a_job_stopped_by_sigterm_and_resumed_is_one_run_killed_running_finished(tmp_path, data_dir):
    settings = embedded(tmp_path)
    out, config = make_run(tmp_path, data_dir, "scaling/strong-w1_r0", max_steps_per_epoch=10)
    env = {**clean_environ(), "OMP_NUM_THREADS": "1", **tracking.to_environ(settings)}
    command = [sys.executable, "-m", "scalestudy.train", "--run-config-json", json.dumps(config)]
    command += ["--out-dir", str(out)]
    logs = tmp_path / "results/logs/tracking"
    tracking.start_follower(settings, logs, [tmp_path / "results/runs"])
    process = subprocess.Popen(command, cwd=REPO, env=env, stderr=subprocess.PIPE, text=True)
    log = []
    for line in process.stderr:
        log.append(line)
        if global_step(line) == 7:
            process.send_signal(signal.SIGTERM)
            break
    log += process.stderr.readlines()
    assert process.wait(timeout=120) == 75, "".join(log)
    client = store.client(settings)
    experiment = store.experiment_id(client, settings)
    wait_for(lambda: store.find_runs(client, experiment, "scaling/strong-w1_r0")[0].info.status == "KILLED")
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    assert tracking.stop_follower(logs / tracking.FOLLOWER_PID)  # what is left, then it exits
    (run,) = store.find_runs(client, experiment, "scaling/strong-w1_r0")
    assert run.info.status == "FINISHED"
    assert run.data.tags[tracking.TAG_HISTORY] == "RUNNING,KILLED,RUNNING,FINISHED"
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "samples_per_s")]
    assert sorted(steps) == list(range(1, 21)), steps  # log_every_steps 1: every step, once
    epochs = pd.read_csv(out / "metrics.csv")
    history = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, "epoch_test_acc"))
    assert history == list(zip(epochs.epoch, epochs.test_acc, strict=True))
    # the sync afterwards finds the same run and adds no step metric, only what live does not send
    record = sync.sync(settings, tmp_path / "results/runs", [], tmp_path)
    assert [r["run_id"] for r in record["runs"]] == [run.info.run_id]
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "samples_per_s")]
    assert sorted(steps) == list(range(1, 21))


def test_an_unreachable_server_changes_no_result(tmp_path, data_dir, monkeypatch, capfd):
    off, config_off = make_run(tmp_path / "off", data_dir, "baseline/default")
    assert train(off, config_off) == 0
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    settings = tracking.settings({"study": {"name": "t"}, "tracking": {"uri": f"http://127.0.0.1:{port}"}})
    for name, value in tracking.to_environ(settings).items():
        monkeypatch.setenv(name, value)
    on, config_on = make_run(tmp_path / "on", data_dir, "baseline/default")
    config_on["checkpoint_dir"] = config_off["checkpoint_dir"] + "-on"
    capfd.readouterr()
    assert train(on, config_on) == 0
    warnings = [line for line in capfd.readouterr().err.splitlines() if "WARNING" in line]
    assert warnings == []  # the job never talks to the server (the follower warns: test_tracking_live)
    assert sorted(p.name for p in on.iterdir()) == sorted([*(p.name for p in off.iterdir()), journal.JOURNAL])
    learning = ["epoch", "train_loss", "train_acc", "test_loss", "test_acc", "lr"]
    pd.testing.assert_frame_equal(
        pd.read_csv(on / "metrics.csv")[learning], pd.read_csv(off / "metrics.csv")[learning]
    )
    results = [json.loads((folder / "summary.json").read_text())["results"] for folder in (off, on)]
    same = {key for key in results[0] if not TIMING.search(key)}
    assert {k: results[1][k] for k in same} == {k: results[0][k] for k in same}
