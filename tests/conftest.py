"""Shared fixtures: a copy of the workflow to run Snakemake in, and a way to run it."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from scalestudy.plan.cluster import THREAD_POOL_ENV
from tests.cputime import CpuClock

REPO = Path(__file__).resolve().parent.parent

# One thread per process in every test and everything a test starts, unless the environment says
# otherwise: the suite runs as three streams side by side on CI's 2 cores (scripts/test.sh), and its
# models are tiny. Measured here: a width-8 ResNet step on 2 threads beside a busy core took 3.8x the
# CPU of 1 thread (and 3x the time); on an idle machine 1.7x the CPU for a 15 % faster step. Set
# before any test imports torch; workflow jobs and ranks set their own (Snakemake, launch specs).
for _name in THREAD_POOL_ENV:
    os.environ.setdefault(_name, "1")
# What a workflow run needs; results/ and .snakemake/ are created by the run itself.
WORKFLOW_PARTS = (
    "Snakefile",
    "rules",
    "config",
    "report",
    "profiles",
    "scalestudy",
    "containers",
    "envs",
    "examples",
)


def copy_workflow(dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    # scalestudy's byte code comes along (scripts/bootstrap.sh compiles it; copy2 keeps the sources'
    # times, so it stays valid): under PYTHONDONTWRITEBYTECODE every job would compile it again.
    ignore = shutil.ignore_patterns("*.sif")
    for part in WORKFLOW_PARTS:
        source = REPO / part
        if source.is_dir():
            shutil.copytree(source, dest / part, ignore=ignore)
        elif source.exists():
            shutil.copy2(source, dest / part)
    return dest


def write_config(workdir: Path, name: str, change, base: str = "config/demo.yaml") -> str:
    """`base` (the demo), changed by `change(config)`, as config/<name> of the workflow copy; its path
    relative to the copy (a --configfile value)."""
    config = yaml.safe_load((REPO / base).read_text())
    change(config)
    path = workdir / "config" / name
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return str(path.relative_to(workdir))


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


def parse_jobs(output: str) -> list[dict]:
    """Snakemake's dry-run job blocks: rule, wildcards, resources, shell command."""
    jobs = []
    for block in re.split(r"\n(?=(?:local)?rule \w+:\n)", output):
        head = re.match(r"(?:local)?rule (\w+):\n", block)
        if not head:
            continue
        fields = dict(re.findall(r"^    (\w+): (.*)$", block, re.M))
        shell = re.search(r"^Shell command: (.*)$", block, re.M)
        jobs.append(
            {
                "rule": head[1],
                "wildcards": dict(
                    item.split("=", 1) for item in fields.get("wildcards", "").split(", ") if item
                ),
                "resources": dict(item.split("=", 1) for item in fields["resources"].split(", ")),
                "threads": fields.get("threads"),
                "shell": shell[1] if shell else "",
            }
        )
    return jobs


@pytest.fixture
def demo_config() -> dict:
    """config/demo.yaml with every schema default filled in, as the Snakefile reads it (a fresh copy)."""
    from scalestudy.plan.studyconfig import load as study_config

    return study_config(REPO / "config/demo.yaml")


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


def stub_apptainer(folder: Path, record: Path | None = None) -> Path:
    """An `apptainer` that only answers --version: Snakemake checks for one even in a dry run.

    With `record`, every other call appends its argv to that file (one JSON list a line) and an
    `exec ... IMAGE COMMAND ARGS` runs COMMAND ARGS on the host, as if the image held the host's
    software. Snakemake ends its wrapper with `IMAGE sh -c CMD`; a launch spec's ranks end with
    `IMAGE PYTHON -m ...` and are not run (the stub cannot know where their options end).
    """
    folder.mkdir(parents=True, exist_ok=True)
    stub = folder / "apptainer"
    if record is None:
        stub.write_text(_VERSION_ONLY_APPTAINER)
    else:
        stub.write_text(_RECORDING_APPTAINER.format(python=sys.executable, record=str(record)))
    stub.chmod(0o755)
    return folder


_VERSION_ONLY_APPTAINER = (
    '#!/bin/sh\n[ "$1" = --version ] && echo "apptainer version 1.3.6" && exit 0\nexit 1\n'
)
_RECORDING_APPTAINER = """#!{python}
import json, os, sys
args = sys.argv[1:]
if args == ["--version"]:
    print("apptainer version 1.3.6")
    raise SystemExit(0)
with open({record!r}, "a") as handle:
    handle.write(json.dumps(args) + "\\n")
if len(args) >= 3 and args[0] == "exec" and args[-2] == "-c":
    os.execvp(args[-3], args[-3:])
raise SystemExit(0)
"""


def recorded_calls(record: Path) -> list[list[str]]:
    """The argv of every call of a recording stub_apptainer, in order."""
    if not record.exists():
        return []
    return [json.loads(line) for line in record.read_text().splitlines() if line]


def pytest_configure(config):
    """Every session ends with its wall time, CPU-seconds and costliest phases (tests/cputime.py)."""
    config.pluginmanager.register(CpuClock(config), "scalestudy-cputime")


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (scripts/test.sh's `-n 2 --dist loadfile`), the modules that run a whole
    workflow (marked `slow`) are handed out first: a module of minutes taken last would run alone
    while the other worker waits. Each module's own order is kept."""
    if not getattr(config.option, "numprocesses", None):
        return
    slow = {item.module.__name__ for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.module.__name__ not in slow)


@pytest.fixture
def compile_modes(monkeypatch) -> list:
    """torch.compile replaced by a recorder: the list of modes asked for, one per call, and the model
    handed back uncompiled (what mode a GPU run compiles with, without a C++ toolchain's minutes)."""
    import torch

    from scalestudy.train import torch_options

    modes: list = []

    def recording_compile(model, **options):
        modes.append(options.get("mode"))
        return model

    monkeypatch.setattr(torch, "compile", recording_compile)
    monkeypatch.setattr(torch_options, "compile_seconds", lambda: 0.0)
    return modes
