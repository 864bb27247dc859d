"""scripts/gpu_check.sh and scripts/gpu_study.sh on a machine without a GPU: what they do before any
GPU work (the time budget of one device command, the missing Snakemake), and the one command end to
end on the CPU at tiny sizes (the study cut short by its limit). The GPU steps themselves run on a GPU
node only (docs/guide/gpu.md, "The prepared GPU check")."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.conftest import REPO


def run_script(*args: str, **env: str) -> subprocess.CompletedProcess:
    environment = {**os.environ, **env}
    return subprocess.run(
        ["bash", *args], cwd=REPO, env=environment, capture_output=True, text=True, timeout=1200
    )


def test_steps_whose_limit_exceeds_the_budget_are_not_run_and_said_so(tmp_path):
    result = run_script(
        "scripts/gpu_check.sh",
        str(tmp_path),
        GPU_CHECK_BUDGET_S="60",
        GPU_CHECK_STEPS="study lm",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "=== study: not run: its limit 435s is more than the" in result.stdout
    assert "=== lm: not run: its limit 210s is more than the" in result.stdout
    assert "gpu_check: not run (GPU_CHECK_BUDGET_S): study lm" in result.stdout
    assert not (tmp_path / "study.log").exists() and not (tmp_path / "lm.log").exists()
    assert "not measured ResNet bf16/512" in (tmp_path / "targets.txt").read_text()  # read all the same


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


@pytest.mark.slow  # two trainer processes and a study's start: 1-3 minutes on a shared 2-core host
def test_the_one_command_on_a_cpu_writes_the_verdicts_and_csvs_and_packs_them(tmp_path):
    """Every part but the tests at a tiny size: the node, the demo study stopped by its 3 s limit (so its
    verdicts FAIL, saying what is missing, with its wall time), eager and the captured step, one LM
    run, issue 51's targets; the folder packed for the device tool's $OUT."""
    out, back = tmp_path / "cpu-today", tmp_path / "OUT"
    result = run_script(
        "scripts/gpu_check.sh",
        str(out),
        STUDY_DEVICE="cpu",
        GPU_CHECK_CPU_SMALL="1",
        STUDY_CONFIG="config/demo.yaml",
        STUDY_LIMIT_S="3",
        GPU_CHECK_STEPS="study variants lm",
        GPU_CHECK_COPY_TO=str(back),
        GPU_CHECK_LIMIT_SCALE="4",  # a trainer process starts in 5 s idle, in over 60 s on a loaded host
    )
    assert result.returncode == 1, result.stdout + result.stderr  # the study's limit cut it short
    assert "gpu_check: FAILED: study (logs in" in result.stdout
    for part in ("node", "study", "variants", "lm"):
        assert f"=== {part}" in result.stdout
    assert "=== variants: exit 0" in result.stdout and "=== lm: exit 0" in result.stdout
    verdicts = (out / "study-check.txt").read_text().splitlines()
    assert any(line.startswith("FAIL  ") for line in verdicts)
    assert re.fullmatch(r"study wall \d+ s", verdicts[-1])
    assert "torch" in (out / "node.txt").read_text()
    assert "captured" in (out / "variants.csv").read_text() and "ddp" in (out / "lm.csv").read_text()
    assert "GPT-2 small MFU" in (out / "targets.txt").read_text()
    with tarfile.open(back / "measurements.tar.gz") as packed:
        names = packed.getnames()
    assert any(name.endswith("study-check.txt") for name in names)
    assert not any("/workflow/" in name for name in names)
    assert {"study-check.txt", "targets.txt", "variants.csv", "lm.csv"} <= {
        path.name for path in back.iterdir()
    }
