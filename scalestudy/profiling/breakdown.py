"""From per-category busy times of one rank to the summary schema's rows (pure standard library).

The profiled window (`window_s` of wall time over `steps` steps) is split into the categories of
`schema.CATEGORIES`:

- convolution/GEMM, normalisation+elementwise and memory copy: their busy time;
- communication: the *exposed* communication time, `communication - overlap`, where `overlap`
  is the communication time that ran concurrently with other work. It is exact when a timeline
  is known (the nsys GPU trace: measure of union(comm kernels) intersected with union(other
  kernels)); otherwise it is the lower bound `min(comm, max(0, comm + concurrent - window))`:
  whatever the categories add up to beyond the wall time must have run at the same time;
- data loading: the time inside the trainer's `data` range;
- idle/other: the rest of the window, clipped at 0 (unknown kernels/ops, overhead, idle).

If the categories still add up to more than the window (e.g. host-side data loading overlapping
GPU kernels), each fraction is taken of their sum, so a rank's fractions always sum to 1.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from scalestudy.profiling.schema import (
    COMM,
    CONV_GEMM,
    DATA,
    IDLE_OTHER,
    LABELS,
    MEMCPY,
    NORM_ELEMENTWISE,
    OTHER,
)


@dataclass
class RankTotals:
    """What one rank spent its profiled window on (seconds, summed over the window)."""

    window_s: float
    steps: int
    busy: dict[str, float] = field(default_factory=dict)  # category -> busy time
    data_s: float = 0.0
    overlap_s: float | None = None  # exact overlap, when a timeline gave it
    data_is_concurrent: bool = True  # data loading counts towards the overlap lower bound

    def get(self, category: str) -> float:
        return float(self.busy.get(category, 0.0))

    @property
    def compute_s(self) -> float:
        return self.get(CONV_GEMM) + self.get(NORM_ELEMENTWISE) + self.get(OTHER)


@dataclass(frozen=True)
class Labels:
    """The identity columns every row of one rank carries."""

    world_size: int
    rank: int
    tool: str
    method: str

    def as_dict(self) -> dict:
        return {"world_size": self.world_size, "rank": self.rank, "tool": self.tool, "method": self.method}


def overlap_lower_bound(comm_s: float, concurrent_s: float, window_s: float) -> float:
    """The least communication time that must have overlapped other work in a window."""
    return min(comm_s, max(0.0, comm_s + concurrent_s - window_s))


def overlap_of(totals: RankTotals) -> float:
    """Exact overlap if known, else the lower bound from the sums."""
    comm = totals.get(COMM)
    if totals.overlap_s is not None:
        return min(comm, max(0.0, totals.overlap_s))
    concurrent = totals.compute_s + totals.get(MEMCPY)
    if totals.data_is_concurrent:
        concurrent += totals.data_s
    return overlap_lower_bound(comm, concurrent, totals.window_s)


def category_times(totals: RankTotals) -> dict[str, float]:
    """Seconds per breakdown category; idle/other fills the window (clipped at 0)."""
    times = {
        CONV_GEMM: totals.get(CONV_GEMM),
        NORM_ELEMENTWISE: totals.get(NORM_ELEMENTWISE),
        COMM: max(0.0, totals.get(COMM) - overlap_of(totals)),
        MEMCPY: totals.get(MEMCPY),
        DATA: totals.data_s,
    }
    times[IDLE_OTHER] = max(0.0, totals.window_s - sum(times.values()))
    return times


def breakdown_rows(totals: RankTotals, labels: Labels) -> list[dict]:
    """One row per category for one rank (schema.BREAKDOWN_COLUMNS)."""
    _check_window(totals)
    times = category_times(totals)
    denominator = max(totals.window_s, sum(times.values()))
    return [
        {
            **labels.as_dict(),
            "category": category,
            "label": LABELS[category],
            "time_s": seconds,
            "fraction": seconds / denominator if denominator > 0 else 0.0,
            "time_per_step_s": seconds / totals.steps,
            "steps": totals.steps,
            "window_s": totals.window_s,
        }
        for category, seconds in times.items()
    ]


def overlap_row(totals: RankTotals, labels: Labels) -> dict:
    """Compute vs communication for one rank (schema.OVERLAP_COLUMNS)."""
    _check_window(totals)
    comm = totals.get(COMM)
    overlap = overlap_of(totals)
    return {
        **labels.as_dict(),
        "compute_s": totals.compute_s,
        "communication_s": comm,
        "overlap_s": overlap,
        "exposed_communication_s": comm - overlap,
        "overlap_fraction": overlap / comm if comm > 0 else math.nan,
        "steps": totals.steps,
        "window_s": totals.window_s,
    }


def _check_window(totals: RankTotals) -> None:
    if not totals.window_s > 0 or totals.steps < 1:
        raise ValueError(
            f"profiled window must be positive with at least one step, got {totals.window_s} s "
            f"over {totals.steps} steps"
        )


# --- intervals (the nsys GPU trace) -------------------------------------------------------------


def merge_intervals(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """Sorted, disjoint union of [start, end) intervals (empty ones dropped)."""
    merged: list[tuple[float, float]] = []
    for start, end in sorted((s, e) for s, e in intervals if e > s):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def intersection_length(a: Iterable[tuple[float, float]], b: Iterable[tuple[float, float]]) -> float:
    """Measure of union(a) intersected with union(b)."""
    left, right = merge_intervals(a), merge_intervals(b)
    i = j = 0
    total = 0.0
    while i < len(left) and j < len(right):
        start = max(left[i][0], right[j][0])
        end = min(left[i][1], right[j][1])
        total += max(0.0, end - start)
        if left[i][1] <= right[j][1]:
            i += 1
        else:
            j += 1
    return total
