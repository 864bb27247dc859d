"""One rank's training run (the Trainer), started by scalestudy.train.program (`python -m scalestudy.train`).

In the order it happens: ranks and devices -> data and model (the workload's: scalestudy.workloads)
-> data parallelism (scalestudy.train.parallel) -> optimizer and schedule (scalestudy.train.optim)
-> resume (scalestudy.train.checkpoint.manager.Checkpointer) -> training loop -> results
(scalestudy.train.results). What setup builds is made by scalestudy.train.build, the epoch's
totals and evaluation by scalestudy.train.bookkeeping; its components are each given what they read,
not the run config: the epoch's batches (scalestudy.train.epoch_data), the step's forward, backward
and update (scalestudy.train.optimizer_step), the progress lines and metrics rows
(scalestudy.train.reporting). Trainer.train_step is one optimizer step, read top to bottom;
train_epoch puts around it the profiler window, the epoch's totals, the steady-state window
(scalestudy.train.steady), progress lines, checkpoint cadence and stop signals. Rank 0 writes the
run folder once, at the end (gpu_monitor.*, metrics.csv, steps.csv, then summary.json), every file
atomically. SIGTERM/SIGUSR1 end the run with a checkpoint and EXIT_RESUMABLE (75): the retry
resumes. The choices it makes (scaling, precision, timing windows, BatchNorm under DDP, signals)
are in docs/reference/methods.md, "The trainer's choices".
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import Any

import torch

from scalestudy import provenance
from scalestudy.launch import distributed
from scalestudy.plan import workloads
from scalestudy.train import bookkeeping, build, compiled, optim, parallel, startup, steady
from scalestudy.train import gpu_monitor as monitor
from scalestudy.train import torch_options as torchopts
from scalestudy.train.built import Built
from scalestudy.train.checkpoint.manager import Checkpointer, CheckpointSettings
from scalestudy.train.epoch_data import EpochData
from scalestudy.train.journal import NULL_RUN
from scalestudy.train.optimizer_step import OptimizerStep, StepSettings
from scalestudy.train.parallel import ParallelSettings
from scalestudy.train.ranges import ProfileWindow, named_range
from scalestudy.train.reporting import ReportSettings, RunReport
from scalestudy.train.results import RunResults, steady_result
from scalestudy.train.state import EpochMeter, EpochProgress, Position, RunState, StepTimer, StopRequest

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
    parallel_settings: ParallelSettings  # what parallel.wrap reads of the config (the compile mode resolved)
    compiled: compiled.CompiledStep  # the compiled step's cache, CUDA graphs and counters
    workload: workloads.WorkloadSpec
    state: RunState  # position, the epoch's totals, history: what checkpoints hold of the run
    control_group: Any  # the gloo group the ranks agree on stopping over (None with one rank)
    # built by setup(), in this order
    ranks: list[dict[str, Any]]  # every rank's host, device and start time
    t0: float  # rank 0's start (time.time()): the time base of the GPU monitor and the window
    data: EpochData  # the workload's loaders, each epoch's batches
    steps_per_epoch: int
    total_steps: int
    report: RunReport  # progress lines, metrics rows, the time to target
    built: Built  # the bare model and its facts (parameters, FLOPs)
    # rank 0's MLflow run while program.run tracks it (scalestudy.train.journal); off: does nothing
    live: Any = NULL_RUN
    model: torch.nn.Module  # the bare model: evaluation, checkpoints, gradient clipping
    wrapped: parallel.Wrapped
    train_model: torch.nn.Module  # what the step calls: the model and its loss, wrapped, compiled or not
    peak_lr: float
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    precision: build.MixedPrecision  # autocast dtype and grad scaler
    optimizer_step: OptimizerStep  # forward and backward, clipping, optimizer and schedule
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
        settings = compiled.CompileSettings.from_config(config, device)
        self.compiled = compiled.CompiledStep(settings)
        self.parallel_settings = dataclasses.replace(
            ParallelSettings.from_config(config), compile_mode=settings.mode
        )

    # -- setup, in the order it happens --

    def setup(self) -> None:
        startup.mark("settings")
        c = self.config
        self.control_group, self.ranks = build.start_ranks(
            self.dist_env, self.backend, self.device, self.parallel_settings, c["pg_timeout_s"], c["nodes"]
        )
        self.t0 = self.ranks[0]["time"]
        startup.mark("process_group")
        self.monitor = build.gpu_monitor(self.device, c["monitor_interval_s"], self.t0, self.rank, self.ranks)
        self.build_data()
        steps = (self.steps_per_epoch, self.total_steps)
        settings = ReportSettings.of(c, self.steps_per_epoch, self.world_size, self.workload.sample_unit)
        self.report = RunReport(settings, self.state)
        startup.mark("data")
        self.build_model()
        startup.mark("model")
        self.peak_lr, self.optimizer, self.scheduler = build.optimizer_and_schedule(
            self.model,
            optim.OptimizerSettings.from_config(c),
            optim.ScheduleSettings.from_config(c),
            self.wrapped.sharded,
            steps,
        )
        self.precision = build.MixedPrecision.of(c["precision"], self.device, self.wrapped)
        self.optimizer_step = OptimizerStep(
            StepSettings.from_config(c),
            self.model,
            self.wrapped.module,
            self.train_model,
            self.optimizer,
            self.scheduler,
            self.precision,
        )
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
        runtime = self.workload.runtime_module()
        loaders = runtime.build_data(self.config, self.rank, self.world_size, self.device)
        self.data = EpochData(*loaders, self.config["epochs"])
        self.steps_per_epoch, self.total_steps = self.data.steps_per_epoch, self.data.total_steps

    def build_model(self) -> None:
        built = self.workload.runtime_module().build_model(self.config, self.device)
        self.model, self.built = built.model, built
        self.compiled.prepare()  # its cache folder and artifacts, before anything compiles
        self.wrapped, self.train_model = build.prepare_model(
            self.model,
            self.parallel_settings,
            self.device,
            self.world_size,
            built.shard_units,
            self.config["label_smoothing"],
        )
        where = self.parallel_settings.parallelism if self.world_size > 1 else "one rank"
        log.info("model: %s; %s", built.description, where)

    # -- training: the attempt, an epoch, one step --

    def fit(self, stop: StopRequest) -> int:
        c = self.config
        self.state.start_attempt()
        self.report.start(self.peak_lr, self.device)
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
        batches = self.data.batches(epoch, self.state.position.step)
        for step in range(self.state.position.step, self.steps_per_epoch):
            started = time.monotonic()
            self.profile_step(meter.clock)
            timer = StepTimer(self.device, self.times_this_step())
            y, predicted, loss = self.train_step(batches, timer)
            self.data.step_done(epoch, step)  # the next epoch's plan, in its last step
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
        micro_batch samples where it is set), clipping, optimizer and schedule (OptimizerStep);
        `timer` times the phases of a sampled step, the window's `parts` where a measured step goes
        (scalestudy.train.step_parts)."""
        parts = self.steady.parts
        with named_range("step"):
            parts.step_started()
            with named_range("data"):
                x, y = next(batches)
            parts.data_ready()
            timer.mark("data")
            predicted, loss = self.optimizer_step.forward_backward(x, y, timer, parts.backward_done)
            with named_range("optimizer"):
                self.optimizer_step.update()
            timer.mark("optimizer")
        return y, predicted, loss

    # -- around the step --

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
        logs = self.report.logs(step)
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
            self.report.progress(meter, self.scheduler.get_last_lr()[0], self.live)

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

    def end_epoch(self) -> None:
        """Evaluation, the epoch's metrics row (RunReport.epoch), then a checkpoint at the next epoch's
        start."""
        test = bookkeeping.evaluate(
            self.model, self.data.test, self.precision.autocast, self.device, self.world_size
        )
        row = self.report.epoch(test, self.scheduler.get_last_lr()[0], self.live)
        self.state.position = Position(row["epoch"], 0, self.state.position.global_step)
        self.state.progress = EpochProgress()
        self.checkpointer.save()

    # -- results --

    def finish(self) -> None:
        self.window.close()
        reports = distributed.gather_object(self.monitor.stop() if self.monitor else None)
        memory = distributed.gather_object(parallel.memory_report(self.device, self.model, self.optimizer))
        if self.is_main:
            self.compiled.save(compile_s=torchopts.compile_seconds())  # a compile job's artifacts
            self.results().write(self.out_dir, reports, memory)
            self.checkpointer.finish()

    def close(self) -> None:
        """The process-wide settings the run changed, restored (program.run, however the run ended)."""
        self.compiled.close()

    def results(self) -> RunResults:
        return RunResults(
            config=self.config,
            given=self.given,
            state=self.state,
            steady=self.steady,
            workload=self.workload,
            built=self.built,
            wrapped_options=self.wrapped.recorded_options(),
            world_size=self.world_size,
            steps_per_epoch=self.steps_per_epoch,
            device=self.device,
            backend=self.backend,
            ranks=self.ranks,
            launcher=self.dist_env.launcher,
            amp_dtype=self.precision.dtype,
            peak_lr=self.peak_lr,
            compiled=self.compiled,
        )
