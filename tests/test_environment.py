"""The environment scripts/bootstrap.sh builds: envs/requirements.lock agrees with the pins of
envs/requirements*.txt, and uv is told the package index pip is told (scripts/uv_index_args.py)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.requirement_files import PIN, pins, requirement_lines

ENVS = REPO / "envs"


def _pins(path: Path) -> dict[str, str]:
    """{canonical name: version} of a requirements file, every line of which must pin with ==."""
    loose = [line for line in requirement_lines(path) if not PIN.match(line)]
    assert not loose, f"{path.name}: not pinned with ==: {loose}"
    return pins(path)


def _uv_index_args():
    spec = importlib.util.spec_from_file_location("uv_index_args", REPO / "scripts/uv_index_args.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_pin_of_the_requirements_is_in_the_lock_at_its_version():
    lock = _pins(ENVS / "requirements.lock")
    for name in ("requirements.txt", "requirements-dev.txt"):
        for package, version in _pins(ENVS / name).items():
            assert lock.get(package) == version, (
                f"envs/{name} pins {package}=={version}, envs/requirements.lock has {lock.get(package)}:"
                " write the lock again (its header says how)"
            )


def test_the_bootstrapped_environment_has_every_package_of_the_lock_at_its_version():
    from importlib.metadata import PackageNotFoundError, version

    if Path(sys.prefix).resolve() != (REPO / ".venv").resolve():
        pytest.skip(f"the tests run in {sys.prefix}, not in the .venv scripts/bootstrap.sh builds")
    differing = {}
    for package, pinned in _pins(ENVS / "requirements.lock").items():
        try:
            installed = version(package)
        except PackageNotFoundError:
            installed = None
        if installed is None or installed.split("+")[0] != pinned:
            differing[package] = (pinned, installed)
    assert not differing, f"{{package: (lock, .venv)}}: {differing}"


def test_pips_settings_become_uvs_arguments_the_environment_winning():
    module = _uv_index_args()
    listing = "\n".join(
        [
            ":env:.find-links='/opt/env-wheels'",
            "global.find-links='/opt/wheels'",
            "global.extra-index-url='file:///a/simple file:///b/simple'",
            "install.constraint='/etc/pip/constraints.txt'",
            "global.cert='/etc/ssl/ca.crt'",
            "global.timeout='60'",
        ]
    )
    settings = module.effective_settings(listing)
    assert settings["find-links"] == "/opt/env-wheels"
    assert module.uv_arguments(settings) == [
        "--extra-index-url",
        "file:///a/simple",
        "--extra-index-url",
        "file:///b/simple",
        "--find-links",
        "/opt/env-wheels",
        "--constraint",
        "/etc/pip/constraints.txt",
        "SSL_CERT_FILE=/etc/ssl/ca.crt",
    ]


def test_the_script_reads_pips_own_configuration(tmp_path):
    """Run as bootstrap.sh runs it: a pip.conf and a PIP_ variable reach uv's arguments."""
    config = tmp_path / "pip.conf"
    config.write_text("[global]\nindex-url = https://mirror.example/simple\nno-index = false\n")
    environment = {**os.environ, "PIP_CONFIG_FILE": str(config), "PIP_TRUSTED_HOST": "mirror.example"}
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts/uv_index_args.py"), sys.executable],
        capture_output=True,
        text=True,
        env=environment,
        check=True,
    )
    lines = result.stdout.splitlines()
    assert lines[lines.index("--index-url") + 1] == "https://mirror.example/simple"
    assert lines[lines.index("--allow-insecure-host") + 1] == "mirror.example"
    assert "--no-index" not in lines
