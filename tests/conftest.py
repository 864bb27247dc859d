"""Shared fixtures: a copy of the workflow to run Snakemake in, and a way to run it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# What a workflow run needs; results/ and .snakemake/ are created by the run itself.
WORKFLOW_PARTS = ("Snakefile", "rules", "config", "report", "profiles", "scalestudy", "containers", "envs")


def copy_workflow(dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.sif")
    for part in WORKFLOW_PARTS:
        source = REPO / part
        if source.is_dir():
            shutil.copytree(source, dest / part, ignore=ignore)
        elif source.exists():
            shutil.copy2(source, dest / part)
    return dest


def snakemake_env() -> dict[str, str]:
    """The environment of a workflow run: this interpreter's venv first on PATH."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.pop("SLURM_JOB_ID", None)
    for key in ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE"):
        env.pop(key, None)  # a rendezvous of an in-process test is not the workflow's
    return env


def run_snakemake(workdir: Path, *args: str, check: bool = True, timeout: int = 1200):
    """Run Snakemake in `workdir`; on failure show its output in the assertion."""
    command = [sys.executable, "-m", "snakemake", "--profile", "profiles/local", *args]
    result = subprocess.run(
        command, cwd=workdir, env=snakemake_env(), capture_output=True, text=True, timeout=timeout
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"snakemake {' '.join(args)} failed ({result.returncode})\n"
            f"--- stdout ---\n{result.stdout[-8000:]}\n--- stderr ---\n{result.stderr[-8000:]}"
        )
    return result


@pytest.fixture
def workflow_copy(tmp_path: Path) -> Path:
    return copy_workflow(tmp_path / "workflow")


@pytest.fixture
def one_torch_thread():
    """torch on one thread for the test (comparisons with references; no oversubscription)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def stub_apptainer(folder: Path) -> Path:
    """An `apptainer` that only answers --version: Snakemake checks for one even in a dry run."""
    folder.mkdir(parents=True, exist_ok=True)
    stub = folder / "apptainer"
    stub.write_text('#!/bin/sh\n[ "$1" = --version ] && echo "apptainer version 1.3.6" && exit 0\nexit 1\n')
    stub.chmod(0o755)
    return folder
