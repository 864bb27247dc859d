"""Replays run folders into MLflow (rule `track`, on the submit host), adding only what is missing:
running it twice, or after a live-tracked or resumed run, creates no second run, step or artifact.

Per run folder with a summary.json: the point's run (found by its point and config-hash tags, else
created under the study's run) gets the flattened run config as params, its tags (stage, mode, world
size, ..., git commit, image digest, Slurm job ids and node lists, attempt), the per-step metrics of
the journal (tracking.jsonl) and steps.csv, the per-epoch metrics of metrics.csv (step = epoch), the
summary's steady-state figures (step 0), the GPU monitor's series as system metrics, and the run
folder's files and rank logs as artifacts; it ends FINISHED. Runs of the same point with another
config hash are tagged superseded. The study's run gets the tables, figures, report and paper.
`schedule` creates the runs of points not yet run, SCHEDULED.
"""

from __future__ import annotations

import csv
import json
import logging
import math
import time
from pathlib import Path
from typing import Any

from scalestudy import provenance
from scalestudy.plan import runfiles
from scalestudy.tracking import EPOCH_COLUMNS, JOURNAL, TAG_HASH, TAG_SUPERSEDED, point_of, point_tags, store

log = logging.getLogger("scalestudy.tracking")

# summary.json results logged as metrics (step 0): the steady-state figures and the run's outcome.
SUMMARY_METRICS = (
    "images_per_s",
    "images_per_s_per_gpu",
    "step_time_s",
    "images_per_s_cv",
    "whole_run_images_per_s",
    "whole_run_images_per_s_per_gpu",
    "final_test_acc",
    "best_test_acc",
    "final_train_loss",
    "final_test_loss",
    "final_test_perplexity",
    "time_to_target_s",
    "total_time_s",
    "peak_memory_bytes",
    "model_state_bytes_per_rank",
)
RUN_ARTIFACTS = (
    runfiles.SUMMARY,
    runfiles.METRICS,
    runfiles.STEPS,
    runfiles.GPU_MONITOR,
    runfiles.GPU_MONITOR_INFO,
    runfiles.PROFILE_OPS,
    runfiles.PROFILE_WINDOW,
    JOURNAL,
)
MONITOR_SKIP = {"time_s", "host", "gpu_index", "gpu_uuid", "gpu_name", "rank"}


def summary_tags(summary: dict[str, Any]) -> dict[str, str]:
    """The tags a finished run's provenance decides."""
    prov, results = summary.get("provenance", {}), summary.get("results", {})
    git = prov.get("git") if isinstance(prov.get("git"), dict) else prov
    values = {
        "git_commit": git.get("git_commit") or git.get("commit"),
        "git_dirty": git.get("git_dirty") if "git_dirty" in git else git.get("dirty"),
        "image": prov.get("image"),
        "image_sha256": prov.get("image_sha256"),
        "attempt": prov.get("attempt"),
        "hosts": ",".join(prov.get("hosts") or []),
        "device_name": results.get("device_name"),
        "window_filled": results.get("window_filled"),
    }
    return {key: str(value) for key, value in values.items() if value not in (None, "")}


def read_csv(path: Path) -> list[dict[str, str]]:
    if not path.is_file():
        return []
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def number(value: Any) -> float | None:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def folder_metrics(run_dir: Path, config_hash: str) -> dict[str, dict[int, float]]:
    """Every metric the run folder holds: {key: {step: value}} (a step logged twice: the last)."""
    found: dict[str, dict[int, float]] = {}

    def put(key: str, step: int, value: Any) -> None:
        if (value := number(value)) is not None:
            found.setdefault(key, {})[int(step)] = value

    journal = run_dir / JOURNAL
    lines = journal.read_text().splitlines() if journal.is_file() else []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line cut by a killed job
        if record.get("config_hash") == config_hash and record.get("kind") == "step":
            step, values, _ = record["at"]
            for key, value in values.items():
                put(key, step, value)
    for row in read_csv(run_dir / runfiles.STEPS):
        put("step_time_s", int(row["step"]), row.get("step_s"))
    for row in read_csv(run_dir / runfiles.METRICS):
        for column in EPOCH_COLUMNS:
            put(f"epoch_{column}", int(row["epoch"]), row.get(column))
    results = json.loads((run_dir / runfiles.SUMMARY).read_text()).get("results", {})
    for key in SUMMARY_METRICS:
        put(f"summary_{key}", 0, results.get(key))
    for index, row in enumerate(read_csv(run_dir / runfiles.GPU_MONITOR)):
        for key, value in row.items():
            if key not in MONITOR_SKIP:
                put(f"system/rank{row.get('rank', 0)}_{key}", index, value)
    return found


def log_missing_metrics(client, run_id: str, metrics: dict[str, dict[int, float]]) -> int:
    """Logs the (key, step) pairs the run lacks; returns how many."""
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    missing = []
    for key, steps in metrics.items():
        have = store.logged_steps(client, run_id, key)
        missing += [Metric(key, value, now, step) for step, value in steps.items() if step not in have]
    for start in range(0, len(missing), 1000):
        client.log_batch(run_id, metrics=missing[start : start + 1000])
    return len(missing)


