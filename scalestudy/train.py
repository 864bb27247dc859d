"""The DDP trainer: `python -m scalestudy.train --run-config-json JSON | --run-config PATH --out-dir DIR`.

Reads top to bottom: run config -> ranks and devices -> data -> model -> optimizer and schedule ->
resume -> training loop (timing, logging, checkpoints, stop signals) -> results. Rank 0 writes the
run folder once, at the end (gpu_monitor.*, metrics.csv, steps.csv, then summary.json), every file
atomically; checkpoints go to the run config's checkpoint_dir.

Choices (see docs/architecture.md for the files):
- Strong or weak scaling is the grid's decision, made through per_gpu_batch and global_batch;
  here global_batch must equal per_gpu_batch x world_size.
- Learning rate lr x scale, scale = global_batch / base_batch ("linear"), its square root ("sqrt")
  or 1 ("none"); linear warm-up over warmup_epochs (step k of W runs at (k+1)/W of it), then cosine
  decay to zero at the last step, updated every step.
- SGD with momentum, nesterov and weight decay on all parameters, fused implementation.
- Precision fp32; bf16 = autocast to bfloat16; fp16 = autocast to float16 with a GradScaler.
  If autocast cannot run the dtype on the device, the run falls back to fp32 with a warning and
  records precision_effective.
- Epochs in metrics.csv and steps.csv count from 1; steps.csv's step is the global step (from 0)
  and its timings are rank 0's.
- Throughput, step time (and so MFU) come from a steady-state window (scalestudy.steady):
  measure_steps optimizer steps after measure_warmup_steps steps of the attempt, across epochs,
  with evaluation, checkpoints and profiler output paused out of it. steps.csv samples no step
  inside the window (its per-phase synchronisation would slow the steps measured).
- DDP: BatchNorm statistics are per rank by design (forward_sync_buffers / broadcast_buffers off);
  evaluation and checkpoints use rank 0's, which every rank takes before evaluating, so test
  metrics are those of the checkpointed model whether or not the run was resumed.
- SIGTERM/SIGUSR1: the current step is finished (with several ranks also the next one, while they
  agree), a checkpoint is written and every rank exits with EXIT_RESUMABLE (75): the workflow
  retries, the retry resumes.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ctypes.util
import logging
import math
import os
import platform
import random
import signal
import socket
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from scalestudy import atomic, checkpoint, distributed, loader, model, monitor, provenance, steady, torchopts
from scalestudy.data.preprocess import PackedDataError, load_packed
from scalestudy.progress import format_seconds, setup_logging
from scalestudy.ranges import ProfileWindow, named_range
from scalestudy.runconfig import RunConfigError, check_locations, load_run_config
from scalestudy.runfiles import METRICS_COLUMNS, STEPS_COLUMNS

EXIT_RESUMABLE = 75
EXIT_BAD_CONFIG = 2
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)

AUTOCAST_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
COMM_HOOKS = {"fp16": default_hooks.fp16_compress_hook, "bf16": default_hooks.bf16_compress_hook}

log = logging.getLogger("scalestudy.train")


# --- run config -------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m scalestudy.train", description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--run-config-json", help="the run config as a JSON object")
    source.add_argument("--run-config", type=Path, help="a JSON file holding the run config")
    parser.add_argument("--out-dir", type=Path, required=True, help="the run folder (rank 0 writes it)")
    parser.add_argument("--log-level", default="INFO")
    return parser.parse_args(argv)


def lr_scale(rule: str, global_batch: int, base_batch: int) -> float:
    ratio = global_batch / base_batch
    return {"linear": ratio, "sqrt": math.sqrt(ratio), "none": 1.0}[rule]


def lr_schedule(warmup_steps: int, total_steps: int):
    """Step -> factor of the peak learning rate: linear warm-up, then cosine to zero."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))

    return factor


# --- process-wide settings ---------------------------------------------------------------------------


