"""One optimizer step's arithmetic, which scalestudy.train.trainer.Trainer.train_step runs between
fetching the batch and the bookkeeping: the forward and backward over the batch or its chunks
(scalestudy.train.accumulation), the loss, gradient clipping, the grad scaler, the optimizer and the
schedule. It is given what it reads of the run config (StepSettings), not the config."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from scalestudy.train import accumulation
from scalestudy.train.build import MixedPrecision
from scalestudy.train.ranges import named_range
from scalestudy.train.state import StepTimer


@dataclass(frozen=True)
class StepSettings:
    """What the step reads of its run config (from_config)."""

    micro_batch: int | None  # samples per chunk of the per-GPU batch; None: one pass
    grad_clip: float | None  # the global gradient norm's limit; 0 or None: no clipping

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> StepSettings:
        return cls(config["micro_batch"], config["grad_clip"])


@dataclass
class OptimizerStep:
    """The step over the model as setup built it: `train_model` (the model and its loss,
    scalestudy.train.model_loss, under DDP or FSDP2, compiled or not) runs the forward and the loss,
    `sync_module` (parallel.Wrapped.module) is told when gradients synchronise, `model` (the bare
    one) is clipped."""

    settings: StepSettings
    model: torch.nn.Module
    sync_module: torch.nn.Module
    train_model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    precision: MixedPrecision

    def forward_backward(
        self, x: torch.Tensor, y: torch.Tensor, timer: StepTimer, backward_done: Callable[[], None]
    ):
        """The batch's gradients, over the ranks: one forward and backward, or one per chunk of
        micro_batch samples with the gradients synchronised in the last one's backward (after which
        `backward_done` is called); `timer` adds up the chunks' phases. Returns the predicted
        classes (a callable: the argmax is taken where counted only, but as each chunk goes with
        micro_batch, whose chunks' logits are not kept) and the batch's mean loss."""
        chunks = accumulation.chunks(x, y, self.settings.micro_batch)
        losses, predicted = [], []
        for index, (x_chunk, y_chunk, weight) in enumerate(chunks):
            last = index == len(chunks) - 1
            with accumulation.gradient_sync(self.sync_module, sync=last):
                with named_range("forward"), self.precision.autocast():
                    logits, loss = self.train_model(x_chunk, y_chunk)
                    loss = loss if weight == 1.0 else loss * weight
                timer.mark("forward")
                with named_range("backward"):
                    self.precision.scaler.scale(loss).backward()
            losses.append(loss.detach())
            predicted.append(logits.detach() if len(chunks) == 1 else logits.detach().argmax(-1))
            if last:
                backward_done()
            timer.mark("backward_allreduce")
        if len(chunks) == 1:
            return lambda: predicted[0].argmax(-1), losses[0]
        return lambda: torch.cat(predicted), torch.stack(losses).sum()

    def update(self) -> None:
        """Clipping, the (scaled) optimizer step, zeroed gradients, the schedule's next step."""
        self.clip_gradients()
        self.precision.scaler.step(self.optimizer)
        self.precision.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()

    def clip_gradients(self) -> None:
        if self.settings.grad_clip:
            self.precision.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.settings.grad_clip)
