"""One rank's training run (the Trainer), started by scalestudy.train.program (`python -m scalestudy.train`).

In the order it happens: ranks and devices -> data and model (the workload's: scalestudy.workloads)
-> data parallelism (scalestudy.train.parallel) -> optimizer and schedule (scalestudy.train.optim)
-> resume (scalestudy.train.checkpoint.manager.Checkpointer) -> training loop -> results
(scalestudy.train.results). What setup builds is made by scalestudy.train.build, the epoch's
totals, evaluation, metrics rows and progress lines by scalestudy.train.bookkeeping: each is given
what it reads, not the run config. Trainer.train_step is one optimizer step, read top to bottom;
train_epoch puts around it the profiler window, the epoch's totals, the steady-state window
(scalestudy.train.steady), progress lines, checkpoint cadence and stop signals. Rank 0 writes the
run folder once, at the end (gpu_monitor.*, metrics.csv, steps.csv, then summary.json), every file
atomically. SIGTERM/SIGUSR1 end the run with a checkpoint and EXIT_RESUMABLE (75): the retry
resumes. The choices it makes (scaling, precision, timing windows, BatchNorm under DDP, signals)
are in docs/architecture.md, "The trainer's choices".
"""

from __future__ import annotations

import logging
import socket
import time
from pathlib import Path
from typing import Any

import torch

from scalestudy import provenance
from scalestudy import workloads as workload_code
from scalestudy.contract import EXIT_RESUMABLE  # noqa: F401 (the trainer's exit code, as tests read it)
from scalestudy.launch import distributed
from scalestudy.plan import workloads
from scalestudy.train import accumulation, bookkeeping, build, parallel, startup, steady
from scalestudy.train import gpu_monitor as monitor
from scalestudy.train.checkpoint.manager import Checkpointer, CheckpointSettings
from scalestudy.train.journal import NULL_RUN
from scalestudy.train.parallel import ParallelSettings
from scalestudy.train.ranges import ProfileWindow, named_range
from scalestudy.train.results import RunResults, steady_result
from scalestudy.train.state import EpochMeter, EpochProgress, Position, RunState, StepTimer, StopRequest
from scalestudy.workloads.built import Built

log = logging.getLogger("scalestudy.train")


# --- the run ------------------------------------------------------------------------------------------


