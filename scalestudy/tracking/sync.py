"""Replays run folders into MLflow (rule `track`, on the submit host), adding only what is missing:
running it twice, or after a live-tracked or resumed run, creates no second run, step or artifact.

Per run folder with a summary.json: the point's run (found by its point and config-hash tags, else
created under the study's run) gets the flattened run config as params, its tags (stage, mode, world
size, ..., git commit, image digest, Slurm job ids and node lists, attempt), the per-step metrics of
the journal (tracking.jsonl) and steps.csv, the per-epoch metrics of metrics.csv (step = epoch), the
summary's steady-state figures and energy (step 0; scalestudy.analysis.energy: joules in the window
and the run, per sample, to the target, GPU-hours; the tag `energy_source` says where they came from
or why not measured), the GPU monitor's series as system metrics, its contention
(tags `contended`, `contention`: the evidence, `monitor_window_samples`, `host_load_warning`), and the run
folder's files and rank logs as artifacts; it ends FINISHED. First, every journal's records the
study's follower did not replay are replayed (scalestudy.tracking.follow: statuses, attempts, Slurm
jobs). The smoke tests (results/smoke) and the collective benchmark (results/comm) are points too
(scalestudy.tracking.preflight_runs). Runs of the same point with another config hash are tagged
superseded. The study's run gets the tables, figures, report and paper. `schedule` creates the
runs of points not yet run, SCHEDULED.
"""

from __future__ import annotations

import csv
import json
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from scalestudy import provenance
from scalestudy.plan import runfiles
from scalestudy.tracking import follow, point_of, point_tags, preflight_runs, store
from scalestudy.train.journal import EPOCH_COLUMNS, JOURNAL

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
    # energy (scalestudy.analysis.energy): absent where not measured, the tag energy_source says why
    *runfiles.ENERGY_MEASURES,
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
CONTENTION_CHARS = 5000  # MLflow's limit on a tag's value (older servers: 5000 characters)
MONITOR_SKIP = {"time_s", "host", "gpu_index", "gpu_uuid", "gpu_name", "rank"}


def summary_tags(summary: dict[str, Any]) -> dict[str, str]:
    """The tags a finished run's provenance decides."""
    prov, results = summary.get("provenance", {}), summary.get("results", {})
    values = {
        "hosts": ",".join(prov.get("hosts") or []),
        "device_name": results.get("device_name"),
        "window_filled": results.get("window_filled"),
        # a foreign process on its GPUs while it measured, and the evidence (scalestudy.analysis.contention)
        "contended": results.get("contended"),
        "contention": (results.get("contention") or "")[:CONTENTION_CHARS],
        "monitor_window_samples": results.get("monitor_window_samples"),
        "host_load_warning": (results.get("host_load_warning") or "")[:CONTENTION_CHARS],
        # where the run's energy came from: counter, power integral, or "not measured: <why>"
        "energy_source": (results.get("energy_source") or "")[:CONTENTION_CHARS],
    }
    return preflight_runs.provenance_tags(prov) | {
        key: str(value) for key, value in values.items() if value not in (None, "")
    }


def read_csv(path: Path) -> list[dict[str, str]]:
    if not path.is_file():
        return []
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def folder_metrics(run_dir: Path, config_hash: str) -> dict[str, dict[int, float]]:
    """Every metric the run folder holds: {key: {step: value}} (a step logged twice: the last)."""
    found: dict[str, dict[int, float]] = {}
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
                store.put_metric(found, key, step, value)
    for row in read_csv(run_dir / runfiles.STEPS):
        store.put_metric(found, "step_time_s", int(row["step"]), row.get("step_s"))
    for row in read_csv(run_dir / runfiles.METRICS):
        for column in EPOCH_COLUMNS:
            store.put_metric(found, f"epoch_{column}", int(row["epoch"]), row.get(column))
    results = json.loads((run_dir / runfiles.SUMMARY).read_text()).get("results", {})
    for key in SUMMARY_METRICS:
        store.put_metric(found, f"summary_{key}", 0, results.get(key))
    for index, row in enumerate(read_csv(run_dir / runfiles.GPU_MONITOR)):
        for key, value in row.items():
            if key not in MONITOR_SKIP:
                store.put_metric(found, f"system/rank{row.get('rank', 0)}_{key}", index, value)
    return found


def rank_logs(run_dir: Path, root: Path) -> list[Path]:
    """The rule's log of a run folder and its attempts' logs (results/logs/<point>.log*)."""
    point = point_of(run_dir)
    base = root / "results/logs" / point
    return sorted(base.parent.glob(f"{base.name}.log*")) if base.parent.is_dir() else []


