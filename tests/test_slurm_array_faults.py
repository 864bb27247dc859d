"""Job arrays under faults and at size, on the real (throw-away) two-node Slurm cluster of
tests/test_slurm.py (issue 22; docs/slurm.md, "Which route").

- a sensitivity sweep submitted as ONE array (`--slurm-array-jobs sensitivity_run`) whose tasks get
  2 minutes (--signal=USR1@30) and need longer: every task is stopped at its limit, Snakemake
  resubmits the failed points with more time (cluster.runtime_growth), each resumes from its
  checkpoint and finishes; the first attempt's kept log names its array task, the summary and the
  run catalog name the Slurm job (and array task) of the attempt that finished;
- a sweep of many points (tiny steps) is a handful of sbatch calls, every point with its own
  summary and its own array task (scalestudy.benchmark.slurm_sweep, which runs the same at 200).

Sbatch calls are counted in the controller's log, as in tests/test_slurm_scale.py. About 11 minutes
on 2 cores (the time limits ~7, the 24 points ~4, each with ~2 minutes of preflight).
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

import pandas as pd
import pytest

from scalestudy.benchmark import slurm_sweep
from scalestudy.launch import attempt_logs as attemptlog
from tests.conftest import copy_workflow
from tests.test_slurm import (  # noqa: F401 - clusters: the module fixture, shared
    Cluster,
    clusters,
    run_in,
    summaries,
    write_config,
)
from tests.test_slurm_scale import profile_command, submissions, sweep_targets

pytestmark = pytest.mark.slurm

ARRAY = re.compile(r"Submitted array job with Snakemake IDs \S+ and SLURM job ID (\d+)\. .*?(\d+)-(\d+)\.")
SINGLE = re.compile(r"Job \d+ has been submitted with SLURM jobid (\d+) \(log: \S*rule_sensitivity_run/")
# One rank's images per second, about (world 1, batch 64; measured 420-740 with the two tasks side
# by side on this 2-core machine): 150 s of work at that speed is more than attempt 1's at most ~85 s
# of training before its signal even at 1.5x the speed, and well under the retry's 10 minutes at a
# quarter of it.
IMAGES_PER_S = 900
TRAIN_SECONDS = 150
# The many-points sweep's size: 24 in CI; SCALESTUDY_SWEEP_POINTS=200 runs the 200 points
# (21 minutes here: ~10 CPU-s a point; python -m scalestudy.benchmark.slurm_sweep is the same).
POINTS = int(os.environ.get("SCALESTUDY_SWEEP_POINTS", "24"))
CI_CHUNK = 10


def gate(slurm: Cluster, workdir: Path, configfile: str) -> None:
    """What every training job waits for (data, smoke tests, the training gate), beforehand: the
    sweep's own run then submits the sweep alone."""
    command = profile_command(configfile, slurm_sweep.GATE)
    run = run_in(slurm, workdir, command, timeout=600)
    assert run.returncode == 0, (run.stdout + run.stderr)[-6000:]


@pytest.fixture(scope="module")
def timed_out_array(clusters, tmp_path_factory):  # noqa: F811 - the module fixture imported above
    """Two sensitivity points (world 1) as one array; attempt 1 has 2 minutes, the work ~150 s."""
    slurm = clusters.get(accounting=True)
    workdir = copy_workflow(tmp_path_factory.mktemp("slurm-array-timelimit") / "scalestudy")
    steps = math.ceil(TRAIN_SECONDS * IMAGES_PER_S / 64)

    def change(config: dict) -> None:
        config["data"]["synthetic"]["train_per_class"] = 800  # 125 steps of 64 per epoch
        config["sensitivity"].update(
            world_size=1, axes={"per_gpu_batch": [64], "bucket_cap_mb": [1, 25]}, epochs=-(-steps // 125)
        )
        config["train"].update(max_steps_per_epoch=None, eval_max_batches=1, checkpoint_every_steps=50)
        config["cluster"].update(runtime_minutes=2, signal_lead_s=30, runtime_growth=5.0)
        config["site_check"] = {"enabled": False}

    configfile = write_config(workdir, "slurm-array-timelimit.yaml", change)
    gate(slurm, workdir, configfile)
    targets = sweep_targets(workdir, configfile)
    options = ["--retries", "2", "--slurm-array-jobs", "sensitivity_run"]
    before = submissions()
    run = run_in(slurm, workdir, profile_command(configfile, *options, *targets), timeout=1200)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-8000:]
    slurm_sweep.catalog(workdir, targets, runner=lambda command: run_in(slurm, workdir, command, 120))
    return slurm, workdir, targets, output, submissions() - before


def first_attempts(output: str) -> tuple[str, int]:
    """The array job id of the sweep's first submission and its number of tasks."""
    arrays = ARRAY.findall(output)
    assert arrays, output[-4000:]
    job_id, first, last = arrays[0]
    return job_id, int(last) - int(first) + 1


