"""The MLflow side of tracking (imports mlflow: use only with tracking on): the client of a
store, the study's experiment and parent run, a grid point's run found by its tags or created,
its status with the history of its transitions, a point's run filled from its files adding only
what it lacks (Filling, fill: the sync's one way to write a run), and the run-id file in the point's
checkpoint folder that lets a retry continue the same MLflow run."""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scalestudy import atomic
from scalestudy.tracking import (
    RUN_ID_FILE,
    STUDY_POINT,
    TAG_HASH,
    TAG_HISTORY,
    TAG_POINT,
    TAG_STUDY,
    TAG_STUDY_RUN,
    TAG_SUPERSEDED,
    flatten,
)


def client(tracking: dict[str, Any], patient: bool = False):
    """An MlflowClient of the settings' store. A training job's (default) fails fast: no retries on
    its critical path, a down server costs one timeout, then a warning. The sync on the submit host
    is `patient`: a few retries and a minute per request (a server just restarted answers slowly)."""
    timeout = 60 if patient else max(1, round(tracking["timeout_s"]))
    os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = "3" if patient else "0"
    os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] = str(timeout)
    from mlflow import MlflowClient

    with schema_lock(tracking["uri"]):
        return MlflowClient(tracking_uri=tracking["uri"])


SQLITE_PREFIX = "sqlite:///"


@contextlib.contextmanager
def schema_lock(uri: str) -> Iterator[None]:
    """Holds an exclusive lock beside an SQLite store while a client opens it. Opening a store
    creates or upgrades its tables; two processes doing that at once (the follower and rule
    `track`, or a test's client, on a fresh results/) break each other's migration ("Online
    migration expected to match one row ..."). A server's store (http://) needs nothing."""
    if not uri.startswith(SQLITE_PREFIX):
        yield
        return
    database = Path(uri[len(SQLITE_PREFIX) :])
    database.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{database}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


PARENT_TAG = "mlflow.parentRunId"  # MLflow's own: a nested run


def runs_page(uri: str, experiment: str) -> str:
    """The UI's page of the experiment's runs table: MLflow 3 (3.17) opens an experiment on its GenAI
    overview (traces) unless the address asks for the model-training view (`workflowType`; the UI
    reads it from the address, else from the browser's last choice, GenAI by default, and no
    longer from the experiment's `mlflow.experimentKind` tag). An http(s) store is its own UI; an
    embedded (sqlite) store's UI is `mlflow ui` on port 5000 (ui_command)."""
    base = uri.rstrip("/") if uri.startswith(("http://", "https://")) else "http://127.0.0.1:5000"
    return f"{base}/#/experiments/{experiment}/runs?workflowType=machine_learning"


def ui_command(uri: str) -> str | None:
    """The command that serves an embedded store's UI on 127.0.0.1:5000 (None for a server's store):
    one worker and no GenAI job runner, 5 processes instead of 18 (docs/guide/tracking.md)."""
    if not uri.startswith(SQLITE_PREFIX):
        return None
    import shlex

    serve = "MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false mlflow ui --workers 1 --port 5000"
    return f"{serve} --backend-store-uri {shlex.quote(uri)}"


def experiment_id(mlflow_client, tracking: dict[str, Any]) -> str:
    found = mlflow_client.get_experiment_by_name(tracking["experiment"])
    if found is not None:
        return found.experiment_id
    try:
        return mlflow_client.create_experiment(
            tracking["experiment"],
            artifact_location=tracking.get("artifact_root") or None,
            # the classic (model training) kind, for the UIs that read it (MLflow 3.0 - 3.4; 3.17 does not)
            tags={"mlflow.experimentKind": "custom_model_development"},
        )
    except Exception:  # another job created it in the meantime
        found = mlflow_client.get_experiment_by_name(tracking["experiment"])
        if found is None:
            raise
        return found.experiment_id


def find_runs(mlflow_client, experiment: str, point: str, config_hash: str | None = None) -> list:
    """The runs of a grid point (of one run config, if given), oldest first."""
    query = f"tags.`{TAG_POINT}` = '{point}'"
    if config_hash:
        query += f" and tags.`{TAG_HASH}` = '{config_hash}'"
    runs = mlflow_client.search_runs([experiment], filter_string=query, max_results=1000)
    return sorted(runs, key=lambda run: run.info.start_time or 0)


