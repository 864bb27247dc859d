"""The state and clocks of a training run (scalestudy.train.trainer): where it is (Position), the current
epoch's totals (EpochProgress), what the results need from earlier epochs and attempts (History),
training time without pauses (TrainingClock), a sampled step's phases (StepTimer), and the stop
signals every rank agrees on (StopRequest)."""

from __future__ import annotations

import contextlib
import signal
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from scalestudy.launch import rendezvous as distributed

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


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
