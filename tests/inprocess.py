"""What the tests that run the trainer in the pytest process share: one thread, no launcher's
variables (a rank's environment would make the trainer join a process group), a packed synthetic
CIFAR-10 folder, the global step of a trainer's progress line, and a signal sent when the trainer
logs a given global step (the stop a job gets from Slurm or torchrun, at an exact point of the run)."""

from __future__ import annotations

import logging
import os
import re
import signal
from pathlib import Path

import numpy as np
import pytest
import torch

from scalestudy.data.synthetic_cifar import generate_arrays
from scalestudy.train import trainer as train

STEP_LINE = re.compile(r"epoch (\d+)/\d+ step (\d+)/(\d+) ")
LAUNCH_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")
PACKED = ("train_images", "train_labels", "test_images", "test_labels")


def launch_free_environ() -> dict[str, str]:
    """This process's environment without any launcher's variables (the tests may run under Slurm)."""
    return {k: v for k, v in os.environ.items() if k not in LAUNCH_VARIABLES and not k.startswith("SLURM_")}


def without_launch_variables(patch: pytest.MonkeyPatch) -> None:
    for name in set(os.environ) - set(launch_free_environ()):
        patch.delenv(name)


@pytest.fixture(autouse=True)
def one_process_one_thread(monkeypatch):
    """Autouse where imported: each test runs as one process on one thread."""
    without_launch_variables(monkeypatch)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def write_packed_cifar(folder: Path, train_per_class: int, test_per_class: int, seed: int = 0) -> Path:
    """`folder` holding the preprocessed arrays of a synthetic CIFAR-10 (what rule preprocess writes)."""
    folder.mkdir(parents=True, exist_ok=True)
    arrays = generate_arrays(train_per_class, test_per_class, seed=seed)
    for name, array in zip(PACKED, arrays, strict=True):
        np.save(folder / f"{name}.npy", array)
    return folder


def global_step(line: str) -> int | None:
    """The global step a trainer progress line reports (counted from 1; epochs count from 1 in the log)."""
    match = STEP_LINE.search(line)
    return (int(match[1]) - 1) * int(match[3]) + int(match[2]) if match else None


class SignalAtStep(logging.Handler):
    """`signum` (SIGTERM unless told) to this process when the trainer logs global step `step`
    (between steps: the trainer logs a step once it is done)."""

    def __init__(self, step: int, signum: int = signal.SIGTERM) -> None:
        super().__init__()
        self.step, self.signum = step, signum

    def emit(self, record) -> None:
        if global_step(record.getMessage()) == self.step:
            os.kill(os.getpid(), self.signum)

    def __enter__(self):
        train.log.addHandler(self)
        train.log.setLevel(logging.INFO)  # the runs log at WARNING; the step lines must still be made
        return self

    def __exit__(self, *exc):
        train.log.removeHandler(self)
        train.log.setLevel(logging.NOTSET)


SigtermAtStep = SignalAtStep  # SignalAtStep(step): SIGTERM, the name the resume tests of the variants use
