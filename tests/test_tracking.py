"""MLflow tracking (scalestudy.tracking): settings, the sync of run folders into an embedded
(SQLite) store, its idempotence, superseded runs, SCHEDULED points, a contended run's tags, and the
checks of the demo's store (called by tests/test_workflow.py). The run folder trains in this process
(one rank, a few steps). The smoke tests and the collective benchmark: test_tracking_preflight.py;
the live journal and follower: test_tracking_live.py and test_tracking_train.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from scalestudy import provenance, tracking
from scalestudy.data.synthetic_cifar import generate_arrays

pytest.importorskip("mlflow")

from scalestudy.tracking import store, sync  # noqa: E402
from scalestudy.train import journal  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
BASE = {
    "world_size": 1,
    "per_gpu_batch": 16,
    "global_batch": 16,
    "base_batch": 16,
    "epochs": 2,
    "width": 8,
    "lr": 0.05,
    "seed": 0,
    "deterministic": True,
    "max_steps_per_epoch": 6,
    "checkpoint_every_steps": 3,
    "log_every_steps": 1,
    "step_timing_every": 4,
    "monitor_interval_s": 0.5,
    "target_accuracy": 0.05,
    "measure_warmup_steps": 2,
    "measure_steps": 4,
    "measure_intervals": 2,
}
LAUNCH_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")


def clean_environ() -> dict[str, str]:
    return {
        k: v
        for k, v in os.environ.items()
        if k not in LAUNCH_VARIABLES and not k.startswith(("SLURM_", tracking.ENV, "APPTAINERENV_"))
    }


@pytest.fixture(autouse=True)
def _one_process(monkeypatch):
    for name in set(os.environ) - set(clean_environ()):
        monkeypatch.delenv(name)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("packed")
    arrays = generate_arrays(16, 8, seed=0)
    for name, array in zip(
        ("train_images", "train_labels", "test_images", "test_labels"), arrays, strict=True
    ):
        np.save(folder / f"{name}.npy", array)
    return folder


def settings_for(root: Path, **changes) -> dict:
    config = {"study": {"name": "t"}, "tracking": {"enabled": True, **changes}}
    return tracking.settings(config, root)


def make_run(root: Path, data_dir: Path, point: str, **changes) -> tuple[Path, dict]:
    """A run folder results/runs/<point> under `root`, trained here; (folder, run config)."""
    out = root / "results/runs" / point
    config = {**BASE, "data_dir": str(data_dir), "checkpoint_dir": str(root / "ckpt" / point), **changes}
    return out, config


def train(out: Path, config: dict) -> int:
    try:
        from scalestudy.train import program as trainer
    except ImportError:  # before the trainer's split into program and Trainer
        from scalestudy.train import trainer

    return trainer.main(
        ["--run-config-json", json.dumps(config), "--out-dir", str(out), "--log-level", "WARNING"]
    )


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


def all_metrics(client, run_id: str) -> dict[str, list[tuple[int, float]]]:
    run = client.get_run(run_id)
    return {
        key: sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))
        for key in run.data.metrics
    }


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
    assert (run.info.start_time, run.info.end_time) == (int(start * 1000), int(end * 1000))
    assert run.data.tags[tracking.TAG_HISTORY] == "SCHEDULED,RUNNING,FINISHED"
    assert run.data.params == scheduled.data.params and run.data.params["per_gpu_batch"] == "16"


def test_a_contended_run_carries_the_mark_and_its_evidence_as_tags(tmp_path):
    """A run whose GPU held a foreign process while it measured (a constructed run folder, judged
    from its monitor files as the trainer judges them): tags contended and the evidence."""
    import numpy as np

    from scalestudy.analysis import constructed_study as synthetic
    from scalestudy.plan import grid
    from tests.test_contention import STRONG_2, small_study

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


# --- the demo (called by tests/test_workflow.py with its demo run) -------------------------------


def check_demo_store(workdir: Path) -> None:
    """The demo's embedded store: one FINISHED run per run folder (found by mlflow.search_runs) with
    its params, tags, per-step and per-epoch metrics and artifacts, the numbers summary.json's; one
    per smoke test and per world size of the collective benchmark (check_demo_preflight_runs); the
    study's run with the tables and figures."""
    import mlflow

    settings = tracking.settings({"study": {"name": "demo"}}, workdir)
    mlflow.set_tracking_uri(settings["uri"])
    runs = mlflow.search_runs(experiment_names=[settings["experiment"]], output_format="list")
    by_point = {}
    for run in runs:
        by_point.setdefault(run.data.tags[tracking.TAG_POINT], []).append(run)
    folders = sorted(path.parent for path in (workdir / "results/runs").glob("**/summary.json"))
    stages = ("baseline/", "scaling/", "sensitivity/", "profile/")  # besides: the study, smoke tests
    assert sorted(tracking.point_of(folder) for folder in folders) == sorted(
        p for p in by_point if p.startswith(stages)
    )
    assert by_point["study"][0].info.status == "FINISHED"
    client = store.client(settings)
    for folder in folders:
        (run,) = by_point[tracking.point_of(folder)]
        summary = json.loads((folder / "summary.json").read_text())
        assert run.info.status == "FINISHED" and run.data.tags["stage"] == summary["run"]["stage"]
        assert run.data.tags[tracking.TAG_HASH] == summary["provenance"]["config_hash"]
        assert run.data.params == tracking.flatten(summary["run"])
        assert (
            run.data.metrics.get("summary_images_per_s") == summary["results"]["images_per_s"]
        )  # None: unfilled
        epochs = pd.read_csv(folder / "metrics.csv")
        history = sorted(
            (m.step, m.value) for m in client.get_metric_history(run.info.run_id, "epoch_test_acc")
        )
        assert history == list(zip(epochs.epoch, epochs.test_acc, strict=True))
        steps = [m.step for m in client.get_metric_history(run.info.run_id, "samples_per_s")]
        assert steps and len(steps) == len(set(steps))
        artifacts = {info.path for info in client.list_artifacts(run.info.run_id)}
        assert {"summary.json", "metrics.csv", "logs"} <= artifacts
    (study,) = by_point["study"]
    assert {"tables", "figures"} <= {info.path for info in client.list_artifacts(study.info.run_id)}
    check_demo_preflight_runs(workdir, by_point, client)
    # live: the study's follower (not only rule track) replayed every training job's journal
    followed = (workdir / "results/logs/tracking" / tracking.FOLLOWER_LOG).read_text()
    for folder in folders:
        assert f"{tracking.point_of(folder)}: " in followed, tracking.point_of(folder)


