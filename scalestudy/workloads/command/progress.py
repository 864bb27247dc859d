"""A command workload's progress files (scalestudy.contract) -> the trainer's results,
metrics.csv and steps.csv rows. Standard library only.

A progress file spans the attempts of one run: the runner writes `{"event": "attempt", ...}` before
it starts the script and `{"event": "exit", ...}` after it ends; the script's lines come between.
A step reported again after a resume counts once (its last occurrence wins); an epoch likewise.
The steady-state window belongs to one attempt (a resumed script warms up again), as the
trainer's does (scalestudy.train.steady, RunResults.steady_results): the run reports the last attempt's
window if it filled, else the last filled one of an earlier attempt, else the last unfilled one.

The file is read line by line and the steps are kept as columns of machine numbers (array.array:
step, samples, seconds, time; 32 bytes a step), not as one dict per line: a long run of a fast
model reports millions of steps, and the runner parses them in bounded memory (1e6 step lines:
scalestudy.benchmark.progress_parser, docs/guide/benchmarks.md).
"""

from __future__ import annotations

import bisect
import json
import math
import statistics
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scalestudy.plan.runfiles import WHOLE_RUN_KEYS
from scalestudy.train import steady

STEP_KEYS = {"step": (int, 0), "samples": ((int, float), 0), "seconds": ((int, float), None)}
EPOCH_METRICS = ("train_loss", "train_acc", "test_loss", "test_acc", "lr", "wall_time_s")
_DENSE_SLACK = 1 << 20  # step numbers up to 4 x lines + this: a bitmap finds repeats, else a set


class ProgressError(ValueError):
    """A progress file the results cannot be made from; the message names the file and line."""


@dataclass
class Attempt:
    started: float | None = None  # time.time() when the runner started the script
    seconds: float | None = None  # the script's wall time, from the runner's exit line
    first: int = 0  # its steps are Steps rows first..end, in the order reported
    end: int = 0

    @property
    def count(self) -> int:
        return self.end - self.first


@dataclass
class Steps:
    """Every step line, in the order reported, as columns (time: NaN where the line has none)."""

    step: array = field(default_factory=lambda: array("q"))
    samples: array = field(default_factory=lambda: array("d"))
    seconds: array = field(default_factory=lambda: array("d"))
    time: array = field(default_factory=lambda: array("d"))

    def __len__(self) -> int:
        return len(self.step)

    def append(self, record: dict[str, Any]) -> None:
        self.step.append(record["step"])
        self.samples.append(record["samples"])
        self.seconds.append(record["seconds"])
        end = record.get("time")
        self.time.append(end if _is_number(end) else math.nan)


@dataclass
class Progress:
    path: Path
    attempts: list[Attempt] = field(default_factory=list)
    reported: Steps = field(default_factory=Steps)
    epochs: dict[int, dict[str, Any]] = field(default_factory=dict)
    memory: list[dict[str, Any]] = field(default_factory=list)
    model: dict[str, Any] = field(default_factory=dict)  # the last "model" line: parameters, FLOPs
    _final: list[int] | None = None  # rows of the steps' last occurrences, by step number

    @property
    def current(self) -> Attempt:
        if not self.attempts:
            self.attempts.append(Attempt())
        return self.attempts[-1]

    @property
    def final(self) -> list[int]:
        """The row of each step's last occurrence, in step order (computed once)."""
        if self._final is None:
            self._final = _last_occurrences(self.reported.step)
        return self._final

    @property
    def steps(self) -> list[int]:
        """The step numbers, each once, in order."""
        return [self.reported.step[row] for row in self.final]


def _last_occurrences(numbers: array) -> list[int]:
    """Rows of the last occurrence of each number, ordered by number. Dense numbers (the usual
    0..N) go through a bitmap and a position array (9 bytes a step number); sparse ones a dict."""
    if not numbers:
        return []
    top = max(numbers)
    if top > 4 * len(numbers) + _DENSE_SLACK:
        rows = {number: row for row, number in enumerate(numbers)}
        return [rows[number] for number in sorted(rows)]
    where = array("q", [-1]) * (top + 1)
    for row, number in enumerate(numbers):
        where[number] = row
    return array("q", (row for row in where if row >= 0))


