"""The Snakemake bundle for a Python without Snakemake (scalestudy.benchmark.bundle): built here for
THIS interpreter from the venv's installed packages (no network), it runs `python -m snakemake`
in an interpreter started with -S (no site-packages at all: only the standard library and the
bundle). The cp312 wheels for the GPU machine (scripts/gpu_bundle.sh) need PyPI and are not
fetched here; their command line is checked against a stand-in for pip."""

from __future__ import annotations

import importlib.metadata as metadata
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from scalestudy.benchmark import bundle
from tests.conftest import REPO, copy_workflow


def test_the_closure_evaluates_markers_for_the_target_python():
    """referencing needs typing-extensions below Python 3.13 only."""
    assert "typing-extensions" in bundle.closure(["referencing"], set(), "3.12").bundled
    plan = bundle.closure(["referencing"], set(), "3.13")
    assert {"referencing", "attrs", "rpds-py"} <= set(plan.bundled)
    assert "typing-extensions" not in plan.bundled


def test_the_closure_stops_at_what_the_target_already_has():
    plan = bundle.closure(["snakemake", "jsonschema"], {"requests", "pyyaml"}, "3.12")
    assert {"snakemake", "jsonschema", "pulp", "rpds-py", "pydantic-core"} <= set(plan.bundled)
    assert plan.present == {"requests", "pyyaml"}
    # requests' own needs are the target's business: they come with its requests
    assert not {"requests", "pyyaml", "urllib3", "charset-normalizer"} & set(plan.bundled)


def test_a_requirement_not_installed_here_is_named():
    with pytest.raises(bundle.BundleError, match="no-such-distribution-xyz .*not installed"):
        bundle.closure(["no-such-distribution-xyz"], set(), "3.12")


def test_the_device_list_leaves_the_machines_own_packages_out():
    names = bundle.read_names(REPO / "scripts" / "gpu_device_packages.txt")
    assert {"torch", "pandas", "matplotlib", "nvidia-ml-py", "pyyaml", "psutil"} <= names
    assert not {"snakemake", "jsonschema", "mlflow-skinny"} & names  # what the machine lacks
    assert not any(name.startswith("#") for name in names)


