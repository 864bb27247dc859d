"""The project's requirement files as the tests read them (tests/test_container.py and
tests/test_environment.py): their lines without comments, and their exact pins by canonical name."""

from __future__ import annotations

import re
from pathlib import Path

from packaging.utils import canonicalize_name

from tests.conftest import REPO

REQUIREMENTS = REPO / "envs/requirements.txt"
PIN = re.compile(r"^([A-Za-z0-9_.-]+)==([^\s;#]+)")


def requirement_lines(path: Path = REQUIREMENTS) -> list[str]:
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return [line for line in lines if line]


def pins(path: Path = REQUIREMENTS) -> dict[str, str]:
    """{canonical name: version} of a requirements file's `name==version` lines."""
    matches = (PIN.match(line) for line in requirement_lines(path))
    return {canonicalize_name(match[1]): match[2] for match in matches if match}
