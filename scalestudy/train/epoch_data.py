"""The run's data, epoch by epoch (scalestudy.train.trainer): the workload's loaders (its runtime's
build_data, scalestudy.workloads) and the run's length in steps. An epoch's batches start at any
step (a resume mid-epoch); the next epoch's plan (permutation, augmentation draws, one copy to the
device) is made in the last step of the epoch before, while the device still runs that step, rather
than after the epoch end's synchronisation."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


class EpochData:
    """`train` and `test`: the workload's loaders (steps_per_epoch, epoch(epoch, start_step))."""

    def __init__(self, train: Any, test: Any, epochs: int) -> None:
        self.train, self.test, self.epochs = train, test, epochs
        self.steps_per_epoch: int = train.steps_per_epoch
        self.total_steps = epochs * self.steps_per_epoch
        self.prepared: dict[tuple[int, int], Any] = {}  # (epoch, start step) -> its plan, made early

    def batches(self, epoch: int, start_step: int) -> Iterator:
        """Epoch `epoch`'s batches from step `start_step` on: the plan step_done made, else a new one."""
        prepared = self.prepared.pop((epoch, start_step), None)
        return iter(prepared or self.train.epoch(epoch, start_step))

    def step_done(self, epoch: int, step: int) -> None:
        """After step `step` (from 0) of `epoch`: where it was the epoch's last and another epoch
        follows, that epoch's plan."""
        if step + 1 == self.steps_per_epoch and epoch + 1 < self.epochs:
            self.prepared = {(epoch + 1, 0): self.train.epoch(epoch + 1, 0)}
