"""MLflow tracking (scalestudy.tracking): settings, the sync of run folders into an embedded
(SQLite) store, its idempotence, superseded runs, SCHEDULED points, a contended run's tags, and the
checks of the demo's store (called by tests/test_workflow.py). The run folder trains in this process
(one rank, a few steps). The smoke tests and the collective benchmark: test_tracking_preflight.py;
the live journal and follower: test_tracking_live.py and test_tracking_train.py."""

# ruff: noqa: F811 - the fixtures imported from tests/tracking_runs.py are the tests' parameters

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest

from scalestudy import provenance, tracking

pytest.importorskip("mlflow")

from scalestudy.tracking import store, sync  # noqa: E402
from scalestudy.train import journal  # noqa: E402
from tests.conftest import REPO
from tests.tracking_runs import (  # noqa: F401 - data_dir: a fixture, one_tracking_process: autouse
    all_metrics,
    clean_environ,
    data_dir,
    make_run,
    one_tracking_process,
    settings_for,
)
from tests.trainer_runs import main as train


@pytest.fixture(scope="module")
def finished(tmp_path_factory, data_dir):
    """One finished run folder (tracking off) and its study root."""
    root = tmp_path_factory.mktemp("study")
    out, config = make_run(root, data_dir, "scaling/strong-w1_r0")
    saved = dict(os.environ)
    for name in set(os.environ) - set(clean_environ()):
        del os.environ[name]
    try:
        assert train(out, config) == 0
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return root, out, config


# --- settings --------------------------------------------------------------------------------------


def test_tracking_off_gives_no_settings_and_no_variables():
    assert tracking.settings({"tracking": {"enabled": False}}) is None
    assert tracking.to_environ(None) == {}
    assert journal.from_environ({}) is None
    assert journal.from_environ({tracking.ENV: "not json"}) is None


def test_the_default_store_is_an_sqlite_file_under_results(tmp_path):
    found = settings_for(tmp_path)
    assert found["uri"] == f"sqlite:///{tmp_path.resolve()}/results/mlflow/mlflow.db"
    assert found["experiment"] == "scalestudy-t"
    server = settings_for(tmp_path, uri="http://login01:5000", experiment="mine")
    assert (server["uri"], server["experiment"], server["artifact_root"]) == (
        "http://login01:5000",
        "mine",
        None,
    )
    assert journal.from_environ(tracking.to_environ(server)) == server


def test_a_run_config_is_flattened_into_params():
    flat = tracking.flatten({"a": 1, "b": {"c": [1, 2], "d": None}, "e": "x"})
    assert flat == {"a": "1", "b.c": "[1, 2]", "b.d": "null", "e": "x"}


def test_tracking_off_imports_no_mlflow():
    code = (
        "import sys, scalestudy.tracking, scalestudy.train.journal, scalestudy.train.trainer;"
        "assert not [m for m in sys.modules if m.startswith('mlflow')], 'mlflow imported'"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, env=clean_environ()
    )
    assert result.returncode == 0, result.stderr[-3000:]


OPEN_AT_ONCE = """
import pathlib, sys, time
from scalestudy.tracking import store
import mlflow  # imported before the start: the processes open the store together
settings = {"uri": sys.argv[1], "experiment": "at-once", "timeout_s": 5.0}  # as tracking.settings gives it
folder = pathlib.Path(sys.argv[2])
(folder / f"ready-{sys.argv[3]}").touch()
while not (folder / "go").exists():
    time.sleep(0.001)
client = store.client(settings)
print(store.experiment_id(client, settings))
"""


