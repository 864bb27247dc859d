"""An epoch's bookkeeping around the trainer's steps (scalestudy.train.trainer): the loss, the totals
over all ranks, the evaluation at the epoch's end, its metrics.csv row and the progress lines. Each
function is given what it reads (no run config): the trainer calls them in the order they happen."""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from scalestudy.contract import EXIT_RESUMABLE
from scalestudy.launch import distributed
from scalestudy.progress import format_seconds
from scalestudy.train.ranges import named_range
from scalestudy.train.state import EpochMeter, EpochProgress, RunState, StopRequest

log = logging.getLogger("scalestudy.train")


def cross_entropy(
    logits: torch.Tensor, targets: torch.Tensor, label_smoothing: float, reduction: str
) -> torch.Tensor:
    """Cross-entropy over the last dimension, per sample (image, token), in fp32."""
    return F.cross_entropy(
        logits.flatten(0, -2).float(),
        targets.flatten(),
        label_smoothing=label_smoothing,
        reduction=reduction,
    )


def epoch_totals(sums: torch.Tensor, images: int, counted: int, device: torch.device) -> EpochProgress:
    """Sums over all ranks (a collective, read on the host: the device has caught up by its
    return); `counted`: the samples the correct count is over. The caller sets time_s."""
    counts = torch.tensor([images, counted], dtype=torch.float64, device=device)
    totals = distributed.all_reduce_sum(torch.cat((sums.double(), counts)))
    loss_sum, correct, all_images, all_counted = totals.tolist()
    return EpochProgress(loss_sum, correct, int(all_images), 0.0, int(all_counted))


def meter_totals(meter: EpochMeter, device: torch.device) -> EpochProgress:
    """The running epoch's totals over all ranks, its training seconds included (a collective)."""
    totals = epoch_totals(meter.sums, meter.samples, meter.counted, device)
    totals.time_s = meter.time_s()
    return totals


def evaluate(
    model: torch.nn.Module, test_data, autocast: Callable[[], Any], device: torch.device, world_size: int
) -> tuple[float, float]:
    """Test loss and accuracy over all ranks' shards, of the model the checkpoint saves: every
    rank first takes rank 0's buffers (BatchNorm statistics are per rank while training), as a
    resume from that checkpoint would. The bare model (not DDP) runs it: the shards may differ
    in batch count, and DDP's forward would start collectives."""
    take_rank0_buffers(model, world_size)
    model.eval()
    sums = torch.zeros(2, dtype=torch.float64, device=device)  # loss, correct
    images = 0
    with torch.no_grad(), named_range("eval"):
        for x, y in test_data.epoch(0):
            with autocast():
                logits = model(x)
            loss = cross_entropy(logits, y, 0.0, reduction="sum")
            sums += torch.stack((loss.double(), (logits.argmax(-1) == y).sum().double()))
            images += y.numel()
    totals = epoch_totals(sums, images, images, device)
    model.train()
    return totals.loss_sum / totals.images, totals.correct / totals.images


def take_rank0_buffers(model: torch.nn.Module, world_size: int) -> None:
    if world_size > 1:
        for buffer in model.buffers():
            torch.distributed.broadcast(buffer, src=0)


def epoch_row(
    state: RunState, test: tuple[float, float], batches: tuple[int, int], world_size: int, lr: float
) -> dict[str, Any]:
    """The finished epoch's metrics.csv row (scalestudy.plan.runfiles.METRICS_COLUMNS): `test` is
    (loss, accuracy), `batches` (global, per GPU)."""
    done = state.progress
    return {
        "epoch": state.position.epoch + 1,
        "train_loss": done.loss_sum / done.images,
        "train_acc": done.correct / done.counted,
        "test_loss": test[0],
        "test_acc": test[1],
        "epoch_time_s": done.time_s,
        "images_per_s": done.images / done.time_s,
        "images_per_s_per_gpu": done.images / done.time_s / world_size,
        "global_batch": batches[0],
        "per_gpu_batch": batches[1],
        "world_size": world_size,
        "lr": lr,
        "wall_time_s": state.elapsed_s(),
    }


def log_start(
    world_size: int, batches: tuple[int, int], steps: tuple[int, int], peak_lr: float, device
) -> None:
    """The attempt's first line: `batches` (per GPU, global), `steps` (per epoch, epochs)."""
    log.info(
        "training: %d ranks x %d = global batch %d, %d steps per epoch, %d epochs, peak lr %.4g, %s",
        world_size,
        *batches,
        *steps,
        peak_lr,
        device,
    )


def warn_if_paced(min_step_s: float) -> None:
    if min_step_s:
        log.warning(
            "train.min_step_s=%g: every step lasts at least %g s (the trainer sleeps the rest); this run's "
            "throughput is that pace, not the machine's",
            min_step_s,
            min_step_s,
        )


def hold_step(min_step_s: float, started: float) -> None:
    """Sleeps out the rest of a step begun at `started` (time.monotonic()) that must last `min_step_s`.
    A stop signal received meanwhile is acted on once the sleep ends (the handler only records it)."""
    rest = min_step_s - (time.monotonic() - started)
    if rest > 0:
        time.sleep(rest)


def log_epoch(row: dict[str, Any], epochs: int, sample_unit: str) -> None:
    log.info(
        "epoch %d/%d done in %s: train loss %.4f acc %.3f | test loss %.4f acc %.3f | %.0f %s/s",
        row["epoch"],
        epochs,
        format_seconds(row["epoch_time_s"]),
        row["train_loss"],
        row["train_acc"],
        row["test_loss"],
        row["test_acc"],
        row["images_per_s"],
        sample_unit,
    )


def log_progress(
    meter: EpochMeter, state: RunState, steps: tuple[int, int, int], sample_unit: str, lr: float, live
) -> None:
    """A progress line and the live journal's step record; `steps`: (epochs, steps per epoch, total
    steps)."""
    epochs, steps_per_epoch, total_steps = steps
    images, counted, images_per_s = meter.samples, meter.counted, meter.log_rate()
    loss_sum, correct = meter.sums.tolist()  # the one device sync per log interval
    position = state.position
    done = position.global_step - state.attempt_first_step
    eta = (total_steps - position.global_step) * (time.perf_counter() - state.attempt_t0) / done
    log.info(
        "epoch %d/%d step %d/%d | loss %.4f acc %.3f | %.0f %s/s | lr %.4g | ETA %s",
        position.epoch + 1,
        epochs,
        position.step,
        steps_per_epoch,
        loss_sum / images,
        correct / counted,
        images_per_s,
        sample_unit,
        lr,
        format_seconds(eta),
    )
    rates = {"train_loss_running": loss_sum / images, "train_acc_running": correct / counted}
    live.step(position.global_step, rates | {"samples_per_s": images_per_s, "lr": lr})


def stop_for_retry(stop: StopRequest, global_step: int) -> int:
    """The checkpoint is written (rank 0); every rank exits with EXIT_RESUMABLE."""
    distributed.barrier()  # rank 0 has finished writing before any rank exits
    received = signal.Signals(stop.signum).name if stop.signum else "another rank's signal"
    log.warning(
        "stopping on %s after global step %d, checkpointed; exit %d: retry to resume",
        received,
        global_step,
        EXIT_RESUMABLE,
    )
    return EXIT_RESUMABLE


def every(count: int, interval: int | None) -> bool:
    return bool(interval) and count % interval == 0
