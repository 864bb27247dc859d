"""MLflow tracking of the preflight stage (scalestudy.tracking.sync): the demo's smoke tests and a
world size's collective benchmark, written by their real code in a study folder, become runs nested
under their stages' runs with the files' numbers, params and provenance; a second sync adds nothing,
a smoke test re-run with another config supersedes its run, and a file that is no smoke result is
refused before the store is touched. The sync of training runs: test_tracking.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from scalestudy import provenance, tracking
from scalestudy.data.synthetic_cifar import generate_arrays
from scalestudy.launch import slurm_job
from scalestudy.plan import studyconfig
from tests.conftest import REPO
from tests.tracking_runs import (  # noqa: F401 - autouse
    all_metrics,
    check_recorded_times,
    clean_environ,
    one_tracking_process,
    settings_for,
)

pytest.importorskip("mlflow")

from scalestudy.tracking import store, sync  # noqa: E402


def rule_command(root: Path, argv: list[str], log: str) -> None:
    """A rule's shell command in the study folder `root`, its output to the rule's log."""
    (root / log).parent.mkdir(parents=True, exist_ok=True)
    env = clean_environ() | {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    with open(root / log, "w") as handle:
        result = subprocess.run(
            [sys.executable, "-m", *argv],
            cwd=root,
            env=env,
            stdout=handle,
            stderr=subprocess.STDOUT,
            timeout=300,
        )
    assert result.returncode == 0, (root / log).read_text()[-3000:]


@pytest.fixture(scope="module")
def preflight_study(tmp_path_factory):
    """The demo's smoke tests and a world size's collective benchmark, written by their real code in a
    study folder: train_w1 and comm w2 by the rules' commands (with their logs), io in this process
    as a Slurm job's would be (SLURM_* and the launcher's job record in the environment)."""
    from scalestudy.preflight import smoke

    root = tmp_path_factory.mktemp("preflight")
    data = root / "results/data/packed"
    data.mkdir(parents=True)
    for name, array in zip(
        ("train_images", "train_labels", "test_images", "test_labels"),
        generate_arrays(16, 4, seed=0),
        strict=True,
    ):
        np.save(data / f"{name}.npy", array)
    config = studyconfig.load(REPO / "config/demo.yaml")
    step = smoke.step_run_config(config, 1) | {"data_dir": str(data)}
    launch = {"launcher": "local", "world_size": 1, "env": {"OMP_NUM_THREADS": "1"}}
    rule_command(
        root,
        ["scalestudy.preflight.smoke", "step", "--launch-json", json.dumps(launch), "--run-config-json",
         json.dumps(step), "--out-dir", "results/smoke/train_w1", "--out", "results/smoke/train_w1.json"],
        "results/logs/smoke/train_w1.log",
    )  # fmt: skip
    bench = config["comm_bench"] | {"max_bytes": 4096, "step_factor": 8, "warmup_iters": 1, "iters": 3}
    bench |= {"device": "cpu", "backend": "gloo", "timeout_s": 60}
    rule_command(
        root,
        ["scalestudy.launch", "--launch-json", json.dumps(launch | {"world_size": 2}), "--module",
         "scalestudy.preflight.collectives", "--", "run", "--settings-json", json.dumps(bench),
         "--out", "results/comm/w2.csv"],
        "results/logs/comm/w2.log",
    )  # fmt: skip
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)
        slurm = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "node[01-02]"}
        slurm[slurm_job.SLURM_JOB_ENV] = json.dumps({"job_id": "4242"})
        for key, value in slurm.items():
            patch.setenv(key, value)
        assert smoke_io(config, data, "results/smoke/io.json") == 0
    return root, config, data, bench


def smoke_io(config: dict, data: Path, out: str, **changes) -> int:
    """rule smoke_io's command (in this process, the working directory the study's)."""
    from scalestudy.preflight import smoke

    run = smoke.io_run_config(config) | {"data_dir": str(data), **changes}
    return smoke.main(
        ["io", "--run-config-json", json.dumps(run),
         "--settings-json", json.dumps({key: config["smoke"][key] for key in smoke.IO_KEYS}),
         "--epoch-json", json.dumps(smoke.saves_per_epoch(config)), "--out", out]
    )  # fmt: skip


def preflight_args(root: Path) -> list[str]:
    """rule track's sync command for the smoke tests and the benchmark (no run folders)."""
    smoke_files = [str(root / f"results/smoke/{name}.json") for name in ("io", "train_w1")]
    return ["--runs-dir", str(root / "results/runs"), "--root", str(root), "--smoke-files", *smoke_files,
            "--comm-files", str(root / "results/comm/w2.csv")]  # fmt: skip