class Trainer:
    """One rank's run: setup() builds it, checkpointer.resume() resumes it, fit() trains it,
    finish() writes the run folder. Every attribute is declared here."""

    # given (__init__)
    config: dict[str, Any]  # the run config, defaults filled in
    given: dict[str, Any]  # the run config as given (summary.json's "run")
    out_dir: Path
    dist_env: distributed.DistEnv
    device: torch.device
    backend: str
    rank: int
    world_size: int
    is_main: bool
    config_hash: str
    parallel_settings: ParallelSettings  # what parallel.wrap reads of the config
    workload: workloads.Workload
    state: RunState  # position, the epoch's totals, history: what checkpoints hold of the run
    control_group: Any  # the gloo group the ranks agree on stopping over (None with one rank)
    next_epoch_batches: dict[tuple[int, int], Any]  # (epoch, step) -> its batches, made early
    # built by setup(), in this order
    ranks: list[dict[str, Any]]  # every rank's host, device and start time
    t0: float  # rank 0's start (time.time()): the time base of the GPU monitor and the window
    train_data: Any  # the workload's loaders: steps_per_epoch, epoch(epoch, start_step)
    test_data: Any
    steps_per_epoch: int
    total_steps: int
    built: Built  # the bare model and its facts (parameters, FLOPs)
    # rank 0's MLflow run while program.run tracks it (scalestudy.train.journal); off: does nothing
    live: Any = NULL_RUN
    model: torch.nn.Module  # the bare model: evaluation, checkpoints, gradient clipping
    wrapped: parallel.Wrapped
    train_model: torch.nn.Module  # what the step calls: DDP or FSDP2, compiled or not
    peak_lr: float
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    precision: build.MixedPrecision  # autocast dtype and grad scaler
    checkpointer: Checkpointer
    window: ProfileWindow
    monitor: monitor.GpuMonitor
    # made by fit(), for the attempt
    steady: steady.SteadyWindow
    steady_kept: bool  # this attempt's filled window is in the history (the next checkpoints keep it)

    def __init__(
        self, config: dict[str, Any], given: dict[str, Any], out_dir: Path, dist_env, device, backend
    ):
        self.config, self.given, self.out_dir = config, given, out_dir
        self.dist_env, self.device, self.backend = dist_env, device, backend
        self.rank, self.world_size = dist_env.rank, dist_env.world_size
        self.is_main = dist_env.is_main
        self.config_hash = provenance.config_hash(config)
        self.workload = workloads.get(config["workload"])
        self.state = RunState()
        self.control_group = None
        self.next_epoch_batches = {}
        self.parallel_settings = ParallelSettings.from_config(config)

    # -- setup, in the order it happens --

    def setup(self) -> None:
        startup.mark("settings")
        c = self.config
        self.control_group, self.ranks = build.start_ranks(
            self.dist_env, self.backend, self.device, self.parallel_settings, c["pg_timeout_s"], c["nodes"]
        )
        self.t0 = self.ranks[0]["time"]
        startup.mark("process_group")
        # every rank samples its own GPU (by UUID), the job's processes told apart by the ranks' PIDs;
        # NVML opens on the monitor's thread while the data and model load; rank 0 writes the
        # gathered reports in finish()
        job = monitor.job_on_host(self.ranks, socket.gethostname())
        self.monitor = monitor.for_device(self.device, c["monitor_interval_s"], self.t0, self.rank, job=job)
        self.monitor.start(background=True)
        self.build_data()
        startup.mark("data")
        self.build_model()
        startup.mark("model")
        self.peak_lr, self.optimizer, self.scheduler = build.optimizer_and_schedule(
            self.model, c, self.wrapped.sharded, self.steps_per_epoch, self.total_steps
        )
        self.precision = build.MixedPrecision.of(c["precision"], self.device, self.wrapped)
        self.checkpointer = Checkpointer(
            CheckpointSettings.from_config(c, self.config_hash),
            sharded=self.workload.reshardable,
            model=self.model,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            scaler=self.precision.scaler,
            run_state=self.state,
            rank=self.rank,
            world_size=self.world_size,
        )
        self.window = ProfileWindow(c["profile"], self.out_dir, self.rank, self.world_size)
        if not self.monitor.wait_open(monitor.OPEN_WAIT_S):  # sampling before the first step (the window)
            log.warning("GPU monitor: NVML not open after %.0f s; it samples once it is", monitor.OPEN_WAIT_S)
        startup.mark("setup")

    def build_data(self) -> None:
        runtime = workload_code.runtime(self.workload.name)
        self.train_data, self.test_data = runtime.build_data(
            self.config, self.rank, self.world_size, self.device
        )
        self.steps_per_epoch = self.train_data.steps_per_epoch
        self.total_steps = self.config["epochs"] * self.steps_per_epoch

    def build_model(self) -> None:
        built = workload_code.runtime(self.workload.name).build_model(self.config, self.device)
        self.model, self.built = built.model, built
        self.wrapped, self.train_model = build.prepare_model(
            self.model,
            self.parallel_settings,
            self.device,
            self.world_size,
            built.shard_units,
            self.config["inductor_cache_dir"],
        )
        where = self.parallel_settings.parallelism if self.world_size > 1 else "one rank"
        log.info("model: %s; %s", built.description, where)

    # -- training: the attempt, an epoch, one step --

    def fit(self, stop: StopRequest) -> int:
        c = self.config
        self.state.start_attempt()
        batches, steps = (c["per_gpu_batch"], c["global_batch"]), (self.steps_per_epoch, c["epochs"])
        bookkeeping.log_start(self.world_size, batches, steps, self.peak_lr, self.device)
        bookkeeping.warn_if_paced(c["min_step_s"])
        measure = tuple(c[f"measure_{key}"] for key in ("warmup_steps", "steps", "intervals", "seconds"))
        self.steady = build.steady_window(measure, self.device, self.t0, self.synchronize, self.control_group)
        if not self.wrapped.sharded:  # FSDP2's sharded parameters take no gradient hook
            self.steady.parts.attach(next(self.model.parameters()))
        startup.mark("resume")
        self.steady.start(self.state.position.global_step)
        self.steady_kept = False
        while self.state.position.epoch < c["epochs"]:
            if not self.train_epoch(stop):
                return bookkeeping.stop_for_retry(stop, self.state.position.global_step)
            with self.steady.paused():
                self.end_epoch()
            if self.state.position.epoch < c["epochs"] and stop.agreed(self.control_group):
                return bookkeeping.stop_for_retry(stop, self.state.position.global_step)
        stop.drain()
        return 0

    def train_epoch(self, stop: StopRequest) -> bool:
        """Runs the rest of the current epoch; False if stopped by a signal (after a checkpoint)."""
        epoch = self.state.position.epoch
        self.train_model.train()
        meter = EpochMeter(self.state.progress, self.device, self.is_main)
        batches = self.epoch_batches(epoch, self.state.position.step)
        for step in range(self.state.position.step, self.steps_per_epoch):
            started = time.monotonic()
            self.profile_step(meter.clock)
            timer = StepTimer(self.device, self.times_this_step())
            y, predicted, loss = self.train_step(batches, timer)
            if step + 1 == self.steps_per_epoch and epoch + 1 < self.config["epochs"]:
                # The next epoch's plan (permutation, augmentation draws, one copy to the device),
                # made while the device still runs this step rather than after the epoch end's sync.
                self.next_epoch_batches = {(epoch + 1, 0): self.train_data.epoch(epoch + 1, 0)}
            bookkeeping.hold_step(self.config["min_step_s"], started)  # before the window counts it
            self.count_step(meter, y, predicted, loss, timer)
            stopping = stop.agreed(self.control_group)
            if stopping or self.checkpoint_due():
                self.save_mid_epoch(meter)
            if stopping:
                return False
        self.state.progress = bookkeeping.meter_totals(meter, self.device)
        return True

    def train_step(self, batches, timer: StepTimer):
        """One optimizer step: batch, forward and backward (DDP's all-reduce; per chunk of
        micro_batch samples where it is set), clipping, optimizer and schedule; `timer` times the
        phases of a sampled step, the window's `parts` where a measured step goes
        (scalestudy.train.step_parts)."""
        parts = self.steady.parts
        with named_range("step"):
            parts.step_started()
            with named_range("data"):
                x, y = next(batches)
            parts.data_ready()
            timer.mark("data")
            predicted, loss = self.forward_backward(x, y, timer)
            with named_range("optimizer"):
                self.clip_gradients()
                self.precision.scaler.step(self.optimizer)
                self.precision.scaler.update()
                self.optimizer.zero_grad(set_to_none=True)
                self.scheduler.step()
            timer.mark("optimizer")
        return y, predicted, loss

    def forward_backward(self, x: torch.Tensor, y: torch.Tensor, timer: StepTimer):
        """The batch's gradients, over the ranks: one forward and backward, or one per chunk of
        micro_batch samples with the gradients synchronised in the last one's backward
        (scalestudy.train.accumulation); `timer` adds up the chunks' phases. Returns the predicted
        classes (a callable: the argmax is taken where counted only, but as each chunk goes with
        micro_batch, whose chunks' logits are not kept) and the batch's mean loss."""
        chunks = accumulation.chunks(x, y, self.config["micro_batch"])
        losses, predicted = [], []
        for index, (x_chunk, y_chunk, weight) in enumerate(chunks):
            last = index == len(chunks) - 1
            with accumulation.gradient_sync(self.wrapped.module, sync=last):
                with named_range("forward"), self.precision.autocast():
                    logits = self.train_model(x_chunk)
                    loss = self.loss(logits, y_chunk)
                    loss = loss if weight == 1.0 else loss * weight
                timer.mark("forward")
                with named_range("backward"):
                    self.precision.scaler.scale(loss).backward()
            losses.append(loss.detach())
            predicted.append(logits.detach() if len(chunks) == 1 else logits.detach().argmax(-1))
            if last:
                self.steady.parts.backward_done()
            timer.mark("backward_allreduce")
        if len(chunks) == 1:
            return lambda: predicted[0].argmax(-1), losses[0]
        return lambda: torch.cat(predicted), torch.stack(losses).sum()

    # -- around the step --

    def epoch_batches(self, epoch: int, start_step: int):
        prepared = self.next_epoch_batches.pop((epoch, start_step), None)
        return iter(prepared or self.train_data.epoch(epoch, start_step))

    def times_this_step(self) -> bool:
        """steps.csv samples every step_timing_every-th step, none inside the steady window or the
        profile window (its per-phase synchronisation would slow the steps measured or profiled)."""
        sampled = bookkeeping.every(self.state.position.global_step, self.config["step_timing_every"])
        return sampled and not self.steady.measuring and not self.window.active

    def count_step(self, meter: EpochMeter, y, predicted, loss, timer: StepTimer) -> None:
        """After a step: the epoch's totals, the steady window, the sampled step's row, the next
        position, and a progress line every log_every_steps steps and at the epoch's end. Correct
        predictions: every step for an accuracy workload, else on log steps only (they sync anyway)."""
        position, history = self.state.position, self.state.history
        step = position.step + 1
        logs = bookkeeping.every(step, self.config["log_every_steps"]) or step == self.steps_per_epoch
        hits = logs or self.workload.metric == "accuracy"
        samples = meter.add(loss, predicted, y, self.world_size, hits=hits)
        self.steady.step_done(samples * self.world_size)
        if self.steady.filled and not self.steady_kept:  # the next checkpoints keep it
            self.steady.gather_parts(lambda parts: distributed.all_gather_object(parts, self.control_group))
            history.steady_window = steady_result(self.steady, self.world_size, self.state.attempt)
            self.steady_kept = True
        if timer.enabled and self.is_main:
            history.steps.append(timer.row(position.epoch + 1, position.global_step))
        self.state.position = Position(position.epoch, step, position.global_step + 1)
        if logs:
            self.log_progress(meter)

    def checkpoint_due(self) -> bool:
        """Every checkpoint_every_steps global steps, but not at an epoch's end (which saves anyway)."""
        position = self.state.position
        periodic = bookkeeping.every(position.global_step, self.config["checkpoint_every_steps"])
        return periodic and position.step < self.steps_per_epoch

    def save_mid_epoch(self, meter: EpochMeter) -> None:
        """A checkpoint with the epoch's totals so far (a collective, read: the device has caught up),
        paused out of both clocks."""
        totals = bookkeeping.meter_totals(meter, self.device)
        with meter.clock.paused(), self.steady.paused():
            self.state.progress = totals
            self.checkpointer.save()

    def profile_step(self, clock) -> None:
        """Open or close the profiler window (ProfileWindow.step) before a step; the steps where it
        opens or closes (synchronising, writing its output) are paused out of both clocks."""
        profile, step = self.window, self.state.position.global_step
        if profile.tool == "none" or profile.done:
            return
        if step == profile.start_step or (profile.active and step >= profile.start_step + profile.steps):
            self.synchronize()  # the queued steps count as training, not as the profiler's
            with clock.paused(), self.steady.paused():
                profile.step(step)

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return bookkeeping.cross_entropy(logits, targets, self.config["label_smoothing"], reduction="mean")

    def clip_gradients(self) -> None:
        if self.config["grad_clip"]:
            self.precision.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config["grad_clip"])

    def log_progress(self, meter: EpochMeter) -> None:
        steps = (self.config["epochs"], self.steps_per_epoch, self.total_steps)
        lr = self.scheduler.get_last_lr()[0]
        bookkeeping.log_progress(meter, self.state, steps, self.workload.sample_unit, lr, self.live)

    def end_epoch(self) -> None:
        """Evaluation, the epoch's metrics row, then a checkpoint at the next epoch's start."""
        c, history = self.config, self.state.history
        test = bookkeeping.evaluate(
            self.model, self.test_data, self.precision.autocast, self.device, self.world_size
        )
        batches = (c["global_batch"], c["per_gpu_batch"])
        lr = self.scheduler.get_last_lr()[0]
        row = bookkeeping.epoch_row(self.state, test, batches, self.world_size, lr)
        history.metrics.append(row)
        self.live.epoch(row["epoch"], row)
        if history.time_to_target_s is None and row["test_acc"] >= c["target_accuracy"]:
            history.time_to_target_s = row["wall_time_s"]
        bookkeeping.log_epoch(row, c["epochs"], self.workload.sample_unit)
        self.state.position = Position(row["epoch"], 0, self.state.position.global_step)
        self.state.progress = EpochProgress()
        self.checkpointer.save()

    # -- results --

    def finish(self) -> None:
        self.window.close()
        reports = distributed.gather_object(self.monitor.stop() if self.monitor else None)
        memory = distributed.gather_object(parallel.memory_report(self.device, self.model, self.optimizer))
        if self.is_main:
            self.results().write(self.out_dir, reports, memory)
            self.checkpointer.finish()

    def results(self) -> RunResults:
        return RunResults(
            config=self.config,
            given=self.given,
            state=self.state,
            steady=self.steady,
            workload=self.workload,
            built=self.built,
            wrapped_options=self.wrapped.options,
            world_size=self.world_size,
            steps_per_epoch=self.steps_per_epoch,
            device=self.device,
            backend=self.backend,
            ranks=self.ranks,
            launcher=self.dist_env.launcher,
            amp_dtype=self.precision.dtype,
            peak_lr=self.peak_lr,
        )
