"""On the throw-away Slurm cluster WITHOUT accounting (tests/slurm_cluster.py; skipped with the
reason without root and apt-get): what a cluster without slurmdbd changes, on one point of the LM
demo (FSDP2, a rank on each node) through docs/guide/cluster.md's run command; the cluster's bring-up lock;
the real study's GPU requests through `sbatch --test-only`. The demo study itself runs on the cluster
with accounting (tests/test_slurm.py), once (issue 45)."""

# ruff: noqa: F811 - the cluster fixtures (clusters, slurm) are tests/slurm_cluster.py's

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys

import pytest
import yaml

from scalestudy.plan import cluster, slurm_requests
from tests.conftest import REPO, copy_workflow, snakemake_env, write_config
from tests.slurm_cluster import (  # noqa: F401 - the cluster fixtures, taken as arguments
    CLUSTER_SH,
    SLURM_STATE,
    bad_config,
    cluster_script,
    clusters,
    slurm,
    snakemake,
    submitted,
    summaries,
)

pytestmark = pytest.mark.slurm


@pytest.fixture(scope="module")
def lm_point(clusters, tmp_path_factory):
    """One point of the LM demo (config/demo-gpt.yaml), FSDP2 over gloo with a rank on each node,
    and only what that point needs (data, gates) run first, on the cluster without accounting."""
    slurm = clusters.get(accounting=False)
    workdir = copy_workflow(tmp_path_factory.mktemp("slurm-lm") / "scalestudy")

    def change(config: dict) -> None:
        config["scaling"].update(modes=["strong"], parallelism=["fsdp"])
        config["train"].update(epochs=3, max_steps_per_epoch=6, checkpoint_every_steps=4)  # 18 >= 3 + 12
        config["cluster"]["ranks_per_node"] = 1 if slurm.nodes == 2 else 2

    configfile = write_config(workdir, "slurm-lm.yaml", change, base="config/demo-gpt.yaml")
    run = snakemake(slurm, workdir, configfile, f"results/runs/{LM_POINT}/summary.json")
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-8000:]
    return workdir, configfile, output


LM_POINT = "scaling/strong/fsdp-w2_r0"


def test_an_lm_point_trains_with_fsdp2_across_both_nodes(lm_point, slurm):
    """Its sharded checkpoints written by both ranks, one on each node."""
    if slurm.nodes < 2:
        pytest.skip("network namespaces are unavailable here: the cluster has one node")
    workdir, _, _ = lm_point
    summary = summaries(workdir)[LM_POINT]
    results = summary["results"]
    assert summary["provenance"]["hosts"] == ["n1", "n2"] and summary["run"]["nodes"] == 2
    assert (results["workload"], results["sample_unit"], results["parallelism"]) == ("gpt", "tokens", "fsdp")
    assert results["world_size"] == 2 and results["backend"] == "gloo" and results["window_filled"]
    assert len(results["peak_memory_bytes_per_rank"]) == 2
    assert slurm.job(summary["provenance"]["slurm"]["job_id"])["NodeList"] == "n[1-2]"
    log = (workdir / f"results/logs/{LM_POINT}.log").read_text()
    assert re.search(r"checkpoint \S*dcp-000000004", log), log[-3000:]  # both ranks wrote their shards


def test_without_accounting_the_run_records_its_job_and_the_accounting_table_says_sacct_is_off(
    lm_point, slurm, tmp_path
):
    """Snakemake followed every job to COMPLETED without sacct; the point's record names its Slurm
    job (no account); rule table_accounting's module, run on the submit host as the rule runs it,
    writes a table that says accounting is disabled instead of failing."""
    workdir, _, output = lm_point
    assert "accounting storage is disabled" in (slurm.run("sacct").stdout + slurm.run("sacct").stderr)
    jobs = submitted(output)
    folders = {log.relative_to(workdir / ".snakemake/slurm_logs").parts[0] for log in jobs.values()}
    assert len(jobs) == 2 and "rule_scaling_run" in folders, (
        jobs
    )  # the preflight group (data, gates), the point
    for job_id in jobs:
        assert slurm.job(job_id)["JobState"] == "COMPLETED", slurm.job(job_id)
    recorded = summaries(workdir)[LM_POINT]["provenance"]["slurm"]
    assert recorded["job_id"] in jobs and recorded["job_account"] is None, recorded
    assert recorded["job_name"] == slurm.job(recorded["job_id"])["JobName"] != "python", recorded
    table = tmp_path / "sacct.json"
    accounting = slurm.run(
        sys.executable, "-m", "scalestudy.analysis.accounting", "--out", str(table),
        "--summaries", str(workdir / f"results/runs/{LM_POINT}/summary.json"),
        cwd=workdir, env=snakemake_env(), timeout=120,
    )  # fmt: skip
    assert accounting.returncode == 0, accounting.stdout[-2000:] + accounting.stderr[-2000:]
    sacct = json.loads(table.read_text())
    assert sacct["jobs"] == {} and "disabled" in sacct["note"], sacct