def test_array_tasks_stopped_at_their_limit_are_retried_with_more_time_and_resume(timed_out_array):
    slurm, workdir, _, output, sbatch_calls = timed_out_array
    array_id, tasks = first_attempts(output)
    assert tasks == 2, output[-4000:]
    runs = {point: run for point, run in summaries(workdir).items() if point.startswith("sensitivity/")}
    assert len(runs) == 2, sorted(runs)
    first = {slurm.job(f"{array_id}_{task}")["JobState"] for task in (1, 2)}
    assert first <= {"TIMEOUT", "FAILED"}, first  # the signal (exit 75) or the limit itself
    assert slurm.job(f"{array_id}_1")["TimeLimit"] == "00:02:00"
    retries = [(job, None) for job in SINGLE.findall(output)]
    retries += [(job, (int(a), int(b))) for job, a, b in ARRAY.findall(output)[1:]]
    assert retries, f"no retry was submitted:\n{output[-4000:]}"
    for job, task_range in retries:
        job_ids = (
            [f"{job}_{task}" for task in range(task_range[0], task_range[1] + 1)] if task_range else [job]
        )
        for retry in job_ids:
            assert slurm.job(retry)["TimeLimit"] == "00:10:00", retry  # the retry got more time
    for point, run in runs.items():
        results, recorded = run["results"], run["provenance"]["slurm"]
        assert results["resumed_from_step"], (point, results)
        assert run["provenance"]["attempt"] == 2, (point, run["provenance"]["attempt"])
        finished = recorded["jobid_taskid"] or recorded["job_id"]
        assert finished.split("_")[0] in {job for job, _ in retries}, (point, recorded, retries)
    kinds = ["array" if task_range else "single job" for _, task_range in retries]
    print(
        f"array {array_id} ({tasks} tasks, {sorted(first)}) -> retried as {kinds}; {sbatch_calls} sbatch "
        f"calls; resumed from steps {[run['results']['resumed_from_step'] for run in runs.values()]}"
    )


def test_the_first_attempts_log_and_the_catalog_name_their_array_tasks(timed_out_array):
    slurm, workdir, _, output, _ = timed_out_array
    array_id, _ = first_attempts(output)
    rows = pd.read_csv(workdir / "results/tables/runs.csv", dtype=str).set_index("point")
    named = set()
    for point, run in summaries(workdir).items():
        log = workdir / "results/logs" / f"{point}.log"
        kept = attemptlog.attempt_logs(log)
        assert sorted(kept) == [1, 2], kept
        first_log = kept[1].read_text()
        task = re.search(rf"launch: attempt 1, Slurm job \d+ \(array task ({array_id}_\d+)\),", first_log)
        assert task, first_log[:2000]
        named.add(task[1])
        assert re.search(r"checkpoint", first_log, re.I) and "resumed from" not in first_log
        assert re.search(r"resumed from \S+: epoch \d+", log.read_text()), log.read_text()[-3000:]
        recorded = run["provenance"]["slurm"]
        row = rows.loc[run["run"]["point"]]
        assert row["attempts"] == "2" and row["provenance.slurm.job_id"] == recorded["job_id"], row
        if recorded["jobid_taskid"]:  # a retry submitted as an array: the catalog names its task
            assert row["provenance.slurm.jobid_taskid"] == recorded["jobid_taskid"] != task[1], row
        else:  # a retry submitted as one job: the catalog names that job, no task
            assert pd.isna(row["provenance.slurm.jobid_taskid"]), row
    assert named == {f"{array_id}_1", f"{array_id}_2"}, named


# ----------------------------------------------------------------------------- many points


@pytest.fixture(scope="module")
def many_points(clusters, tmp_path_factory):  # noqa: F811
    slurm = clusters.get(accounting=True)
    workdir = copy_workflow(tmp_path_factory.mktemp("slurm-array-many") / "scalestudy")
    timeout = 600 + 10 * POINTS
    runner = lambda command: run_in(slurm, workdir, command, timeout)  # noqa: E731
    # CI's small sweep in chunks of 10, as 200 points go in the profile's chunks of 50: several
    # arrays, every task of each its own point
    extra = ["--slurm-array-limit", str(CI_CHUNK)] if POINTS < 100 else []
    result = slurm_sweep.run(workdir, points=POINTS, runner=runner, counter=submissions, extra=extra)
    return slurm, workdir, result


def test_a_sweep_of_many_points_is_at_most_5_sbatch_calls(many_points):
    slurm, workdir, result = many_points
    assert result["returncode"] == 0, result["output"][-6000:]
    shown = {key: value for key, value in result.items() if key != "output"}
    assert result["points"] == POINTS and 1 <= result["sweep_sbatch_calls"] <= 5, shown
    assert result["controller_sbatch_calls"] == result["sweep_sbatch_calls"], shown  # Slurm agrees
    assert sum(result["array_sizes"]) == POINTS and result["summaries"] == POINTS, shown
    assert max(result["array_sizes"]) <= (CI_CHUNK if POINTS < 100 else 50), shown
    runs = {point: run for point, run in summaries(workdir).items() if point.startswith("sensitivity/")}
    assert len(runs) == POINTS
    tasks = {run["provenance"]["slurm"]["jobid_taskid"] for run in runs.values()}
    assert None not in tasks and len(tasks) == POINTS, tasks  # every point its own array task
    print(json.dumps(shown))
