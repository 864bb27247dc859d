"""The trainer's own components, each on its own (the trainer's runs test them together:
tests/test_train*.py): the epoch's batches (scalestudy.train.epoch_data), one optimizer step
(scalestudy.train.optimizer_step) and what a run reports as it trains (scalestudy.train.reporting)."""

from __future__ import annotations

import copy
import logging

import pytest
import torch
import torch.nn.functional as F

from scalestudy.train import optim
from scalestudy.train.build import MixedPrecision
from scalestudy.train.epoch_data import EpochData
from scalestudy.train.model_loss import ModelAndLoss
from scalestudy.train.optimizer_step import OptimizerStep, StepSettings
from scalestudy.train.reporting import ReportSettings, RunReport
from scalestudy.train.state import EpochProgress, Position, RunState, StepTimer

# --- the epoch's batches -------------------------------------------------------------------------------


class _Loader:
    """A loader of 3 steps an epoch whose batches name themselves; `made` lists every plan made."""

    steps_per_epoch = 3

    def __init__(self) -> None:
        self.made: list[tuple[int, int]] = []

    def epoch(self, epoch: int, start_step: int = 0):
        self.made.append((epoch, start_step))
        return [(epoch, step) for step in range(start_step, self.steps_per_epoch)]


def test_the_next_epochs_plan_is_made_in_the_last_step_and_used_once():
    loader = _Loader()
    data = EpochData(loader, "test", epochs=2)
    assert (data.steps_per_epoch, data.total_steps, data.test) == (3, 6, "test")
    assert list(data.batches(0, 1)) == [(0, 1), (0, 2)]  # a resume mid-epoch starts where it stopped
    data.step_done(0, 1)
    assert loader.made == [(0, 1)]  # not the epoch's last step: nothing made early
    data.step_done(0, 2)
    assert loader.made == [(0, 1), (1, 0)]
    assert list(data.batches(1, 0)) == [(1, 0), (1, 1), (1, 2)]
    assert loader.made == [(0, 1), (1, 0)]  # the plan made early, not a second one
    data.step_done(1, 2)  # the last epoch's last step: no epoch follows
    assert loader.made == [(0, 1), (1, 0)]
    list(data.batches(1, 0))
    assert loader.made[-1] == (1, 0) and len(loader.made) == 3  # a plan serves one epoch only


# --- one optimizer step --------------------------------------------------------------------------------


def _step(model: torch.nn.Module, micro_batch: int | None, grad_clip: float | None = None, lr: float = 0.1):
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    scheduler = optim.build_scheduler(optimizer, warmup_steps=0, total_steps=10)
    precision = MixedPrecision(None, False, torch.amp.GradScaler("cpu", enabled=False), "cpu")
    settings = StepSettings(micro_batch, grad_clip=grad_clip)
    step = ModelAndLoss(model, label_smoothing=0.1)
    return OptimizerStep(settings, model, step, step, optimizer, scheduler, precision)


def _batch(scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    return scale * torch.randn(6, 5, generator=generator), torch.randint(0, 4, (6,), generator=generator)


def test_chunks_of_micro_batch_give_the_one_pass_gradients_loss_and_predictions():
    torch.manual_seed(0)
    whole = torch.nn.Linear(5, 4)
    chunked = copy.deepcopy(whole)
    x, y = _batch()
    results = []
    for model, micro_batch in ((whole, None), (chunked, 2)):
        done: list[int] = []
        timer = StepTimer(torch.device("cpu"), enabled=True)
        step = _step(model, micro_batch)
        predicted, loss = step.forward_backward(x, y, timer, lambda done=done: done.append(1))
        assert done == [1]  # once, after the last chunk's backward
        assert {"forward_s", "backward_allreduce_s"} <= set(timer.times)
        results.append((predicted(), loss, [p.grad.clone() for p in model.parameters()]))
    (one_pred, one_loss, one_grads), (chunk_pred, chunk_loss, chunk_grads) = results
    expected = F.cross_entropy(whole(x), y, label_smoothing=0.1)
    assert one_loss.item() == pytest.approx(expected.item())
    assert chunk_loss.item() == pytest.approx(expected.item())
    assert torch.equal(one_pred, whole(x).argmax(-1)) and torch.equal(chunk_pred, one_pred)
    for one, chunk in zip(one_grads, chunk_grads, strict=True):
        torch.testing.assert_close(chunk, one)


def test_the_update_clips_the_global_gradient_norm_then_steps_and_zeroes():
    torch.manual_seed(0)
    model = torch.nn.Linear(5, 4)
    step = _step(model, None, grad_clip=0.5, lr=1.0)
    before = [p.detach().clone() for p in model.parameters()]
    x, y = _batch(scale=100.0)
    step.forward_backward(x, y, StepTimer(torch.device("cpu"), enabled=False), lambda: None)
    norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()]))
    assert norm > 0.5  # large enough to be clipped
    step.update()
    moved = torch.stack([(p.detach() - b).norm() for p, b in zip(model.parameters(), before, strict=True)])
    assert torch.linalg.vector_norm(moved).item() == pytest.approx(0.5, rel=1e-4)  # lr 1: the clipped step
    assert all(p.grad is None for p in model.parameters())
    assert step.scheduler.last_epoch == 1


# --- what a run reports --------------------------------------------------------------------------------


class _Live:
    def __init__(self) -> None:
        self.epochs: list[int] = []

    def epoch(self, epoch: int, row: dict) -> None:
        self.epochs.append(epoch)


def _report(log_every_steps: int | None) -> RunReport:
    config = {"epochs": 3, "log_every_steps": log_every_steps, "global_batch": 8, "per_gpu_batch": 4}
    settings = ReportSettings.of(config | {"target_accuracy": 0.5}, 5, 2, "images")
    return RunReport(settings, RunState())


def test_progress_lines_every_log_every_steps_and_at_the_epochs_end():
    assert [_report(2).logs(step) for step in range(1, 6)] == [False, True, False, True, True]
    assert [_report(None).logs(step) for step in range(1, 6)] == [False] * 4 + [True]


def test_the_epochs_row_is_kept_journaled_logged_and_the_target_timed_once(caplog):
    report, live = _report(2), _Live()
    history = report.state.history
    for epoch, accuracy in enumerate((0.4, 0.6, 0.9)):
        report.state.position = Position(epoch, 0, 5 * epoch)
        report.state.progress = EpochProgress(loss_sum=8.0, correct=3.0, images=4, time_s=2.0, counted=4)
        with caplog.at_level(logging.INFO, logger="scalestudy.train"):
            row = report.epoch((0.7, accuracy), 0.01, live)
        assert history.metrics[-1] is row and row["epoch"] == epoch + 1
        assert (row["train_loss"], row["images_per_s_per_gpu"], row["global_batch"]) == (2.0, 1.0, 8)
        if epoch == 1:
            reached = row["wall_time_s"]
        assert history.time_to_target_s == (None if epoch == 0 else reached)  # the first epoch at 0.5
    assert live.epochs == [1, 2, 3]
    assert "epoch 3/3 done in" in caplog.text and "2 images/s" in caplog.text
