"""What a run reports while it trains (scalestudy.train.trainer): the attempt's first line, a progress
line (and the live journal's step record) every log_every_steps steps and at an epoch's end, and each
epoch's metrics.csv row, kept in the run's history with its line, its journal record and the time to
the target accuracy. Given what it reads of the run (ReportSettings), not the run config; the rows and
lines themselves are scalestudy.train.bookkeeping's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from scalestudy.train import bookkeeping
from scalestudy.train.state import EpochMeter, RunState


@dataclass(frozen=True)
class ReportSettings:
    """The run's length, batches, sample unit and target accuracy (of)."""

    epochs: int
    steps_per_epoch: int
    log_every_steps: int | None  # 0 or None: progress lines at epoch ends only
    global_batch: int
    per_gpu_batch: int
    world_size: int
    sample_unit: str  # the workload's: images, tokens, ...
    target_accuracy: float

    @classmethod
    def of(
        cls, config: dict[str, Any], steps_per_epoch: int, world_size: int, sample_unit: str
    ) -> ReportSettings:
        return cls(
            epochs=config["epochs"],
            steps_per_epoch=steps_per_epoch,
            log_every_steps=config["log_every_steps"],
            global_batch=config["global_batch"],
            per_gpu_batch=config["per_gpu_batch"],
            world_size=world_size,
            sample_unit=sample_unit,
            target_accuracy=config["target_accuracy"],
        )

    @property
    def total_steps(self) -> int:
        return self.epochs * self.steps_per_epoch


class RunReport:
    """Reports on `state` (scalestudy.train.state.RunState); `live`: the live journal of the run
    (scalestudy.train.journal; NULL_RUN where there is none)."""

    def __init__(self, settings: ReportSettings, state: RunState) -> None:
        self.settings, self.state = settings, state

    def start(self, peak_lr: float, device: torch.device) -> None:
        s = self.settings
        batches, steps = (s.per_gpu_batch, s.global_batch), (s.steps_per_epoch, s.epochs)
        bookkeeping.log_start(s.world_size, batches, steps, peak_lr, device)

    def logs(self, step: int) -> bool:
        """A progress line after the epoch's step `step` (from 1): every log_every_steps steps and
        at the epoch's end."""
        return bookkeeping.every(step, self.settings.log_every_steps) or step == self.settings.steps_per_epoch

    def progress(self, meter: EpochMeter, lr: float, live) -> None:
        s = self.settings
        steps = (s.epochs, s.steps_per_epoch, s.total_steps)
        bookkeeping.log_progress(meter, self.state, steps, s.sample_unit, lr, live)

    def epoch(self, test: tuple[float, float], lr: float, live) -> dict[str, Any]:
        """The finished epoch's metrics row (`test`: its test loss and accuracy), appended to the
        history, journaled and logged; the time to target where its accuracy first reaches it."""
        s, history = self.settings, self.state.history
        row = bookkeeping.epoch_row(self.state, test, (s.global_batch, s.per_gpu_batch), s.world_size, lr)
        history.metrics.append(row)
        live.epoch(row["epoch"], row)
        if history.time_to_target_s is None and row["test_acc"] >= s.target_accuracy:
            history.time_to_target_s = row["wall_time_s"]
        bookkeeping.log_epoch(row, s.epochs, s.sample_unit)
        return row
