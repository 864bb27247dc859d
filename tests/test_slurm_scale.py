"""Big grids on the real (throw-away) two-node Slurm cluster of tests/test_slurm.py: few submissions,
no queue wait between points, seconds of overhead per job (issue 22; docs/guide/cluster.md,
"which route when").

- the profiles' polling: a 1 s job is seen finished within 15 s of its submission, with at most one
  status query (squeue) per 10 s;
- job arrays (`--slurm-array-jobs`): a setting that mixes shapes is refused before anything is
  submitted (the sweeps that run as arrays: tests/test_slurm_array_faults.py);
- one allocation (profiles/slurm-allocation, its driver script as docs/guide/cluster.md gives it): the demo
  study (the smaller grid of tests/test_slurm.py) is exactly one Slurm job; every training point
  ran in it as its own srun step.

Sbatch calls are counted in the controller's log (`_slurm_rpc_submit_batch_job`), client calls with
shims on PATH (tests/slurm/overhead/shim.sh). About 5 minutes on 2 cores.
"""

from __future__ import annotations

import datetime
import os
import re
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import REPO, copy_workflow, snakemake_env, write_config
from tests.slurm_cluster import (  # noqa: F401 - clusters: the module fixture, shared
    Cluster,
    assert_learns_what_the_local_executor_learns,
    clusters,
    profile_command,
    run_in,
    shorter_demo,
    summaries,
    sweep_targets,
)
from tests.slurm_cluster import controller_submissions as submissions

pytestmark = pytest.mark.slurm

OVERHEAD = REPO / "tests/slurm/overhead"
CLIENTS = ("sbatch", "squeue", "sacct", "scontrol")


@pytest.fixture
def slurm_accounting(clusters):  # noqa: F811 - the module fixture imported above
    return clusters.get(accounting=True)


def shimmed(workdir: Path) -> dict[str, str]:
    """An environment whose Slurm clients log each call to workdir/calls.log."""
    shims = workdir / "shims"
    shims.mkdir(exist_ok=True)
    for name in CLIENTS:
        (shims / name).symlink_to(OVERHEAD / "shim.sh")
    env = snakemake_env()
    env.update(PATH=f"{shims}{os.pathsep}{env['PATH']}", SLURM_CALL_LOG=str(workdir / "calls.log"))
    return env


def calls(workdir: Path, name: str) -> list[float]:
    lines = (workdir / "calls.log").read_text().splitlines()
    return [float(line.split()[0]) for line in lines if line.split()[1] == name]


def run_trivial(slurm: Cluster, workdir: Path, jobs: int, *options: str, timeout: int = 300):
    """tests/slurm/overhead through profiles/slurm-noapptainer as it is (its polling untouched)."""
    for name in ("Snakefile",):
        (workdir / name).write_text((OVERHEAD / name).read_text())
    (workdir / "config.yaml").write_text(f"n: {jobs}\nsleep: 1\n")
    command = [
        "timeout", "-s", "INT", "-k", "20", str(timeout), sys.executable, "-m", "snakemake",
        "--profile", str(REPO / "profiles/slurm-noapptainer"), "--configfile", "config.yaml", *options,
    ]  # fmt: skip
    started = time.time()
    run = slurm.run(*command, cwd=workdir, env=shimmed(workdir), timeout=timeout + 60)
    assert run.returncode == 0, (run.stdout + run.stderr)[-6000:]
    return started, time.time(), run.stdout + run.stderr


def slurm_time(text: str) -> float:
    return datetime.datetime.fromisoformat(text).timestamp()  # the controller's local time, as ours


def test_a_short_job_is_seen_finished_within_seconds_polling_once_per_10_s(slurm_accounting, tmp_path):
    """Overhead = queue wait (submit -> start) + detection (end -> the status query after which
    Snakemake stops polling). The job's own run time (1 s of work after the jobstep plugin's second
    Snakemake has parsed the workflow) depends on the machine's load and is reported, not bounded."""
    started, ended, _ = run_trivial(slurm_accounting, tmp_path, jobs=1)
    (submitted,) = calls(tmp_path, "sbatch")
    polls = sorted(
        stamp for stamp in calls(tmp_path, "squeue") + calls(tmp_path, "sacct") if stamp > submitted
    )
    assert polls, "no status query after the submission"
    job = slurm_accounting.job((tmp_path / "out/0.txt").read_text().split()[0])
    start, end = slurm_time(job["StartTime"]), slurm_time(job["EndTime"])
    wait, detection = start - submitted, polls[-1] - end
    print(
        f"overhead: {wait + detection:.1f} s (queue {wait:.1f} s, detection {detection:.1f} s), job "
        f"{end - start:.0f} s, {len(polls)} status queries, {ended - started:.1f} s end to end"
    )
    assert wait + detection <= 15, (wait, detection)
    gaps = [later - earlier for earlier, later in zip(polls, polls[1:], strict=False)]
    assert polls[0] - submitted >= 9.5 and all(gap >= 9.5 for gap in gaps), (polls[0] - submitted, gaps)


# ----------------------------------------------------------------------------- one allocation