def study_run(mlflow_client, experiment: str, study: str) -> str:
    """The study's parent run (found by its tags, or created)."""
    found = find_runs(mlflow_client, experiment, STUDY_POINT)
    if found:
        return found[0].info.run_id
    tags = {TAG_POINT: STUDY_POINT, TAG_STUDY: study, "mlflow.runName": f"study {study}", "stage": "study"}
    return mlflow_client.create_run(experiment, tags=tags).info.run_id


_STAGE_RUNS: dict[tuple[str, str, str], str] = {}  # (experiment, study run, stage) -> its run id


def stage_run(mlflow_client, experiment: str, study: str, stage: str) -> str:
    """The run of one stage (baseline, scaling, ...) nested under the study's run `study` (found by
    its tags, or created): the points of the stage nest under it."""
    key = (experiment, study, stage)
    if key not in _STAGE_RUNS:
        point = f"{STUDY_POINT}/{stage}"
        found = find_runs(mlflow_client, experiment, point)
        if found:
            _STAGE_RUNS[key] = found[0].info.run_id
        else:
            tags = {TAG_POINT: point, "stage": stage, "mlflow.runName": stage, PARENT_TAG: study}
            tags[TAG_STUDY_RUN] = study
            _STAGE_RUNS[key] = mlflow_client.create_run(experiment, tags=tags).info.run_id
    return _STAGE_RUNS[key]


def stage_runs(mlflow_client, experiment: str) -> list[str]:
    """The run ids of every stage's run of the experiment."""
    query = f"tags.`{TAG_POINT}` LIKE '{STUDY_POINT}/%'"
    return [run.info.run_id for run in mlflow_client.search_runs([experiment], filter_string=query)]


def children(mlflow_client, experiment: str, run_id: str) -> list:
    """The runs nested under `run_id` (MLflow's parent tag)."""
    query = f"tags.`{PARENT_TAG}` = '{run_id}'"
    return mlflow_client.search_runs([experiment], filter_string=query, max_results=50000)


def finish_stage(mlflow_client, experiment: str, stage_id: str) -> str:
    """A stage's run FINISHED over its own points' span: from the first point's start to the last
    one's end, not the study's (a stage run is made when the grid is scheduled, at the study's
    start). MLflow moves no start time, so a stage run that started earlier is made again from its
    first point's start (started_again), its points nested under the new one. Points that never
    started (SCHEDULED) count for nothing; a stage without a started point ends now. Its run id."""
    points = children(mlflow_client, experiment, stage_id)
    ran = [run for run in points if run.info.status != "SCHEDULED" and run.info.start_time]
    if not ran:
        set_status(mlflow_client, stage_id, "FINISHED")
        return stage_id
    first = min(run.info.start_time for run in ran)
    last = max((run.info.end_time for run in ran if run.info.end_time), default=None)
    stage = mlflow_client.get_run(stage_id)
    if stage.info.start_time != first:
        nest = {PARENT_TAG: stage.data.tags[PARENT_TAG]} if PARENT_TAG in stage.data.tags else {}
        stage_id = started_again(mlflow_client, experiment, stage, nest, first / 1000)
        for run in points:
            mlflow_client.set_tag(run.info.run_id, PARENT_TAG, stage_id)
        for key, known in list(_STAGE_RUNS.items()):  # this process's cache of the stage's run
            if known == stage.info.run_id:
                _STAGE_RUNS[key] = stage_id
    set_status(mlflow_client, stage_id, "FINISHED", ended=last / 1000 if last else None)
    return stage_id


def point_run(
    mlflow_client,
    experiment: str,
    tags: dict[str, str],
    given: dict[str, Any] | None,
    parent: str | None = None,
    status: str = "SCHEDULED",
    started: float | None = None,
) -> tuple[str, bool]:
    """The run of a grid point's run config (its tags name both): (run id, created). A new one
    starts in `status`, with the flattened run config as its params, nested under its stage's run
    under the study's run `parent` (MLflow's parent tag: the runs table lists the stages under the
    study, the points under their stage). A SCHEDULED run that starts RUNNING is made again from the
    moment it started (`started`, Unix seconds; now if None), its tags and params kept: MLflow
    counts a run's duration from its start time, which no API moves, and the queue is not the run."""
    nest = {}
    if parent:
        nest = {
            TAG_STUDY_RUN: parent,
            PARENT_TAG: stage_run(mlflow_client, experiment, parent, tags["stage"]),
        }
    found = find_runs(mlflow_client, experiment, tags[TAG_POINT], tags[TAG_HASH])
    if found:
        run = found[-1]
        if status == "RUNNING" and run.info.status == "SCHEDULED":
            return started_again(mlflow_client, experiment, run, nest, started), False
        for key, value in nest.items():  # a store whose points hung under the study's run itself
            if run.data.tags.get(key) != value:
                mlflow_client.set_tag(run.info.run_id, key, value)
        return run.info.run_id, False
    start_ms = round(started * 1000) if started else None
    run_id = mlflow_client.create_run(experiment, start_time=start_ms, tags=dict(tags) | nest).info.run_id
    if given is not None:
        log_params(mlflow_client, run_id, given)
    set_status(mlflow_client, run_id, status)
    return run_id, True


