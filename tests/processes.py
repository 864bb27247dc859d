"""The environment of what the tests run as a job would: the processes they start, and the pytest
process where it runs a rank itself. No launcher's variables (a rank's would make the trainer join
a process group; the tests may themselves run under Slurm), one thread. And the global step of a
trainer's progress line, at which a test stops it."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

import pytest

STEP_LINE = re.compile(r"epoch (\d+)/\d+ step (\d+)/(\d+) ")  # a trainer's progress line
LAUNCH_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")


def launch_free_environ(
    environ: Mapping[str, str] | None = None, also: tuple[str, ...] = ()
) -> dict[str, str]:
    """`environ` (this process's) without any launcher's variables, Slurm's, or those starting with
    one of `also`."""
    environ = os.environ if environ is None else environ
    return {
        k: v for k, v in environ.items() if k not in LAUNCH_VARIABLES and not k.startswith(("SLURM_", *also))
    }


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a process a test starts: launcher-free, one thread, and `extra`."""
    return {**launch_free_environ(), "OMP_NUM_THREADS": "1", **extra}


def without_launch_variables(patch: pytest.MonkeyPatch) -> None:
    """This process's launcher variables removed for the test (`patch`: its monkeypatch)."""
    for name in set(os.environ) - set(launch_free_environ()):
        patch.delenv(name)


def global_step(line: str) -> int | None:
    """The global step a trainer progress line reports (counted from 1; epochs count from 1 in the log)."""
    match = STEP_LINE.search(line)
    return (int(match[1]) - 1) * int(match[3]) + int(match[2]) if match else None