def wait_for(slurm: Cluster, job_id: str, timeout: int) -> dict[str, str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = slurm.job(job_id)
        if state["JobState"] not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
            return state
        time.sleep(5)
    slurm.run("scancel", job_id)
    raise AssertionError(f"the driver job {job_id} did not finish in {timeout} s")


@pytest.fixture(scope="module")
def allocation_demo(clusters, tmp_path_factory):  # noqa: F811
    """The smaller demo's run catalog through profiles/slurm-allocation's driver, sbatch'ed as
    docs/guide/cluster.md says, sized for the toy nodes on the command line (which overrides the script's
    #SBATCH lines)."""
    slurm = clusters.get(accounting=True)
    workdir = copy_workflow(tmp_path_factory.mktemp("slurm-allocation") / "scalestudy")
    configfile = write_config(workdir, "slurm-demo.yaml", shorter_demo(slurm))
    before = submissions()
    sbatch = re.search(r"^\$ (sbatch .*profiles/slurm-allocation/driver\.sbatch)", DOCS_TEXT(), re.M)
    assert sbatch, "docs/guide/cluster.md has no `$ sbatch ... slurm-allocation/driver.sbatch` command"
    toy = ["--nodes", str(slurm.nodes), "--ntasks-per-node=2", "--cpus-per-task=1", "--time=30"]
    # the run catalog (every point, and what the tests read), not the figures and paper after it
    target = "results/tables/runs.csv"
    command = ["sbatch", "--parsable", *toy, "profiles/slurm-allocation/driver.sbatch", target]
    command += ["--configfile", configfile]
    submitted = slurm.run(*command, cwd=workdir, env=snakemake_env())
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip().split(";")[0]
    state = wait_for(slurm, job_id, timeout=1200)
    return slurm, workdir, configfile, job_id, state, submissions() - before


def DOCS_TEXT() -> str:  # noqa: N802 - read when used (the docs may change under a running session)
    return (REPO / "docs/guide/cluster.md").read_text()


def test_in_one_allocation_the_study_is_one_job_and_every_point_a_step(allocation_demo):
    slurm, workdir, _, job_id, state, sbatch_calls = allocation_demo
    driver_log = (workdir / f"slurm-driver-{job_id}.log").read_text()
    assert state["JobState"] == "COMPLETED", driver_log[-6000:]
    assert sbatch_calls == 1, sbatch_calls
    rows = pd.read_csv(workdir / "results/tables/runs.csv", dtype=str)
    assert set(rows["provenance.slurm.job_id"]) == {job_id}, rows["provenance.slurm.job_id"]
    runs = summaries(workdir)
    assert {"baseline/default", "scaling/strong/w1_r0", "scaling/strong/w2_r0", "profile/w2"} <= set(runs)
    steps = {}
    for point, run in runs.items():
        recorded = run["provenance"]["slurm"]
        assert recorded["job_id"] == job_id, (point, recorded)
        assert recorded["step_id"] not in (None, "batch", "extern"), (point, recorded)
        steps[point] = recorded["step_id"]
    assert len(set(steps.values())) == len(steps), steps  # each point its own step
    assert set(rows["provenance.slurm.step_id"]) == set(steps.values())  # the catalog names them
    assert rows["provenance.slurm.jobid_taskid"].isna().all()  # the column array tasks fill
    sacct = slurm.run("sacct", "-j", job_id, "-n", "-P", "-o", "JobID,State").stdout.split()
    step_rows = {row.split("|")[0].split(".")[1] for row in sacct if "." in row.split("|")[0]}
    assert set(steps.values()) <= step_rows, (steps, sacct)
    print(f"one allocation: job {job_id}, {len(step_rows)} steps, {len(runs)} points")


def test_in_one_allocation_the_study_learns_what_the_local_executor_learns(allocation_demo, tmp_path_factory):
    """The same catalog's learning columns as the local executor on the same config (throughput and
    timings aside); the local run is shared with tests/test_slurm.py's grouped route."""
    _, workdir, configfile, _, state, _ = allocation_demo
    assert state["JobState"] == "COMPLETED", state
    assert_learns_what_the_local_executor_learns(workdir, configfile, tmp_path_factory.getbasetemp())


# ----------------------------------------------------------------------------- job arrays


@pytest.fixture(scope="module")
def array_sweep(clusters, tmp_path_factory):  # noqa: F811
    """A copy of the workflow whose config makes the demo's sensitivity sweep array-safe (8 points
    at world 2 on one node). The sweeps that run as arrays are tests/test_slurm_array_faults.py's
    (24 points in <= 5 sbatch calls, every task its own point; a killed task resumes)."""
    slurm = clusters.get(accounting=True)
    workdir = copy_workflow(tmp_path_factory.mktemp("slurm-arrays") / "scalestudy")

    def change(config: dict) -> None:
        config["cluster"]["ranks_per_node"] = 2  # world 2 on one node: an array-safe shape

    return slurm, workdir, write_config(workdir, "slurm-arrays.yaml", change)


def test_a_setting_that_mixes_shapes_is_refused_before_anything_is_submitted(array_sweep):
    slurm, workdir, configfile = array_sweep
    before = submissions()
    target = "results/runs/baseline/default/summary.json"
    command = profile_command(configfile, "--slurm-array-jobs", "all", target)
    run = run_in(slurm, workdir, command, timeout=300)
    output = run.stdout + run.stderr
    assert run.returncode != 0 and "would put points of different shapes into one array" in output, output[
        -3000:
    ]
    assert "scaling_run: its points have 2 different shapes" in output
    assert submissions() == before
