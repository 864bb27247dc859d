"""How the trainer counts correct predictions (issue 24, item 9). The LM's metric is perplexity: its
argmax over B x T x vocab runs on log steps only (they read the epoch's totals anyway), so no step of
the steady window between them takes one, and train_acc is over the samples it was counted on, carried
through a resume bit for bit. The ResNet's metric is accuracy: it counts every step, as before.
CPU, one rank, in this process."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
import torch

from scalestudy import contract
from scalestudy.train import trainer as train
from scalestudy.train.checkpoint import dcp as sharded_checkpoint
from scalestudy.train.state import EpochProgress, RunState
from tests.inprocess import SignalAtStep, write_packed_cifar, write_packed_text
from tests.processes import without_launch_variables
from tests.run_configs import lm_run, resnet_run
from tests.trainer_runs import main

LM = lm_run(  # the tiny LM of test_lm's runs, its log steps and window placed around each other
    epochs=2,
    monitor_interval_s=0.5,
    checkpoint_every_steps=0,
    log_every_steps=4,  # log steps: global steps 3, 7, 11, 15 (from 0)
    measure_warmup_steps=4,  # the window: steps 4, 5, 6, between two log steps
    measure_steps=3,
    measure_intervals=1,
)
TOKENS_PER_STEP = 16 * 32
LOG_STEPS = [3, 7, 11, 15]
RESNET = resnet_run(
    epochs=1,
    max_steps_per_epoch=6,
    checkpoint_every_steps=0,
    log_every_steps=3,
    measure_warmup_steps=1,  # the window: steps 1..4
    measure_steps=4,
    measure_intervals=1,
)


@pytest.fixture(scope="module", autouse=True)
def _one_process_one_thread():
    with pytest.MonkeyPatch.context() as patch:
        without_launch_variables(patch)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        yield
        torch.set_num_threads(threads)


class _ArgmaxPerStep:
    """Counts argmax calls (the tensor method and torch.argmax) from the start of each training step
    (Trainer.train_step) to the end of its bookkeeping (Trainer.count_step): steps[i] is global step i's."""

    def __init__(self, patch: pytest.MonkeyPatch) -> None:
        self.calls, self.steps, self._start = 0, [], 0
        method, function = torch.Tensor.argmax, torch.argmax
        train_step, count_step = train.Trainer.train_step, train.Trainer.count_step

        def counting(original):
            def argmax(*args, **kwargs):
                self.calls += 1
                return original(*args, **kwargs)

            return argmax

        def step(trainer, *args, **kwargs):
            self._start = self.calls
            return train_step(trainer, *args, **kwargs)

        def counted(trainer, *args, **kwargs):
            count_step(trainer, *args, **kwargs)
            self.steps.append(self.calls - self._start)

        patch.setattr(torch.Tensor, "argmax", counting(method))
        patch.setattr(torch, "argmax", counting(function))
        patch.setattr(train.Trainer, "train_step", step)
        patch.setattr(train.Trainer, "count_step", counted)


def _run_counting(out: Path, config: dict) -> list[int]:
    with pytest.MonkeyPatch.context() as patch:
        counter = _ArgmaxPerStep(patch)
        assert main(out, config) == 0
    return counter.steps


def _window(out: Path) -> range:
    results = json.loads((out / "summary.json").read_text())["results"]
    assert results["window_filled"]
    return range(results["measure_start_step"], results["measure_start_step"] + results["measured_steps"])


@pytest.fixture(scope="module")
def lm_data(tmp_path_factory) -> Path:
    return write_packed_text(tmp_path_factory.mktemp("text"))


def _lm_config(root: Path, data: Path, name: str) -> tuple[Path, Path, dict]:
    ckpt = root / name / "ckpt"
    return root / name / "run", ckpt, {**LM, "data_dir": str(data), "checkpoint_dir": str(ckpt)}


@pytest.fixture(scope="module")
def lm_reference(tmp_path_factory, lm_data):
    out, ckpt, config = _lm_config(tmp_path_factory.mktemp("lm"), lm_data, "reference")
    return out, ckpt, config, _run_counting(out, config)


def test_the_lm_takes_no_argmax_inside_the_window_and_still_reports_train_acc(lm_reference):
    out, _, _, steps = lm_reference
    assert len(steps) == 16
    assert [step for step, calls in enumerate(steps) if calls] == LOG_STEPS
    window = _window(out)
    assert list(window) == [4, 5, 6] and all(steps[step] == 0 for step in window)
    metrics = pd.read_csv(out / "metrics.csv")
    assert len(metrics) == 2 and metrics["train_acc"].between(0.0, 1.0).all()
    assert metrics["train_acc"].iloc[-1] > 1 / 256  # better than chance: it counted real predictions


def test_the_resnet_counts_its_accuracy_every_step(tmp_path):
    data = write_packed_cifar(tmp_path / "packed", 32, 10)
    config = {**RESNET, "data_dir": str(data), "checkpoint_dir": str(tmp_path / "ckpt")}
    steps = _run_counting(tmp_path / "run", config)
    assert steps == [1] * 6
    assert list(_window(tmp_path / "run")) == [1, 2, 3, 4]
    assert 0.0 <= pd.read_csv(tmp_path / "run" / "metrics.csv")["train_acc"].iloc[0] <= 1.0


def test_a_resumed_lm_carries_the_counted_samples_bit_for_bit(lm_reference, tmp_path, lm_data):
    """Stopped after global step 4 of 8 in the epoch: the checkpoint's correct count is over step 3's
    tokens only; the resumed run's metrics.csv is the uninterrupted one's."""
    out, ckpt, config = _lm_config(tmp_path, lm_data, "killed")
    with SignalAtStep(4):
        assert main(out, config) == contract.EXIT_RESUMABLE
    progress = sharded_checkpoint.latest(ckpt)[0]["epoch_progress"]
    assert progress["images"] == 4 * TOKENS_PER_STEP and progress["counted"] == TOKENS_PER_STEP
    assert 0 <= progress["correct"] <= TOKENS_PER_STEP
    assert main(out, config) == 0
    columns = ["epoch", "train_loss", "train_acc", "test_loss", "test_acc"]
    reference = pd.read_csv(lm_reference[0] / "metrics.csv")[columns]
    pd.testing.assert_frame_equal(pd.read_csv(out / "metrics.csv")[columns], reference, check_exact=True)


def test_a_checkpoint_without_the_counted_samples_counted_every_step():
    old = {"loss_sum": 5.0, "correct": 3.0, "images": 10, "time_s": 1.5}
    state = RunState()
    position = {"epoch": 0, "step": 2, "global_step": 2}
    state.load_state_dict({"position": position, "epoch_progress": old, "history": {}})
    assert state.progress == EpochProgress(5.0, 3.0, 10, 1.5, counted=10)
    saved = state.state_dict()["epoch_progress"]
    assert saved["counted"] == 10 and math.isclose(saved["correct"] / saved["counted"], 0.3)
