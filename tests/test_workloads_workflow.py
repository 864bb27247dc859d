"""Other workloads through the study with Snakemake: the LM demo's config (config/demo-gpt.yaml, DDP
and FSDP2) from an empty results/ through every stage that trains to its tables, figures and report,
and the user's own script (examples/train_script.py, workload: command) through the demo grid."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import copy_workflow, run_snakemake, write_config

pytestmark = pytest.mark.slow


# What the tests below read of the LM study: every stage that trains (DDP and FSDP2, at 1 and 2 ranks,
# the sweep, the profile runs), its tables, the figures an LM draws in its own units, and the report
# of them. The rest of README's LM demo (the collective benchmark, the paper, the crate) is the same
# for every workload and runs in the ResNet demo (tests/test_workflow.py); the LM paper compiles in
# tests/test_paper_pdf.py. Issue 45: 186 CPU-s for these targets, against 223 for the whole demo
# (idle); with a sweep over the parallelism alone and one profile run (smaller_lm), 160 in the suite.
LM_FIGURES = ("throughput", "efficiency", "memory", "accuracy", "sensitivity")
LM_TARGETS = ("results/tables/scaling.csv", *(f"results/figures/{name}.png" for name in LM_FIGURES))
LM_CONFIG = "config/demo-gpt.yaml"


def smaller_lm(config: dict) -> None:
    config["sensitivity"]["axes"]["per_gpu_batch"] = [4]  # the parallelism alone
    config["profiling"]["world_sizes"] = [2]


@pytest.fixture(scope="module")
def lm_demo(tmp_path_factory) -> tuple[Path, str]:
    """The LM demo's config (smaller_lm) to LM_TARGETS and their report, in a copy of the repository;
    (folder, config file)."""
    workdir = copy_workflow(tmp_path_factory.mktemp("lm") / "scalestudy")
    configfile = write_config(workdir, "lm.yaml", smaller_lm, base=LM_CONFIG)
    started = time.monotonic()
    run_snakemake(workdir, *LM_TARGETS, "--configfile", configfile, timeout=1500)
    run_snakemake(workdir, *LM_TARGETS, "--report", "results/report.html", "--configfile", configfile)
    print(f"LM study: {time.monotonic() - started:.0f} s")
    return workdir, configfile


def test_the_lm_study_reports_tokens_memory_and_both_parallelisms(lm_demo):
    workdir, _ = lm_demo
    scaling = pd.read_csv(workdir / "results/tables/scaling.csv")
    assert set(scaling["parallelism"]) == {"ddp", "fsdp"} and set(scaling["sample_unit"]) == {"tokens"}
    assert scaling["peak_memory_bytes"].gt(0).all()
    fsdp = scaling[(scaling["parallelism"] == "fsdp") & (scaling["mode"] == "strong")]
    state = fsdp.set_index("world_size")["model_state_bytes_per_rank"]
    assert state[2] < 0.55 * state[1]  # FSDP2 shards parameters, gradients and AdamW's moments
    for name in LM_FIGURES:
        assert (workdir / f"results/figures/{name}.png").stat().st_size > 10_000, name
    report = (workdir / "results/report.html").read_text(errors="replace")
    assert "memory.png" in report and "okens/s" in report


def test_the_lm_loss_falls_and_every_run_is_the_lm(lm_demo):
    workdir, _ = lm_demo
    metrics = pd.read_csv(workdir / "results/runs/baseline/default/metrics.csv")
    assert metrics["train_loss"].is_monotonic_decreasing and metrics["test_loss"].iloc[-1] < 3.5
    for path in (workdir / "results/runs").rglob("summary.json"):
        results = json.loads(path.read_text())["results"]
        assert (results["workload"], results["sample_unit"]) == ("gpt", "tokens"), path


def test_the_lm_study_has_nothing_left_to_do(lm_demo):
    workdir, configfile = lm_demo
    result = run_snakemake(workdir, "--dry-run", *LM_TARGETS, "--configfile", configfile)
    assert "Nothing to be done" in result.stdout + result.stderr


def users_script(config: dict) -> None:
    config["workload"] = {
        "name": "command",
        "command": {
            "script": "examples/train_script.py",
            "args": ["--samples", "4096"],
            "sample_unit": "samples",
        },
    }
    # every stage, fewer points than the demo: strong scaling only (its 2 ranks the one run of two),
    # a sweep of 2 over two axes at one rank, one profile run (of one rank); one epoch (25 steps: the
    # measured window's 21 fit), as the sweep's points always had. What is tested is the plumbing,
    # not what the script learns.
    config["scaling"]["modes"] = ["strong"]
    config["sensitivity"].update(world_size=1, axes={"per_gpu_batch": [16], "lr": [0.05, 0.1]})
    config["profiling"]["world_sizes"] = [1]
    config["train"]["epochs"] = 1


# What the tests below read, not the whole study: the ResNet demo runs every stage (tests/test_workflow.py);
# here the script's runs through the grid, their tables and one paper figure (15 jobs of 46: no
# communication benchmark, profile figures, paper PDF, crate or tracking; issue 45).
COMMAND_TARGETS = (
    "results/tables/runs.csv",
    "results/tables/scaling.csv",
    "results/tables/sensitivity.csv",
    "results/paper/figures/throughput.pdf",
)


@pytest.fixture(scope="module")
def command_study(tmp_path_factory) -> Path:
    workdir = copy_workflow(tmp_path_factory.mktemp("command") / "scalestudy")
    configfile = write_config(workdir, "command.yaml", users_script)
    run_snakemake(workdir, *COMMAND_TARGETS, "--configfile", configfile, timeout=1500)
    return workdir


def test_the_users_script_runs_through_the_demo_grid(command_study):
    runs = pd.read_csv(command_study / "results/tables/runs.csv")
    assert set(runs["stage"]) == {"baseline", "scaling", "sensitivity", "profile"}
    assert set(runs["workload"]) == {"command"} and set(runs["sample_unit"]) == {"samples"}
    scaling = pd.read_csv(command_study / "results/tables/scaling.csv")
    assert scaling["images_per_s_mean"].gt(0).all() and len(scaling) == 2
    sensitivity = pd.read_csv(command_study / "results/tables/sensitivity.csv")
    assert {"per_gpu_batch", "lr"} <= set(sensitivity.columns) and len(sensitivity) == 2
    summary = json.loads((command_study / "results/runs/scaling/strong/w2_r0/summary.json").read_text())
    assert summary["provenance"]["script"]["path"].endswith("examples/train_script.py")
    assert (command_study / "results/paper/figures/throughput.pdf").is_file()


def test_a_changed_script_re_runs_the_training_jobs(command_study):
    script = command_study / "examples/train_script.py"
    script.write_text(script.read_text() + "\n# changed\n")
    result = run_snakemake(command_study, "--dry-run", "--configfile", "config/command.yaml")
    assert "scaling_run" in result.stdout and "baseline_run" in result.stdout
