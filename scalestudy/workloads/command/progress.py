"""A command workload's progress files (scalestudy.workloads.command.contract) -> the trainer's results,
metrics.csv
and steps.csv rows. Standard library only.

A progress file spans the attempts of one run: the runner writes `{"event": "attempt", ...}` before
it starts the script and `{"event": "exit", ...}` after it ends; the script's lines come between.
A step reported again after a resume counts once (its last occurrence wins); an epoch likewise.
The steady-state window belongs to one attempt (a resumed script warms up again), as the
trainer's does (scalestudy.train.steady, Trainer.steady_results): the run reports the last attempt's
window if it filled, else the last filled one of an earlier attempt, else the last unfilled one.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scalestudy.train import steady

STEP_KEYS = {"step": (int, 0), "samples": ((int, float), 0), "seconds": ((int, float), None)}
WHOLE_RUN_KEYS = ("whole_run_images_per_s", "whole_run_images_per_s_per_gpu", "whole_run_step_time_s")
EPOCH_METRICS = ("train_loss", "train_acc", "test_loss", "test_acc", "lr", "wall_time_s")


class ProgressError(ValueError):
    """A progress file the results cannot be made from; the message names the file and line."""


@dataclass
class Attempt:
    started: float | None = None  # time.time() when the runner started the script
    seconds: float | None = None  # the script's wall time, from the runner's exit line
    steps: list[dict[str, Any]] = field(default_factory=list)  # in the order reported


@dataclass
class Progress:
    path: Path
    attempts: list[Attempt] = field(default_factory=list)
    steps: dict[int, dict[str, Any]] = field(default_factory=dict)  # last occurrence wins
    epochs: dict[int, dict[str, Any]] = field(default_factory=dict)
    memory: list[dict[str, Any]] = field(default_factory=list)
    model: dict[str, Any] = field(default_factory=dict)  # the last "model" line: parameters, FLOPs

    @property
    def current(self) -> Attempt:
        if not self.attempts:
            self.attempts.append(Attempt())
        return self.attempts[-1]


def read_progress(path: str | Path) -> Progress:
    """Parse one rank's progress file; ProgressError names file:line and the bad value."""
    progress = Progress(Path(path))
    try:
        text = progress.path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ProgressError(f"progress file {path}: cannot be read: {error}") from None
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
            _take(progress, _parse_line(line, f"{path}:{number}"), f"{path}:{number}")
    return progress


def _parse_line(line: str, where: str) -> dict[str, Any]:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        raise ProgressError(f"{where}: not a JSON object ({error}): {line[:120]!r}") from None
    if not isinstance(record, dict) or not isinstance(record.get("event"), str):
        raise ProgressError(f'{where}: a progress line must be a JSON object with an "event": {line[:120]!r}')
    return record


def _take(progress: Progress, record: dict[str, Any], where: str) -> None:
    event = record["event"]
    if event == "attempt":
        progress.attempts.append(Attempt(started=record.get("time")))
    elif event == "exit":
        progress.current.seconds = record.get("seconds")
    elif event == "step":
        for key, (kinds, minimum) in STEP_KEYS.items():
            _check_number(record, key, kinds, minimum, where)
        step = {**record, "attempt": len(progress.attempts) - 1}
        progress.current.steps.append(step)
        progress.steps.pop(record["step"], None)  # re-inserted: dict order is the order of last reports
        progress.steps[record["step"]] = step
    elif event == "epoch":
        _check_number(record, "epoch", int, 1, where)
        if "end_step" in record:
            _check_number(record, "end_step", int, 0, where)
        progress.epochs[record["epoch"]] = record
    elif event == "memory":
        _check_number(record, "peak_bytes", int, 0, where)
        progress.memory.append(record)
    elif event == "model":
        _check_number(record, "parameters", int, 1, where)
        if record.get("train_flops_per_sample") is not None:
            _check_number(record, "train_flops_per_sample", (int, float), None, where)
        progress.model = record
    # other events: left for later versions of the contract


def _check_number(record: dict, key: str, kinds, minimum: float | None, where: str) -> None:
    value = record.get(key)
    good = isinstance(value, kinds) and not isinstance(value, bool) and math.isfinite(value)
    if not good or (value < minimum if minimum is not None else value <= 0):
        bound = f">= {minimum}" if minimum is not None else "> 0"
        kind = "an integer" if kinds is int else "a number"
        raise ProgressError(f'{where}: "{record["event"]}" needs {key} {kind} {bound}, got {value!r}')


def peak_memory(progress: Progress) -> tuple[int | None, str | None]:
    """(the largest peak the script reported, its source), or (None, None)."""
    if not progress.memory:
        return None, None
    largest = max(progress.memory, key=lambda record: record["peak_bytes"])
    return largest["peak_bytes"], str(largest.get("source") or "script")


# --- results -------------------------------------------------------------------------------------


