"""Experiment tracking in MLflow (docs/guide/tracking.md): one MLflow run per grid point, grouped under
one run for the study.

The run folder stays the source of truth. The study's settings (config `tracking:`) reach a
training job through one environment variable (ENV, set by rules/track.smk), never through the run
config, so the run configs and results/ are the same with tracking on or off. Rank 0 of a training
job appends its run's records to a journal in its run folder (scalestudy.train.journal); the
study's follower on the submit host sends them to MLflow while the jobs run
(scalestudy.tracking.follow), and `python -m scalestudy.tracking sync` (rule `track`) replays the
run folders afterwards, adding only what is missing (scalestudy.tracking.sync).

This module imports no third-party package (the Snakefile imports it); only the submodules that
talk to MLflow import mlflow, and only when tracking is on.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from scalestudy.plan import schema
from scalestudy.train.journal import ENV

# Beside the point's checkpoints: the MLflow run a retry of the point continues.
RUN_ID_FILE = "mlflow-run.json"
EMBEDDED_DB = "results/mlflow/mlflow.db"
EMBEDDED_ARTIFACTS = "results/mlflow/artifacts"
RUNS_ROOT = "results/runs"

# Tags that identify a grid point's MLflow run (the sync and the trainer find runs by them).
TAG_POINT = "scalestudy.point"
TAG_HASH = "scalestudy.config_hash"
TAG_STUDY = "scalestudy.study"
TAG_STUDY_RUN = "scalestudy.study_run"
TAG_HISTORY = "scalestudy.status_history"
TAG_SUPERSEDED = "scalestudy.superseded"
STUDY_POINT = "study"
STATUSES = ("SCHEDULED", "RUNNING", "FINISHED", "FAILED", "KILLED")


def settings(config: dict[str, Any], root: str | os.PathLike = ".") -> dict[str, Any] | None:
    """The study's tracking settings (config `tracking:`), or None when tracking is off. The
    embedded store is an SQLite file under results/ (absolute paths: jobs run elsewhere)."""
    section = {**schema.defaults("tracking"), **(config.get("tracking") or {})}
    if not section["enabled"]:
        return None
    root = Path(root).resolve()
    uri = section.get("uri") or f"sqlite:///{root / EMBEDDED_DB}"
    artifacts = section.get("artifact_root") or (root / EMBEDDED_ARTIFACTS).as_uri()
    study = config.get("study", {}).get("name", "study")
    return {
        "uri": uri,
        "experiment": section.get("experiment") or f"scalestudy-{study}",
        "artifact_root": artifacts if not section.get("uri") else section.get("artifact_root"),
        "study": study,
        "live": bool(section["live"]),
        "timeout_s": float(section["timeout_s"]),
    }


def to_environ(tracking: dict[str, Any] | None) -> dict[str, str]:
    """The variables that carry the settings to a training job (and through apptainer's --cleanenv)."""
    if tracking is None:
        return {}
    text = json.dumps(tracking, sort_keys=True)
    return {ENV: text, f"APPTAINERENV_{ENV}": text}


def planned_points(config: dict[str, Any]) -> list[dict[str, Any]]:
    """{point, run} of every grid point of the study (the SCHEDULED runs before any starts)."""
    from scalestudy.plan import grid

    return [
        {"point": f"{point.stage}/{point.name}", "run": grid.run_config(config, point)}
        for point in grid.all_points(config)
    ]


FOLLOWER_PID = "follow.pid"  # in the study's tracking log folder, while a follower runs
FOLLOWER_LOG = "follow.log"
PLANNED_POINTS = "planned.json"


def start_follower(
    tracking: dict[str, Any],
    logs_dir: str | os.PathLike,
    roots: list[str | os.PathLike],
    points: list[dict[str, Any]] | None = None,
) -> int | None:
    """Starts the study's follower (scalestudy.tracking.follow) beside this process (Snakemake's),
    once a previous one has stopped: it makes `points` (planned_points) SCHEDULED, then replays the
    run folders' journals under `roots` into MLflow while the jobs write them, until stop_follower
    or this process's end. This process never imports mlflow. Its pid; None for `live: false`."""
    import subprocess
    import sys

    if not tracking["live"]:
        return None
    logs = Path(logs_dir).resolve()
    logs.mkdir(parents=True, exist_ok=True)
    stop_follower(logs / FOLLOWER_PID)
    command = [sys.executable, "-m", "scalestudy.tracking", "follow"]
    command += ["--tracking-json", json.dumps(tracking, sort_keys=True), "--journals", *map(str, roots)]
    if points:
        (logs / PLANNED_POINTS).write_text(json.dumps(points))
        command += ["--points-json", str(logs / PLANNED_POINTS)]
    command += ["--parent-pid", str(os.getpid())]
    command += ["--pid-file", str(logs / FOLLOWER_PID), "--log", str(logs / FOLLOWER_LOG)]
    quiet = {"stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL}  # its warnings: to our stderr
    follower = subprocess.Popen(command, **quiet, start_new_session=True)
    return follower.pid


def stop_follower(pid_file: str | os.PathLike, timeout_s: float = 120) -> bool:
    """Stops the follower that `pid_file` names, if it runs on this host: SIGTERM, which makes it
    replay what the journals hold and exit; waited for `timeout_s`, then killed. False if none ran."""
    import signal
    import socket
    import time

    try:
        record = json.loads(Path(pid_file).read_text())
        pid = int(record["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return False
    if record.get("host") != socket.gethostname() or not _is_follower(pid):
        return False
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while _is_follower(pid):
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            break
        time.sleep(0.1)
    Path(pid_file).unlink(missing_ok=True)
    return True


def _is_follower(pid: int) -> bool:
    """A live process with that pid that is a follower (not a pid reused since)."""
    from scalestudy.launch.distributed import process_running  # stdlib only

    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"scalestudy.tracking\0follow" in command and process_running(pid)


def point_of(out_dir: str | os.PathLike) -> str:
    """A run folder's point: its path below results/runs (`scaling/strong-w2_r0`), else below
    results/ (a smoke test's `smoke/train_w2`), else its name."""
    parts = Path(out_dir).resolve().parts
    for index in range(len(parts) - 2, -1, -1):
        if parts[index : index + 2] == ("results", "runs"):
            return "/".join(parts[index + 2 :])
    if "results" in parts:
        return "/".join(parts[len(parts) - parts[::-1].index("results") :])
    return Path(out_dir).name


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """A run config as MLflow params: nested keys joined by '.', lists and null as JSON."""
    flat: dict[str, str] = {}
    for key, value in sorted(config.items()):
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{name}."))
        elif isinstance(value, str):
            flat[name] = value
        else:
            flat[name] = json.dumps(value, sort_keys=True)
    return {key: value[:6000] for key, value in flat.items()}


def point_tags(point: str, config_hash: str, given: dict[str, Any], study: str) -> dict[str, str]:
    """The tags of a grid point's run that the run config decides."""
    stage = point.split("/", 1)[0]
    tags = {
        TAG_POINT: point,
        TAG_HASH: config_hash,
        TAG_STUDY: study,
        "stage": stage,
        "point": point,
        "mlflow.runName": point,
    }
    for key in ("mode", "world_size", "nodes", "parallelism", "workload", "precision", "per_gpu_batch"):
        if given.get(key) is not None:
            tags[key] = str(given[key])
    return tags