def test_processes_opening_a_fresh_store_at_once_all_succeed(tmp_path):
    """The follower, rule track and a user's client may open a fresh embedded store together:
    each would create its tables (a CI run failed on MLflow's migration, "expected to match one
    row"); store.client lets one at a time in. Without the lock 3 of 4 failed here, every time."""
    uri = settings_for(tmp_path)["uri"]
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", OPEN_AT_ONCE, uri, str(tmp_path), str(index)],
            cwd=REPO,
            env=clean_environ(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for index in range(4)
    ]
    deadline = time.monotonic() + 120
    while len(list(tmp_path.glob("ready-*"))) < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    (tmp_path / "go").touch()  # all four have imported mlflow: they open the store at once
    results = [(p.wait(timeout=120), *p.communicate()) for p in processes]
    assert [code for code, _, _ in results] == [0] * 4, [err[-2000:] for _, _, err in results]
    assert len({out.strip() for _, out, _ in results}) == 1  # one experiment, the same for all


# --- sync ------------------------------------------------------------------------------------------


def test_sync_fills_the_store_and_the_numbers_are_the_summarys(finished):
    root, out, config = finished
    settings = settings_for(root)
    record = sync.sync(settings, root / "results/runs", [], root)
    client = store.client(settings)
    experiment = store.experiment_id(client, settings)
    (run,) = store.find_runs(client, experiment, "scaling/strong-w1_r0")
    assert run.info.status == "FINISHED" and record["runs"][0]["created"]
    summary = json.loads((out / "summary.json").read_text())
    tags = run.data.tags
    assert (
        tags[tracking.TAG_HASH]
        == provenance.config_hash(summary["run"])
        == summary["provenance"]["config_hash"]
    )
    assert (tags["stage"], tags["world_size"], tags[tracking.TAG_STUDY_RUN]) == (
        "scaling",
        "1",
        record["study_run"],
    )
    # nested under its stage's run, nested under the study's run; both FINISHED by the sync
    (stage,) = client.search_runs(
        [experiment], filter_string=f"tags.`mlflow.parentRunId` = '{record['study_run']}'"
    )
    assert stage.data.tags["mlflow.runName"] == "scaling" and stage.info.status == "FINISHED"
    assert tags["mlflow.parentRunId"] == stage.info.run_id
    nested = client.search_runs(
        [experiment], filter_string=f"tags.`mlflow.parentRunId` = '{stage.info.run_id}'"
    )
    assert [child.info.run_id for child in nested] == [run.info.run_id]
    # the UI link opens the training runs, not the GenAI overview
    assert (
        record["ui"] == f"http://127.0.0.1:5000/#/experiments/{experiment}/runs?workflowType=machine_learning"
    )
    assert run.data.params["per_gpu_batch"] == "16" and run.data.params["data_dir"] == config["data_dir"]
    for key in ("images_per_s", "final_test_acc", "peak_memory_bytes", "gpu_hours"):
        assert run.data.metrics[f"summary_{key}"] == pytest.approx(summary["results"][key], rel=1e-12)
    # a CPU run: no energy metric (never a zero), the tag says why
    assert tags["energy_source"].startswith("not measured: no NVIDIA GPU (device cpu)")
    assert not {"summary_energy_j", "summary_joules_per_sample"} & set(run.data.metrics)
    metrics = pd.read_csv(out / "metrics.csv")
    history = all_metrics(client, run.info.run_id)
    assert history["epoch_test_acc"] == list(zip(metrics.epoch, metrics.test_acc, strict=True))
    steps = pd.read_csv(out / "steps.csv")
    assert [s for s, _ in history["step_time_s"]] == steps.step.tolist()
    names = {info.path for info in client.list_artifacts(run.info.run_id)}
    assert {"summary.json", "metrics.csv", "steps.csv", "gpu_monitor.csv"} <= names


