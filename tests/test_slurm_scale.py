"""Big grids on the real (throw-away) two-node Slurm cluster of tests/test_slurm.py: few submissions,
no queue wait between points, seconds of overhead per job (issue 22; docs/slurm.md, "Which route").

- the profiles' polling: a 1 s job is seen finished within 15 s of its submission, with at most one
  status query (squeue) per 10 s;
- job arrays (`--slurm-array-jobs`): six same-shaped jobs are ONE sbatch call, each task knows its
  array task;
- one allocation (profiles/slurm-allocation, its driver script as docs/slurm.md gives it): the demo
  study (the smaller grid of tests/test_slurm.py) is exactly one Slurm job; every training point
  ran in it as its own srun step.

Sbatch calls are counted in the controller's log (`_slurm_rpc_submit_batch_job`), client calls with
shims on PATH (tests/slurm/overhead/shim.sh). About 4 minutes on 2 cores.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, copy_workflow, snakemake_env
from tests.test_slurm import Cluster, clusters, shorter_demo, summaries, write_config  # noqa: F401

pytestmark = pytest.mark.slurm

OVERHEAD = REPO / "tests/slurm/overhead"
STATE = Path(os.environ.get("SCALESTUDY_SLURM_STATE", "/tmp/scalestudy-slurm"))
CLIENTS = ("sbatch", "squeue", "sacct", "scontrol")


@pytest.fixture
def slurm_accounting(clusters):  # noqa: F811 - the module fixture imported above
    return clusters.get(accounting=True)


def submissions() -> int:
    """sbatch calls the controller accepted so far (its log, SlurmctldDebug=info)."""
    log = STATE / "log/slurmctld.log"
    return log.read_text(errors="replace").count("_slurm_rpc_submit_batch_job") if log.exists() else 0


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


def test_a_short_job_is_seen_finished_within_seconds_polling_once_per_10_s(slurm_accounting, tmp_path):
    started, ended, _ = run_trivial(slurm_accounting, tmp_path, jobs=1)
    (submitted,) = calls(tmp_path, "sbatch")
    overhead = ended - submitted - 1  # the job sleeps 1 s; Snakemake's own start is before sbatch
    queries = calls(tmp_path, "squeue") + calls(tmp_path, "sacct")
    polls = [stamp for stamp in queries if stamp > submitted]
    print(f"overhead: {overhead:.1f} s submit -> detected-finished; {len(polls)} status queries")
    assert overhead <= 15, overhead
    assert len(polls) <= 1 + (ended - submitted) / 10, polls
    gaps = [later - earlier for earlier, later in zip(polls, polls[1:], strict=False)]
    assert all(gap >= 9.5 for gap in gaps), gaps


def test_same_shaped_jobs_are_one_array_and_each_task_knows_its_index(slurm_accounting, tmp_path):
    before = submissions()
    _, _, output = run_trivial(slurm_accounting, tmp_path, 6, "--slurm-array-jobs", "work")
    assert len(calls(tmp_path, "sbatch")) == 1 and submissions() - before == 1, output[-3000:]
    tasks = [(tmp_path / f"out/{i}.txt").read_text().split() for i in range(6)]
    assert len({task[1] for task in tasks}) == 1, tasks  # one array job id
    assert sorted(int(task[2]) for task in tasks) == list(range(1, 7)), tasks
    assert len({task[0] for task in tasks}) == 6  # each task is its own job id


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
    """The smaller demo through profiles/slurm-allocation's driver, sbatch'ed as docs/slurm.md says,
    sized for the toy nodes on the command line (which overrides the script's #SBATCH lines)."""
    slurm = clusters.get(accounting=True)
    workdir = copy_workflow(tmp_path_factory.mktemp("slurm-allocation") / "scalestudy")
    configfile = write_config(workdir, "slurm-demo.yaml", shorter_demo(slurm))
    before = submissions()
    sbatch = re.search(r"^\$ (sbatch .*profiles/slurm-allocation/driver\.sbatch)", DOCS_TEXT(), re.M)
    assert sbatch, "docs/slurm.md has no `$ sbatch ... profiles/slurm-allocation/driver.sbatch` command"
    toy = ["--nodes", str(slurm.nodes), "--ntasks-per-node=2", "--cpus-per-task=1", "--time=30"]
    command = ["sbatch", "--parsable", *toy, "profiles/slurm-allocation/driver.sbatch", "--configfile", configfile]
    submitted = slurm.run(*command, cwd=workdir, env=snakemake_env())
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip().split(";")[0]
    state = wait_for(slurm, job_id, timeout=1200)
    return slurm, workdir, job_id, state, submissions() - before


def DOCS_TEXT() -> str:  # noqa: N802 - read when used (the docs may change under a running session)
    return (REPO / "docs/slurm.md").read_text()


def test_in_one_allocation_the_study_is_one_job_and_every_point_a_step(allocation_demo):
    slurm, workdir, job_id, state, sbatch_calls = allocation_demo
    driver_log = (workdir / f"slurm-driver-{job_id}.log").read_text()
    assert state["JobState"] == "COMPLETED", driver_log[-6000:]
    assert sbatch_calls == 1, sbatch_calls
    assert (workdir / "results/report.html").stat().st_size > 100_000
    runs = summaries(workdir)
    assert {"baseline/default", "scaling/strong/w1_r0", "scaling/strong/w2_r0", "profile/w2"} <= set(runs)
    steps = {}
    for point, run in runs.items():
        recorded = run["provenance"]["slurm"]
        assert recorded["job_id"] == job_id, (point, recorded)
        assert recorded["step_id"] not in (None, "batch", "extern"), (point, recorded)
        steps[point] = recorded["step_id"]
    assert len(set(steps.values())) == len(steps), steps  # each point its own step
    sacct = slurm.run("sacct", "-j", job_id, "-n", "-P", "-o", "JobID,State").stdout.split()
    step_rows = {row.split("|")[0].split(".")[1] for row in sacct if "." in row.split("|")[0]}
    assert set(steps.values()) <= step_rows, (steps, sacct)
    print(f"one allocation: job {job_id}, {len(step_rows)} steps, {len(runs)} points")