def check_demo_preflight_runs(workdir: Path, by_point: dict[str, list], client) -> None:
    """One FINISHED run per smoke test (results/smoke/*.json) and per world size of the collective
    benchmark (results/comm/w*.csv), tagged with its stage, its metrics the files' numbers."""
    smoke_files = sorted((workdir / "results/smoke").glob("*.json"))
    comm_files = sorted((workdir / "results/comm").glob("w*.csv"))
    assert {path.stem for path in smoke_files} >= {"io", "train_w1", "train_w2"} and comm_files
    expected = [f"smoke/{path.stem}" for path in smoke_files] + [
        f"comm_bench/{path.stem}" for path in comm_files
    ]
    assert sorted(p for p in by_point if p.startswith(("smoke/", "comm_bench/"))) == sorted(expected)
    for path in smoke_files:
        (run,) = by_point[f"smoke/{path.stem}"]
        record = json.loads(path.read_text())
        assert (run.info.status, run.data.tags["stage"]) == ("FINISHED", "smoke")
        assert run.data.tags[tracking.TAG_HASH] == record["provenance"]["config_hash"]
        assert run.data.params == tracking.flatten(record["run_config"])
        figures = record["loader"] if record["check"] == "io" else record
        key = "smoke_loader_images_per_s" if record["check"] == "io" else "smoke_images_per_s"
        assert run.data.metrics[key] == figures["images_per_s"]
        assert path.name in {info.path for info in client.list_artifacts(run.info.run_id)}
    for path in comm_files:
        (run,) = by_point[f"comm_bench/{path.stem}"]
        rows = pd.read_csv(path)
        assert (run.info.status, run.data.tags["stage"]) == ("FINISHED", "comm_bench")
        assert run.data.tags["world_size"] == str(rows.world_size[0])
        assert run.data.tags[tracking.TAG_HASH] == rows["provenance.config_hash"][0]
        for collective, group in rows.dropna(subset=["busbw_gb_s"]).groupby("collective"):
            history = client.get_metric_history(run.info.run_id, f"{collective}_busbw_gb_s")
            assert sorted((m.step, m.value) for m in history) == list(
                zip(group.bytes, group.busbw_gb_s, strict=True)
            )
        logs = {Path(info.path).name for info in client.list_artifacts(run.info.run_id, "logs")}
        assert {f"{path.stem}.log", f"{path.stem}.tsv"} <= logs  # the rule's log and benchmark file
