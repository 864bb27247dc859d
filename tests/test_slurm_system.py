"""The system description and the collective benchmark on the real (throw-away) Slurm cluster of
tests/test_slurm.py: with one rank per node, the grid's two-rank jobs span both nodes, so `system`
describes both hosts (one srun task per node) and `comm_bench` measures inter-node collectives (gloo
across the nodes' network namespaces). Skipped, with the reason, where the cluster cannot come up.
"""

from __future__ import annotations

import csv
import json

import pytest

from scalestudy.plan import groups
from tests.conftest import copy_workflow
from tests.test_slurm import clusters, shorter_demo, snakemake, submitted, write_config  # noqa: F401

pytestmark = pytest.mark.slurm

TARGETS = ("results/tables/system.csv", "results/comm/busbw.csv", "results/tables/comm_bench_fit.csv")


@pytest.fixture(scope="module")
def slurm(clusters):  # noqa: F811 - the cluster manager of tests/test_slurm.py
    """The two-node cluster without accounting, for the whole module."""
    return clusters.get(accounting=False)


@pytest.fixture(scope="module")
def checks(slurm, tmp_path_factory):
    workdir = copy_workflow(tmp_path_factory.mktemp("slurm-system") / "scalestudy")
    configfile = write_config(workdir, "slurm-system.yaml", shorter_demo(slurm))
    run = snakemake(slurm, workdir, configfile, *TARGETS, timeout=600)
    output = run.stdout + run.stderr
    assert run.returncode == 0, f"system and comm_bench failed through Slurm:\n{output[-8000:]}"
    return workdir, output


def rows(path):
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def test_system_and_comm_bench_ran_as_slurm_jobs(checks, slurm):
    """Each in a Slurm job of the grid's largest shape (both nodes): its own (`rule_system`,
    `rule_comm_bench`) or, as the profiles group the short jobs, the preflight group's one job."""
    workdir, output = checks
    folders = {
        job: log.relative_to(workdir / ".snakemake/slurm_logs").parts[0]
        for job, log in submitted(output).items()
    }
    made_by = {
        "system": {  # one record per host (n1.json, ...), beside the nodes_<kind>.json list
            json.loads(path.read_text())["slurm"]["job_id"]
            for path in (workdir / "results/system").glob("n[0-9]*.json")
        },
        "comm_bench": {row["provenance.slurm.job_id"] for row in rows(workdir / "results/comm/busbw.csv")},
    }
    for rule, jobs in made_by.items():
        assert len(jobs) == 1 and jobs <= set(folders), (rule, jobs, folders)  # a job Snakemake submitted
        (job_id,) = jobs
        folder = folders[job_id]  # (the table_* rules run on the submit host)
        assert folder == f"rule_{rule}" or folder.startswith(f"group_{groups.PREFLIGHT}"), folder
        state = slurm.job(job_id)
        assert state["JobState"] == "COMPLETED", state
        assert state["NumNodes"] == str(slurm.nodes)


def test_the_system_table_lists_every_host(checks, slurm):
    workdir, _ = checks
    table = rows(workdir / "results/tables/system.csv")
    expected = ["n1", "n2"][: slurm.nodes]
    assert sorted(row["host"] for row in table) == expected
    for row in table:
        assert row["kind"] == "compute" and row["gpu_model"] == "none"  # CPU nodes: said, not guessed
        assert row["slurm"].startswith("slurm") and int(row["logical_cpus"]) >= 1
        assert (workdir / "results/system" / f"{row['host']}.json").is_file()


def test_comm_bench_spans_the_nodes(checks, slurm):
    workdir, _ = checks
    bench = rows(workdir / "results/comm/busbw.csv")
    assert {row["collective"] for row in bench} == {"all_reduce", "all_gather", "reduce_scatter"}
    placement = "inter-node" if slurm.nodes == 2 else "intra-node"
    for row in bench:
        assert row["world_size"] == "2" and row["backend"] == "gloo" and row["placement"] == placement
        assert row["hosts"] == " ".join(["n1", "n2"][: slurm.nodes])
        assert float(row["time_s"]) > 0 and row["provenance.slurm.job_id"]
    fit = rows(workdir / "results/tables/comm_bench_fit.csv")
    assert {row["placement"] for row in fit} == {placement} and all(
        float(r["bandwidth_gb_s"]) > 0 for r in fit
    )