def test_sync_twice_adds_nothing_and_a_new_config_supersedes(finished, tmp_path):
    root, out, _ = finished
    study = tmp_path / "study"
    shutil.copytree(root / "results/runs", study / "results/runs")
    settings = settings_for(study)
    first = sync.sync(settings, study / "results/runs", [], study)
    again = sync.sync(settings, study / "results/runs", [], study)
    assert first["runs"][0]["metrics"] > 0 and first["runs"][0]["artifacts"] >= 4
    assert again["runs"][0]["metrics"] == again["runs"][0]["artifacts"] == 0
    assert again["runs"][0]["run_id"] == first["runs"][0]["run_id"] and not again["runs"][0]["created"]
    summary_path = study / "results/runs/scaling/strong-w1_r0/summary.json"
    summary = json.loads(summary_path.read_text())
    summary["run"]["lr"] = 0.1  # the point re-run with another config
    summary_path.write_text(json.dumps(summary))
    third = sync.sync(settings, study / "results/runs", [], study)
    assert third["runs"][0]["created"] and third["runs"][0]["superseded"] == 1
    client = store.client(settings)
    old = client.get_run(first["runs"][0]["run_id"])
    assert old.data.tags[tracking.TAG_SUPERSEDED] == "true"
    assert old.data.tags["scalestudy.superseded_by"] == third["runs"][0]["run_id"]


def test_a_scheduled_run_starts_when_its_job_started_not_when_it_was_scheduled(finished, tmp_path):
    """MLflow's duration counts from a run's start time: a SCHEDULED run made RUNNING is made again
    from the journal's start record (the SCHEDULED one deleted), and ends at its end record."""
    root, out, _ = finished
    study = tmp_path / "study"
    shutil.copytree(root / "results/runs", study / "results/runs")
    folder = study / "results/runs/scaling/strong-w1_r0"
    summary = json.loads((folder / "summary.json").read_text())
    config_hash = provenance.config_hash(summary["run"])
    settings = settings_for(study)
    sync.schedule(settings, [{"point": "scaling/strong-w1_r0", "run": summary["run"]}])
    client = store.client(settings)
    experiment = store.experiment_id(client, settings)
    (scheduled,) = store.find_runs(client, experiment, "scaling/strong-w1_r0")
    start, end = time.time() + 60, time.time() + 76  # a 16 s run that waited a minute in the queue
    records = [{"kind": "start", "at": start}, {"kind": "end", "at": end, "status": "FINISHED"}]
    text = "".join(json.dumps({**item, "config_hash": config_hash}) + "\n" for item in records)
    (folder / journal.JOURNAL).write_text(text)
    sync.sync(settings, study / "results/runs", [], study)
    (run,) = store.find_runs(client, experiment, "scaling/strong-w1_r0")
    assert run.info.run_id != scheduled.info.run_id
    assert client.get_run(scheduled.info.run_id).info.lifecycle_stage == "deleted"
    assert (run.info.start_time, run.info.end_time) == (round(start * 1000), round(end * 1000))
    assert run.data.tags[tracking.TAG_HISTORY] == "SCHEDULED,RUNNING,FINISHED"
    assert run.data.params == scheduled.data.params and run.data.params["per_gpu_batch"] == "16"


def test_a_stage_run_spans_its_own_points_not_the_study(finished, tmp_path):
    """A stage's run is made when the grid is scheduled (the study's start) and ends with rule track:
    the sync makes it span its points, from the first one's start to the last one's end (made again
    from that start, its points nested under it), and a second sync leaves it as it is."""
    root, _, _ = finished
    study = tmp_path / "study"
    points = {"scaling/strong-w1_r0": (60, 76), "scaling/strong-w2_r0": (90, 131.5)}  # seconds from now
    given = json.loads((root / "results/runs/scaling/strong-w1_r0/summary.json").read_text())["run"]
    config_hash = provenance.config_hash(given)
    settings = settings_for(study)
    sync.schedule(settings, [{"point": point, "run": given} for point in points])
    client = store.client(settings)
    experiment = store.experiment_id(client, settings)
    (scheduled_stage,) = store.find_runs(client, experiment, f"{tracking.STUDY_POINT}/scaling")
    now = time.time()
    for point, (start, end) in points.items():
        folder = study / "results/runs" / point
        shutil.copytree(root / "results/runs/scaling/strong-w1_r0", folder)
        records = [
            {"kind": "start", "at": now + start},
            {"kind": "end", "at": now + end, "status": "FINISHED"},
        ]
        text = "".join(json.dumps({**item, "config_hash": config_hash}) + "\n" for item in records)
        (folder / journal.JOURNAL).write_text(text)
    for _ in range(2):  # the second sync changes nothing
        sync.sync(settings, study / "results/runs", [], study)
        (stage,) = store.find_runs(client, experiment, f"{tracking.STUDY_POINT}/scaling")
        span = (round((now + 60) * 1000), round((now + 131.5) * 1000))
        assert (stage.info.start_time, stage.info.end_time, stage.info.status) == (*span, "FINISHED")
        for point in points:
            (run,) = store.find_runs(client, experiment, point)
            assert run.data.tags[store.PARENT_TAG] == stage.info.run_id
    assert stage.info.run_id != scheduled_stage.info.run_id
    assert client.get_run(scheduled_stage.info.run_id).info.lifecycle_stage == "deleted"
    assert stage.data.tags[store.PARENT_TAG] == store.study_run(client, experiment, "t")
    assert stage.data.tags["mlflow.runName"] == "scaling"


