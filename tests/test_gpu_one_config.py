"""config/gpu-one.yaml, the one-GPU study scripts/gpu_check.sh runs: it validates against the schema,
every point fills its measurement window, and Snakemake plans it with the local profile (a dry run
on this CPU machine; the study itself needs a GPU)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

from scalestudy.benchmark import dag
from scalestudy.plan import grid, windowtime
from scalestudy.plan.studyconfig import load as study_config
from tests import gpufake
from tests.conftest import REPO, run_snakemake, snakemake_env

CONFIG_FILE = "config/gpu-one.yaml"


def test_the_one_gpu_config_is_the_real_model_on_one_gpu_with_a_precision_by_batch_sweep():
    config = study_config(REPO / CONFIG_FILE)  # the schema, defaults filled in (no Snakemake)
    assert config["model"]["width"] == 64
    assert (config["train"]["device"], config["train"]["backend"]) == ("cuda", "nccl")
    assert config["data"]["source"] == "synthetic"
    assert 10 * config["data"]["synthetic"]["train_per_class"] == 20_000
    assert config["profiling"]["ncu"]["enabled"] and not config["profiling"]["ncu"]["loader_kernels"]
    assert not config["tracking"]["enabled"]  # no MLflow on the GPU machine
    points = grid.all_points(config)
    assert {point.world_size for point in points} == {1}
    sweep = grid.sensitivity_points(config)
    assert [point.name for point in sweep] == [
        f"{precision}/bs{batch}" for precision in ("tf32", "bf16") for batch in (256, 512)
    ]
    assert grid.window_problems(config) == []  # every point fills train.measure
    # the compiled step with CUDA graphs (compile_mode auto) at every point but the plain baseline
    assert config["model"]["compile"] and config["train"]["compile_mode"] == "auto"
    baseline = grid.run_config(config, grid.baseline_point(config))
    assert (baseline["compile"], baseline["precision"], baseline["loader"]) == (False, "fp32", "dataloader")


# Images/s on one GPU (issue 41's H100 run, shared FACTS: the H100 and H200), the fastest seen per
# precision (bf16: compiled with CUDA graphs at batch 512, docs/measurements/h200-2026-11-28-variants);
# the check below asks every point to fill its window 25 % faster still.
FASTEST_IMAGES_PER_S = {"fp32": 9_200, "tf32": 36_500, "bf16": 80_000}
HEADROOM = 1.25


def test_every_point_fills_its_window_in_seconds_at_the_fastest_rates_seen():
    """train.measure.seconds at the rates a GPU reached: the warm-up plus the steps the trainer plans
    for the seconds fit every point's steps (bf16/bs512 left 112 of 171 steps unmeasured, issue 41)."""
    config = study_config(REPO / CONFIG_FILE)
    assert config["train"]["measure"]["seconds"] == 2
    samples = grid.samples_per_epoch(config)
    for point, run in windowtime.grid_runs(config):
        step_s = run["per_gpu_batch"] / (FASTEST_IMAGES_PER_S[run["precision"]] * HEADROOM)
        assert windowtime.seconds_problem(point, run, step_s, samples) == [], point.run_dir
    # the check can fail: at twice the headroom the bf16 points at batch 256 run out of steps
    bf16 = [(p, r) for p, r in windowtime.grid_runs(config) if r["precision"] == "bf16"]
    short = [
        line
        for point, run in bf16
        for line in windowtime.seconds_problem(point, run, run["per_gpu_batch"] / 140_000, samples)
    ]
    assert short and all("(needs " in line and "epochs" in line for line in short), short


def test_the_one_gpu_study_dry_runs_with_the_local_profile(workflow_copy):
    result = run_snakemake(workflow_copy, "--dry-run", "--printshellcmds", "--configfile", CONFIG_FILE)
    jobs = dag.job_counts(result.stdout)
    assert jobs["sensitivity_run"] == 4 and jobs["scaling_run"] == 1 and jobs["baseline_run"] == 1
    assert jobs["compile_cache"] == 1  # the key of bf16 at 256: strong w1, its sweep point, the profile
    assert jobs["profile_run"] == 1 and jobs["profile_ncu"] == 1
    assert "track" not in jobs and "paper_pdf" not in jobs
    command = next(line for line in result.stdout.splitlines() if "scalestudy.profiling.ncu run" in line)
    argv = shlex.split(command)
    assert argv[argv.index("--profile-record") + 1] == "results/runs/profile/w1/profile_tool.json"
    assert "--loader-kernels" not in argv and "--kernel-regex" not in argv


def test_on_a_one_gpu_machine_every_gpu_job_of_the_plan_holds_the_gpu(workflow_copy, tmp_path):
    """The dry run the GPU machine makes (a fake NVML of one GPU here): the workflow schedules one GPU
    and every training, profile, smoke and comm job asks for it, so they run one at a time."""
    env = gpufake.machine_env(
        gpufake.write_state(tmp_path / "nvml.json", 1), tmp_path / "locks", snakemake_env()
    )
    command = [
        sys.executable,
        "-m",
        "snakemake",
        "-n",
        "--profile",
        "profiles/local",
        "--configfile",
        CONFIG_FILE,
    ]
    result = subprocess.run(command, cwd=workflow_copy, env=env, capture_output=True, text=True, timeout=600)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert "the local executor schedules 1 GPU(s)" in output, output[-3000:]
    gpu_rules = {
        "baseline_run",
        "scaling_run",
        "sensitivity_run",
        "profile_run",
        "profile_ncu",
        "compile_cache",
    }
    gpu_rules |= {"smoke_io", "smoke_step", "site_check"}
    found: dict[str, set[str]] = {}
    for block in output.split("\nrule ")[1:]:
        name = block.split(":", 1)[0].strip()
        resources = re.search(r"resources: (.*)", block)
        found.setdefault(name, set()).add(resources.group(1) if resources else "")
    assert gpu_rules <= set(found), sorted(gpu_rules - set(found))
    for name in gpu_rules:
        assert all(re.search(r"\bgpu=1\b", line) for line in found[name]), (name, found[name])
    for name in set(found) - gpu_rules - {"system"}:
        assert not any(re.search(r"\bgpu=", line) for line in found[name]), (name, found[name])
