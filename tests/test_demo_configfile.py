"""scripts/demo.sh names a missing `--configfile` in one line (exit 2) before it installs or plans
anything (issue 43): Snakemake itself loads its config files before the workflow's code runs and
prints a 26-line traceback. The script runs from a copy whose bootstrap.sh is a stub that records
it was reached, so no test here can install, plan or run the demo."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO

REACHED = "bootstrap reached"


@pytest.fixture
def demo(tmp_path: Path) -> Path:
    """A copy of scripts/demo.sh beside a stub bootstrap.sh (and a `snakemake` that is never on PATH)."""
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    shutil.copy(REPO / "scripts/demo.sh", scripts / "demo.sh")
    (scripts / "bootstrap.sh").write_text(f'echo "{REACHED}"\nexit 97\n')
    (tmp_path / "config").mkdir()
    (tmp_path / "config/here.yaml").write_text("{}\n")
    return scripts / "demo.sh"


def run_demo(demo: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(demo), *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )


@pytest.mark.parametrize(
    "args, missing",
    [
        (["--configfile", "nope.yaml"], "nope.yaml"),
        (["--configfile=config/nope.yaml"], "config/nope.yaml"),
        (["--configfiles", "config/here.yaml", "other.yaml"], "other.yaml"),  # every word after it
        (["-n", "--configfile", "config/here.yaml", "--configfile", "b.yaml"], "b.yaml"),
        (["--cores", "2", "target.txt", "--configfile", "config"], "config"),  # a folder; targets unchecked
    ],
)
def test_the_demo_names_a_missing_configfile_in_one_line(demo, tmp_path, args, missing):
    done = run_demo(demo, *args, cwd=tmp_path / "config")  # paths are the repository's, wherever it runs
    assert done.returncode == 2, done.stdout + done.stderr
    assert REACHED not in done.stdout
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    why = "not a file" if missing == "config" else "no such file"
    assert lines[0] == f"demo: --configfile {missing}: {why} (relative to {tmp_path})"


def test_existing_configfiles_go_on_to_the_install(demo, tmp_path):
    done = run_demo(demo, "--configfile", "config/here.yaml", "--configfile=config/here.yaml", cwd=tmp_path)
    assert done.returncode == 97, done.stdout + done.stderr
    assert REACHED in done.stdout
    assert "demo:" not in done.stderr
