"""rules/profile.smk planned by Snakemake (dry runs): which jobs, which commands, the ncu switch."""

from __future__ import annotations

import shlex
import subprocess

import yaml

from scalestudy.benchmark import dag
from tests.conftest import run_snakemake, write_config

FIGURES = ("profile_breakdown", "profile_top_kernels", "profile_ncu_throughput")
TARGETS = [f"results/figures/{name}.png" for name in FIGURES]


def test_demo_plans_one_profiled_run_per_world_size_and_no_ncu(workflow_copy):
    result = run_snakemake(workflow_copy, *TARGETS, "--dry-run", "--printshellcmds")
    jobs = dag.job_counts(result.stdout)
    demo = yaml.safe_load((workflow_copy / "config/demo.yaml").read_text())
    worlds = len(demo["profiling"]["world_sizes"])
    for rule in ("profile_run", "profile_nsys_stats", "profile_summary"):
        assert jobs[rule] == worlds, jobs
    assert jobs["profile_combine"] == 1 and "profile_ncu" not in jobs
    assert (
        "python -m scalestudy.profiling.figures ncu-throughput --not-run 'disabled in the config"
        in result.stdout
    )


def ncu_config(workflow_copy, **ncu) -> str:
    """The demo with ncu on (profiling.ncu: `ncu`), as config/ncu.yaml of the workflow copy."""
    return write_config(
        workflow_copy, "ncu.yaml", lambda config: config["profiling"].update(ncu={"enabled": True, **ncu})
    )


NCU_STATUS = "results/profile/w1/ncu_status.json"


def ncu_dry_run(workflow_copy, targets=(NCU_STATUS,), **ncu) -> tuple[subprocess.CompletedProcess, list[str]]:
    """A dry run of `targets` with ncu on (profiling.ncu: `ncu`): Snakemake's result, and the argv
    of the ncu job it plans."""
    path = ncu_config(workflow_copy, **ncu)
    result = run_snakemake(workflow_copy, *targets, "--dry-run", "--printshellcmds", "--configfile", path)
    command = next(line for line in result.stdout.splitlines() if "scalestudy.profiling.ncu run" in line)
    return result, shlex.split(command)


def test_enabled_ncu_runs_on_one_gpu_and_feeds_its_figure(workflow_copy):
    result, argv = ncu_dry_run(workflow_copy, TARGETS, kernel_regex="regex:conv|gemm", launch_count=7)
    assert dag.job_counts(result.stdout)["profile_ncu"] == 1
    assert "--top-kernels 10 --launch-count 7 --kernel-regex 'regex:conv|gemm'" in result.stdout
    assert "--nsys-stats" not in argv  # a configured regex needs no nsys summary
    assert (
        "--status results/profile/w1/ncu_status.json --kernels results/profile/w1/ncu_kernels.csv"
        in result.stdout
    )


def test_a_kernel_regex_with_braces_plans_and_reaches_ncu_as_one_argument(workflow_copy):
    """Issue 13, item 2: `{0,4}` in a params string was taken for a wildcard ("Wildcards in params
    cannot be determined"); params functions are not formatted."""
    regex = "regex:.*gemm.{0,4}|conv{1}[a-z]{2,}"
    _, argv = ncu_dry_run(workflow_copy, kernel_regex=regex)
    assert argv[argv.index("--kernel-regex") + 1] == regex


def test_without_a_regex_ncu_waits_for_and_reads_the_one_gpu_profile_run(workflow_copy):
    """The kernels come from the profile run of the w1 point (nsys's summary or the torch profiler's
    kernel table, as its record says): the ncu job depends on that run and its nsys export."""
    result, argv = ncu_dry_run(workflow_copy, top_kernels=5)
    assert argv[argv.index("--profile-record") + 1] == "results/runs/profile/w1/profile_tool.json"
    assert argv[argv.index("--nsys-stats") + 1] == "results/profile/w1/nsys_stats"
    assert argv[argv.index("--top-kernels") + 1] == "5" and "--kernel-regex" not in argv
    assert "--loader-kernels" not in argv  # the default: the loader's kernels are left out
    jobs = dag.job_counts(result.stdout)
    assert jobs["profile_run"] == 1 and jobs["profile_nsys_stats"] == 1, jobs


def test_a_configured_regex_needs_no_profile_run_and_the_loader_can_be_asked_for(workflow_copy):
    result, argv = ncu_dry_run(workflow_copy, kernel_regex="regex:conv", loader_kernels=True)
    assert "--profile-record" not in argv and "--loader-kernels" in argv
    jobs = dag.job_counts(result.stdout)
    assert jobs and "profile_run" not in jobs, result.stdout[-3000:]


def test_the_removed_launch_skip_is_refused_with_what_replaced_it(workflow_copy):
    path = ncu_config(workflow_copy, launch_skip=3000)
    result = run_snakemake(workflow_copy, *TARGETS, "--dry-run", "--configfile", path, check=False)
    assert result.returncode != 0
    assert "profiling.ncu.launch_skip (3000) is no longer used" in result.stdout + result.stderr
    assert "NVTX 'step' ranges" in result.stdout + result.stderr
