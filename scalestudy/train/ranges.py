"""Named ranges around the phases of a step, and the profiling window of a profile run.

`named_range("forward")` shows up as a record_function range in torch.profiler traces and, on a
GPU, as an NVTX start/end range (nvtxRangeStart/End) in Nsight Systems and Nsight Compute. Not a
push/pop range: those are per thread, and autograd runs the CUDA backward (and DDP's/FSDP2's
collectives it issues) on its own device thread, whose stack holds no `step`: ncu's
`--nvtx-include step/` never saw a backward or communication kernel. A start/end range is the
process's, whichever thread launches the kernel (ncu filters on it with `--nvtx-include step`, no
trailing slash). `ProfileWindow` captures `steps` steps from `start_step`:

- tool "nsys": torch.cuda.profiler.start()/stop() (cudaProfilerStart/Stop); the nsys process that
  wraps each rank is started with `--capture-range=cudaProfilerApi` and records only that window.
- tool "torch": torch.profiler over the window (CPU, plus CUDA when available); rank 0 writes
  profile_ops.csv from key_averages() and profile_kernels.csv: each device kernel with the named
  range its launching op ran in (`kernels_table`; header only without device kernels). Nsight
  Compute takes its kernels from that table (scalestudy.profiling.kernel_choice).
- tool "none" or no profile: nothing.

Every tool writes profile_window.json (tool, start_step, steps, wall_s, world_size, rank) on rank 0.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from scalestudy import atomic
from scalestudy.plan import runfiles
from scalestudy.plan.runconfig import check_profile
from scalestudy.profiling.schema import NAMED_RANGES

log = logging.getLogger("scalestudy.ranges")


@contextlib.contextmanager
def named_range(name: str) -> Iterator[None]:
    """A record_function range and, with CUDA, a process-wide NVTX start/end range named `name`."""
    nvtx = _cuda_available()
    with torch.profiler.record_function(name):
        handle = torch.cuda.nvtx.range_start(name) if nvtx else None
        try:
            yield
        finally:
            if handle is not None:
                torch.cuda.nvtx.range_end(handle)


class ProfileWindow:
    """Call .step(global_step) before each training step; .close() once at the end of training."""

    def __init__(
        self, profile: dict[str, Any] | None, out_dir: str | Path, rank: int = 0, world_size: int = 1
    ) -> None:
        self.tool, self.start_step, self.steps = check_profile(profile)
        self.out_dir, self.rank, self.world_size = Path(out_dir), rank, world_size
        self._profiler: torch.profiler.profile | None = None
        self._started: float | None = None
        self.done = False

    @property
    def active(self) -> bool:
        return self._started is not None

    def step(self, global_step: int) -> None:
        if self.tool == "none" or self.done:
            return
        if not self.active and global_step == self.start_step:
            self._open()
        elif self.active and global_step >= self.start_step + self.steps:
            self.close()

    def close(self) -> None:
        if not self.active:
            return
        _synchronize()
        wall_s = time.perf_counter() - self._started
        if self.tool == "nsys" and _cuda_available():
            torch.cuda.profiler.stop()
        elif self._profiler is not None:
            self._profiler.__exit__(None, None, None)
        self._started, self.done = None, True
        if self.rank == 0:
            self._write(wall_s)
        log.info("profile window (%s) closed after %d steps, %.3f s", self.tool, self.steps, wall_s)

    def _open(self) -> None:
        _synchronize()
        if self.tool == "nsys":
            if _cuda_available():
                torch.cuda.profiler.start()
            else:
                log.warning("profile tool 'nsys' without CUDA: only the window timing is recorded")
        elif self.rank == 0:  # torch.profiler on rank 0 only: the others would only add overhead
            activities = [torch.profiler.ProfilerActivity.CPU]
            if _cuda_available():
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self._profiler = torch.profiler.profile(activities=activities)
            self._profiler.__enter__()
        self._started = time.perf_counter()
        log.info("profile window (%s) opened at step %d for %d steps", self.tool, self.start_step, self.steps)

    def _write(self, wall_s: float) -> None:
        window = {
            "tool": self.tool,
            "start_step": self.start_step,
            "steps": self.steps,
            "wall_s": wall_s,
            "world_size": self.world_size,
            "rank": self.rank,
        }
        atomic.write_json(self.out_dir / runfiles.PROFILE_WINDOW, window)
        if self._profiler is not None:
            atomic.write_csv(self.out_dir / runfiles.PROFILE_OPS, ops_table(self._profiler.key_averages()))
            atomic.write_csv(self.out_dir / runfiles.PROFILE_KERNELS, kernels_table(self._profiler.events()))


def ops_table(averages):
    """key_averages() as the profile_ops.csv table, busiest operator first."""
    import pandas as pd

    rows = [
        (
            e.key,
            e.count,
            e.self_cpu_time_total,
            e.cpu_time_total,
            e.self_device_time_total,
            e.device_time_total,
        )
        for e in sorted(averages, key=lambda e: e.self_cpu_time_total, reverse=True)
    ]
    return pd.DataFrame(rows, columns=runfiles.PROFILE_OPS_COLUMNS)


def kernels_table(events):
    """The device kernels of profiler events (their `kernels`: name, device, duration in us) summed
    by name and the innermost named range (NAMED_RANGES) around the op that launched them, busiest
    first. The loader's kernels are those of "data"; autograd launches the backward's from its own
    thread, outside every range of the main thread (""). Memory operations (Memcpy, Memset) come
    along as torch lists them; the reader picks the kernels it wants."""
    import pandas as pd

    totals: dict[tuple[str, str], list] = {}
    for event in events:
        for kernel in getattr(event, "kernels", None) or ():
            entry = totals.setdefault((kernel.name, launching_range(event)), [0, 0.0])
            entry[0] += 1
            entry[1] += float(kernel.duration)
    rows = [(name, where, count, device_us) for (name, where), (count, device_us) in totals.items()]
    rows.sort(key=lambda row: (-row[3], row[0], row[1]))
    return pd.DataFrame(rows, columns=runfiles.PROFILE_KERNEL_COLUMNS)


def launching_range(event) -> str:
    """The innermost named range among the event and its CPU parents, or "" outside all of them."""
    while event is not None:
        if event.name in NAMED_RANGES:
            return event.name
        event = event.cpu_parent
    return ""


@functools.cache
def _cuda_available() -> bool:
    return torch.cuda.is_available()


def _synchronize() -> None:
    if _cuda_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