def read_progress(path: str | Path) -> Progress:
    """Parse one rank's progress file, line by line; ProgressError names file:line and the bad value."""
    progress = Progress(Path(path))
    try:
        with open(progress.path, encoding="utf-8") as handle:
            for number, line in enumerate(handle, 1):
                if line.strip():
                    _take(progress, _parse_line(line.rstrip("\n"), f"{path}:{number}"), f"{path}:{number}")
    except (OSError, UnicodeDecodeError) as error:
        raise ProgressError(f"progress file {path}: cannot be read: {error}") from None
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
        end = len(progress.reported)
        progress.attempts.append(Attempt(started=record.get("time"), first=end, end=end))
    elif event == "exit":
        progress.current.seconds = record.get("seconds")
    elif event == "step":
        for key, (kinds, minimum) in STEP_KEYS.items():
            _check_number(record, key, kinds, minimum, where)
        progress.current.end = len(progress.reported) + 1
        progress.reported.append(record)
        progress._final = None
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
    # other events ("saved", ...): the runner's, or left for later versions of the contract


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
    if not progress.final:
        raise ProgressError(
            f'{progress.path}: no "step" line: the script reported no optimizer step '
            "(scalestudy.contract.Reporter.step)"
        )
    world_size = config["world_size"]
    results = {
        "epochs": len(progress.epochs) or config["epochs"],
        "steps": len(progress.final),
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
    found, columns = [], progress.reported
    for index, attempt in enumerate(progress.attempts):
        if not attempt.count:
            continue
        rows = slice(attempt.first, attempt.end)
        times = columns.time[rows]
        placed = t0 is not None and index == len(progress.attempts) - 1 and all(map(math.isfinite, times))
        result = steady.window_of_steps(
            columns.seconds[rows],
            columns.samples[rows],
            config["measure_warmup_steps"],
            config["measure_steps"],
            config["measure_intervals"],
            config["world_size"],
            start_step=columns.step[attempt.first],
            end_times=times if placed else None,
            t0=t0 or 0.0,
            min_seconds=config.get("measure_seconds"),
        )
        found.append({**result, "measure_attempt": index})
    filled = [result for result in found if result["window_filled"]]
    return filled[-1] if filled else found[-1]


def whole_run(progress: Progress, world_size: int) -> dict[str, Any]:
    """Samples over the summed step times of every step (the first steps' one-off costs included)."""
    seconds, samples = _sums(progress, progress.final)
    rates = (samples / seconds, samples / seconds / world_size, seconds / len(progress.final))
    return dict(zip(WHOLE_RUN_KEYS, rates, strict=True))


def total_time(progress: Progress) -> float:
    """The script's wall time over all attempts (an attempt cut short: its steps' time)."""
    seconds = progress.reported.seconds
    return sum(
        attempt.seconds if _is_number(attempt.seconds) else math.fsum(seconds[attempt.first : attempt.end])
        for attempt in progress.attempts
    )


def _sums(progress: Progress, rows) -> tuple[float, float]:
    """(seconds, samples) summed over the given rows of the reported steps."""
    columns = progress.reported
    return math.fsum(columns.seconds[row] for row in rows), math.fsum(columns.samples[row] for row in rows)


def _resumes(progress: Progress) -> dict[str, Any]:
    starts = [progress.reported.step[attempt.first] for attempt in progress.attempts if attempt.count]
    resumes = starts[1:]
    return {"resumed_from_step": resumes[-1] if resumes else None, "resumes": resumes}


def _epochs(progress: Progress) -> list[tuple[dict[str, Any], range | None]]:
    """(epoch record, the indices into progress.final of its steps) per reported epoch, in epoch
    order: the steps from the previous epoch's end_step up to its own (None without an end_step)."""
    final = progress.final
    numbers = array("q", (progress.reported.step[row] for row in final))
    epochs, previous_end = [], 0
    for number in sorted(progress.epochs):
        record = progress.epochs[number]
        end = record.get("end_step")
        span = None
        if end is not None:
            span = range(bisect.bisect_left(numbers, previous_end), bisect.bisect_left(numbers, end))
        epochs.append((record, span))
        previous_end = previous_end if end is None else end
    return epochs


def _rows(progress: Progress, span: range | None):
    return progress.final[span.start : span.stop] if span else None


def _seconds(progress: Progress, rows) -> float | None:
    return _sums(progress, rows)[0] or None if rows else None


def epoch_rows(progress: Progress, config: dict[str, Any]) -> list[dict[str, Any]]:
    """metrics.csv's rows: what the script reported; the time and rate from the epoch's steps."""
    rows = []
    for record, steps in _epochs(progress):
        seconds = _seconds(progress, _rows(progress, steps))
        rate = _sums(progress, _rows(progress, steps))[1] / seconds if seconds else None
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


def step_columns(progress: Progress) -> dict[str, array]:
    """steps.csv's columns (epoch, step, step_s; epoch 0: none), each step once in step order: every
    step's wall time; the phases are the script's own affair."""
    columns, final = progress.reported, progress.final
    epoch = array("q", [0]) * len(final)
    for record, span in _epochs(progress):
        for index in span or ():
            epoch[index] = record["epoch"]
    return {
        "epoch": epoch,
        "step": array("q", (columns.step[row] for row in final)),
        "step_s": array("d", (columns.seconds[row] for row in final)),
    }


def step_rows(progress: Progress) -> list[dict[str, Any]]:
    """steps.csv's rows as dicts (small files; the runner writes step_columns)."""
    columns = step_columns(progress)
    return [
        {"epoch": epoch or None, "step": step, "step_s": seconds}
        for epoch, step, seconds in zip(columns["epoch"], columns["step"], columns["step_s"], strict=True)
    ]


def _epoch_time(progress: Progress, epochs: int) -> float:
    """The median epoch time after the first epoch (or the only one); without epoch lines the
    steps' time over the run config's epochs."""
    spans = [span for _, span in _epochs(progress)]
    times = [seconds for span in spans if (seconds := _seconds(progress, _rows(progress, span))) is not None]
    if not times:
        return _sums(progress, progress.final)[0] / epochs
    return statistics.median(times[1:] or times)


def _steps_per_epoch(progress: Progress) -> int | None:
    counts = [len(span) for _, span in _epochs(progress) if span]
    return counts[0] if counts else None


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