def test_a_contended_run_carries_the_mark_and_its_evidence_as_tags(tmp_path):
    """A run whose GPU held a foreign process while it measured (a constructed run folder, judged
    from its monitor files as the trainer judges them): tags contended and the evidence."""

    from scalestudy.analysis import constructed_study as synthetic
    from scalestudy.plan import grid
    from tests.contended_study import STRONG_2, small_study

    config = small_study()
    point = next(p for p in grid.scaling_points(config) if p.run_dir == STRONG_2)
    truth = synthetic.Truth(foreign=(synthetic.Foreign(STRONG_2, pid=31337),))
    out = synthetic.write_run(tmp_path, config, point, truth, np.random.default_rng(0))
    settings = settings_for(tmp_path)
    sync.sync(settings, tmp_path / "results/runs", [], tmp_path)
    client = store.client(settings)
    (run,) = store.find_runs(client, store.experiment_id(client, settings), "scaling/strong/w2_r0")
    results = json.loads((out / "summary.json").read_text())["results"]
    assert run.data.tags["contended"] == "True"
    assert run.data.tags["contention"] == results["contention"] and "pids 31337" in results["contention"]
    assert run.data.tags["monitor_window_samples"] == str(results["monitor_window_samples"])
    # its energy (the constructed counter): metrics per point, and where they came from
    assert run.data.tags["energy_source"] == "counter"
    for key in ("energy_j", "energy_window_j", "joules_per_sample", "mean_power_w"):
        assert run.data.metrics[f"summary_{key}"] == pytest.approx(results[key], rel=1e-12), key


def test_scheduled_points_become_the_runs_the_sync_finishes(finished, tmp_path):
    root, out, _ = finished
    study = tmp_path / "study"
    shutil.copytree(root / "results/runs", study / "results/runs")
    given = json.loads((out / "summary.json").read_text())["run"]
    settings = settings_for(study)
    points = [
        {"point": "scaling/strong-w1_r0", "run": given},
        {"point": "scaling/strong-w2_r0", "run": given},
    ]
    assert sync.schedule(settings, points) == ["scaling/strong-w1_r0", "scaling/strong-w2_r0"]
    assert sync.schedule(settings, points) == []  # once
    client = store.client(settings)
    experiment = store.experiment_id(client, settings)
    (waiting,) = store.find_runs(client, experiment, "scaling/strong-w2_r0")
    assert waiting.info.status == "SCHEDULED"
    record = sync.sync(settings, study / "results/runs", [], study)
    (done,) = store.find_runs(client, experiment, "scaling/strong-w1_r0")
    assert done.info.run_id == record["runs"][0]["run_id"] and done.info.status == "FINISHED"
    assert done.data.tags[tracking.TAG_HISTORY] == "SCHEDULED,FINISHED"


def test_the_command_line_names_a_bad_setting(tmp_path):
    from scalestudy.tracking.__main__ import main

    assert main(["sync", "--tracking-json", "{", "--runs-dir", str(tmp_path)]) == 2
    assert main(["schedule", "--tracking-json", '{"uri": "x"}', "--points-json", str(tmp_path / "no")]) == 2
