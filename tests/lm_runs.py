"""What the LM's end-to-end CPU tests share (tests/test_lm.py, tests/test_micro_batch.py): the tiny
GPT's run (tests/run_configs.lm_run) on a synthetic corpus's tokens, the fixtures that make its
folders, two ranks under torchrun, and the weights and results they compare."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
import torch.distributed.checkpoint as dcp

from scalestudy.train.checkpoint import dcp as sharded_checkpoint
from scalestudy.workloads.gpt import model as gpt_model
from tests.conftest import REPO
from tests.inprocess import write_packed_text
from tests.processes import child_env, global_step
from tests.run_configs import GPT, lm_run

BASE = lm_run(epochs=2, monitor_interval_s=0.5, measure_steps=10)
TWO_RANKS = {"world_size": 2, "per_gpu_batch": 8}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return write_packed_text(tmp_path_factory.mktemp("lm"))


@pytest.fixture(scope="module")
def runs(tmp_path_factory, data_dir):
    """make(name, checkpoints=None, **changes) -> (run folder, checkpoint folder, run config) of
    BASE + changes (global_batch made to match)."""
    root = tmp_path_factory.mktemp("runs")

    def make(name, checkpoints=None, **changes):
        folder = root / name
        ckpt = root / (checkpoints or name) / "ckpt"
        config = {**BASE, "data_dir": str(data_dir), "checkpoint_dir": str(ckpt), **changes}
        config["global_batch"] = config["per_gpu_batch"] * config["world_size"]
        return folder / "run", ckpt, config

    return make


def torchrun(out, config, stop_at_step: int | None = None) -> tuple[int, str]:
    """2 ranks under torchrun; with stop_at_step, SIGTERM to the launcher (which passes it to the
    ranks) once rank 0 logs that global step. Returns (exit code, log)."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    command += ["-m", "scalestudy.train", "--run-config-json", json.dumps(config), "--out-dir", str(out)]
    process = subprocess.Popen(command, cwd=REPO, env=child_env(), stderr=subprocess.PIPE, text=True)
    lines = []
    for line in process.stderr:
        lines.append(line)
        if stop_at_step is not None and global_step(line) == stop_at_step:
            process.send_signal(signal.SIGTERM)
            stop_at_step = None
    process.wait(timeout=300)
    return process.returncode, "".join(lines)


def weights(ckpt: Path) -> dict[str, torch.Tensor]:
    """The model of the newest DCP checkpoint in `ckpt` (weights_at)."""
    return weights_at(sharded_checkpoint.latest(ckpt)[1])


def weights_at(path: Path) -> dict[str, torch.Tensor]:
    """The model of the DCP checkpoint folder `path`, loaded into a plain GPT (whatever sharding
    wrote it)."""
    state = {"model": gpt_model.GPT(gpt_model.config_from(GPT, 256)).state_dict()}
    dcp.load(state, checkpoint_id=str(path))
    return state["model"]


def initial_weights() -> dict:
    torch.manual_seed(BASE["seed"])
    return gpt_model.GPT(gpt_model.config_from(GPT, 256)).state_dict()


def relative_difference(a: dict, b: dict, start: dict) -> float:
    """|a - b| over how far the weights moved from `start` (the initialisation)."""
    flat = {name: torch.cat([t[k].flatten().double() for k in sorted(t)]) for name, t in (("a", a), ("b", b))}
    moved = flat["a"] - torch.cat([start[k].flatten().double() for k in sorted(start)])
    return float((flat["a"] - flat["b"]).norm() / moved.norm())


def metrics(out: Path) -> pd.DataFrame:
    return pd.read_csv(out / "metrics.csv")[["epoch", "train_loss", "train_acc", "test_loss", "test_acc"]]


def results(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())["results"]