@contextlib.contextmanager
def process_settings(config: dict[str, Any]):
    """Seeds, determinism and threads for this run; restored afterwards (tests run main in-process)."""
    saved = (
        torch.are_deterministic_algorithms_enabled(),
        torch.get_num_threads(),
        torch.backends.cudnn.benchmark,
    )
    if config["deterministic"]:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before cuBLAS starts
        torch.use_deterministic_algorithms(True)
        torch.set_num_threads(1)  # the same reduction order in every run
    torch.backends.cudnn.benchmark = not config["deterministic"]
    seed_everything(config["seed"])
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(saved[0])
        torch.set_num_threads(saved[1])
        torch.backends.cudnn.benchmark = saved[2]


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also every CUDA device


class StopRequest:
    """Remembers SIGTERM/SIGUSR1; the loop asks between steps, and all ranks agree on the answer."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}
        self._pending: tuple[Any, torch.Tensor] | None = None  # the all-reduce running during a step

    def __enter__(self) -> StopRequest:
        self._previous = {signum: signal.signal(signum, self._handle) for signum in STOP_SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _handle(self, signum: int, _frame) -> None:
        self.signum = signum

    def agreed(self, group) -> bool:
        """True on every rank, after the same step, once any rank has been signalled.

        With several ranks the flags are summed by a CPU all-reduce on the gloo `group` that runs
        in the background during the next step (a blocking one would put a cross-node round trip
        into every step, and no device is synchronised either way): a signal received during step
        k stops the ranks after step k + 1.
        """
        if not distributed.is_initialized():
            return self.signum is not None
        stop = False
        if self._pending is not None:
            work, flags = self._pending
            work.wait()
            stop = bool(flags.item())
        flags = torch.tensor([int(self.signum is not None)])
        self._pending = None if stop else (distributed.all_reduce_sum(flags, group, async_op=True), flags)
        return stop

    def drain(self) -> None:
        """Wait for the last agreement (every rank started it) before the process group goes."""
        if self._pending is not None:
            self._pending[0].wait()
            self._pending = None


class StepTimer:
    """Phase durations of a sampled step, synchronising the device at each mark; free otherwise."""

    def __init__(self, device: torch.device, enabled: bool) -> None:
        self.device, self.enabled = device, enabled
        self.times: dict[str, float] = {}
        if enabled:
            self._start = self._last = self._now()

    def mark(self, phase: str) -> None:
        if self.enabled:
            now = self._now()
            self.times[f"{phase}_s"] = now - self._last
            self._last = now

    def row(self, epoch: int, step: int) -> dict[str, Any]:
        return {"epoch": epoch, "step": step, **self.times, "step_s": self._last - self._start}

    def _now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()


class TrainingClock:
    """Seconds of training since creation, leaving out the time spent in `paused()` (checkpoint
    writing, profiler output), so that throughput measures training only. Read it, and start a
    pause, after the device has finished the queued steps (Trainer.synchronize, or a collective
    whose result is read), or they would count as paused."""

    def __init__(self) -> None:
        self._start, self._paused = time.perf_counter(), 0.0

    def seconds(self) -> float:
        return time.perf_counter() - self._start - self._paused

    @contextlib.contextmanager
    def paused(self):
        started = time.perf_counter()
        try:
            yield
        finally:
            self._paused += time.perf_counter() - started


@dataclass
class Position:
    """The next step to run: epoch (from 0), step within it, global step."""

    epoch: int = 0
    step: int = 0
    global_step: int = 0


@dataclass
class EpochProgress:
    """The current epoch's totals so far, over all ranks: saved with a mid-epoch checkpoint, so a
    resumed epoch reports the same train loss and accuracy as an uninterrupted one."""

    loss_sum: float = 0.0
    correct: float = 0.0
    images: int = 0
    time_s: float = 0.0


@dataclass
class History:
    """What the results need from earlier epochs and attempts; saved in every checkpoint."""

    metrics: list[dict[str, Any]] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)
    elapsed_s: float = 0.0  # training wall time of earlier attempts
    time_to_target_s: float | None = None
    resumes: list[int] = field(default_factory=list)
    steady_window: dict[str, Any] | None = None  # the last filled measurement window (any attempt)


# --- the run ------------------------------------------------------------------------------------------


class Trainer:
    def __init__(
        self, config: dict[str, Any], given: dict[str, Any], out_dir: Path, dist_env, device, backend
    ):
        self.config, self.given, self.out_dir = config, given, out_dir
        self.dist_env, self.device, self.backend = dist_env, device, backend
        self.rank, self.world_size = dist_env.rank, dist_env.world_size
        self.is_main = dist_env.is_main
        self.config_hash = provenance.config_hash(config)
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
        c = self.config
        common = {"batch_size": c["per_gpu_batch"], "rank": self.rank, "world_size": self.world_size}
        common |= {"seed": c["seed"], "device": self.device, "channels_last": c["channels_last"]}
        if c["loader"] == "tensor":
            images, labels = load_packed(c["data_dir"], "train")
            self.train_data = loader.TensorLoader(
                images, labels, train=True, max_steps=c["max_steps_per_epoch"], **common
            )
        else:
            self.train_data = loader.ClassicLoader(
                c["data_dir"], num_workers=c["num_workers"], max_steps=c["max_steps_per_epoch"], **common
            )
        images, labels = load_packed(c["data_dir"], "test")
        self.test_data = loader.TensorLoader(
            images, labels, train=False, max_steps=c["eval_max_batches"], **common
        )
        self.steps_per_epoch = self.train_data.steps_per_epoch
        self.total_steps = c["epochs"] * self.steps_per_epoch

    def build_model(self) -> None:
        c = self.config
        if c["norm"] == "sync" and self.device.type != "cuda":
            raise RunConfigError(
                f"norm='sync' (SyncBatchNorm) needs CUDA devices, this rank runs on {self.device}"
            )
        self.model = model.build_model(c["width"], norm=c["norm"], channels_last=c["channels_last"])
        self.model.to(self.device)
        self.parameters = model.count_parameters(self.model)
        self.forward_flops_per_image = model.count_flops(self.model, 1)
        self.train_model = self.model
        self.ddp_options = None
        if self.world_size > 1:
            self.ddp_options = torchopts.ddp_options(c["compile"])
            self.train_model = DistributedDataParallel(
                self.model,
                device_ids=[self.device.index] if self.device.type == "cuda" else None,
                bucket_cap_mb=c["bucket_cap_mb"],
                **self.ddp_options,
            )
            if c["comm_hook"] != "none":
                self.train_model.register_comm_hook(None, COMM_HOOKS[c["comm_hook"]])
        elif c["comm_hook"] != "none":
            log.warning("comm_hook=%r has no effect with one rank (no DDP)", c["comm_hook"])
        if c["compile"]:
            torchopts.use_inductor_cache(c["inductor_cache_dir"])
            # compiling the DDP module lets DDPOptimizer split the graph at bucket boundaries
            self.train_model = torch.compile(self.train_model)
        log.info(
            "model: ResNet-18 CIFAR, width %d, %s parameters, %.3f GFLOP forward per image",
            c["width"],
            f"{self.parameters:,}",
            self.forward_flops_per_image / 1e9,
        )

    def build_optimizer(self) -> None:
        c = self.config
        self.peak_lr = c["lr"] * lr_scale(c["lr_scaling"], c["global_batch"], c["base_batch"])
        self.optimizer = torch.optim.SGD(
            self.model.parameters(),
            lr=self.peak_lr,
            momentum=c["momentum"],
            nesterov=c["nesterov"],
            weight_decay=c["weight_decay"],
            fused=True,
        )
        warmup_steps = round(c["warmup_epochs"] * self.steps_per_epoch)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_schedule(warmup_steps, self.total_steps)
        )

    # -- resume and checkpoints --

    def resume(self) -> None:
        """Rank 0 claims the checkpoint of this run's interrupted attempt, if there is one (any
        other is removed: scalestudy.checkpoint.claim), and hands it to every rank."""
        found, error = None, None
        if self.is_main:
            c = self.config
            try:
                found = checkpoint.claim(c["checkpoint_dir"], self.config_hash, c["epochs"], c)
            except OSError as failure:  # every rank must hear of it, or the others wait in the broadcast
                error = f"checkpoint_dir {c['checkpoint_dir']}: {failure}"
        found, error = distributed.broadcast_object((found, error))
        if error:
            raise RunConfigError(error)
        if found is None:
            log.info("no checkpoint in %s: starting from scratch", self.config["checkpoint_dir"])
            return
        state, path = found
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        checkpoint.set_rng_state(state["rng"][self.rank])
        self.position = Position(**state["position"])
        self.carry = EpochProgress(**state["epoch_progress"])
        self.history = History(**state["history"])
        self.resumed_from_step = self.position.global_step
        self.history.resumes.append(self.position.global_step)
        log.info(
            "resumed from %s: epoch %d, step %d of it, global step %d",
            path,
            self.position.epoch + 1,
            self.position.step,
            self.position.global_step,
        )

    def save_checkpoint(self, progress: EpochProgress) -> None:
        rng_states = distributed.all_gather_object(checkpoint.rng_state())
        if not self.is_main:
            return
        state = {
            "config_hash": self.config_hash,
            "run_config": self.config,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "position": asdict(self.position),
            "sampler": {
                "loader": self.config["loader"],
                "seed": self.config["seed"],
                "epoch": self.position.epoch,
                "start_step": self.position.step,
                "world_size": self.world_size,
            },
            "rng": rng_states,
            "epoch_progress": asdict(progress),
            "history": asdict(self.history) | {"elapsed_s": self.elapsed_s()},
        }
        path = checkpoint.save(self.config["checkpoint_dir"], state, self.position.global_step)
        log.info("checkpoint %s", path)

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
                    loss = F.cross_entropy(logits, y, label_smoothing=c["label_smoothing"])
                timer.mark("forward")
                with named_range("backward"):
                    self.scaler.scale(loss).backward()
                timer.mark("backward_allreduce")
                with named_range("optimizer"):
                    self.scaler.step(self.optimizer)
                    self.scaler.update()
                    self.optimizer.zero_grad(set_to_none=True)
                    self.scheduler.step()
                timer.mark("optimizer")
            if step + 1 == self.steps_per_epoch and epoch + 1 < c["epochs"]:
                # The next epoch's plan (permutation, augmentation draws, one copy to the device),
                # made while the device still runs this step rather than after the epoch end's sync.
                self.next_epoch_batches = {(epoch + 1, 0): self.train_data.epoch(epoch + 1, 0)}
            sums += torch.stack((loss.detach().double() * len(y), (logits.argmax(1) == y).sum().double()))
            images += len(y)
            self.steady.step_done(len(y) * self.world_size)
            if self.steady.filled and not self.steady_kept:  # the next checkpoints keep it
                self.history.steady_window, self.steady_kept = self.steady_result(), True
            log_images += len(y) * self.world_size
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
        return torch.autocast(self.device.type, dtype=self.amp_dtype, enabled=self.amp_dtype is not None)

    def log_progress(self, sums: torch.Tensor, images: int, images_per_s: float) -> None:
        loss_sum, correct = sums.tolist()  # the one device sync per log interval
        done = self.position.global_step - self.attempt_first_step
        eta = (self.total_steps - self.position.global_step) * (time.perf_counter() - self.attempt_t0) / done
        log.info(
            "epoch %d/%d step %d/%d | loss %.4f acc %.3f | %.0f img/s | lr %.4g | ETA %s",
            self.position.epoch + 1,
            self.config["epochs"],
            self.position.step,
            self.steps_per_epoch,
            loss_sum / images,
            correct / images,
            images_per_s,
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
            "epoch %d/%d done in %s: train loss %.4f acc %.3f | test loss %.4f acc %.3f | %.0f img/s",
            epoch + 1,
            c["epochs"],
            format_seconds(done.time_s),
            row["train_loss"],
            row["train_acc"],
            test_loss,
            test_acc,
            row["images_per_s"],
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
                loss = F.cross_entropy(logits.float(), y, reduction="sum")
                sums += torch.stack((loss.double(), (logits.argmax(1) == y).sum().double()))
                images += len(y)
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
        checkpoint.finished(self.config["checkpoint_dir"], self.config_hash, self.config["keep_checkpoints"])

    def results(self) -> dict[str, Any]:
        c, metrics = self.config, self.history.metrics
        later = metrics[1:] or metrics
        test_accs = [row["test_acc"] for row in metrics]
        return {
            "epochs": len(metrics),
            "steps": self.position.global_step,
            "steps_per_epoch": self.steps_per_epoch,
            "world_size": self.world_size,
            "global_batch": c["global_batch"],
            "per_gpu_batch": c["per_gpu_batch"],
            **self.steady_results(),
            **self.whole_run_rates(),
            "epoch_time_s": statistics.median(row["epoch_time_s"] for row in later) if later else None,
            "compile_s": torchopts.compile_seconds() if c["compile"] else None,
            "inductor_cache_dir": os.environ.get("TORCHINDUCTOR_CACHE_DIR") if c["compile"] else None,
            "ddp_options": self.ddp_options,
            "final_test_acc": test_accs[-1] if test_accs else None,
            "best_test_acc": max(test_accs) if test_accs else None,
            "final_train_loss": metrics[-1]["train_loss"] if metrics else None,
            "time_to_target_s": self.history.time_to_target_s,
            "target_accuracy": c["target_accuracy"],
            "total_time_s": self.elapsed_s(),
            "resumed_from_step": self.resumed_from_step,
            "resumes": self.history.resumes,
            "device": self.device.type,
            "device_name": self.ranks[0]["device_name"],
            "backend": self.backend,  # chosen for the device even with one rank (no process group)
            "precision_effective": next(k for k, v in AUTOCAST_DTYPES.items() if v == self.amp_dtype),
            "parameters": self.parameters,
            "forward_flops_per_image": self.forward_flops_per_image,
            "train_flops_per_image": 3 * self.forward_flops_per_image,
            "peak_lr": self.peak_lr,
        }

    def steady_result(self) -> dict[str, Any]:
        """This attempt's measurement window (attempt 0 is the first, each resume adds one)."""
        return {**self.steady.result(self.world_size), "measure_attempt": len(self.history.resumes)}

    def steady_results(self) -> dict[str, Any]:
        """The window the run reports: this attempt's if it filled one, else the last filled window
        of an earlier attempt (kept in the checkpoints), else this attempt's unfilled one.

        A window from an earlier attempt has no measure_start_s / measure_end_s / measure_segments_s:
        they would be on that attempt's clock, and gpu_monitor.csv covers only this (the last)
        attempt, so its GPU monitor summary is "not measured".
        """
        current = self.steady_result()
        earlier = self.history.steady_window
        if current["window_filled"]:
            return current
        if earlier is not None:
            log.info("window not filled in this attempt: reporting attempt %d's", earlier["measure_attempt"])
            return {**earlier, "measure_start_s": None, "measure_end_s": None, "measure_segments_s": None}
        log.warning(
            "measurement window not filled: %d of %d steps measured after %d warm-up steps (%d steps in "
            "this attempt); images_per_s is left empty, whole_run_* hold whole-run rates",
            current["measured_steps"],
            current["measure_steps"],
            current["warmup_steps"],
            self.steady.seen,
        )
        return current

    def whole_run_rates(self) -> dict[str, Any]:
        """Images over the training time of every epoch, the first one's one-off costs included."""
        metrics = self.history.metrics
        seconds = sum(row["epoch_time_s"] for row in metrics)
        images = sum(row["images_per_s"] * row["epoch_time_s"] for row in metrics)
        if not seconds > 0:
            return dict.fromkeys(WHOLE_RUN_KEYS)
        steps = len(metrics) * self.steps_per_epoch
        return dict(
            zip(
                WHOLE_RUN_KEYS,
                (images / seconds, images / seconds / self.world_size, seconds / steps),
                strict=True,
            )
        )

    def provenance(self) -> dict[str, Any]:
        extra = {
            "world_size": self.world_size,
            "hosts": sorted({r["host"] for r in self.ranks}),
            "ranks": [{k: v for k, v in r.items() if k != "time"} for r in self.ranks],
            "device_names": sorted({r["device_name"] for r in self.ranks}),
            "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
            "slurm_nodelist": os.environ.get("SLURM_JOB_NODELIST"),
            "launcher": self.dist_env.launcher,
            "ddp_options": self.ddp_options,
        }
        return provenance.collect(config=self.given, seed=self.config["seed"], extra=extra)


