"""Timing primitives: device synchronisation, rates, and repeats after warm-up (interleaved)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from typing import TypeVar

T = TypeVar("T")


def synchronize(device) -> None:
    """Wait for queued device work, so that a wall-clock interval covers it (a no-op on the CPU)."""
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def rate(items: float, seconds: float) -> float:
    if seconds <= 0:
        raise ValueError(f"a rate needs a positive duration, got {seconds} s")
    return items / seconds


def timed_rate(work: Callable[[], float], device="cpu") -> float:
    """Items per second of one call of `work`, which does the work and returns how many items it did."""
    synchronize(device)
    start = time.perf_counter()
    items = work()
    synchronize(device)
    return rate(items, time.perf_counter() - start)


def interleave(runs: Mapping[str, Callable[[], T]], repeats: int, warmup: int = 1) -> dict[str, list[T]]:
    """Each run's measurements: `warmup` discarded rounds, then `repeats` kept rounds.

    A round calls every run once, in turn, so a change of machine load during the benchmark
    falls on all of them alike instead of on whichever happened to run last.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    kept: dict[str, list[T]] = {name: [] for name in runs}
    for round_index in range(warmup + repeats):
        for name, run in runs.items():
            value = run()
            if round_index >= warmup:
                kept[name].append(value)
    return kept


def median(values) -> float:
    return float(statistics.median(values))
