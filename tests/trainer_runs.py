"""What the trainer's end-to-end CPU tests (tests/test_train*.py) share: the small deterministic run
they vary, the fixtures that make its folders, and the ways to run, stop and compare it.

Runs use ResNet-18 at width 8 on 320 synthetic training images (batch 16, 12 steps per epoch) in
deterministic mode, so that an interrupted and resumed run can be compared bit for bit with an
uninterrupted one. Single-rank runs call program.main() in this process (no 4 s torch import);
that gives the same bits as a subprocess, since both run with one thread. Each module makes its
runs with a module-scoped `runs` fixture of its own that returns run_maker(tmp_path_factory).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest
import torch

from scalestudy.train import program
from scalestudy.train.checkpoint import single_file as checkpoint
from tests.conftest import REPO
from tests.inprocess import write_packed_cifar
from tests.processes import child_env, global_step
from tests.run_configs import resnet_run

BASE = resnet_run(
    epochs=2,
    max_steps_per_epoch=12,
    checkpoint_every_steps=5,
    log_every_steps=1,
    step_timing_every=4,
    target_accuracy=0.05,
    # the measurement window: steps 4..19 of 24, across the epoch boundary at 12
    measure_warmup_steps=4,
    measure_steps=16,
    measure_intervals=4,
)
STEPS_PER_EPOCH = 12


def run_maker(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., tuple[Path, Path, dict]]:
    """What each module's `runs` fixture returns: make(name, **changes) -> (run folder, checkpoint
    folder, run config) for a run of BASE + changes, on 320 images packed once for the maker."""
    data_dir = write_packed_cifar(tmp_path_factory.mktemp("packed"), train_per_class=32, test_per_class=10)
    root = tmp_path_factory.mktemp("runs")

    def make(name, **changes):
        folder = root / name
        config = {**BASE, "data_dir": str(data_dir), "checkpoint_dir": str(folder / "ckpt"), **changes}
        return folder / "run", folder / "ckpt", config

    return make


def main(out_dir, config, log_level: str = "WARNING") -> int:
    """One rank of the run in this process; its exit status."""
    return program.main(
        ["--run-config-json", json.dumps(config), "--out-dir", str(out_dir), "--log-level", log_level]
    )


def final(ckpt_dir) -> dict:
    """The state of the newest checkpoint in `ckpt_dir`."""
    state, _ = checkpoint.load_latest(ckpt_dir)
    return state


def assert_same_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    different = [key for key in a if not torch.equal(a[key], b[key])]
    assert not different, f"tensors differ: {different[:5]}"


def learning_columns(out_dir) -> pd.DataFrame:
    return pd.read_csv(out_dir / "metrics.csv")[["epoch", "train_loss", "train_acc", "test_loss", "test_acc"]]


def summary_results(out_dir) -> dict:
    return json.loads((out_dir / "summary.json").read_text())["results"]


def start_trainer(out, config, env=None, stderr=subprocess.PIPE) -> subprocess.Popen:
    """The trainer in a process of its own (one thread; `env` added to this one's, launchers' left out)."""
    command = [sys.executable, "-m", "scalestudy.train", "--run-config-json", json.dumps(config)]
    return subprocess.Popen(
        [*command, "--out-dir", str(out)],
        cwd=REPO,
        env=child_env(**(env or {})),
        stderr=stderr,
        text=True,
    )


def signal_at_step(process: subprocess.Popen, step: int, signum: int, target_pid: int | None = None) -> str:
    """Read the trainer's log until it reports global step `step`, then send `signum` (to
    `target_pid`, default the trainer) while the next step runs; returns the whole log."""
    lines = []
    for line in process.stderr:
        lines.append(line)
        if global_step(line) == step:
            os.kill(target_pid or process.pid, signum)
            break
    lines += process.stderr.readlines()
    process.wait(timeout=120)
    return "".join(lines)


def last_step(log: str) -> int:
    """The last global step a trainer's log reports."""
    return max(filter(None, map(global_step, log.splitlines())))


def torchrun_to_the_end(out, config, timeout: float = 300) -> None:
    """A 2-rank run under torchrun --standalone that must finish."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    command += ["-m", "scalestudy.train", "--run-config-json", json.dumps(config), "--out-dir", str(out)]
    result = subprocess.run(
        command, cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, result.stderr[-5000:]
