"""What the tests that run the trainer in the pytest process share: one thread, no launcher's
variables (a rank's environment would make the trainer join a process group), a packed synthetic
CIFAR-10 folder, and a SIGTERM sent when the trainer logs a given global step (the stop a job gets
from Slurm or torchrun, at an exact point of the run)."""

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


def without_launch_variables(patch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n in LAUNCH_VARIABLES or n.startswith("SLURM_")]:
        patch.delenv(name)


@pytest.fixture(autouse=True)
def one_process_one_thread(monkeypatch):
    """Autouse where imported: each test runs as one process on one thread."""
    without_launch_variables(monkeypatch)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def write_packed_cifar(folder: Path, train_images: int, test_images: int, seed: int = 0) -> Path:
    """`folder` holding the preprocessed arrays of a synthetic CIFAR-10 (what rule preprocess writes)."""
    folder.mkdir(parents=True, exist_ok=True)
    arrays = generate_arrays(train_images, test_images, seed=seed)
    for name, array in zip(PACKED, arrays, strict=True):
        np.save(folder / f"{name}.npy", array)
    return folder


class SigtermAtStep(logging.Handler):
    """SIGTERM to this process when the trainer logs global step `step` (counted from 1; between
    steps: the trainer logs a step once it is done)."""

    def __init__(self, step: int) -> None:
        super().__init__()
        self.step = step

    def emit(self, record) -> None:
        match = STEP_LINE.search(record.getMessage())
        if match and (int(match[1]) - 1) * int(match[3]) + int(match[2]) == self.step:
            os.kill(os.getpid(), signal.SIGTERM)

    def __enter__(self):
        train.log.addHandler(self)
        train.log.setLevel(logging.INFO)  # the runs log at WARNING; the step lines must still be made
        return self

    def __exit__(self, *exc):
        train.log.removeHandler(self)
        train.log.setLevel(logging.NOTSET)
