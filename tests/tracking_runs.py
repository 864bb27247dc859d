"""What the tracking tests share (tests/test_tracking*.py): the environment without a job's tracking
settings, a run folder trained in this process with its run config, the embedded store's settings and
metrics, a wait for the follower, and the checks of the demo's store (tests/test_workflow.py)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pandas as pd
import pytest

from scalestudy import tracking
from tests.inprocess import write_packed_cifar
from tests.processes import launch_free_environ
from tests.run_configs import resnet_run

pytest.importorskip("mlflow")

from scalestudy.tracking import store  # noqa: E402

# a run of 2 epochs of 6 steps, a checkpoint every 3; a finished run's checkpoints retired, as in a study
BASE = resnet_run(
    epochs=2,
    max_steps_per_epoch=6,
    checkpoint_every_steps=3,
    log_every_steps=1,
    step_timing_every=4,
    target_accuracy=0.05,
    measure_warmup_steps=2,
    measure_steps=4,
    measure_intervals=2,
    keep_checkpoints=False,
)


def clean_environ() -> dict[str, str]:
    """This process's environment without a launcher's variables nor the job's tracking settings."""
    return launch_free_environ(also=(tracking.ENV, "APPTAINERENV_"))


@pytest.fixture(autouse=True)
def one_tracking_process(monkeypatch):
    """Autouse where imported: no launcher's variables, no job's tracking settings."""
    for name in set(os.environ) - set(clean_environ()):
        monkeypatch.delenv(name)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return write_packed_cifar(tmp_path_factory.mktemp("packed"), 16, 8)


def settings_for(root: Path, **changes) -> dict:
    config = {"study": {"name": "t"}, "tracking": {"enabled": True, **changes}}
    return tracking.settings(config, root)


def make_run(root: Path, data_dir: Path, point: str, **changes) -> tuple[Path, dict]:
    """A run folder results/runs/<point> under `root`, trained here; (folder, run config)."""
    out = root / "results/runs" / point
    config = {**BASE, "data_dir": str(data_dir), "checkpoint_dir": str(root / "ckpt" / point), **changes}
    return out, config


def all_metrics(client, run_id: str) -> dict[str, list[tuple[int, float]]]:
    run = client.get_run(run_id)
    return {
        key: sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))
        for key in run.data.metrics
    }


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
    check_stage_spans(client, store.experiment_id(client, settings), by_point)
    # live: the study's follower (not only rule track) replayed every training job's journal
    followed = (workdir / "results/logs/tracking" / tracking.FOLLOWER_LOG).read_text()
    for folder in folders:
        assert f"{tracking.point_of(folder)}: " in followed, tracking.point_of(folder)


def check_stage_spans(client, experiment: str, by_point: dict[str, list]) -> None:
    """Each stage's run lasts from its first point's start to its last point's end (a stage's run
    is made when the grid is scheduled, at the study's start, and ends with the sync)."""
    stages = [point for point in by_point if point.startswith(f"{tracking.STUDY_POINT}/")]
    assert {"study/baseline", "study/scaling", "study/smoke", "study/comm_bench"} <= set(stages)
    for point in stages:
        (stage,) = by_point[point]
        ran = store.children(client, experiment, stage.info.run_id)
        assert ran and all(run.info.status == "FINISHED" for run in ran), point
        span = (min(run.info.start_time for run in ran), max(run.info.end_time for run in ran))
        assert (stage.info.start_time, stage.info.end_time) == span, point


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
        if record["check"] == "io":  # replayed: the job's own times, not the sync's
            check_recorded_times(
                run, record["provenance"]["timestamp"], workdir / "results/benchmarks/smoke/io.tsv"
            )
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
        benchmark = workdir / f"results/benchmarks/comm/{path.stem}.tsv"
        check_recorded_times(run, rows["provenance.timestamp"][0], benchmark)


def check_recorded_times(run, timestamp: str, benchmark: Path) -> None:
    """A replayed run ended when its result's provenance was taken and lasted the wall time
    Snakemake's benchmark measured of its job."""
    import datetime

    ended = round(datetime.datetime.fromisoformat(timestamp).timestamp() * 1000)
    wall_ms = round(float(pd.read_csv(benchmark, sep="\t")["s"].iloc[-1]) * 1000)
    assert (run.info.start_time, run.info.end_time) == (ended - wall_ms, ended), run.data.tags


def wait_for(predicate, timeout_s: float = 600):
    """The follower runs at nice 19 (training comes first), its start included (importing mlflow,
    2.4 CPU-s): its first pass took 5 s on an idle machine, 34 to 112 s in the full suite (two test
    workers and the Slurm tests on 2 cores), and waited for the first idle moment beside 6 busy loops."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if value := predicate():
                return value
        except Exception:  # noqa: BLE001 - the store is being created by the follower
            pass
        time.sleep(0.2)
    raise AssertionError("timed out")