def one_run(client, experiment: str, point: str):
    (run,) = store.find_runs(client, experiment, point)
    return run, all_metrics(client, run.info.run_id), {i.path for i in client.list_artifacts(run.info.run_id)}


def test_sync_puts_the_smoke_tests_and_the_collective_benchmark_in_the_store(preflight_study, tmp_path):
    from scalestudy.preflight import collectives
    from scalestudy.tracking.__main__ import main

    root, _, _, bench = preflight_study
    study = tmp_path / "study"
    shutil.copytree(root / "results", study / "results", ignore=shutil.ignore_patterns("data"))
    walls = {"comm/w2": 7.25, "smoke/io": 9.4}  # what Snakemake's benchmark: measured of each job
    for stem, wall in walls.items():
        benchmark = study / f"results/benchmarks/{stem}.tsv"
        benchmark.parent.mkdir(parents=True, exist_ok=True)
        benchmark.write_text(f"s\th:m:s\tmax_rss\n{wall}\t0:00:{wall:02.0f}\t100.0\n")
    settings = settings_for(study)
    out = study / "results/logs/tracking/sync.json"
    assert (
        main(["sync", "--tracking-json", json.dumps(settings), *preflight_args(study), "--out", str(out)])
        == 0
    )
    first = {run["point"]: run for run in json.loads(out.read_text())["runs"]}
    assert sorted(first) == ["comm_bench/w2", "smoke/io", "smoke/train_w1"]
    assert all(run["created"] and run["metrics"] > 0 for run in first.values())
    client = store.client(settings)
    experiment = store.experiment_id(client, settings)
    found = client.search_runs([experiment], filter_string="tags.stage != 'study'")
    stages = {r.data.tags["stage"]: r for r in found if r.data.tags[tracking.TAG_POINT].startswith("study/")}
    assert sorted(stages) == ["comm_bench", "smoke"]  # a run per stage, the points nested under it
    for run in found:
        point = run.data.tags[tracking.TAG_POINT]
        if point not in ("study/comm_bench", "study/smoke"):
            assert run.data.tags["mlflow.parentRunId"] == stages[point.split("/")[0]].info.run_id
    found = [r for r in found if r not in stages.values()]
    assert sorted((r.data.tags["stage"], r.info.status) for r in found) == [
        ("comm_bench", "FINISHED"),
        ("smoke", "FINISHED"),
        ("smoke", "FINISHED"),
    ]

    # comm_bench/w2: the CSV's numbers per message size (step = bytes), its settings, its provenance
    rows = pd.read_csv(study / "results/comm/w2.csv")
    run, history, artifacts = one_run(client, experiment, "comm_bench/w2")
    tags = run.data.tags
    assert [tags[key] for key in ("world_size", "nodes", "placement", "backend")] == [
        "2",
        "1",
        "intra-node",
        "gloo",
    ]
    assert tags[tracking.TAG_HASH] == rows["provenance.config_hash"][0]
    assert tags["git_commit"] == rows["provenance.git_commit"][0]
    given = collectives.settings_from_json(json.dumps(bench))  # what the rule gave, defaults filled in
    assert (
        run.data.params == tracking.flatten(given)
        and provenance.config_hash(given) == tags[tracking.TAG_HASH]
    )
    for collective, group in rows.groupby("collective"):
        assert history[f"{collective}_busbw_gb_s"] == list(zip(group.bytes, group.busbw_gb_s, strict=True))
        assert history[f"{collective}_time_s"] == list(zip(group.bytes, group.time_s, strict=True))
        largest = group.loc[group.bytes.idxmax()]
        assert history[f"summary_{collective}_busbw_at_max_gb_s"] == [(0, largest.busbw_gb_s)]
        assert history[f"summary_{collective}_busbw_peak_gb_s"] == [(0, group.busbw_gb_s.max())]
    assert {"w2.csv", "logs"} <= artifacts
    assert {Path(i.path).name for i in client.list_artifacts(run.info.run_id, "logs")} == {"w2.log", "w2.tsv"}
    check_recorded_times(
        run, rows["provenance.timestamp"][0], study / "results/benchmarks/comm/w2.tsv"
    )  # the job's, not the sync's

    # smoke/io: one rank, its run config's params, the record's figures, the Slurm job it recorded
    record = json.loads((study / "results/smoke/io.json").read_text())
    run, history, artifacts = one_run(client, experiment, "smoke/io")
    tags = run.data.tags
    assert [tags[key] for key in ("stage", "world_size", "nodes", "smoke_check")] == ["smoke", "1", "1", "io"]
    assert record["run_config"]["world_size"] == 2  # the grid's largest point's loader, in one rank
    assert tags[tracking.TAG_HASH] == record["provenance"]["config_hash"]
    assert (tags["slurm.job_ids"], tags["slurm.nodelists"]) == ("4242", "node[01-02]")
    assert run.data.params == tracking.flatten(record["run_config"])
    assert history["smoke_loader_images_per_s"] == [(0, record["loader"]["images_per_s"])]
    assert history["smoke_checkpoint_write_mb_s"] == [(0, record["checkpoint"]["write_mb_s"])]
    assert history["smoke_checkpoint_save_s_per_epoch"] == [(0, record["checkpoint"]["save_s_per_epoch"])]
    assert artifacts == {"io.json", "logs"}  # run here, not by the rule: no log, its benchmark file
    check_recorded_times(run, record["provenance"]["timestamp"], study / "results/benchmarks/smoke/io.tsv")

    # smoke/train_w1: the record's figures and everything its trainer's run folder has
    record = json.loads((study / "results/smoke/train_w1.json").read_text())
    summary = json.loads((study / "results/smoke/train_w1/summary.json").read_text())
    run, history, artifacts = one_run(client, experiment, "smoke/train_w1")
    assert run.data.tags["world_size"] == "1" and run.data.tags["stage"] == "smoke"
    assert (
        run.data.tags[tracking.TAG_HASH]
        == summary["provenance"]["config_hash"]
        == record["provenance"]["config_hash"]
    )
    assert run.data.params == tracking.flatten(record["run_config"])
    for key in ("wall_s", "step_time_s", "images_per_s", "steps"):
        assert history[f"smoke_{key}"] == [(0, record[key])]
    assert run.data.metrics["summary_whole_run_images_per_s"] == summary["results"]["whole_run_images_per_s"]
    epochs = pd.read_csv(study / "results/smoke/train_w1/metrics.csv")
    assert history["epoch_train_loss"] == list(zip(epochs.epoch, epochs.train_loss, strict=True))
    assert {"train_w1.json", "summary.json", "metrics.csv", "logs"} <= artifacts

    # a second sync adds nothing
    again = sync.sync(
        settings, study / "results/runs", [], study,
        smoke_files=[study / "results/smoke/io.json", study / "results/smoke/train_w1.json"],
        comm_files=[study / "results/comm/w2.csv"],
    )  # fmt: skip
    for run in again["runs"]:
        assert (run["created"], run["metrics"], run["artifacts"]) == (False, 0, 0), run
        assert run["run_id"] == first[run["point"]]["run_id"]
    runs = client.search_runs([experiment], max_results=100)
    assert len(runs) == 6  # the three points, their two stages' runs and the study's run
    # each stage's run spans its points: from the first one's start to the last one's end
    for stage in ("smoke", "comm_bench"):
        (stage_run,) = store.find_runs(client, experiment, f"{tracking.STUDY_POINT}/{stage}")
        points = store.children(client, experiment, stage_run.info.run_id)
        assert sorted(run.data.tags[tracking.TAG_POINT] for run in points) == sorted(
            point for point in first if point.startswith(f"{stage}/")
        )
        span = (min(r.info.start_time for r in points), max(r.info.end_time for r in points))
        assert (stage_run.info.start_time, stage_run.info.end_time) == span, stage