def test_without_accounting_an_account_is_taken_with_a_warning_that_it_cannot_be_checked(lm_point, slurm):
    """The preview command (docs/guide/cluster.md) runs the same check as the workflow: on a cluster without
    accounting Slurm accepts any account, which is a warning saying so, not an error."""
    workdir, _, _ = lm_point
    badconfig = bad_config(workdir, slurm, "slurm-acct.yaml", account="nosuchacct", partition="debug")
    preview = slurm.run(
        sys.executable, "-m", "scalestudy.plan.slurm_requests", "--configfile", badconfig,
        cwd=workdir, env=snakemake_env(), timeout=120,
    )  # fmt: skip
    assert preview.returncode == 0, preview.stdout[-2000:] + preview.stderr[-2000:]
    assert "warning: cluster.account 'nosuchacct' cannot be checked: this cluster keeps no accounting" in (
        preview.stdout
    )
    assert "error:" not in preview.stdout


def test_a_second_bring_up_never_stops_the_running_cluster(slurm):
    """tests/slurm/cluster.sh takes a lock: bring-ups started together, or one of the other kind,
    leave the running slurmctld alone."""
    pidfile = SLURM_STATE / "run/slurmctld.pid"
    pid = pidfile.read_text()
    other = cluster_script("up-two-node", accounting=True, timeout=120)
    assert other.returncode == 1 and "not replacing" in other.stderr, other.stderr
    together = [
        subprocess.Popen(["bash", str(CLUSTER_SH), "up-two-node"], stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    for process in together:
        _, stderr = process.communicate(timeout=120)
        assert process.returncode == 0 and "already up" in stderr, stderr
    assert pidfile.read_text() == pid
    assert cluster_script("status").stdout.split() == ["up", str(slurm.nodes), "no-accounting"]


@pytest.mark.parametrize("world", [1, 2, 4, 8])
def test_slurm_accepts_the_real_studys_gpu_requests(slurm, world, tmp_path):
    """config/config.yaml's geometry (4 GPUs per node), with CPUs and memory shrunk to the toy
    nodes, through the plugin's own sbatch builder, checked by `sbatch --test-only`."""
    config = yaml.safe_load((REPO / "config/config.yaml").read_text())
    config["cluster"].update(cpus_per_rank=1, mem_mb_per_rank=100)
    nodes, per_node = cluster.layout(config, world)
    if nodes > slurm.nodes:
        pytest.skip(f"world {world} needs {nodes} nodes; the test cluster has {slurm.nodes}")
    sbatch = slurm_requests.sbatch_command(cluster.train_resources(config, world, 1), threads=world)
    result = slurm.run("sh", "-c", f"{sbatch} --test-only --wrap=true", cwd=tmp_path)
    assert result.returncode == 0, f"{sbatch}\n{result.stderr}"
    match = re.search(r"using (\d+) processors on nodes (\S+)", result.stderr)
    assert match, result.stderr
    assert int(match[1]) == world  # one CPU per rank here
    hosts = subprocess.run(
        [*slurm.client, "scontrol", "show", "hostnames", match[2]], capture_output=True, text=True
    ).stdout.split()
    assert len(hosts) == nodes, (sbatch, result.stderr)
    assert shlex.split(sbatch).count(f"--gres=gpu:{per_node}") == 1