def folder_filling(run_dir: Path, tracking: dict, root: Path) -> store.Filling:
    """What a finished run folder gives its point's run."""
    summary = json.loads((run_dir / runfiles.SUMMARY).read_text())
    given = summary["run"]
    config_hash = provenance.config_hash(given)
    prov = summary.get("provenance", {})
    return store.Filling(
        tags=point_tags(point_of(run_dir), config_hash, given, tracking["study"]),
        given=given,
        more_tags=summary_tags(summary),
        slurm=[(prov.get("slurm_job_id"), prov.get("slurm_nodelist"))],
        metrics=folder_metrics(run_dir, config_hash),
        artifacts={"": [run_dir / name for name in RUN_ARTIFACTS], "logs": rank_logs(run_dir, root)},
        **journal_times(run_dir, config_hash),
    )


def journal_times(run_dir: Path, config_hash: str) -> dict[str, float | None]:
    """{started, ended}: the run's first start and last end in its journal (None where absent)."""
    times: dict[str, list[float]] = {"start": [], "end": []}
    for record in follow.journal_records(run_dir):
        at = record.get("at")
        if (
            record.get("config_hash") == config_hash
            and record.get("kind") in times
            and isinstance(at, int | float)
        ):
            times[record["kind"]].append(float(at))
    return {"started": min(times["start"], default=None), "ended": max(times["end"], default=None)}


def sync_run(client, experiment: str, parent: str, run_dir: Path, tracking: dict, root: Path) -> dict:
    """One run folder into its MLflow run; what was added."""
    return store.fill(client, experiment, parent, folder_filling(run_dir, tracking, root))


def preflight_fillings(
    tracking: dict, smoke_files: Iterable[Path], comm_files: Iterable[Path], root: Path
) -> list[store.Filling]:
    """The smoke tests' and the collective benchmark's points (scalestudy.tracking.preflight_runs);
    a smoke training step with its trainer's run folder (results/smoke/train_w<N>/) gets that too."""
    fillings = []
    for path in map(Path, smoke_files):
        folder = path.with_suffix("")
        trained = folder_filling(folder, tracking, root) if (folder / runfiles.SUMMARY).is_file() else None
        fillings.append(preflight_runs.smoke_filling(path, tracking, root, trained))
    return fillings + [preflight_runs.comm_filling(Path(path), tracking, root) for path in comm_files]


def sync_study(client, experiment: str, parent: str, files: list[Path], root: Path) -> int:
    """The study's files (tables, figures, report, paper) on its run, by their folder under results/."""
    sent = 0
    for path in files:
        try:
            folder = str(path.resolve().parent.relative_to((root / "results").resolve()))
        except ValueError:
            folder = "other"
        sent += store.log_missing_artifacts(client, parent, [path], None if folder == "." else folder)
    return sent


def replay_journals(replayer: follow.Replayer, runs_dir: Path, smoke_files: Iterable[Path]) -> None:
    """What the follower has not replayed of every journal (a run's status history, its
    attempts' jobs; a failed point's too), before the run folders fill their runs."""
    journals = sorted(runs_dir.glob(f"**/{JOURNAL}"))
    journals += [path for path in (Path(f).with_suffix("") / JOURNAL for f in smoke_files) if path.is_file()]
    for path in journals:
        replayer.replay(path.parent, follow.journal_records(path.parent))


def sync(
    tracking: dict,
    runs_dir: Path,
    study_files: list[Path],
    root: Path,
    smoke_files: Iterable[Path] = (),
    comm_files: Iterable[Path] = (),
) -> dict[str, Any]:
    """Every run folder under `runs_dir`, the smoke tests' results and the collective benchmark's
    CSVs given, and the study's files; a record of what was added. The files are read before the
    store is touched: a bad one (preflight_runs.BadOutput) changes nothing."""
    preflight = preflight_fillings(tracking, smoke_files, comm_files, root)
    client = store.client(tracking, patient=True)
    experiment = store.experiment_id(client, tracking)
    parent = store.study_run(client, experiment, tracking["study"])
    replay_journals(follow.Replayer(client, experiment, parent, tracking), runs_dir, smoke_files)
    runs = [
        sync_run(client, experiment, parent, path.parent, tracking, root)
        for path in sorted(runs_dir.glob("**/summary.json"))
    ]
    runs += [store.fill(client, experiment, parent, filling) for filling in preflight]
    study = sync_study(client, experiment, parent, study_files, root)
    for stage in store.stage_runs(client, experiment):  # rule track runs once the study's outputs exist
        store.finish_stage(client, experiment, stage)
    store.set_status(client, parent, "FINISHED")
    return {
        "experiment": tracking["experiment"],
        "study_run": parent,
        "runs": runs,
        "study_artifacts": study,
        "ui": store.runs_page(tracking["uri"], experiment),
    }


def schedule(tracking: dict, points: list[dict[str, Any]]) -> list[str]:
    """Creates a SCHEDULED run for each point ({point, run}) that has no run of its run config."""
    client = store.client(tracking, patient=True)
    experiment = store.experiment_id(client, tracking)
    return follow.schedule_in(
        client, experiment, store.study_run(client, experiment, tracking["study"]), tracking, points
    )
