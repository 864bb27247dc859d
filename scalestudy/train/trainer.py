"""The trainer: `python -m scalestudy.train --run-config-json JSON | --run-config PATH --out-dir DIR`.

Reads top to bottom: run config -> ranks and devices -> data and model (the workload's:
scalestudy.workloads) -> data parallelism (DDP or FSDP2: scalestudy.train.parallel) -> optimizer and
schedule (scalestudy.train.optim) -> resume -> training loop (timing, logging, checkpoints, stop signals)
-> results. Rank 0 writes the run folder once, at the end (gpu_monitor.*, metrics.csv, steps.csv,
then summary.json), every file atomically; checkpoints go to the run config's checkpoint_dir
(scalestudy.train.checkpoint.single_file, or scalestudy.train.checkpoint.dcp for workloads that reshard).

The Trainer is split along those lines: this module holds setup and the training loop; its
resume and checkpoint methods are scalestudy.train.checkpoint.manager's, its results
scalestudy.train.results',
its state and clocks scalestudy.train.state's, the process settings scalestudy.train.process's.

Every workload's step is the same: the model maps a batch to logits over classes in its last
dimension (ResNet: [B, 10] per image; LM: [B, T, vocab] per token), the loss is their cross-entropy
with the targets, and a sample is one target (an image, a token): throughput, accuracy and the
loss are per sample, in the workload's unit (`sample_unit`; the result keys keep their historical
names images_per_s, ... for every unit).

Choices (see docs/architecture.md for the files):
- Strong or weak scaling is the grid's decision, made through per_gpu_batch and global_batch;
  here global_batch must equal per_gpu_batch x world_size.
- Learning rate and optimizer: scalestudy.train.optim (linear/sqrt scaling, warm-up, cosine; SGD for the
  ResNet, AdamW for the LM); grad_clip clips the global gradient norm.
- Precision fp32; bf16 = autocast to bfloat16; fp16 = autocast to float16 with a GradScaler; under
  FSDP2 its mixed-precision policy instead of autocast (scalestudy.train.parallel). If autocast cannot
  run the dtype on the device, the run falls back to fp32 with a warning and records
  precision_effective.
- Epochs in metrics.csv and steps.csv count from 1; steps.csv's step is the global step (from 0)
  and its timings are rank 0's.
- Throughput, step time (and so MFU) come from a steady-state window (scalestudy.train.steady):
  measure_steps optimizer steps after measure_warmup_steps steps of the attempt, across epochs,
  with evaluation, checkpoints and profiler output paused out of it. steps.csv samples no step
  inside the window (its per-phase synchronisation would slow the steps measured).
- DDP: BatchNorm statistics are per rank by design (forward_sync_buffers / broadcast_buffers off);
  evaluation and checkpoints use rank 0's, which every rank takes before evaluating, so test
  metrics are those of the checkpointed model whether or not the run was resumed.
- Peak memory per rank (CUDA's max allocated, or the CPU's peak RSS) and the bytes of model state
  a rank holds (parameters, gradients, optimizer state: FSDP2 shards them) go into the results.
- SIGTERM/SIGUSR1: the current step is finished (with several ranks also the next one, while they
  agree), a checkpoint is written and every rank exits with EXIT_RESUMABLE (75): the workflow
  retries, the retry resumes.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import socket
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from scalestudy import atomic, provenance, workloads
from scalestudy.data.preprocess import PackedDataError
from scalestudy.launch import rendezvous as distributed
from scalestudy.plan import runconfig
from scalestudy.plan.runconfig import RunConfigError, check_locations, load_run_config
from scalestudy.plan.runfiles import METRICS_COLUMNS, STEPS_COLUMNS
from scalestudy.progress import format_seconds, setup_logging
from scalestudy.train import gpu_monitor as monitor
from scalestudy.train import optim, parallel, steady
from scalestudy.train import torch_options as torchopts
from scalestudy.train.checkpoint import dcp as sharded_checkpoint
from scalestudy.train.checkpoint import single_file as checkpoint
from scalestudy.train.checkpoint.manager import RunCheckpoints
from scalestudy.train.optim import lr_scale, lr_schedule  # noqa: F401 - the trainer's documented names
from scalestudy.train.parallel import COMM_HOOKS  # noqa: F401
from scalestudy.train.process import (
    autocast_dtype,
    device_name,
    exit_now,
    keep_freed_host_memory,
    process_settings,
)
from scalestudy.train.ranges import ProfileWindow, named_range
from scalestudy.train.results import RunResults
from scalestudy.train.state import EpochProgress, History, Position, StepTimer, StopRequest, TrainingClock

EXIT_RESUMABLE = 75
EXIT_BAD_CONFIG = 2


log = logging.getLogger("scalestudy.train")


# --- run config -------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m scalestudy.train", description=__doc__.splitlines()[0])
    runconfig.add_arguments(parser)
    return parser.parse_args(argv)


# --- the run ------------------------------------------------------------------------------------------


class Trainer(RunCheckpoints, RunResults):
    def __init__(
        self, config: dict[str, Any], given: dict[str, Any], out_dir: Path, dist_env, device, backend
    ):
        self.config, self.given, self.out_dir = config, given, out_dir
        self.dist_env, self.device, self.backend = dist_env, device, backend
        self.rank, self.world_size = dist_env.rank, dist_env.world_size
        self.is_main = dist_env.is_main
        self.config_hash = provenance.config_hash(config)
        self.workload = workloads.get(config["workload"])
        self.control_group = None
        self.history = History()
        self.position = Position()
        self.carry = EpochProgress()
        self.resumed_from_step: int | None = None
        self.next_epoch_batches: dict[tuple[int, int], Any] = {}  # (epoch, step) -> its batches, made early

    # -- setup, in the order it happens --

    def setup(self) -> None:
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
        hosts = {r["host"] for r in self.ranks}
        if len(hosts) != c["nodes"]:
            log.warning(
                "run config nodes=%d but the ranks run on %d hosts: %s", c["nodes"], len(hosts), sorted(hosts)
            )
        self.build_data()
        self.build_model()
        self.build_optimizer()
        self.amp_dtype = autocast_dtype(c["precision"], self.device)
        self.use_autocast = self.wrapped.autocast and self.amp_dtype is not None
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.amp_dtype == torch.float16)
        self.window = ProfileWindow(c["profile"], self.out_dir, self.rank, self.world_size)
        # every rank samples its own GPU (by UUID); rank 0 writes the gathered reports in finish()
        self.monitor = monitor.for_device(self.device, c["monitor_interval_s"], self.t0, self.rank).start()

    def _rank_info(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "local_rank": self.dist_env.local_rank,
            "host": socket.gethostname(),
            "device": str(self.device),
            "device_name": device_name(self.device),
            "time": time.time(),
        }

    def build_data(self) -> None:
        runtime = workloads.runtime(self.workload.name)
        self.train_data, self.test_data = runtime.build_data(
            self.config, self.rank, self.world_size, self.device
        )
        self.steps_per_epoch = self.train_data.steps_per_epoch
        self.total_steps = self.config["epochs"] * self.steps_per_epoch

    def build_model(self) -> None:
        c = self.config
        built = workloads.runtime(self.workload.name).build_model(c, self.device)
        self.model, self.built = built.model, built
        self.wrapped = parallel.wrap(self.model, c, self.device, self.world_size, built.shard_units)
        self.train_model = self.wrapped.module
        if c["compile"]:
            torchopts.use_inductor_cache(c["inductor_cache_dir"])
            # compiling the DDP module lets DDPOptimizer split the graph at bucket boundaries
            self.train_model = torch.compile(self.train_model)
        log.info("model: %s; %s", built.description, c["parallelism"] if self.world_size > 1 else "one rank")

    def build_optimizer(self) -> None:
        c = self.config
        self.peak_lr = c["lr"] * optim.lr_scale(c["lr_scaling"], c["global_batch"], c["base_batch"])
        self.optimizer = optim.build_optimizer(self.model, c, self.peak_lr, sharded=self.wrapped.sharded)
        warmup_steps = round(c["warmup_epochs"] * self.steps_per_epoch)
        self.scheduler = optim.build_scheduler(self.optimizer, warmup_steps, self.total_steps)

    # -- training --

    def fit(self, stop: StopRequest) -> int:
        c = self.config
        self.attempt_t0 = time.perf_counter()
        self.attempt_first_step = self.position.global_step
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
        )
        self.steady.start(self.position.global_step)
        self.steady_kept = False
        while self.position.epoch < c["epochs"]:
            if not self.train_epoch(stop):
                return self.stop_for_retry(stop)
            with self.steady.paused():
                self.end_epoch()
            if self.position.epoch < c["epochs"] and stop.agreed(self.control_group):
                return self.stop_for_retry(stop)
        stop.drain()
        return 0

    def train_epoch(self, stop: StopRequest) -> bool:
        """Runs the rest of the current epoch; False if stopped by a signal (after a checkpoint)."""
        c, epoch = self.config, self.position.epoch
        self.train_model.train()
        carry = self.carry if self.is_main else EpochProgress(time_s=self.carry.time_s)
        # float64: the carried totals of a resumed epoch keep their bits; read at log steps only
        sums = torch.tensor([carry.loss_sum, carry.correct], dtype=torch.float64, device=self.device)
        images = carry.images
        clock = TrainingClock()
        log_mark, log_images = 0.0, 0
        prepared = self.next_epoch_batches.pop((epoch, self.position.step), None)
        batches = iter(prepared or self.train_data.epoch(epoch, self.position.step))
        for step in range(self.position.step, self.steps_per_epoch):
            self.profile_step(clock)
            sampled = _every(self.position.global_step, c["step_timing_every"]) and not self.steady.measuring
            timer = StepTimer(self.device, sampled)
            with named_range("step"):
                with named_range("data"):
                    x, y = next(batches)
                timer.mark("data")
                with named_range("forward"), self.autocast():
                    logits = self.train_model(x)
                    loss = self.loss(logits, y, reduction="mean")
                timer.mark("forward")
                with named_range("backward"):
                    self.scaler.scale(loss).backward()
                timer.mark("backward_allreduce")
                with named_range("optimizer"):
                    self.clip_gradients()
                    self.scaler.step(self.optimizer)
                    self.scaler.update()
                    self.optimizer.zero_grad(set_to_none=True)
                    self.scheduler.step()
                timer.mark("optimizer")
            if step + 1 == self.steps_per_epoch and epoch + 1 < c["epochs"]:
                # The next epoch's plan (permutation, augmentation draws, one copy to the device),
                # made while the device still runs this step rather than after the epoch end's sync.
                self.next_epoch_batches = {(epoch + 1, 0): self.train_data.epoch(epoch + 1, 0)}
            samples = y.numel()
            sums += torch.stack((loss.detach().double() * samples, (logits.argmax(-1) == y).sum().double()))
            images += samples
            self.steady.step_done(samples * self.world_size)
            if self.steady.filled and not self.steady_kept:  # the next checkpoints keep it
                self.history.steady_window, self.steady_kept = self.steady_result(), True
            log_images += samples * self.world_size
            if timer.enabled and self.is_main:
                self.history.steps.append(timer.row(epoch + 1, self.position.global_step))
            self.position = Position(epoch, step + 1, self.position.global_step + 1)
            if _every(step + 1, c["log_every_steps"]) or step + 1 == self.steps_per_epoch:
                now = clock.seconds()
                self.log_progress(sums, images, log_images / (now - log_mark))
                log_mark, log_images = now, 0
            stopping = stop.agreed(self.control_group)
            periodic = _every(self.position.global_step, c["checkpoint_every_steps"])
            if stopping or (periodic and step + 1 < self.steps_per_epoch):  # the epoch end saves anyway
                totals = self.epoch_totals(sums, images)  # reads a collective: the device has caught up
                totals.time_s = carry.time_s + clock.seconds()
                with clock.paused(), self.steady.paused():
                    self.save_checkpoint(totals)
            if stopping:
                return False
        self.carry = self.epoch_totals(sums, images)
        self.carry.time_s = carry.time_s + clock.seconds()
        return True

    def profile_step(self, clock: TrainingClock) -> None:
        """Open or close the profiler window (ProfileWindow.step) before a step; the steps where it
        opens or closes (synchronising, writing its output) are paused out of both clocks."""
        profile, step = self.window, self.position.global_step
        if profile.tool == "none" or profile.done:
            return
        if step == profile.start_step or (profile.active and step >= profile.start_step + profile.steps):
            self.synchronize()  # the queued steps count as training, not as the profiler's
            with clock.paused(), self.steady.paused():
                profile.step(step)

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def epoch_totals(self, sums: torch.Tensor, images: int, time_s: float = 0.0) -> EpochProgress:
        """Sums over all ranks (a collective, read on the host: the device has caught up by its
        return); the time is rank 0's."""
        totals = torch.cat((sums.double(), torch.tensor([images], dtype=torch.float64, device=self.device)))
        loss_sum, correct, all_images = distributed.all_reduce_sum(totals).tolist()
        return EpochProgress(loss_sum, correct, int(all_images), time_s)

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

    def log_progress(self, sums: torch.Tensor, images: int, images_per_s: float) -> None:
        loss_sum, correct = sums.tolist()  # the one device sync per log interval
        done = self.position.global_step - self.attempt_first_step
        eta = (self.total_steps - self.position.global_step) * (time.perf_counter() - self.attempt_t0) / done
        log.info(
            "epoch %d/%d step %d/%d | loss %.4f acc %.3f | %.0f %s/s | lr %.4g | ETA %s",
            self.position.epoch + 1,
            self.config["epochs"],
            self.position.step,
            self.steps_per_epoch,
            loss_sum / images,
            correct / images,
            images_per_s,
            self.workload.sample_unit,
            self.scheduler.get_last_lr()[0],
            format_seconds(eta),
        )

    def end_epoch(self) -> None:
        c, epoch = self.config, self.position.epoch
        done = self.carry
        test_loss, test_acc = self.evaluate()
        wall = self.elapsed_s()
        row = {
            "epoch": epoch + 1,
            "train_loss": done.loss_sum / done.images,
            "train_acc": done.correct / done.images,
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
        self.history.metrics.append(row)
        if self.history.time_to_target_s is None and test_acc >= c["target_accuracy"]:
            self.history.time_to_target_s = wall
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
        self.position = Position(epoch + 1, 0, self.position.global_step)
        self.carry = EpochProgress()
        self.save_checkpoint(self.carry)

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
        totals = self.epoch_totals(sums, images, 0.0)
        self.model.train()
        return totals.loss_sum / totals.images, totals.correct / totals.images

    def take_rank0_buffers(self) -> None:
        if self.world_size > 1:
            for buffer in self.model.buffers():
                torch.distributed.broadcast(buffer, src=0)

    def elapsed_s(self) -> float:
        return self.history.elapsed_s + time.perf_counter() - self.attempt_t0

    def stop_for_retry(self, stop: StopRequest) -> int:
        """The checkpoint is written (rank 0); every rank exits with EXIT_RESUMABLE."""
        distributed.barrier()  # rank 0 has finished writing before any rank exits
        received = signal.Signals(stop.signum).name if stop.signum else "another rank's signal"
        log.warning(
            "stopping on %s after global step %d, checkpointed; exit %d: retry to resume",
            received,
            self.position.global_step,
            EXIT_RESUMABLE,
        )
        return EXIT_RESUMABLE

    # -- results --

    def finish(self) -> None:
        self.window.close()
        reports = distributed.gather_object(self.monitor.stop() if self.monitor else None)
        self.memory = distributed.gather_object(self.memory_report())
        if not self.is_main:
            return
        import pandas as pd

        monitor.write_outputs(self.out_dir, reports, self.config["monitor_interval_s"])
        atomic.write_csv(
            self.out_dir / "metrics.csv", pd.DataFrame(self.history.metrics, columns=METRICS_COLUMNS)
        )
        atomic.write_csv(self.out_dir / "steps.csv", pd.DataFrame(self.history.steps, columns=STEPS_COLUMNS))
        summary = {"run": self.given, "results": self.results(), "provenance": self.provenance()}
        atomic.write_json(self.out_dir / "summary.json", summary)
        log.info("wrote %s", self.out_dir)
        if self.workload.reshardable:
            sharded_checkpoint.finished(self.config["checkpoint_dir"], self.config["keep_checkpoints"])
        else:
            checkpoint.finished(
                self.config["checkpoint_dir"], self.config_hash, self.config["keep_checkpoints"]
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


# --- entry point --------------------------------------------------------------------------------------


def main(argv: list[str] | None = None, *, exit_process: bool = False) -> int:
    """The trainer's command line; `exit_process` (python -m) ends the process here (see exit_now).
    A run config of the command workload goes to its runner (scalestudy.workloads.command.runner): every
    rule, the profiler and the smoke test start any workload the same way."""
    args = parse_args(argv)
    if _given_workload(args) == "command":
        from scalestudy.workloads.command import runner as command

        return command.main(argv)
    setup_logging(getattr(logging, args.log_level.upper(), logging.INFO))
    try:
        given, config = load_run_config(args)
        dist_env = distributed.from_environ()
        distributed.die_with_launcher()  # a torchrun rank ends with its agent, even a SIGKILLed one
        if dist_env.world_size != config["world_size"]:
            raise RunConfigError(
                f"run config world_size={config['world_size']} but the {dist_env.launcher} environment "
                f"has {dist_env.world_size} ranks"
            )
        device = distributed.select_device(config["device"], dist_env.local_rank)
        backend = distributed.select_backend(config["backend"], device)
        check_locations(config, args.out_dir)
    except (RunConfigError, ValueError) as error:
        log.error("%s", error)
        return EXIT_BAD_CONFIG
    if not dist_env.is_main:
        logging.getLogger("scalestudy").setLevel(logging.WARNING)
    trainer = Trainer(config, given, args.out_dir, dist_env, device, backend)
    code = run(trainer, config)
    if exit_process:
        exit_now(code)  # while `trainer` (model, DDP reducer, profiler) is still alive
    return code


def _given_workload(args: argparse.Namespace) -> str | None:
    """The run config's workload, or None where it cannot be read (load_run_config says why)."""
    with contextlib.suppress(RunConfigError):
        given, _ = load_run_config(args, validated=False)
        return given.get("workload")
    return None


def run(trainer: Trainer, config: dict[str, Any]) -> int:
    with process_settings(config), StopRequest() as stop:
        try:
            trainer.setup()
            trainer.resume()
            code = trainer.fit(stop)
            if code == 0:
                trainer.finish()
            elif trainer.monitor:
                trainer.monitor.stop()
            return code
        except (RunConfigError, PackedDataError) as error:
            log.error("%s", error)
            return EXIT_BAD_CONFIG
        finally:
            distributed.destroy_process_group()


def run_as_program() -> None:
    """`python -m scalestudy.train`: the trainer's process from start to exit."""
    keep_freed_host_memory()
    exit_now(main(exit_process=True))


if __name__ == "__main__":
    run_as_program()