def run_isolated(bundle_dir: Path | None, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """This interpreter with -S (no site-packages: the venv's and the base's are both left out) and
    only `bundle_dir` on PYTHONPATH."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(cwd), "PYTHONDONTWRITEBYTECODE": "1"}
    if bundle_dir is not None:
        env["PYTHONPATH"] = str(bundle_dir)
    command = [sys.executable, "-S", *args]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def local_bundle(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("bundle") / "gpu-bundle"
    return out, bundle.build(out, ["snakemake", "jsonschema"], present=set())


def test_a_bundle_of_this_interpreter_records_what_it_holds(local_bundle):
    out, manifest = local_bundle
    assert json.loads((out / bundle.MANIFEST).read_text()) == manifest
    assert manifest["packages"]["snakemake"] == {"version": metadata.version("snakemake"), "source": "copied"}
    assert all(entry["source"] == "copied" for entry in manifest["packages"].values())  # no network
    assert (out / "snakemake").is_dir() and (out / "yaml").is_dir()
    assert not list(out.rglob("__pycache__")) and not list(out.rglob("*.pyc"))
    # pulp's CBC for other platforms is gone, the x86_64 Linux one is kept
    assert not (out / "pulp/solverdir/cbc/osx").exists() and (out / "pulp/solverdir/cbc/linux/i64").is_dir()
    assert set(manifest["pruned"]) == set(bundle.PRUNE["pulp"])
    assert manifest["bytes"] == bundle.folder_bytes(out) - (out / bundle.MANIFEST).stat().st_size
    assert manifest["bytes"] < 60e6


def test_an_interpreter_without_snakemake_runs_it_from_the_bundle(local_bundle, tmp_path):
    out, _ = local_bundle
    missing = run_isolated(None, "-c", "import snakemake", cwd=tmp_path)
    assert missing.returncode != 0 and "No module named 'snakemake'" in missing.stderr
    version = run_isolated(out, "-m", "snakemake", "--version", cwd=tmp_path)
    assert version.returncode == 0, version.stderr[-3000:]
    assert version.stdout.strip() == metadata.version("snakemake")


def test_the_demo_dry_runs_from_the_bundle(local_bundle, tmp_path):
    """Schema validation (jsonschema), the profile, every rule file: all from the bundle and the
    workflow's own package (the copy's scalestudy/, found from the working directory)."""
    out, _ = local_bundle
    workflow = copy_workflow(tmp_path / "workflow")
    result = run_isolated(out, "-m", "snakemake", "-n", "--profile", "profiles/local", cwd=workflow)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "Job stats:" in result.stdout and "sensitivity_run" in result.stdout


def test_a_bundle_over_its_limit_is_refused_and_leaves_nothing(tmp_path):
    out = tmp_path / "small"
    with pytest.raises(bundle.BundleError, match=r"more than --max-mb 1\b"):
        bundle.build(out, ["snakemake"], present=set(), max_mb=1)
    assert list(tmp_path.iterdir()) == []


def test_compiled_distributions_are_fetched_as_wheels_of_the_target_python(tmp_path, monkeypatch):
    """What `--wheels-for 3.12` asks pip for (a stand-in for pip: no network here)."""
    seen = []

    def fake_pip(command, **kwargs):
        seen.append(command)
        dest = Path(command[command.index("--dest") + 1])
        dest.mkdir(parents=True, exist_ok=True)
        (dest / "rpds_py-1.0-cp312-cp312-manylinux_2_17_x86_64.whl").write_bytes(b"")
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(bundle.subprocess, "run", fake_pip)
    wheel = bundle.download_wheel("rpds-py", "1.0", "3.12", tmp_path / "rpds-py", "python")
    (command,) = seen
    assert command[:4] == ["python", "-m", "pip", "download"] and "--no-deps" in command
    assert "--only-binary=:all:" in command and command[-1] == "rpds-py==1.0"
    pairs = list(zip(command, command[1:], strict=False))
    assert ("--python-version", "3.12") in pairs and ("--abi", "cp312") in pairs
    assert ("--implementation", "cp") in pairs
    platforms = {value for option, value in pairs if option == "--platform"}
    assert {"manylinux2014_x86_64", "manylinux_2_28_x86_64", "manylinux_2_17_x86_64"} <= platforms
    assert wheel.name.startswith("rpds_py-1.0-cp312")


def test_no_wheel_for_the_target_is_an_error_naming_it(tmp_path, monkeypatch):
    monkeypatch.setattr(
        bundle.subprocess,
        "run",
        lambda command, **kwargs: subprocess.CompletedProcess(command, 1, "", "No matching distribution"),
    )
    with pytest.raises(bundle.BundleError, match=r"no cp312 .*greenlet==3\.0.*No matching distribution"):
        bundle.download_wheel("greenlet", "3.0", "3.12", tmp_path / "g", "python")


def test_a_wheel_is_unpacked_as_pip_installs_it(tmp_path):
    wheel = tmp_path / "x-1.0-cp312-cp312-manylinux_2_17_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("x/__init__.py", "")
        archive.writestr("x/_speedups.cpython-312-x86_64-linux-gnu.so", b"\0")
        archive.writestr("x-1.0.dist-info/METADATA", "Name: x\nVersion: 1.0\n")
        archive.writestr("x-1.0.data/platlib/x_extra.py", "")
        archive.writestr("x-1.0.data/scripts/x-tool", "#!/bin/sh\n")
    out = tmp_path / "out"
    bundle.unpack_wheel(wheel, out)
    found = sorted(str(path.relative_to(out)) for path in out.rglob("*") if path.is_file())
    assert found == [
        "x-1.0.dist-info/METADATA",
        "x/__init__.py",
        "x/_speedups.cpython-312-x86_64-linux-gnu.so",
        "x_extra.py",
    ]
