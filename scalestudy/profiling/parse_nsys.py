"""`nsys stats` CSVs of one rank -> the summary schema.

Inputs (`scalestudy.profiling.nsys export`, columns as `nsys stats --format csv` writes them in
Nsight Systems 2023.x-2025.x):

- `cuda_gpu_kern_sum`: "Total Time (ns)", "Instances", "Name" (required) -> busy time per
  category (`categorize.category`), NCCL kernels (`nccl*`) being communication;
- `cuda_gpu_mem_time_sum`: "Total Time (ns)", "Operation" -> memory copy (memcpy and memset);
- `nvtx_sum`: "Total Time (ns)", "Instances", "Range" -> the steps (the count of the `step`
  ranges), a lower bound of the window (their total time) and data loading (the `data` ranges);
- `cuda_gpu_trace`: "Start (ns)", "Duration (ns)", "Name" -> the exact compute/communication
  overlap: measure of union(NCCL kernels) intersected with union(other kernels).

The window is the longer of the `step` ranges' total and the GPU trace's span (first activity's
start to last activity's end). The NVTX ranges are CPU time: the trainer queues work ahead of the
GPU, and the drain after the last step's range (before the window's closing synchronise) is in no
range, so with the ranges alone the GPU's busy time could exceed the window and push idle to 0.
The trace span covers that drain (nsys records only the cudaProfilerApi capture range, which the
trainer opens and closes after a synchronise). Without NVTX ranges the window is the trace span;
without a trace, the step ranges (and the overlap is the lower bound, see `breakdown`). Data
loading is host time and may overlap GPU work.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from scalestudy.profiling import nsys
from scalestudy.profiling.breakdown import Labels, RankTotals, intersection_length
from scalestudy.profiling.categorize import category
from scalestudy.profiling.schema import COMM, DATA_RANGE, MEMCPY, STEP_RANGE
from scalestudy.profiling.tables import TableError, numeric, read_table, top_rows

NS = 1e-9
KERNEL_COLUMNS = ("Total Time (ns)", "Instances", "Name")
MEMORY_COLUMNS = ("Total Time (ns)", "Operation")
NVTX_COLUMNS = ("Total Time (ns)", "Instances", "Range")
TRACE_COLUMNS = ("Start (ns)", "Duration (ns)", "Name")


def kernel_table(path: Path) -> pd.DataFrame:
    """name, category, total_time_s, instances of every kernel."""
    frame = read_table(path, KERNEL_COLUMNS, "nsys cuda_gpu_kern_sum")
    return pd.DataFrame(
        {
            "name": frame["Name"],
            "category": frame["Name"].map(category),
            "total_time_s": numeric(frame, "Total Time (ns)", path) * NS,
            "instances": numeric(frame, "Instances", path).fillna(0).astype(int),
        }
    )


def memory_time(path: Path) -> float:
    """Seconds of memcpy/memset (0 when nsys wrote no memory table: no memory operations)."""
    if not path.is_file():
        return 0.0
    frame = read_table(path, MEMORY_COLUMNS, "nsys cuda_gpu_mem_time_sum")
    return float(numeric(frame, "Total Time (ns)", path).sum() * NS)


def nvtx_ranges(path: Path) -> dict[str, tuple[float, int]]:
    """Range name (domain prefix dropped) -> (total seconds, instances); empty without NVTX data."""
    if not path.is_file():
        return {}
    frame = read_table(path, NVTX_COLUMNS, "nsys nvtx_sum")
    totals = numeric(frame, "Total Time (ns)", path) * NS
    counts = numeric(frame, "Instances", path).fillna(0).astype(int)
    ranges: dict[str, tuple[float, int]] = {}
    for name, seconds, count in zip(frame["Range"], totals, counts, strict=True):
        key = str(name).rsplit(":", 1)[-1].strip()
        old_seconds, old_count = ranges.get(key, (0.0, 0))
        ranges[key] = (old_seconds + float(seconds), old_count + int(count))
    return ranges


def trace_intervals(path: Path) -> pd.DataFrame | None:
    """start_s, end_s, category of every GPU activity; None when no trace was exported."""
    if not path.is_file():
        return None
    frame = read_table(path, TRACE_COLUMNS, "nsys cuda_gpu_trace")
    start = numeric(frame, "Start (ns)", path) * NS
    return pd.DataFrame(
        {
            "start_s": start,
            "end_s": start + numeric(frame, "Duration (ns)", path) * NS,
            "category": frame["Name"].map(category),
        }
    )


def exact_overlap(trace: pd.DataFrame) -> float:
    comm = trace[trace["category"] == COMM]
    compute = trace[~trace["category"].isin([COMM, MEMCPY])]
    comm_intervals = zip(comm["start_s"], comm["end_s"], strict=True)
    return intersection_length(comm_intervals, zip(compute["start_s"], compute["end_s"], strict=True))


def window_of(ranges: dict, trace: pd.DataFrame | None, steps: int, source: Path) -> tuple[float, int]:
    """(window seconds, steps): the longer of the NVTX step ranges' total and the GPU trace's span
    (see the module doc), with the step ranges' count; either one alone where the other is missing."""
    span = float(trace["end_s"].max() - trace["start_s"].min()) if trace is not None and len(trace) else None
    if STEP_RANGE in ranges and ranges[STEP_RANGE][1] > 0:
        cpu_s, counted = ranges[STEP_RANGE]
        return max(cpu_s, span or 0.0), counted
    if span is not None:
        return span, steps
    raise TableError(
        f"{source}: no NVTX {STEP_RANGE!r} ranges and no GPU trace: the profiled window is unknown"
    )


def rank_summary(stats_dir: Path, rank: int, steps: int) -> tuple[RankTotals, pd.DataFrame, str]:
    """(totals, kernel table, method) of one rank's exported CSVs."""
    kernels = kernel_table(nsys.stats_csv(stats_dir, rank, nsys.KERNELS))
    ranges = nvtx_ranges(nsys.stats_csv(stats_dir, rank, nsys.NVTX))
    trace = trace_intervals(nsys.stats_csv(stats_dir, rank, nsys.GPU_TRACE))
    window_s, window_steps = window_of(ranges, trace, steps, nsys.stats_csv(stats_dir, rank, nsys.NVTX))
    busy = kernels.groupby("category")["total_time_s"].sum().to_dict()
    busy[MEMCPY] = busy.get(MEMCPY, 0.0) + memory_time(nsys.stats_csv(stats_dir, rank, nsys.MEMORY))
    totals = RankTotals(
        window_s=window_s,
        steps=window_steps,
        busy=busy,
        data_s=ranges.get(DATA_RANGE, (0.0, 0))[0],
        overlap_s=exact_overlap(trace) if trace is not None else None,
        data_is_concurrent=False,
    )
    return totals, kernels, "nsys_trace" if trace is not None else "nsys_summary"


def summarize(
    stats_dir: Path, world_size: int, steps: int, top: int
) -> list[tuple[RankTotals, Labels, list[dict]]]:
    """Per rank: totals, row labels and the top kernels."""
    results = []
    for rank in range(world_size):
        totals, kernels, method = rank_summary(stats_dir, rank, steps)
        labels = Labels(world_size, rank, "nsys", method)
        results.append((totals, labels, top_rows(kernels, labels.as_dict(), "kernel", top)))
    return results
