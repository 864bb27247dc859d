"""What the trainer's setup builds (scalestudy.train.trainer.Trainer.setup), each piece given what it
reads: the ranks (process groups, every rank's facts), the GPU monitor, the model prepared for its
parallelism (scalestudy.train.parallel) and compiled, the optimizer and schedule
(scalestudy.train.optim), the mixed precision (autocast dtype, grad scaler) and an attempt's
steady-state window (scalestudy.train.steady)."""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from scalestudy.launch import distributed
from scalestudy.train import gpu_monitor as monitor
from scalestudy.train import gpu_processes, optim, parallel, steady, step_parts
from scalestudy.train import torch_options as torchopts
from scalestudy.train.parallel import ParallelSettings, Wrapped
from scalestudy.train.process import autocast_dtype, device_name

log = logging.getLogger("scalestudy.train")


def start_ranks(
    dist_env: distributed.DistEnv,
    backend: str,
    device: torch.device,
    settings: ParallelSettings,
    pg_timeout_s: float,
    nodes: int,
) -> tuple[Any, list[dict[str, Any]]]:
    """The process groups (the gloo control group with several ranks; FSDP2's own group with one)
    and every rank's facts (rank_info); a warning where the ranks' hosts are not `nodes`."""
    control_group = None
    if dist_env.world_size > 1:
        control_group = distributed.init_process_group(dist_env, backend, pg_timeout_s, device)
    elif settings.needs_process_group(dist_env.world_size):
        parallel.init_single_rank_group(backend)
    parallel.reset_peak_memory(device)  # the run's peak, not an earlier one's in this process
    ranks = distributed.all_gather_object(rank_info(dist_env, device))
    hosts = {r["host"] for r in ranks}
    if len(hosts) != nodes:
        log.warning("run config nodes=%d but the ranks run on %d hosts: %s", nodes, len(hosts), sorted(hosts))
    return control_group, ranks


def rank_info(dist_env: distributed.DistEnv, device: torch.device) -> dict[str, Any]:
    return {
        "rank": dist_env.rank,
        "local_rank": dist_env.local_rank,
        "host": socket.gethostname(),
        "device": str(device),
        "device_name": device_name(device),
        "pid": os.getpid(),  # the GPU monitor tells the job's processes on a GPU by them
        "gpu_uuid": monitor.device_uuid(device),
        "time": time.time(),
    }


def gpu_monitor(
    device: torch.device, interval_s: float, t0: float, rank: int, ranks: list[dict[str, Any]]
) -> monitor.GpuMonitor:
    """This rank's GPU monitor, started: every rank samples its own GPU (by UUID), the job's processes
    told apart by the ranks' PIDs (`ranks`: rank_info of each); NVML opens on the monitor's thread
    while the data and model load; rank 0 writes the gathered reports at the run's end."""
    job = gpu_processes.job_on_host(ranks, socket.gethostname())
    sampler = monitor.for_device(device, interval_s, t0, rank, job=job)
    sampler.start(background=True)
    return sampler


def prepare_model(
    model: torch.nn.Module,
    settings: ParallelSettings,
    device: torch.device,
    world_size: int,
    shard_units,
    label_smoothing: float,
) -> tuple[Wrapped, torch.nn.Module]:
    """(what parallel.wrap made, the module the step calls: the model and its loss, (x, y) ->
    (logits, loss), compiled where `settings.compile`, in settings.compile_mode resolved
    (scalestudy.train.compiled, which has prepared its cache): as one region with one rank or DDP;
    under FSDP2 block by block and the loss on its own, by parallel.wrap)."""
    wrapped = parallel.wrap(model, settings, device, world_size, shard_units, label_smoothing)
    train_model = wrapped.step
    if settings.compile and not wrapped.compiled:  # FSDP2's blocks were compiled before sharding
        # compiling the DDP module lets DDPOptimizer split the graph at bucket boundaries
        torchopts.log_graph_breaks()
        train_model = torch.compile(train_model, mode=settings.compile_mode)
    return wrapped, train_model


def optimizer_and_schedule(
    model: torch.nn.Module,
    settings: optim.OptimizerSettings,
    schedule: optim.ScheduleSettings,
    sharded: bool,
    steps: tuple[int, int],
):
    """(peak learning rate, optimizer, scheduler): lr scaled for the global batch, warm-up in steps;
    `steps`: (per epoch, in all)."""
    steps_per_epoch, total_steps = steps
    peak_lr = schedule.peak_lr()
    optimizer = optim.build_optimizer(model, settings, peak_lr, sharded=sharded)
    warmup_steps = round(schedule.warmup_epochs * steps_per_epoch)
    return peak_lr, optimizer, optim.build_scheduler(optimizer, warmup_steps, total_steps)


@dataclass
class MixedPrecision:
    """The step's precision: autocast to `dtype` (None: fp32) where the wrapped model takes it (not
    under FSDP2's mixed-precision policy), and a grad scaler that scales for fp16 only."""

    dtype: torch.dtype | None
    enabled: bool  # autocast is on
    scaler: torch.amp.GradScaler
    device_type: str

    @classmethod
    def of(cls, precision: str, device: torch.device, wrapped: Wrapped) -> MixedPrecision:
        dtype = autocast_dtype(precision, device)
        scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
        return cls(dtype, wrapped.autocast and dtype is not None, scaler, device.type)

    def autocast(self):
        return torch.autocast(self.device_type, dtype=self.dtype, enabled=self.enabled)


def steady_window(
    measure: tuple[int, int, int, float],
    device: torch.device,
    t0: float,
    synchronize: Callable[[], None],
    control_group,
) -> steady.SteadyWindow:
    """The attempt's measurement window; `measure`: (warm-up steps, steps, intervals, seconds), the
    run config's measure_* keys."""
    warmup_steps, steps, intervals, seconds = measure
    return steady.SteadyWindow(
        warmup_steps,
        steps,
        intervals,
        synchronize=synchronize,
        t0=t0,
        min_seconds=seconds,
        agree=lambda seconds: steady.mean_over_ranks(seconds, control_group),
        parts=step_parts.for_device(device),
    )
