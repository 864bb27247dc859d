"""config/gpu-one.yaml, the one-GPU study scripts/gpu_check.sh runs: it validates against the schema,
every point fills its measurement window, and Snakemake plans it with the local profile (a dry run
on this CPU machine; the study itself needs a GPU)."""

from __future__ import annotations

import re
import shlex

from scalestudy.analysis.settings import study_config
from scalestudy.plan import grid
from tests.conftest import REPO, run_snakemake

CONFIG_FILE = "config/gpu-one.yaml"


def planned_jobs(output: str) -> dict[str, int]:
    table = re.search(r"Job stats:\n.*?\n-+\s+-+\n(.*?)\ntotal\s+\d+", output, re.S)
    assert table, output[-3000:]
    return {name: int(count) for name, count in (line.split() for line in table.group(1).splitlines())}


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
        f"{precision}/bs{batch}" for precision in ("fp32", "tf32", "bf16") for batch in (256, 512)
    ]
    assert grid.window_problems(config) == []  # every point fills train.measure


def test_the_one_gpu_study_dry_runs_with_the_local_profile(workflow_copy):
    result = run_snakemake(workflow_copy, "--dry-run", "--printshellcmds", "--configfile", CONFIG_FILE)
    jobs = planned_jobs(result.stdout)
    assert jobs["sensitivity_run"] == 6 and jobs["scaling_run"] == 1 and jobs["baseline_run"] == 1
    assert jobs["profile_run"] == 1 and jobs["profile_ncu"] == 1
    assert "track" not in jobs and "paper_pdf" not in jobs
    command = next(line for line in result.stdout.splitlines() if "scalestudy.profiling.ncu run" in line)
    argv = shlex.split(command)
    assert argv[argv.index("--profile-record") + 1] == "results/runs/profile/w1/profile_tool.json"
    assert "--loader-kernels" not in argv and "--kernel-regex" not in argv