def step_results(progress: Progress, config: dict[str, Any], t0: float | None) -> dict[str, Any]:
    """The trainer's step-derived results keys from rank 0's progress. `t0`: the wall-clock origin of
    this attempt's gpu_monitor.csv."""
    if not progress.steps:
        raise ProgressError(
            f'{progress.path}: no "step" line: the script reported no optimizer step '
            "(scalestudy.workloads.command.contract.Reporter.step)"
        )
    world_size = config["world_size"]
    results = {
        "epochs": len(progress.epochs) or config["epochs"],
        "steps": len(progress.steps),
        "steps_per_epoch": _steps_per_epoch(progress),
        "world_size": world_size,
        "global_batch": config["global_batch"],
        "per_gpu_batch": config["per_gpu_batch"],
        **window(progress, config, t0),
        **whole_run(progress, world_size),
        "epoch_time_s": _epoch_time(progress, config["epochs"]),
        "total_time_s": total_time(progress),
        **_resumes(progress),
    }
    rows = epoch_rows(progress, config)
    accuracies, train_losses, test_losses = (
        [row[key] for row in rows if _is_number(row[key])] for key in ("test_acc", "train_loss", "test_loss")
    )
    results |= {
        "final_test_acc": accuracies[-1] if accuracies else None,
        "best_test_acc": max(accuracies) if accuracies else None,
        "final_train_loss": train_losses[-1] if train_losses else None,
        "final_test_loss": test_losses[-1] if test_losses else None,
    }
    return results


def window(progress: Progress, config: dict[str, Any], t0: float | None) -> dict[str, Any]:
    """The steady-state window of each attempt (its steps as reported); the run's choice of them."""
    found = []
    for index, attempt in enumerate(progress.attempts):
        if not attempt.steps:
            continue
        times = [step.get("time") for step in attempt.steps]
        placed = t0 is not None and index == len(progress.attempts) - 1 and all(map(_is_number, times))
        result = steady.window_of_steps(
            [step["seconds"] for step in attempt.steps],
            [step["samples"] for step in attempt.steps],
            config["measure_warmup_steps"],
            config["measure_steps"],
            config["measure_intervals"],
            config["world_size"],
            start_step=attempt.steps[0]["step"],
            end_times=times if placed else None,
            t0=t0 or 0.0,
        )
        found.append({**result, "measure_attempt": index})
    filled = [result for result in found if result["window_filled"]]
    return filled[-1] if filled else found[-1]


def whole_run(progress: Progress, world_size: int) -> dict[str, Any]:
    """Samples over the summed step times of every step (the first steps' one-off costs included)."""
    steps = progress.steps.values()
    seconds = sum(step["seconds"] for step in steps)
    samples = sum(step["samples"] for step in steps)
    rates = (samples / seconds, samples / seconds / world_size, seconds / len(steps))
    return dict(zip(WHOLE_RUN_KEYS, rates, strict=True))


def total_time(progress: Progress) -> float:
    """The script's wall time over all attempts (an attempt cut short: its steps' time)."""
    return sum(
        attempt.seconds if _is_number(attempt.seconds) else sum(step["seconds"] for step in attempt.steps)
        for attempt in progress.attempts
    )


def _resumes(progress: Progress) -> dict[str, Any]:
    starts = [attempt.steps[0]["step"] for attempt in progress.attempts if attempt.steps]
    resumes = starts[1:]
    return {"resumed_from_step": resumes[-1] if resumes else None, "resumes": resumes}


def _epochs(progress: Progress) -> list[tuple[dict[str, Any], list[dict[str, Any]] | None]]:
    """(epoch record, its steps) per reported epoch, in epoch order: the steps from the previous
    epoch's end_step up to its own (None without an end_step)."""
    epochs, previous_end = [], 0
    for number in sorted(progress.epochs):
        record = progress.epochs[number]
        end = record.get("end_step")
        steps = None if end is None else [s for n, s in progress.steps.items() if previous_end <= n < end]
        epochs.append((record, steps))
        previous_end = previous_end if end is None else end
    return epochs


def _seconds(steps: list[dict[str, Any]] | None) -> float | None:
    return sum(step["seconds"] for step in steps) or None if steps else None


def epoch_rows(progress: Progress, config: dict[str, Any]) -> list[dict[str, Any]]:
    """metrics.csv's rows: what the script reported; the time and rate from the epoch's steps."""
    rows = []
    for record, steps in _epochs(progress):
        seconds = _seconds(steps)
        rate = sum(step["samples"] for step in steps) / seconds if seconds else None
        row = {key: record.get(key) for key in EPOCH_METRICS}
        row |= {
            "epoch": record["epoch"],
            "epoch_time_s": seconds,
            "images_per_s": rate,
            "images_per_s_per_gpu": rate / config["world_size"] if rate else None,
            "global_batch": config["global_batch"],
            "per_gpu_batch": config["per_gpu_batch"],
            "world_size": config["world_size"],
        }
        rows.append(row)
    return rows


def step_rows(progress: Progress) -> list[dict[str, Any]]:
    """steps.csv's rows: every step's wall time (step_s); the phases are the script's own affair."""
    epoch_of = {step["step"]: record["epoch"] for record, steps in _epochs(progress) for step in steps or ()}
    return [
        {"epoch": epoch_of.get(number), "step": number, "step_s": step["seconds"]}
        for number, step in sorted(progress.steps.items())
    ]


def _epoch_time(progress: Progress, epochs: int) -> float:
    """The median epoch time after the first epoch (or the only one); without epoch lines the
    steps' time over the run config's epochs."""
    times = [seconds for _, steps in _epochs(progress) if (seconds := _seconds(steps)) is not None]
    if not times:
        return sum(step["seconds"] for step in progress.steps.values()) / epochs
    return statistics.median(times[1:] or times)


def _steps_per_epoch(progress: Progress) -> int | None:
    counts = [len(steps) for _, steps in _epochs(progress) if steps]
    return counts[0] if counts else None


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