def started_again(mlflow_client, experiment: str, run, nest: dict[str, str], started: float | None) -> str:
    """A run made again from `started` (or now), with its tags and params: a SCHEDULED run as it
    starts, a stage's run at its first point's start; the old one is deleted (MLflow's soft delete:
    out of the runs table)."""
    from mlflow.entities import Param

    tags = {key: value for key, value in run.data.tags.items() if not key.startswith("mlflow.")}
    tags |= {"mlflow.runName": run.data.tags.get("mlflow.runName") or run.info.run_name} | nest
    start_ms = round((started or time.time()) * 1000)
    run_id = mlflow_client.create_run(experiment, start_time=start_ms, tags=tags).info.run_id
    params = [Param(key, value) for key, value in run.data.params.items()]
    for start in range(0, len(params), 100):
        mlflow_client.log_batch(run_id, params=params[start : start + 100])
    mlflow_client.delete_run(run.info.run_id)
    return run_id


def log_params(mlflow_client, run_id: str, given: dict[str, Any]) -> None:
    """The flattened run config, the keys the run does not have yet (params never change)."""
    from mlflow.entities import Param

    have = mlflow_client.get_run(run_id).data.params
    params = [Param(k, v) for k, v in flatten(given).items() if k not in have]
    for start in range(0, len(params), 100):
        mlflow_client.log_batch(run_id, params=params[start : start + 100])


def set_status(
    mlflow_client, run_id: str, status: str, reason: str | None = None, ended: float | None = None
) -> None:
    """Moves the run to `status` and appends it to the status-history tag (KILLED, RUNNING,
    FINISHED of a resumed job stay visible after the fact); a repeated status is not appended."""
    run = mlflow_client.get_run(run_id)
    history = [s for s in run.data.tags.get(TAG_HISTORY, "").split(",") if s]
    if not history or history[-1] != status:
        mlflow_client.set_tag(run_id, TAG_HISTORY, ",".join([*history, status]))
    if reason:
        mlflow_client.set_tag(run_id, "failure_reason", reason[:5000])
    if status in ("FINISHED", "FAILED", "KILLED"):
        mlflow_client.set_terminated(run_id, status, end_time=round(ended * 1000) if ended else None)
    else:
        mlflow_client.update_run(run_id, status=status)


def append_tag(mlflow_client, run_id: str, key: str, value: str | None) -> None:
    """Adds `value` to a comma-separated tag (Slurm job ids of every attempt), once."""
    if not value:
        return
    have = [v for v in mlflow_client.get_run(run_id).data.tags.get(key, "").split(",") if v]
    if value not in have:
        mlflow_client.set_tag(run_id, key, ",".join([*have, value]))


def logged_steps(mlflow_client, run_id: str, key: str) -> set[int]:
    return {metric.step for metric in mlflow_client.get_metric_history(run_id, key)}


def metric_value(value: Any) -> float | None:
    """A value as a metric: a finite float, else None (not logged: '', 'nan', None, text)."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def put_metric(found: dict[str, dict[int, float]], key: str, step: int, value: Any) -> None:
    """Adds (key, step) = value to `found` ({key: {step: value}}) if the value is a metric."""
    if (value := metric_value(value)) is not None:
        found.setdefault(key, {})[int(step)] = value


@dataclass
class Filling:
    """What one point's MLflow run gets from its files; `fill` adds what the run lacks."""

    tags: dict[str, str]  # point_tags(): the point and its config hash find the run
    given: dict[str, Any] | None = None  # the params (flattened)
    more_tags: dict[str, str] = field(default_factory=dict)
    slurm: list[tuple[str | None, str | None]] = field(default_factory=list)  # (job id, node list)
    metrics: dict[str, dict[int, float]] = field(default_factory=dict)  # {key: {step: value}}
    artifacts: dict[str, list[Path]] = field(default_factory=dict)  # folder ('' = top) -> files
    started: float | None = None  # when the run started, Unix seconds (its journal's first start)
    ended: float | None = None  # when it ended (its journal's last end)


