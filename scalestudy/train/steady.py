"""The steady-state measurement window of one training attempt (throughput, step time, MFU).

A window is `steps` optimizer steps after `warmup_steps` steps of the attempt, counted across epoch
boundaries. The warm-up absorbs the one-off costs of a fresh process (torch.compile, cudnn
autotuning, allocator growth, first touches of the data). Time spent in `paused()` (evaluation,
checkpoint writing, profiler output) is left out of the window. The window is split into
`intervals` sub-intervals of (nearly) equal step counts; their rates give the spread.

The device is synchronised only at the window's edges, at sub-interval edges and at the edges of a
pause that falls inside the window (an epoch end or a checkpoint: rare), never per step; plus once
after the attempt's first step (outside the window), to time it.

A window can be asked to last at least `min_seconds` (train.measure.seconds), still counted in whole
steps. The window plans its steps when it opens, from the warm-up's rate: the device is synchronised
once more in the middle of the warm-up (outside the window), and the steps from there to the
window's start (less any pause among them: an epoch end) give the rate; the ranks agree on those
seconds (`agree`: the mean over ranks, the same number on every rank, so every rank plans alike at
the same step), and the window gets max(`steps`, the steps `min_seconds` take at that rate, plus
5 %). A window that still closes shorter than `min_seconds` (its steps ran faster than the warm-up's)
is extended in place (`measure_extensions` counts it): the ranks agree on its seconds again, and the
missing steps at its own rate, plus 5 %, are added as further sub-intervals no larger than the
first ones; nothing measured is discarded, so a run whose steps hold warm-up plus the planned steps
fills its window. The training itself is untouched (the same batches, the same order), so runs stay
deterministic and a resume bit-exact.

A window belongs to one attempt (one process): a resumed attempt starts a fresh warm-up, because its
compile, autotuning and caches start cold again; a window that an interruption cut short is
discarded (see RunResults.steady_results for which window a resumed run reports).

Where the measured steps go on each rank (data wait, device span, gradient wait: `parts`,
scalestudy.train.step_parts) is measured inside the window only; when the window is filled the
trainer gathers every rank's (`gather_parts`, one collective on the CPU control group) and the
result reports them as `step_parts` (one list per quantity, rank order), the scaling-loss
waterfall's raw measurements (scalestudy.analysis.waterfall).

Times: `measure_start_s` / `measure_end_s` are seconds since `t0` on the wall clock (time.time()),
the time base of gpu_monitor.csv's time_s; durations use the monotonic perf_counter. The window's
unpaused stretches are `measure_segments_s` ([start, end] pairs on the same clock): the GPU monitor's
summary keeps only the samples inside them, so evaluation and checkpoint writing at the epoch ends
inside a window (many at large N, where an epoch is a few steps) do not dilute SM activity or power.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from scalestudy.plan.windowtime import steps_for_seconds
from scalestudy.train.step_parts import StepParts, per_rank

WARMUP, MEASURING, DONE = "warmup", "measuring", "done"


def interval_sizes(steps: int, intervals: int) -> list[int]:
    """`steps` split into `intervals` counts that differ by at most one, larger ones first."""
    intervals = max(1, min(intervals, steps))
    base, extra = divmod(steps, intervals)
    return [base + (1 if i < extra else 0) for i in range(intervals)]


@dataclass
class Interval:
    steps: int = 0
    images: int = 0
    seconds: float = 0.0

    @property
    def images_per_s(self) -> float:
        return self.images / self.seconds if self.seconds > 0 else math.nan


@dataclass
class SteadyWindow:
    """Call start(global_step) before the attempt's first step, step_done(images) after every
    optimizer step (images: over all ranks), and wrap non-training work in paused()."""

    warmup_steps: int
    steps: int
    intervals: int
    synchronize: Callable[[], None] = lambda: None
    clock: Callable[[], float] = time.perf_counter
    wall: Callable[[], float] = time.time
    t0: float = 0.0
    min_seconds: float | None = None  # the window lasts at least this long (None: `steps` alone)
    agree: Callable[[float], float] = lambda seconds: seconds  # the same value on every rank
    parts: StepParts = field(default_factory=StepParts)  # where the measured steps go, on this rank
    step_parts: dict[str, Any] | None = None  # every rank's parts, once gathered (gather_parts)
    extensions: int = 0  # times the window was extended to last min_seconds
    phase: str = WARMUP
    seen: int = 0  # steps of this attempt so far
    start_step: int | None = None  # the global step the window starts at
    first_step_s: float | None = None
    start_s: float | None = None
    end_s: float | None = None
    done: list[Interval] = field(default_factory=list)
    segments: list[list[float]] = field(default_factory=list)  # unpaused [start, end], since t0
    _sizes: list[int] = field(default_factory=list)
    _current: Interval = field(default_factory=Interval)
    _segment_start: float | None = None  # perf_counter of the running (unpaused) segment
    _segment_wall: float | None = None  # its start on the wall clock, since t0
    _attempt_start: float = 0.0
    _rate_from: tuple[int, float] | None = None  # (steps seen, clock) in the warm-up, to plan from
    _warm_paused: float = 0.0  # pauses since _rate_from (left out of the warm-up's rate)

    def __post_init__(self) -> None:
        if self.warmup_steps < 0 or self.steps < 1 or self.intervals < 1:
            raise ValueError(
                f"measure window needs warmup_steps >= 0, steps >= 1, intervals >= 1, got "
                f"{self.warmup_steps}, {self.steps}, {self.intervals}"
            )
        if self.min_seconds is not None and not self.min_seconds > 0:
            raise ValueError(f"measure window seconds must be positive, got {self.min_seconds}")
        self._sizes = interval_sizes(self.steps, self.intervals)

    @property
    def measuring(self) -> bool:
        return self.phase == MEASURING

    @property
    def filled(self) -> bool:
        return self.phase == DONE

    @property
    def measured_steps(self) -> int:
        return sum(i.steps for i in self.done) + self._current.steps

    def start(self, global_step: int) -> None:
        self.synchronize()
        self._attempt_start = self.clock()
        self.start_step = global_step + self.warmup_steps
        if self.warmup_steps == 0:
            self._open()

    def step_done(self, images: int) -> None:
        self.seen += 1
        if self.phase == WARMUP:
            if self.seen == 1:
                self.synchronize()
                self.first_step_s = self.clock() - self._attempt_start
            if self._plans_from_warmup() and self.seen == max(1, self.warmup_steps // 2):
                if self.seen > 1:
                    self.synchronize()
                self._rate_from = (self.seen, self.clock())
            if self.seen >= self.warmup_steps:
                self._open()
        elif self.phase == MEASURING:
            self.parts.step_ended()
            self._current.steps += 1
            self._current.images += images
            if self._current.steps == self._sizes[len(self.done)]:
                self._close_interval()

    @contextlib.contextmanager
    def paused(self):
        """Leave the enclosed work out of the window (a no-op outside it and the timed warm-up)."""
        if self.phase == WARMUP and self._rate_from is not None:
            self.synchronize()
            begin = self.clock()
            try:
                yield
            finally:
                self.synchronize()
                self._warm_paused += self.clock() - begin
            return
        if not self.measuring:
            yield
            return
        self._end_segment()
        self._end_wall_segment()
        try:
            yield
        finally:
            self.synchronize()
            self._segment_start = self.clock()
            self._segment_wall = self.wall() - self.t0

    def _plans_from_warmup(self) -> bool:
        return self.min_seconds is not None and self.warmup_steps >= 2

    def _plan_from_warmup(self) -> None:
        """Size the window to last min_seconds at the agreed rate of the warm-up's timed steps."""
        if self._rate_from is None:
            return
        seen, since = self._rate_from
        seconds = self.agree(self.clock() - since - self._warm_paused)
        steps = steps_for_seconds(self.min_seconds, max(seconds, 1e-9) / (self.seen - seen), self.steps)
        self.steps, self._sizes = steps, interval_sizes(steps, self.intervals)

    def _open(self) -> None:
        self.synchronize()
        self._plan_from_warmup()
        self.parts.open(max(self._sizes))
        self.start_s = self._segment_wall = self.wall() - self.t0
        self._segment_start = self.clock()
        self.phase = MEASURING

    def _end_segment(self) -> None:
        self.synchronize()
        self._current.seconds += self.clock() - self._segment_start
        self._segment_start = None

    def _end_wall_segment(self) -> None:
        self.segments.append([self._segment_wall, self.wall() - self.t0])
        self._segment_wall = None

    def _close_interval(self) -> None:
        self._end_segment()
        self.parts.interval_closed()  # after the synchronisation, outside the clock
        self.done.append(self._current)
        self._current = Interval()
        if len(self.done) == len(self._sizes) and not self._extend():
            self._end_wall_segment()
            self.end_s = self.segments[-1][1]
            self.phase = DONE
            self.parts.close()
        else:
            self._segment_start = self.clock()

    def _extend(self) -> bool:
        """Add the steps that make the closed window last min_seconds at its own rate (agreed across
        ranks) as further sub-intervals, no larger than the first; False if it lasted long enough."""
        if self.min_seconds is None:
            return False
        seconds = self.agree(sum(i.seconds for i in self.done))
        if seconds >= self.min_seconds:
            return False
        measured = self.measured_steps
        extra = steps_for_seconds(self.min_seconds, max(seconds, 1e-9) / measured, measured + 1) - measured
        largest = max(self._sizes)
        self._sizes += interval_sizes(extra, math.ceil(extra / largest))
        self.steps += extra
        self.extensions += 1
        return True

    def gather_parts(self, gather: Callable[[dict[str, Any]], list[dict[str, Any]]]) -> None:
        """Every rank's parts of the filled window: `gather` is an all-gather of one object per rank
        (every rank calls this at the same step, the one that filled the window)."""
        measured_s = sum(i.seconds for i in self.done)
        self.step_parts = per_rank(gather(self.parts.report(measured_s, self.measured_steps)))

    def result(self, world_size: int) -> dict[str, Any]:
        """The window's summary.json keys; rates are None unless the window was filled."""
        measured_s = sum(i.seconds for i in self.done) + self._current.seconds
        out: dict[str, Any] = {
            "warmup_steps": self.warmup_steps,
            "measure_steps": self.steps,
            "measure_seconds": self.min_seconds,
            "measure_extensions": self.extensions,
            "measured_steps": self.measured_steps,
            "measured_s": measured_s,
            "window_filled": self.filled,
            "measure_start_step": self.start_step,
            "measure_start_s": self.start_s,
            "measure_end_s": self.end_s,
            "measure_segments_s": [list(segment) for segment in self.segments],
            "first_step_s": self.first_step_s,
            "images_per_s": None,
            "images_per_s_per_gpu": None,
            "step_time_s": None,
            "images_per_s_min": None,
            "images_per_s_max": None,
            "images_per_s_cv": None,
            "interval_images_per_s": [i.images_per_s for i in self.done],
            "step_parts": self.step_parts if self.filled else None,
        }
        if not self.filled:
            return out
        rates = [i.images_per_s for i in self.done]
        images = sum(i.images for i in self.done)
        out.update(
            images_per_s=images / measured_s,
            images_per_s_per_gpu=images / measured_s / world_size,
            step_time_s=measured_s / self.measured_steps,
            images_per_s_min=min(rates),
            images_per_s_max=max(rates),
            images_per_s_cv=statistics.stdev(rates) / statistics.fmean(rates) if len(rates) > 1 else None,
        )
        return out


