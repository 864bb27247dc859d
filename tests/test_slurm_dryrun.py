"""A dry run of the real study (config/config.yaml) with profiles/slurm: what every grid point asks
Slurm for, as Snakemake prints it, and the sbatch call the executor plugin makes of it.

No cluster is needed. Snakemake wants an `apptainer` binary even for a dry run with
--software-deployment-method apptainer, and Apptainer is not installable here: a stub that only
answers --version stands in for it.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from scalestudy.plan import grid, slurm_requests
from tests import gpufake
from tests.conftest import REPO, copy_workflow, parse_jobs, snakemake_env, stub_apptainer

TRAINING_RULES = {"baseline_run", "scaling_run", "sensitivity_run", "profile_run"}
GPUS_PER_NODE = 4  # config/config.yaml


def study_config() -> dict:
    from snakemake.utils import validate

    config = yaml.safe_load((REPO / "config/config.yaml").read_text())
    validate(config, str(REPO / "config/schema.yaml"))
    return config


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory) -> list[dict]:
    workdir = copy_workflow(tmp_path_factory.mktemp("dryrun") / "scalestudy")
    # a submit host with 8 GPUs (the fake NVML): Slurm binds the jobs' GPUs, these stay unscheduled
    state = gpufake.write_state(workdir.parent / "nvml.json", 8)
    env = gpufake.machine_env(state, workdir.parent / "gpu-locks", snakemake_env())
    env["PATH"] = f"{stub_apptainer(workdir / '.stub-bin')}{os.pathsep}{env['PATH']}"
    command = [sys.executable, "-m", "snakemake", "-n", "--printshellcmds", "--profile", "profiles/slurm"]
    command += ["--configfile", "config/config.yaml"]
    result = subprocess.run(command, cwd=workdir, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    return parse_jobs(result.stdout + result.stderr)


def world_of(job: dict, config: dict) -> int:
    if job["rule"] == "baseline_run":
        return 1
    if job["rule"] == "sensitivity_run":
        return config["sensitivity"]["world_size"]
    if job["rule"] == "scaling_run":  # {mode}/w{world}_r{repeat}
        return int(re.fullmatch(r"\w+/w(\d+)_r\d+", job["wildcards"]["point"])[1])
    return int(job["wildcards"]["world"])


def launch_spec_of(job: dict) -> dict:
    words = shlex.split(job["shell"])
    return json.loads(words[words.index("--launch-json") + 1])


def test_every_grid_point_asks_for_whole_gpu_nodes(dry_run):
    config = study_config()
    training = [job for job in dry_run if job["rule"] in TRAINING_RULES]
    assert len(training) == len(grid.all_points(config))
    table = set()
    for job in training:
        world, resources = world_of(job, config), job["resources"]
        nodes, per_node = math.ceil(world / GPUS_PER_NODE), min(world, GPUS_PER_NODE)
        assert resources["nodes"] == str(nodes), job
        assert resources["tasks"] == str(world), job
        assert resources["gres"] == f"gpu:{per_node}", job
        assert resources["cpus_per_task"] == "8" and resources["runtime"] == "60", job
        assert resources["mem_mb"] == str(16000 * per_node), job
        assert resources["slurm_extra"] == f"--ntasks-per-node={per_node} --signal=USR1@300", job
        assert resources["mpi"] == ("srun" if world > 1 else ""), job
        spec = launch_spec_of(job)
        assert (spec["world_size"], spec["nodes"], spec["tasks_per_node"]) == (world, nodes, per_node)
        table.add(f"world {world:2d}: {nodes} node(s) x {per_node} GPU(s)")
    assert "world  8: 2 node(s) x 4 GPU(s)" in table and "world 16: 4 node(s) x 4 GPU(s)" in table
    print("\n".join(sorted(table)))


def test_no_job_asks_slurm_for_gpus_through_a_gpu_resource(dry_run):
    """The local executor's `gpu` resource (rules/common/resources.smk) is absent under the Slurm
    executor: the plugin would turn it into --gpus=N beside the gres the jobs ask for; the launcher
    takes no lock."""
    assert dry_run and all("gpu" not in job["resources"] for job in dry_run)
    assert any(job["resources"].get("gres") == "gpu:4" for job in dry_run)


def test_the_plugin_builds_the_expected_sbatch_call_from_the_printed_resources(dry_run):
    pytest.importorskip("snakemake_executor_plugin_slurm")
    job = next(j for j in dry_run if j["rule"] == "scaling_run" and j["wildcards"]["point"] == "strong/w8_r0")
    resources = {key: int(value) if value.isdigit() else value for key, value in job["resources"].items()}
    resources = {key: value for key, value in resources.items() if "<TBD>" not in str(value)}
    options = shlex.split(slurm_requests.sbatch_command(resources, threads=8))
    for expected in ("--nodes=2", "--ntasks=8", "--ntasks-per-node=4", "--gres=gpu:4", "--cpus-per-task=8"):
        assert expected in options, (expected, options)
    assert options[options.index("--mem") + 1] == "64000"


def test_cpu_jobs_get_light_resources(dry_run):
    preprocess = next(job for job in dry_run if job["rule"] == "preprocess")
    assert preprocess["resources"]["cpus_per_task"] == "2"
    assert preprocess["resources"]["mem_mb"] == "8000"


def test_training_ranks_run_in_the_image_when_the_workflow_is_containerized(dry_run):
    """profiles/slurm sets --sdm apptainer: the launch spec must carry the image (launch_spec(...,
    containerized=CONTAINERIZED) in the training rules' params)."""
    for job in (job for job in dry_run if job["rule"] in TRAINING_RULES):
        assert launch_spec_of(job)["image"] == "containers/scalestudy.sif", job["wildcards"]


def test_the_container_less_profile_plans_the_study_without_apptainer(tmp_path):
    """profiles/slurm-noapptainer: no `apptainer` on PATH, no image built, ranks started bare."""
    workdir = copy_workflow(tmp_path / "scalestudy")
    env = snakemake_env()
    env["PATH"] = os.pathsep.join(
        folder for folder in env["PATH"].split(os.pathsep) if not (Path(folder) / "apptainer").exists()
    )
    command = [
        sys.executable,
        "-m",
        "snakemake",
        "-n",
        "--printshellcmds",
        "--profile",
        "profiles/slurm-noapptainer",
    ]
    command += ["--configfile", "config/config.yaml"]
    result = subprocess.run(command, cwd=workdir, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    jobs = parse_jobs(result.stdout + result.stderr)
    assert not [job for job in jobs if job["rule"] == "build_image"]
    training = [job for job in jobs if job["rule"] in TRAINING_RULES]
    assert training and all(launch_spec_of(job)["image"] is None for job in training)
    assert all("apptainer exec" not in job["shell"] for job in jobs)
