"""scripts/gpu_check.sh and scripts/gpu_study.sh on a machine without a GPU: what they do before any
GPU work (the time budget of one device command, the missing Snakemake). The GPU steps themselves
run on a GPU node only (docs/benchmarks.md, "One-GPU study through Snakemake")."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO


def run_script(*args: str, **env: str) -> subprocess.CompletedProcess:
    environment = {**os.environ, **env}
    return subprocess.run(
        ["bash", *args], cwd=REPO, env=environment, capture_output=True, text=True, timeout=300
    )


def test_steps_whose_limit_exceeds_the_budget_are_not_run_and_said_so(tmp_path):
    result = run_script(
        "scripts/gpu_check.sh",
        str(tmp_path),
        GPU_CHECK_BUDGET_S="60",
        GPU_CHECK_STEPS="study lm",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "=== study: not run: its limit 530s is more than the" in result.stdout
    assert "=== lm: not run: its limit 100s is more than the" in result.stdout
    assert "gpu_check: not run (GPU_CHECK_BUDGET_S): study lm" in result.stdout
    assert not (tmp_path / "study.log").exists() and not (tmp_path / "lm.log").exists()


def python_without_site_packages(folder: Path) -> str:
    """This interpreter started with -S: the standard library only, as a machine without Snakemake."""
    wrapper = folder / "python-S"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper)


def test_the_study_without_snakemake_or_its_bundle_stops_saying_how_to_build_it(tmp_path):
    python = python_without_site_packages(tmp_path)
    missing = subprocess.run([python, "-c", "import snakemake"], capture_output=True)
    assert missing.returncode != 0  # the precondition: this interpreter has no Snakemake
    result = run_script(
        "scripts/gpu_study.sh", str(tmp_path / "study"), PYTHON=python, GPU_BUNDLE=str(tmp_path / "none")
    )
    assert result.returncode == 2
    assert "has no Snakemake or jsonschema" in result.stdout and "bash scripts/gpu_bundle.sh" in result.stdout
    assert not (tmp_path / "study" / "workflow").exists()