def mean_over_ranks(value: float, group) -> float:
    """`agree` of a trainer's window: the mean of `value` over the ranks of its gloo control `group`
    (a blocking CPU all-reduce at the window's end), the same number on every rank; `value` itself
    with one rank (no group)."""
    if group is None:
        return value
    import torch

    from scalestudy.launch import distributed

    total = torch.tensor([value], dtype=torch.float64)
    distributed.all_reduce_sum(total, group)
    return total.item() / torch.distributed.get_world_size(group)


def window_of_steps(
    seconds: Sequence[float],
    samples: Sequence[float],
    warmup_steps: int,
    steps: int,
    intervals: int,
    world_size: int,
    start_step: int = 0,
    end_times: Sequence[float] | None = None,
    t0: float = 0.0,
    min_seconds: float | None = None,
) -> dict[str, Any]:
    """The window of steps reported after the fact (the command workload: each step's duration and
    global samples, in order), with the same keys as SteadyWindow.result: replayed through a
    SteadyWindow whose clock advances by each step's duration. `end_times` (wall clock at each
    step's end) place the window on the run's clock (measure_start_s/end_s/segments_s, seconds
    since `t0`); without them those keys are None."""
    clock, wall = [0.0], [math.nan]
    if end_times:
        wall[0] = end_times[0] - seconds[0]
    window = SteadyWindow(
        warmup_steps,
        steps,
        intervals,
        clock=lambda: clock[0],
        wall=lambda: wall[0],
        t0=t0,
        min_seconds=min_seconds,
    )
    window.start(start_step)
    for index, (duration, count) in enumerate(zip(seconds, samples, strict=True)):
        clock[0] += duration
        if end_times:
            wall[0] = end_times[index]
        window.step_done(count)
    result = window.result(world_size)
    if not end_times:
        result.update(measure_start_s=None, measure_end_s=None, measure_segments_s=None)
    return result