def fill(mlflow_client, experiment: str, parent: str, filling: Filling) -> dict[str, Any]:
    """The point's run of its config hash (found, else created under the study's run `parent`) gets
    the filling's params, tags, Slurm jobs, missing (metric, step) pairs and artifacts, ends
    FINISHED, and supersedes the point's runs of other configs; what was added."""
    point, config_hash = filling.tags[TAG_POINT], filling.tags[TAG_HASH]
    run_id, created = point_run(
        mlflow_client, experiment, filling.tags, filling.given, parent, "RUNNING", filling.started
    )
    if filling.given is not None:
        log_params(mlflow_client, run_id, filling.given)
    have = mlflow_client.get_run(run_id).data.tags
    for key, value in {**filling.tags, **filling.more_tags}.items():
        if have.get(key) != value:
            mlflow_client.set_tag(run_id, key, value)
    for job_id, nodelist in filling.slurm:
        append_tag(mlflow_client, run_id, "slurm.job_ids", job_id)
        append_tag(mlflow_client, run_id, "slurm.nodelists", nodelist)
    added = log_missing_metrics(mlflow_client, run_id, filling.metrics)
    sent = sum(
        log_missing_artifacts(mlflow_client, run_id, files, folder or None)
        for folder, files in filling.artifacts.items()
    )
    if mlflow_client.get_run(run_id).info.status != "FINISHED":
        set_status(mlflow_client, run_id, "FINISHED", ended=filling.ended)
    superseded = mark_superseded(mlflow_client, experiment, point, config_hash, run_id)
    return {
        "point": point,
        "run_id": run_id,
        "created": created,
        "metrics": added,
        "artifacts": sent,
        "superseded": superseded,
    }


def log_missing_metrics(mlflow_client, run_id: str, metrics: dict[str, dict[int, float]]) -> int:
    """Logs the (key, step) pairs the run lacks; returns how many."""
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    missing = []
    for key, steps in metrics.items():
        have = logged_steps(mlflow_client, run_id, key)
        missing += [Metric(key, value, now, step) for step, value in steps.items() if step not in have]
    for start in range(0, len(missing), 1000):
        mlflow_client.log_batch(run_id, metrics=missing[start : start + 1000])
    return len(missing)


def log_missing_artifacts(
    mlflow_client, run_id: str, files: list[Path], artifact_path: str | None = None
) -> int:
    """Uploads the files the run lacks (or holds with another size); returns how many."""
    listed = mlflow_client.list_artifacts(run_id, artifact_path)
    have = {Path(info.path).name: info.file_size for info in listed}
    sent = 0
    for path in files:
        if path.is_file() and have.get(path.name) != path.stat().st_size:
            mlflow_client.log_artifact(run_id, str(path), artifact_path)
            sent += 1
    return sent


def mark_superseded(mlflow_client, experiment: str, point: str, config_hash: str, run_id: str) -> int:
    """Tags the point's runs of other run configs as superseded by `run_id` (never deletes them)."""
    marked = 0
    for run in find_runs(mlflow_client, experiment, point):
        if run.data.tags.get(TAG_HASH) != config_hash and run.data.tags.get(TAG_SUPERSEDED) != "true":
            mlflow_client.set_tag(run.info.run_id, TAG_SUPERSEDED, "true")
            mlflow_client.set_tag(run.info.run_id, "scalestudy.superseded_by", run_id)
            marked += 1
    return marked


def read_run_id(checkpoint_dir: str | os.PathLike, config_hash: str, uri: str) -> str | None:
    """The MLflow run an earlier attempt of this run config started in this store, if any."""
    path = Path(checkpoint_dir) / RUN_ID_FILE
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if record.get("config_hash") == config_hash and record.get("uri") == uri:
        return record.get("run_id")
    return None


def write_run_id(checkpoint_dir: str | os.PathLike, config_hash: str, uri: str, run_id: str) -> None:
    Path(checkpoint_dir).mkdir(parents=True, exist_ok=True)
    record = {"run_id": run_id, "config_hash": config_hash, "uri": uri}
    atomic.write_json(Path(checkpoint_dir) / RUN_ID_FILE, record)
