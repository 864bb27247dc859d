"""The state and clocks of a training run (scalestudy.train.trainer): the run state that goes into
its checkpoints (RunState: where it is, Position; the current epoch's totals so far, EpochProgress;
what the results need from earlier epochs and attempts, History), the running epoch's totals on
this rank (EpochMeter), training time without pauses (TrainingClock), a sampled step's phases
(StepTimer), and the stop signals every rank agrees on (StopRequest)."""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from scalestudy.contract import STOP_SIGNALS
from scalestudy.launch import distributed


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
            key = f"{phase}_s"  # a phase marked again (gradient accumulation's chunks) adds up
            self.times[key] = self.times.get(key, 0.0) + now - self._last
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
    resumed epoch reports the same train loss and accuracy as an uninterrupted one. `correct` is
    counted over `counted` samples: every step's for an accuracy workload, the log steps' for the
    others (the LM's argmax over B x T x vocab stays out of the steps between them)."""

    loss_sum: float = 0.0
    correct: float = 0.0
    images: int = 0
    time_s: float = 0.0
    counted: int = 0  # the samples `correct` was counted on


@dataclass
class History:
    """What the results need from earlier epochs and attempts; saved in every checkpoint."""

    metrics: list[dict[str, Any]] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)
    elapsed_s: float = 0.0  # training wall time of earlier attempts
    time_to_target_s: float | None = None
    resumes: list[int] = field(default_factory=list)
    steady_window: dict[str, Any] | None = None  # the last filled measurement window (any attempt)


@dataclass
class RunState:
    """What a checkpoint holds of the run besides model, optimizer and schedule (state_dict /
    load_state_dict), and the clock of the current attempt (elapsed_s: training wall time of every
    attempt so far)."""

    position: Position = field(default_factory=Position)
    progress: EpochProgress = field(default_factory=EpochProgress)  # the epoch's totals at the last save
    history: History = field(default_factory=History)
    resumed_from_step: int | None = None
    attempt_t0: float = field(default_factory=time.perf_counter)
    attempt_first_step: int = 0

    @property
    def attempt(self) -> int:
        """This attempt's number: 0 is the first, each resume adds one."""
        return len(self.history.resumes)

    def start_attempt(self) -> None:
        self.attempt_t0 = time.perf_counter()
        self.attempt_first_step = self.position.global_step

    def elapsed_s(self) -> float:
        return self.history.elapsed_s + time.perf_counter() - self.attempt_t0

    def state_dict(self) -> dict[str, Any]:
        return {
            "position": asdict(self.position),
            "epoch_progress": asdict(self.progress),
            "history": asdict(self.history) | {"elapsed_s": self.elapsed_s()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.position = Position(**state["position"])
        progress = state["epoch_progress"]
        # a checkpoint from before `counted` counted every step's samples
        self.progress = EpochProgress(**{"counted": progress["images"], **progress})
        self.history = History(**state["history"])

    def mark_resumed(self) -> None:
        self.resumed_from_step = self.position.global_step
        self.history.resumes.append(self.position.global_step)


class EpochMeter:
    """The running epoch's totals on this rank, from the carried totals of a resumed epoch (rank 0
    holds them, the others add only their own): loss sum and correct count on the device (float64:
    the carried totals keep their bits; read at log steps only), samples (all, and those the correct
    count counted), and the epoch's clock."""

    def __init__(self, carried: EpochProgress, device: torch.device, is_main: bool) -> None:
        start = carried if is_main else EpochProgress(time_s=carried.time_s)
        self.carried_s = carried.time_s
        self.sums = torch.tensor([start.loss_sum, start.correct], dtype=torch.float64, device=device)
        self.samples, self.counted = start.images, start.counted
        self.clock = TrainingClock()
        self._log_mark, self._log_samples = 0.0, 0

    def add(
        self,
        loss: torch.Tensor,
        predicted: Callable[[], torch.Tensor],
        targets: torch.Tensor,
        world_size: int,
        hits: bool,
    ) -> int:
        """One step's loss (a mean) and, with `hits`, its correct predictions (`predicted()`: the
        predicted classes, the logits' argmax); returns the step's samples on this rank."""
        samples = targets.numel()
        if hits:
            correct = (predicted() == targets).sum().double()
            self.sums += torch.stack((loss.detach().double() * samples, correct))
            self.counted += samples
        else:
            self.sums[0] += loss.detach().double() * samples
        self.samples += samples
        self._log_samples += samples * world_size
        return samples

    def time_s(self) -> float:
        """The epoch's training seconds, earlier attempts' part of it included."""
        return self.carried_s + self.clock.seconds()

    def log_rate(self) -> float:
        """Samples per second over all ranks since the previous call (or the epoch's start)."""
        now = self.clock.seconds()
        rate = self._log_samples / (now - self._log_mark)
        self._log_mark, self._log_samples = now, 0
        return rate