WHOLE_RUN_KEYS = ("whole_run_images_per_s", "whole_run_images_per_s_per_gpu", "whole_run_step_time_s")


def _every(count: int, interval: int | None) -> bool:
    return bool(interval) and count % interval == 0


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype for `precision`, or None (fp32) with a warning if the device cannot run it."""
    dtype = AUTOCAST_DTYPES[precision]
    if dtype is None:
        return None
    try:
        with torch.autocast(device.type, dtype=dtype):
            probe = torch.ones(1, 1, 4, 4, device=device)
            F.conv2d(probe, torch.ones(1, 1, 3, 3, device=device)).sum()
    except (RuntimeError, AssertionError) as error:
        log.warning(
            "precision=%s: autocast cannot run %s on %s (%s); training in fp32",
            precision,
            dtype,
            device,
            error,
        )
        return None
    return dtype


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


# --- entry point --------------------------------------------------------------------------------------


def main(argv: list[str] | None = None, *, exit_process: bool = False) -> int:
    """The trainer's command line; `exit_process` (python -m) ends the process here (see exit_now)."""
    args = parse_args(argv)
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


def exit_now(code: int) -> None:
    """Flush and end the process without freeing the trainer or the interpreter's teardown.

    Every output is written (atomically) and the process group is gone by now. After a
    torch.profiler window in a multi-rank run, glibc sometimes aborts in a native thread that
    exits when the trainer's objects are freed ("tcache_thread_shutdown(): unaligned tcache chunk
    detected": 3 of 32 two-rank CPU profile runs of the demo before this, 0 of 30 after), which
    would turn a finished run into a failed job.
    """
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


# glibc's mallopt parameters (<malloc.h>) and the largest mmap threshold it accepts on 64-bit.
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD_MAX = 32 << 20


def keep_freed_host_memory() -> None:
    """Let glibc keep freed activation buffers for the next step instead of unmapping them.

    Blocks above the mmap threshold (most activations of a batch) get a fresh mmap each and are
    unmapped on free, so every CPU step faults its activation pages in again: measured 971 -> 1,077
    img/s (+11 %) for the demo model on 2 cores. Process-wide, so only the command line calls it.
    """
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):
        return  # not glibc: nothing to tune
    mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX)
    mallopt(M_TRIM_THRESHOLD, 32 * MMAP_THRESHOLD_MAX)


if __name__ == "__main__":
    keep_freed_host_memory()
    exit_now(main(exit_process=True))
