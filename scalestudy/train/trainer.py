"""One rank's training run (the Trainer), started by scalestudy.train.program (`python -m scalestudy.train`).

In the order it happens: ranks and devices -> data and model (the workload's: scalestudy.workloads)
-> data parallelism (scalestudy.train.parallel) -> optimizer and schedule (scalestudy.train.optim)
-> resume (scalestudy.train.checkpoint.manager.Checkpointer) -> training loop -> results
(scalestudy.train.results). Trainer.train_step is one optimizer step, read top to bottom;
train_epoch puts around it the profiler window, the epoch's totals, the steady-state window
(scalestudy.train.steady), progress lines, checkpoint cadence and stop signals. Rank 0 writes the
run folder once, at the end (gpu_monitor.*, metrics.csv, steps.csv, then summary.json), every file
atomically. SIGTERM/SIGUSR1 end the run with a checkpoint and EXIT_RESUMABLE (75): the retry
resumes. The choices it makes (scaling, precision, timing windows, BatchNorm under DDP, signals)
are in docs/architecture.md, "The trainer's choices".
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from scalestudy import atomic, provenance
from scalestudy import workloads as workload_code
from scalestudy.contract import EXIT_RESUMABLE
from scalestudy.launch import distributed
from scalestudy.plan import runfiles, workloads
from scalestudy.plan.runfiles import METRICS_COLUMNS, STEPS_COLUMNS
from scalestudy.progress import format_seconds
from scalestudy.train import gpu_monitor as monitor
from scalestudy.train import optim, parallel, startup, steady, step_parts
from scalestudy.train import torch_options as torchopts
from scalestudy.train.checkpoint.manager import Checkpointer
from scalestudy.train.journal import NULL_RUN
from scalestudy.train.process import autocast_dtype, device_name
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
    amp_dtype: torch.dtype | None
    use_autocast: bool
    scaler: torch.amp.GradScaler
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

    # -- setup, in the order it happens --

    def setup(self) -> None:
        startup.mark("settings")
        c = self.config
        if self.world_size > 1:
            self.control_group = distributed.init_process_group(
                self.dist_env, self.backend, c["pg_timeout_s"], self.device
            )
        elif parallel.needs_process_group(c, self.world_size):
            parallel.init_single_rank_group(self.backend)
        parallel.reset_peak_memory(self.device)  # the run's peak, not an earlier one's in this process
        self.ranks = distributed.all_gather_object(self._rank_info())
        self.t0 = self.ranks[0]["time"]
        startup.mark("process_group")
        hosts = {r["host"] for r in self.ranks}
        if len(hosts) != c["nodes"]:
            log.warning(
                "run config nodes=%d but the ranks run on %d hosts: %s", c["nodes"], len(hosts), sorted(hosts)
            )
        self.build_data()
        startup.mark("data")
        self.build_model()
        startup.mark("model")
        self.build_optimizer()
        self.amp_dtype = autocast_dtype(c["precision"], self.device)
        self.use_autocast = self.wrapped.autocast and self.amp_dtype is not None
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.amp_dtype == torch.float16)
        self.checkpointer = Checkpointer(
            config=c,
            config_hash=self.config_hash,
            sharded=self.workload.reshardable,
            model=self.model,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            scaler=self.scaler,
            run_state=self.state,
            rank=self.rank,
            world_size=self.world_size,
        )
        self.window = ProfileWindow(c["profile"], self.out_dir, self.rank, self.world_size)
        # every rank samples its own GPU (by UUID), the job's processes told apart by the ranks' PIDs;
        # rank 0 writes the gathered reports in finish()
        job = monitor.job_on_host(self.ranks, socket.gethostname())
        self.monitor = monitor.for_device(self.device, c["monitor_interval_s"], self.t0, self.rank, job=job)
        self.monitor.start()
        startup.mark("setup")

    def _rank_info(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "local_rank": self.dist_env.local_rank,
            "host": socket.gethostname(),
            "device": str(self.device),
            "device_name": device_name(self.device),
            "pid": os.getpid(),  # the GPU monitor tells the job's processes on a GPU by them
            "gpu_uuid": monitor.device_uuid(self.device),
            "time": time.time(),
        }

    def build_data(self) -> None:
        runtime = workload_code.runtime(self.workload.name)
        self.train_data, self.test_data = runtime.build_data(
            self.config, self.rank, self.world_size, self.device
        )
        self.steps_per_epoch = self.train_data.steps_per_epoch
        self.total_steps = self.config["epochs"] * self.steps_per_epoch

    def build_model(self) -> None:
        c = self.config
        built = workload_code.runtime(self.workload.name).build_model(c, self.device)
        self.model, self.built = built.model, built
        self.wrapped = parallel.wrap(self.model, c, self.device, self.world_size, built.shard_units)
        self.train_model = self.wrapped.module
        if c["compile"]:
            torchopts.use_inductor_cache(c["inductor_cache_dir"])
        if c["compile"] and not self.wrapped.compiled:  # FSDP2's blocks were compiled before sharding
            # compiling the DDP module lets DDPOptimizer split the graph at bucket boundaries
            torchopts.log_graph_breaks()
            self.train_model = torch.compile(self.train_model, mode=c["compile_mode"])
        log.info("model: %s; %s", built.description, c["parallelism"] if self.world_size > 1 else "one rank")

    def build_optimizer(self) -> None:
        c = self.config
        self.peak_lr = c["lr"] * optim.lr_scale(c["lr_scaling"], c["global_batch"], c["base_batch"])
        self.optimizer = optim.build_optimizer(self.model, c, self.peak_lr, sharded=self.wrapped.sharded)
        warmup_steps = round(c["warmup_epochs"] * self.steps_per_epoch)
        self.scheduler = optim.build_scheduler(self.optimizer, warmup_steps, self.total_steps)

    # -- training: the attempt, an epoch, one step --

    def fit(self, stop: StopRequest) -> int:
        c = self.config
        self.state.start_attempt()
        log.info(
            "training: %d ranks x %d = global batch %d, %d steps per epoch, %d epochs, peak lr %.4g, %s",
            self.world_size,
            c["per_gpu_batch"],
            c["global_batch"],
            self.steps_per_epoch,
            c["epochs"],
            self.peak_lr,
            self.device,
        )
        self.steady = steady.SteadyWindow(
            c["measure_warmup_steps"],
            c["measure_steps"],
            c["measure_intervals"],
            synchronize=self.synchronize,
            t0=self.t0,
            min_seconds=c["measure_seconds"],
            agree=lambda seconds: steady.mean_over_ranks(seconds, self.control_group),
            parts=step_parts.for_device(self.device),
        )
        if not self.wrapped.sharded:  # FSDP2's sharded parameters take no gradient hook
            self.steady.parts.attach(next(self.model.parameters()))
        startup.mark("resume")
        self.steady.start(self.state.position.global_step)
        self.steady_kept = False
        while self.state.position.epoch < c["epochs"]:
            if not self.train_epoch(stop):
                return self.stop_for_retry(stop)
            with self.steady.paused():
                self.end_epoch()
            if self.state.position.epoch < c["epochs"] and stop.agreed(self.control_group):
                return self.stop_for_retry(stop)
        stop.drain()
        return 0

    def train_epoch(self, stop: StopRequest) -> bool:
        """Runs the rest of the current epoch; False if stopped by a signal (after a checkpoint)."""
        epoch = self.state.position.epoch
        self.train_model.train()
        meter = EpochMeter(self.state.progress, self.device, self.is_main)
        batches = self.epoch_batches(epoch, self.state.position.step)
        for step in range(self.state.position.step, self.steps_per_epoch):
            self.profile_step(meter.clock)
            timer = StepTimer(self.device, self.times_this_step())
            x, y, logits, loss = self.train_step(batches, timer)
            if step + 1 == self.steps_per_epoch and epoch + 1 < self.config["epochs"]:
                # The next epoch's plan (permutation, augmentation draws, one copy to the device),
                # made while the device still runs this step rather than after the epoch end's sync.
                self.next_epoch_batches = {(epoch + 1, 0): self.train_data.epoch(epoch + 1, 0)}
            self.count_step(meter, y, logits, loss, timer)
            stopping = stop.agreed(self.control_group)
            if stopping or self.checkpoint_due():
                self.save_mid_epoch(meter)
            if stopping:
                return False
        self.state.progress = self.epoch_totals(meter.sums, meter.samples, meter.counted)
        self.state.progress.time_s = meter.time_s()
        return True

    def train_step(self, batches, timer: StepTimer):
        """One optimizer step: batch, forward and loss, backward (DDP's all-reduce), clipping,
        optimizer and schedule; `timer` times the phases of a sampled step, the window's `parts`
        where a measured step goes (scalestudy.train.step_parts)."""
        parts = self.steady.parts
        with named_range("step"):
            parts.step_started()
            with named_range("data"):
                x, y = next(batches)
            parts.data_ready()
            timer.mark("data")
            with named_range("forward"), self.autocast():
                logits = self.train_model(x)
                loss = self.loss(logits, y, reduction="mean")
            timer.mark("forward")
            with named_range("backward"):
                self.scaler.scale(loss).backward()
            parts.backward_done()
            timer.mark("backward_allreduce")
            with named_range("optimizer"):
                self.clip_gradients()
                self.scaler.step(self.optimizer)
                self.scaler.update()
                self.optimizer.zero_grad(set_to_none=True)
                self.scheduler.step()
            timer.mark("optimizer")
        return x, y, logits, loss

    # -- around the step --

    def epoch_batches(self, epoch: int, start_step: int):
        prepared = self.next_epoch_batches.pop((epoch, start_step), None)
        return iter(prepared or self.train_data.epoch(epoch, start_step))

    def times_this_step(self) -> bool:
        """steps.csv samples every step_timing_every-th step, none inside the steady window or the
        profile window (its per-phase synchronisation would slow the steps measured or profiled)."""
        every = _every(self.state.position.global_step, self.config["step_timing_every"])
        return every and not self.steady.measuring and not self.window.active

    def count_step(self, meter: EpochMeter, y, logits, loss, timer: StepTimer) -> None:
        """After a step: the epoch's totals, the steady window, the sampled step's row, the next
        position, and a progress line every log_every_steps steps and at the epoch's end. Correct
        predictions: every step for an accuracy workload, else on log steps only (they sync anyway)."""
        position, history = self.state.position, self.state.history
        step = position.step + 1
        logs = _every(step, self.config["log_every_steps"]) or step == self.steps_per_epoch
        samples = meter.add(loss, logits, y, self.world_size, hits=logs or self.workload.metric == "accuracy")
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
        periodic = _every(position.global_step, self.config["checkpoint_every_steps"])
        return periodic and position.step < self.steps_per_epoch

    def save_mid_epoch(self, meter: EpochMeter) -> None:
        """A checkpoint with the epoch's totals so far (a collective, read: the device has caught up),
        paused out of both clocks."""
        totals = self.epoch_totals(meter.sums, meter.samples, meter.counted)
        totals.time_s = meter.time_s()
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

    def epoch_totals(self, sums: torch.Tensor, images: int, counted: int) -> EpochProgress:
        """Sums over all ranks (a collective, read on the host: the device has caught up by its
        return); `counted`: the samples the correct count is over. The caller sets time_s."""
        counts = torch.tensor([images, counted], dtype=torch.float64, device=self.device)
        totals = distributed.all_reduce_sum(torch.cat((sums.double(), counts)))
        loss_sum, correct, all_images, all_counted = totals.tolist()
        return EpochProgress(loss_sum, correct, int(all_images), 0.0, int(all_counted))

    def autocast(self):
        return torch.autocast(self.device.type, dtype=self.amp_dtype, enabled=self.use_autocast)

    def loss(self, logits: torch.Tensor, targets: torch.Tensor, reduction: str) -> torch.Tensor:
        """Cross-entropy over the last dimension, per sample (image, token), in fp32."""
        return F.cross_entropy(
            logits.flatten(0, -2).float(),
            targets.flatten(),
            label_smoothing=self.config["label_smoothing"] if reduction == "mean" else 0.0,
            reduction=reduction,
        )

    def clip_gradients(self) -> None:
        if self.config["grad_clip"]:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config["grad_clip"])

    def log_progress(self, meter: EpochMeter) -> None:
        images, counted, images_per_s = meter.samples, meter.counted, meter.log_rate()
        loss_sum, correct = meter.sums.tolist()  # the one device sync per log interval
        state, position = self.state, self.state.position
        done = position.global_step - state.attempt_first_step
        eta = (self.total_steps - position.global_step) * (time.perf_counter() - state.attempt_t0) / done
        log.info(
            "epoch %d/%d step %d/%d | loss %.4f acc %.3f | %.0f %s/s | lr %.4g | ETA %s",
            position.epoch + 1,
            self.config["epochs"],
            position.step,
            self.steps_per_epoch,
            loss_sum / images,
            correct / counted,
            images_per_s,
            self.workload.sample_unit,
            self.scheduler.get_last_lr()[0],
            format_seconds(eta),
        )
        rates = {"train_loss_running": loss_sum / images, "train_acc_running": correct / counted}
        self.live.step(
            position.global_step,
            rates | {"samples_per_s": images_per_s, "lr": self.scheduler.get_last_lr()[0]},
        )

    def end_epoch(self) -> None:
        c, epoch, history = self.config, self.state.position.epoch, self.state.history
        done = self.state.progress
        test_loss, test_acc = self.evaluate()
        wall = self.state.elapsed_s()
        row = {
            "epoch": epoch + 1,
            "train_loss": done.loss_sum / done.images,
            "train_acc": done.correct / done.counted,
            "test_loss": test_loss,
            "test_acc": test_acc,
            "epoch_time_s": done.time_s,
            "images_per_s": done.images / done.time_s,
            "images_per_s_per_gpu": done.images / done.time_s / self.world_size,
            "global_batch": c["global_batch"],
            "per_gpu_batch": c["per_gpu_batch"],
            "world_size": self.world_size,
            "lr": self.scheduler.get_last_lr()[0],
            "wall_time_s": wall,
        }
        history.metrics.append(row)
        self.live.epoch(epoch + 1, row)
        if history.time_to_target_s is None and test_acc >= c["target_accuracy"]:
            history.time_to_target_s = wall
        log.info(
            "epoch %d/%d done in %s: train loss %.4f acc %.3f | test loss %.4f acc %.3f | %.0f %s/s",
            epoch + 1,
            c["epochs"],
            format_seconds(done.time_s),
            row["train_loss"],
            row["train_acc"],
            test_loss,
            test_acc,
            row["images_per_s"],
            self.workload.sample_unit,
        )
        self.state.position = Position(epoch + 1, 0, self.state.position.global_step)
        self.state.progress = EpochProgress()
        self.checkpointer.save()

    def evaluate(self) -> tuple[float, float]:
        """Test loss and accuracy over all ranks' shards, of the model the checkpoint saves: every
        rank first takes rank 0's buffers (BatchNorm statistics are per rank while training), as a
        resume from that checkpoint would. The bare model (not DDP) runs it: the shards may differ
        in batch count, and DDP's forward would start collectives."""
        self.take_rank0_buffers()
        self.model.eval()
        sums = torch.zeros(2, dtype=torch.float64, device=self.device)  # loss, correct
        images = 0
        with torch.no_grad(), named_range("eval"):
            for x, y in self.test_data.epoch(0):
                with self.autocast():
                    logits = self.model(x)
                loss = self.loss(logits, y, reduction="sum")
                sums += torch.stack((loss.double(), (logits.argmax(-1) == y).sum().double()))
                images += y.numel()
        totals = self.epoch_totals(sums, images, images)
        self.model.train()
        return totals.loss_sum / totals.images, totals.correct / totals.images

    def take_rank0_buffers(self) -> None:
        if self.world_size > 1:
            for buffer in self.model.buffers():
                torch.distributed.broadcast(buffer, src=0)

    def stop_for_retry(self, stop: StopRequest) -> int:
        """The checkpoint is written (rank 0); every rank exits with EXIT_RESUMABLE."""
        distributed.barrier()  # rank 0 has finished writing before any rank exits
        received = signal.Signals(stop.signum).name if stop.signum else "another rank's signal"
        log.warning(
            "stopping on %s after global step %d, checkpointed; exit %d: retry to resume",
            received,
            self.state.position.global_step,
            EXIT_RESUMABLE,
        )
        return EXIT_RESUMABLE

    # -- results --

    def finish(self) -> None:
        self.window.close()
        reports = distributed.gather_object(self.monitor.stop() if self.monitor else None)
        memory = distributed.gather_object(self.memory_report())
        if not self.is_main:
            return
        import pandas as pd

        history = self.state.history
        monitor.write_outputs(self.out_dir, reports, self.config["monitor_interval_s"])
        atomic.write_csv(
            self.out_dir / runfiles.METRICS, pd.DataFrame(history.metrics, columns=METRICS_COLUMNS)
        )
        atomic.write_csv(self.out_dir / runfiles.STEPS, pd.DataFrame(history.steps, columns=STEPS_COLUMNS))
        summary = self.results().summary(memory, self.out_dir)
        summary["results"].update(startup.of_attempt(self.steady.first_step_s))
        atomic.write_json(self.out_dir / runfiles.SUMMARY, summary)
        log.info("wrote %s", self.out_dir)
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
            amp_dtype=self.amp_dtype,
            peak_lr=self.peak_lr,
        )

    def memory_report(self) -> dict[str, Any]:
        peak, source = parallel.peak_memory(self.device)
        return {
            "peak": peak,
            "source": source,
            "state": parallel.model_state_bytes(self.model, self.optimizer),
        }


def _every(count: int, interval: int | None) -> bool:
    return bool(interval) and count % interval == 0