def test_a_smoke_test_rerun_with_another_config_supersedes_its_run(preflight_study, tmp_path, monkeypatch):
    root, config, data, _ = preflight_study
    study = tmp_path / "study"
    shutil.copytree(
        root / "results/smoke", study / "results/smoke", ignore=shutil.ignore_patterns("train_w1*")
    )
    settings = settings_for(study)
    io = study / "results/smoke/io.json"
    first = sync.sync(settings, study / "results/runs", [], study, smoke_files=[io])
    monkeypatch.chdir(study)
    assert smoke_io(config, data, str(io), num_workers=0) == 0  # the point re-run, its run config changed
    second = sync.sync(settings, study / "results/runs", [], study, smoke_files=[io])
    (old,), (new,) = first["runs"], second["runs"]
    assert new["created"] and new["superseded"] == 1 and new["run_id"] != old["run_id"]
    client = store.client(settings)
    assert client.get_run(old["run_id"]).data.tags["scalestudy.superseded_by"] == new["run_id"]


def test_a_smoke_result_that_is_not_one_is_refused_naming_the_file(tmp_path):
    from scalestudy.tracking.__main__ import main

    bad = tmp_path / "results/smoke/io.json"
    bad.parent.mkdir(parents=True)
    bad.write_text("{}")
    settings = json.dumps(settings_for(tmp_path))
    assert (
        main(["sync", "--tracking-json", settings, "--runs-dir", str(tmp_path), "--smoke-files", str(bad)])
        == 2
    )
    assert not (tmp_path / "results/mlflow").exists()  # read before the store is touched