def log_missing_artifacts(client, run_id: str, files: list[Path], artifact_path: str | None = None) -> int:
    """Uploads the files the run lacks (or holds with another size); returns how many."""
    have = {Path(info.path).name: info.file_size for info in client.list_artifacts(run_id, artifact_path)}
    sent = 0
    for path in files:
        if path.is_file() and have.get(path.name) != path.stat().st_size:
            client.log_artifact(run_id, str(path), artifact_path)
            sent += 1
    return sent


def rank_logs(run_dir: Path, root: Path) -> list[Path]:
    """The rule's log of a run folder and its attempts' logs (results/logs/<point>.log*)."""
    point = point_of(run_dir)
    base = root / "results/logs" / point
    return sorted(base.parent.glob(f"{base.name}.log*")) if base.parent.is_dir() else []


def sync_run(client, experiment: str, parent: str, run_dir: Path, tracking: dict, root: Path) -> dict:
    """One run folder into its MLflow run; what was added."""
    summary = json.loads((run_dir / runfiles.SUMMARY).read_text())
    given = summary["run"]
    config_hash = provenance.config_hash(given)
    point = point_of(run_dir)
    tags = point_tags(point, config_hash, given, tracking["study"])
    run_id, created = store.point_run(client, experiment, tags, given, parent, status="RUNNING")
    store.log_params(client, run_id, given)
    for key, value in {**tags, **summary_tags(summary)}.items():
        client.set_tag(run_id, key, value)
    slurm = summary.get("provenance", {})
    store.append_tag(client, run_id, "slurm.job_ids", slurm.get("slurm_job_id"))
    store.append_tag(client, run_id, "slurm.nodelists", slurm.get("slurm_nodelist"))
    added = log_missing_metrics(client, run_id, folder_metrics(run_dir, config_hash))
    files = [run_dir / name for name in RUN_ARTIFACTS]
    artifacts = log_missing_artifacts(client, run_id, files)
    artifacts += log_missing_artifacts(client, run_id, rank_logs(run_dir, root), "logs")
    if client.get_run(run_id).info.status != "FINISHED":
        store.set_status(client, run_id, "FINISHED")
    superseded = mark_superseded(client, experiment, point, config_hash, run_id)
    return {
        "point": point,
        "run_id": run_id,
        "created": created,
        "metrics": added,
        "artifacts": artifacts,
        "superseded": superseded,
    }


def mark_superseded(client, experiment: str, point: str, config_hash: str, run_id: str) -> int:
    """Tags the point's runs of other run configs as superseded by `run_id` (never deletes them)."""
    marked = 0
    for run in store.find_runs(client, experiment, point):
        if run.data.tags.get(TAG_HASH) != config_hash and run.data.tags.get(TAG_SUPERSEDED) != "true":
            client.set_tag(run.info.run_id, TAG_SUPERSEDED, "true")
            client.set_tag(run.info.run_id, "scalestudy.superseded_by", run_id)
            marked += 1
    return marked


def sync_study(client, experiment: str, parent: str, files: list[Path], root: Path) -> int:
    """The study's files (tables, figures, report, paper) on its run, by their folder under results/."""
    sent = 0
    for path in files:
        try:
            folder = str(path.resolve().parent.relative_to((root / "results").resolve()))
        except ValueError:
            folder = "other"
        sent += log_missing_artifacts(client, parent, [path], None if folder == "." else folder)
    return sent


def sync(tracking: dict, runs_dir: Path, study_files: list[Path], root: Path) -> dict[str, Any]:
    """Every run folder under `runs_dir` and the study's files; a record of what was added."""
    client = store.client(tracking, patient=True)
    experiment = store.experiment_id(client, tracking)
    parent = store.study_run(client, experiment, tracking["study"])
    runs = [
        sync_run(client, experiment, parent, path.parent, tracking, root)
        for path in sorted(runs_dir.glob("**/summary.json"))
    ]
    study = sync_study(client, experiment, parent, study_files, root)
    store.set_status(client, parent, "FINISHED")  # rule track runs once the study's outputs exist
    return {"experiment": tracking["experiment"], "study_run": parent, "runs": runs, "study_artifacts": study}


def schedule(tracking: dict, points: list[dict[str, Any]]) -> list[str]:
    """Creates a SCHEDULED run for each point ({point, run}) that has no run of its run config."""
    client = store.client(tracking, patient=True)
    experiment = store.experiment_id(client, tracking)
    parent = store.study_run(client, experiment, tracking["study"])
    created = []
    for item in points:
        config_hash = provenance.config_hash(item["run"])
        tags = point_tags(item["point"], config_hash, item["run"], tracking["study"])
        run_id, new = store.point_run(client, experiment, tags, item["run"], parent, status="SCHEDULED")
        if new:
            created.append(item["point"])
    return created
