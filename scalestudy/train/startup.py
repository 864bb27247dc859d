"""A training job's fixed cost: from its launch to the end of its first training step, with its parts.

scalestudy.launch.launcher puts the launch time (time.time(), once the job holds its GPUs: a wait
for a GPU is queueing, not start-up) in the environment (LAUNCH_TIME_ENV) before it execs srun,
torchrun, apptainer or the trainer; every rank inherits it. The trainer marks the
wall clock as it passes each stage of its start-up (`mark`), and rank 0 reports, in summary.json's
results (runs.csv's columns `startup_s`, `startup_parts_s.<part>`): `startup_s`, the seconds from
the launch (or, run without the launcher, from this process's start) to the end of the attempt's
first step, and the part each stage took:

- `launch_s`: the launch to this process's start (srun, torchrun, apptainer, an image); 0 where
  the launcher execs the trainer itself (one local rank: the same process);
- `imports_s`: the interpreter and the trainer's imports (torch), to the trainer's main();
- `config_s`: the run config, the device and backend chosen, the batch checked against the data;
- `settings_s`: the process settings (seeds, determinism: torch.use_deterministic_algorithms
  imports torch._inductor, seconds), the signal handlers, the MLflow run where tracking is on;
- `process_group_s`: the process group (none at world size 1 without FSDP2) and the ranks' facts;
- `data_s`: the data loaded and, for the tensor loader, copied to the device;
- `model_s`: the model built, wrapped (DDP) and compiled where asked;
- `setup_s`: optimizer, checkpointer, profiler window, and the wait (if any) for the GPU monitor,
  which opens NVML on its own thread from the process group on, while data and model load;
- `resume_s`: the checkpoint looked for (and loaded on a resume);
- `first_step_s`: the attempt's first step, to its device synchronisation (cudnn autotuning,
  compilation, allocator growth: the steady window's `first_step_s`).

A stage not passed (a mark missing) is left out; the parts add up to `startup_s`. Standard library
(and the launcher's, itself standard library only).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from typing import Any

from scalestudy.launch.launcher import LAUNCH_TIME_ENV

STAGES = ("imports", "config", "settings", "process_group", "data", "model", "setup", "resume", "first_step")

log = logging.getLogger("scalestudy.train")

_marks: dict[str, float] = {}


def mark(stage: str, at: float | None = None) -> None:
    """The wall clock as the trainer finishes `stage` (one of STAGES); a later attempt's marks
    replace an earlier one's."""
    if stage not in STAGES:
        raise ValueError(f"unknown start-up stage {stage!r}: one of {', '.join(STAGES)}")
    _marks[stage] = time.time() if at is None else at


def begin() -> None:
    """The trainer's main() starts: the interpreter and its imports are done; no earlier run's marks."""
    _marks.clear()
    mark("imports")


def launch_time(environ: Mapping[str, str] = os.environ) -> float | None:
    """The launcher's start (seconds since the epoch), or None if the trainer was not launched by it."""
    try:
        value = float(environ.get(LAUNCH_TIME_ENV, ""))
    except ValueError:
        return None
    return value if value > 0 else None


def process_start_time() -> float | None:
    """This process's start (seconds since the epoch) from /proc (Linux); None elsewhere."""
    try:
        with open("/proc/self/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        with open("/proc/stat") as handle:
            boot = next(float(line.split()[1]) for line in handle if line.startswith("btime"))
    except (OSError, IndexError, ValueError, StopIteration):
        return None
    return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: starttime, in clock ticks


def report(
    marks: Mapping[str, float] | None = None,
    launched: float | None = None,
    process_start: float | None = None,
) -> dict[str, Any]:
    """`startup_s` (the launch, else the process start, to the last mark) and `startup_parts_s`
    (each marked stage's seconds since the one before; `launch_s` the launch to the process start);
    `startup_from`: "launch", "process start" or None (no start known)."""
    marks = dict(_marks if marks is None else marks)
    process_start = process_start_time() if process_start is None else process_start
    parts: dict[str, float] = {}
    previous = process_start
    if launched is not None and process_start is not None:
        # the launcher execs a one-rank trainer (the same process, started before the launch)
        previous = max(process_start, launched)
        parts["launch_s"] = previous - launched
    for stage in STAGES:
        if stage in marks:
            if previous is not None:
                parts[f"{stage}_s"] = marks[stage] - previous
            previous = marks[stage]
    start, source = (launched, "launch") if launched is not None else (process_start, "process start")
    last = max(marks.values(), default=None)
    total = last - start if start is not None and last is not None else None
    return {
        "startup_s": total,
        "startup_from": source if total is not None else None,
        "startup_parts_s": parts,
    }


def log_report(startup: Mapping[str, Any]) -> None:
    if startup["startup_s"] is None:
        return
    parts = ", ".join(
        f"{name.removesuffix('_s')} {seconds:.2f}" for name, seconds in startup["startup_parts_s"].items()
    )
    log.info(
        "start-up: %.2f s from the %s to the first step's end (%s)",
        startup["startup_s"],
        startup["startup_from"],
        parts,
    )


def of_attempt(first_step_s: float | None) -> dict[str, Any]:
    """The report of this attempt (its first step ended first_step_s after the "resume" mark, where
    the attempt's clock starts), logged; from the launch where the launcher set LAUNCH_TIME_ENV."""
    if first_step_s is not None and "resume" in _marks:
        mark("first_step", _marks["resume"] + first_step_s)
    startup = report(launched=launch_time())
    log_report(startup)
    return startup
