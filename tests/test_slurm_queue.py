"""Queue limits on the real (throw-away) two-node Slurm cluster of tests/test_slurm.py (issue 22;
docs/guide/cluster.md, "Queue limits"): with the user's MaxSubmitJobs at 2, four jobs submitted at once
through profiles/slurm-noapptainer all finish, none counted as failed: Slurm refuses two sbatch
calls (AssocMaxSubmitJobLimit), and the sbatch wrapper (scalestudy.launch.submit_retry) waits and
submits them again once the first jobs have left the queue. About 1 minute on 2 cores.
"""

from __future__ import annotations

import re
import sys
import time

import pytest

from tests.conftest import REPO, snakemake_env
from tests.slurm_cluster import (  # noqa: F401 - clusters: the module fixture, shared
    SUBMITTED,
    Cluster,
    cluster_script,
    clusters,
)

pytestmark = pytest.mark.slurm

OVERHEAD = REPO / "tests/slurm/overhead/Snakefile"
LIMIT = 2
JOBS = 4
# What rules/common/hooks.smk does, with waits short enough for a test (the defaults: 30 s up to 5 min).
WRAPPER = """import os
from scalestudy.launch import submit_retry

if workflow.is_main_process:
    submit_retry.put_first(os.environ, submit_retry.install(
        ".snakemake/scalestudy-sbatch", patience_minutes=3, log_path="logs/sbatch-retries.log",
        first_wait_s=3, max_wait_s=6,
    ))

"""


def limits_enforced(slurm: Cluster) -> bool:
    config = slurm.run("scontrol", "show", "config").stdout
    return bool(re.search(r"^AccountingStorageEnforce\s*=.*\blimits\b", config, re.M))


def max_submit_jobs(slurm: Cluster, user: str) -> set[str]:
    """The MaxSubmitJobs slurmctld holds for the user's associations (as slurmdbd last told it)."""
    shown = slurm.run("scontrol", "show", "assoc_mgr", f"users={user}", "flags=assoc").stdout
    return set(re.findall(r"MaxSubmitJobs=([^( ]+)", shown))


@pytest.fixture
def limited(clusters):  # noqa: F811 - the module fixture imported above
    """The cluster with accounting, the user allowed LIMIT jobs in the queue, restored afterwards."""
    slurm = clusters.get(accounting=True)
    if not limits_enforced(slurm):  # brought up before tests/slurm/cluster.sh enforced limits
        assert cluster_script("down").returncode == 0
        slurm = clusters.get(accounting=True)
    assert limits_enforced(slurm), "AccountingStorageEnforce has no `limits` (tests/slurm/cluster.sh)"
    user = slurm.run("id", "-un").stdout.strip()
    try:
        change = slurm.run("sacctmgr", "-i", "modify", "user", user, "set", f"maxsubmitjobs={LIMIT}")
        assert change.returncode == 0, change.stderr
        deadline = time.monotonic() + 20
        while max_submit_jobs(slurm, user) != {str(LIMIT)} and time.monotonic() < deadline:
            time.sleep(0.5)
        assert max_submit_jobs(slurm, user) == {str(LIMIT)}
        yield slurm
    finally:
        slurm.run("sacctmgr", "-i", "modify", "user", user, "set", "maxsubmitjobs=-1")


def test_jobs_refused_for_the_submit_limit_wait_and_all_finish(limited, tmp_path):
    (tmp_path / "Snakefile").write_text(WRAPPER + OVERHEAD.read_text())
    (tmp_path / "config.yaml").write_text(f"n: {JOBS}\nsleep: 1\n")
    # Without the wrapper Slurm's refusal reaches the plugin (the limit holds for this user).
    refused = limited.run("sbatch", "--wrap", "true", "--array", f"1-{LIMIT + 1}", "-t", "1", "--mem", "100")
    assert refused.returncode != 0 and "AssocMaxSubmitJobLimit" in refused.stderr, refused

    command = [
        "timeout", "-s", "INT", "-k", "20", "240", sys.executable, "-m", "snakemake",
        "--profile", str(REPO / "profiles/slurm-noapptainer"), "--configfile", "config.yaml",
    ]  # fmt: skip
    started = time.monotonic()
    run = limited.run(*command, cwd=tmp_path, env=snakemake_env(), timeout=300)
    took = time.monotonic() - started
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-6000:]

    job_ids = {(tmp_path / f"out/{i}.txt").read_text().split()[0] for i in range(JOBS)}
    assert len(job_ids) == JOBS  # every point ran, each in its own Slurm job
    assert len(SUBMITTED.findall(output)) == JOBS  # each submitted once: no retry of Snakemake's
    for failure in ("sbatch failed", "Error in rule", "Trying to restart"):
        assert failure not in output, output[-6000:]

    log = (tmp_path / "logs/sbatch-retries.log").read_text().splitlines()
    waits = [line for line in log if "refused by the submit limit AssocMaxSubmitJobLimit" in line]
    accepted = [line for line in log if "accepted after" in line]
    assert waits and accepted, log
    assert len(accepted) == JOBS - LIMIT, log  # the two over the limit, each accepted in the end
    assert {line.rsplit(": ", 1)[1].split(";")[0] for line in accepted} <= job_ids
    print(
        f"{JOBS} jobs under MaxSubmitJobs={LIMIT}: {len(waits)} refusals waited out, {took:.0f} s end to end"
    )
