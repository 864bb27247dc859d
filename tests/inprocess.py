"""What the tests that run the trainer in the pytest process share: one thread, no launcher's
variables (a rank's environment would make the trainer join a process group), a packed synthetic
CIFAR-10 or token folder, and a signal sent when the trainer logs a given global step (the stop a
job gets from Slurm or torchrun, at an exact point of the run)."""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path

import numpy as np
import pytest
import torch

from scalestudy.data import synthetic_text as textcorpus
from scalestudy.data import tokenize
from scalestudy.data.synthetic_cifar import generate_arrays
from scalestudy.train import trainer as train
from tests.processes import global_step, without_launch_variables

PACKED = ("train_images", "train_labels", "test_images", "test_labels")


@pytest.fixture(autouse=True)
def one_process_one_thread(monkeypatch):
    """Autouse where imported: each test runs as one process on one thread."""
    without_launch_variables(monkeypatch)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def write_packed_text(folder: Path, corpus_bytes: int = 120_000, seed: int = 3, seq_len: int = 32) -> Path:
    """`folder`/packed holding the LM's tokens of a synthetic corpus of `corpus_bytes` (what rule
    preprocess writes for the gpt workload, its windows of seq_len + 1 tokens)."""
    folder.mkdir(parents=True, exist_ok=True)
    textcorpus.write_corpus(folder / "corpus.txt", corpus_bytes, seed=seed)
    argv = [
        "--corpus",
        str(folder / "corpus.txt"),
        "--out-dir",
        str(folder / "packed"),
        "--seq-len",
        str(seq_len),
    ]
    assert tokenize.main(argv) == 0
    return folder / "packed"


def write_packed_cifar(folder: Path, train_per_class: int, test_per_class: int, seed: int = 0) -> Path:
    """`folder` holding the preprocessed arrays of a synthetic CIFAR-10 (what rule preprocess writes)."""
    folder.mkdir(parents=True, exist_ok=True)
    arrays = generate_arrays(train_per_class, test_per_class, seed=seed)
    for name, array in zip(PACKED, arrays, strict=True):
        np.save(folder / f"{name}.npy", array)
    return folder


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
