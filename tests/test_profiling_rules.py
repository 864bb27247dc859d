"""rules/profile.smk planned by Snakemake (dry runs): which jobs, which commands, the ncu switch."""

from __future__ import annotations

import re

import yaml

from tests.conftest import run_snakemake

FIGURES = ("profile_breakdown", "profile_top_kernels", "profile_ncu_throughput")
TARGETS = [f"results/figures/{name}.png" for name in FIGURES]


def planned_jobs(output: str) -> dict[str, int]:
    table = re.search(r"Job stats:\n.*?\n-+\s+-+\n(.*?)\ntotal\s+\d+", output, re.S)
    assert table, output[-3000:]
    return {name: int(count) for name, count in (line.split() for line in table.group(1).splitlines())}


def test_demo_plans_one_profiled_run_per_world_size_and_no_ncu(workflow_copy):
    result = run_snakemake(workflow_copy, *TARGETS, "--dry-run", "--printshellcmds")
    jobs = planned_jobs(result.stdout)
    demo = yaml.safe_load((workflow_copy / "config/demo.yaml").read_text())
    worlds = len(demo["profiling"]["world_sizes"])
    for rule in ("profile_run", "profile_nsys_stats", "profile_summary"):
        assert jobs[rule] == worlds, jobs
    assert jobs["profile_combine"] == 1 and "profile_ncu" not in jobs
    assert (
        "python -m scalestudy.profiling.figures ncu-throughput --not-run 'disabled in the config"
        in result.stdout
    )


def test_enabled_ncu_runs_on_one_gpu_and_feeds_its_figure(workflow_copy):
    config = yaml.safe_load((workflow_copy / "config/demo.yaml").read_text())
    config["profiling"]["ncu"] = {"enabled": True, "kernel_regex": "regex:conv|gemm", "launch_skip": 7}
    path = workflow_copy / "config/ncu.yaml"
    path.write_text(yaml.safe_dump(config))
    result = run_snakemake(
        workflow_copy, *TARGETS, "--dry-run", "--printshellcmds", "--configfile", str(path)
    )
    assert planned_jobs(result.stdout)["profile_ncu"] == 1
    assert "--kernel-regex 'regex:conv|gemm' --launch-skip 7" in result.stdout
    assert (
        "--status results/profile/w1/ncu_status.json --kernels results/profile/w1/ncu_kernels.csv"
        in result.stdout
    )
