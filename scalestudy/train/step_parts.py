"""Where this rank's measured steps go: the raw measurements of the scaling-loss waterfall
(scalestudy.analysis.waterfall), taken inside the steady-state window (scalestudy.train.steady) only.

Per step of the window, on every rank:

- data wait: the host's seconds inside the loader's next() (two perf_counter reads, no device work);
- device span (GPUs only): CUDA events recorded on the current stream at the step's start (before
  the batch is fetched) and after its last kernel was queued (StepParts.step_ended, called by the
  window's step_done); their elapsed time is the device's time from starting the step's work to
  finishing it. The wall time per step minus this span is what the device spent outside any step,
  waiting for the host between steps (the analysis's host and launch overhead). Idle gaps *inside*
  a step's span (kernel launches slower than the kernels) are not seen by events around the step.
  On the CPU there is no device timeline: the span is None ("not measured"), never a zero;
- gradient wait: from this rank's last gradient to backward()'s return: the all-reduce left after
  the rank's own backward work plus the wait for slower ranks. The last gradient is the model's
  first parameter's (the input layer's, whose gradient autograd computes last), marked by a
  post-accumulate-grad hook: a host clock on the CPU (gloo's all-reduce blocks the host at the end of
  backward), a CUDA event on a GPU (the stream waits for NCCL's all-reduce there). Under FSDP2 the
  sharded parameters have no such hook: None. A rank's step time minus its gradient wait is its
  own step time; the slowest rank's own time over the median rank's is the straggler wait.

What it costs per measured step: a few perf_counter reads and, on a GPU, four event records (a few
microseconds of host time; no synchronisation). The events are read once per window sub-interval,
after the window's own device synchronisation at the interval's end, outside its clock; the events
are allocated when the window opens (outside its clock too) and reused. Nothing here changes what
is computed, so runs stay deterministic and a resume bit-exact.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

NOT_HOOKED = "no gradient hook (FSDP2's sharded parameters)"


class StepParts:
    """Host clocks: the data wait and, once `attach`ed, the gradient wait. The window calls
    `open(steps)` when it starts measuring (steps: the most steps of one sub-interval), `step_ended`
    after each measured step, `interval_closed` after synchronising at a sub-interval's end and
    `close` when the window is filled; the trainer calls `step_started`, `data_ready` and
    `backward_done` around each step (no-ops outside the window)."""

    device_timeline = False

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self.active = False
        self.hooked = False
        self.data_wait_s = 0.0
        self.device_s = 0.0
        self.gradient_wait_s = 0.0
        self._step_start = 0.0
        self._last_gradient: float | None = None

    def attach(self, parameter) -> None:
        """Mark this rank's last gradient of each step: `parameter`'s, after it is accumulated."""
        parameter.register_post_accumulate_grad_hook(lambda _parameter: self.last_gradient())
        self.hooked = True

    def open(self, steps: int) -> None:
        self.data_wait_s = self.device_s = self.gradient_wait_s = 0.0
        self.active = True

    def close(self) -> None:
        self.active = False

    def step_started(self) -> None:
        if self.active:
            self._step_start = self.clock()

    def data_ready(self) -> None:
        if self.active:
            self.data_wait_s += self.clock() - self._step_start

    def last_gradient(self) -> None:
        if self.active:
            self._last_gradient = self.clock()

    def backward_done(self) -> None:
        if self.active and self._last_gradient is not None:
            self.gradient_wait_s += self.clock() - self._last_gradient
            self._last_gradient = None

    def step_ended(self) -> None:
        """After the step's last kernel is queued (host clocks need nothing here)."""

    def interval_closed(self) -> None:
        """After the device was synchronised at a sub-interval's end (host clocks need nothing)."""

    def report(self, seconds: float, steps: int) -> dict[str, Any]:
        """This rank's window per step: wall time, data wait, device span, gradient wait (seconds)."""
        return {
            "step_s": seconds / steps,
            "data_wait_s": self.data_wait_s / steps,
            "device_busy_s": self.device_s / steps if self.device_timeline else None,
            "gradient_wait_s": self.gradient_wait_s / steps if self.hooked else None,
        }


class CudaStepParts(StepParts):
    """StepParts with CUDA events for the device span and the gradient wait: four events per step,
    from a pool sized for one sub-interval, read after the interval's synchronisation."""

    device_timeline = True

    def __init__(self, clock: Callable[[], float] = time.perf_counter, event_factory=None) -> None:
        super().__init__(clock)
        if event_factory is None:
            import torch

            def event_factory():
                return torch.cuda.Event(enable_timing=True)

        self.new_event = event_factory
        self.pool: list[tuple[Any, Any, Any, Any]] = []  # per step: start, end, last gradient, backward
        self.gradient_marked: list[bool] = []
        self.index = 0

    def open(self, steps: int) -> None:
        super().open(steps)
        while len(self.pool) < steps:
            self.pool.append(tuple(self.new_event() for _ in range(4)))
            self.gradient_marked.append(False)
        self.index = 0

    def step_started(self) -> None:
        if self.active:
            super().step_started()
            self.gradient_marked[self.index] = False
            self.pool[self.index][0].record()

    def last_gradient(self) -> None:
        if self.active:
            self.pool[self.index][2].record()
            self.gradient_marked[self.index] = True

    def backward_done(self) -> None:
        if self.active and self.gradient_marked[self.index]:
            self.pool[self.index][3].record()

    def step_ended(self) -> None:
        if self.active:
            self.pool[self.index][1].record()
            self.index += 1

    def interval_closed(self) -> None:
        for (start, end, gradient, backward), marked in zip(
            self.pool[: self.index], self.gradient_marked, strict=False
        ):
            self.device_s += start.elapsed_time(end) / 1e3  # milliseconds
            if marked:
                self.gradient_wait_s += gradient.elapsed_time(backward) / 1e3
        self.index = 0


def for_device(device) -> StepParts:
    """CUDA events on a GPU, host clocks elsewhere."""
    return CudaStepParts() if device.type == "cuda" else StepParts()


def per_rank(reports: list[dict[str, Any]]) -> dict[str, list | None]:
    """Every rank's report (rank order) as one list per quantity; a quantity some rank did not
    measure is None."""
    keys = reports[0].keys()
    columns = {key: [report[key] for report in reports] for key in keys}
    return {key: None if any(v is None for v in values) else values for key, values in columns.items()}
