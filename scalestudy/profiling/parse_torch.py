"""The torch.profiler fallback (the trainer's profile_ops.csv + profile_window.json) -> the schema.

`profile_ops.csv` (rank 0) is torch.profiler's key-averaged table: `name, count, self_cpu_us,
cpu_total_us, self_device_us, device_total_us`. Each op's *self* time goes to its category
(`categorize.category`: aten::convolution / mkldnn / addmm / mm -> convolution/GEMM, batch_norm /
relu / add ... -> normalisation+elementwise, c10d / gloo / nccl collectives -> communication,
copy_ / to -> memory copy); self times do not double count nested ops. When the device columns
hold time (a CUDA run), the device times are used (method torch_device), else the CPU self times
(method torch_cpu). On a device torch lists every kernel (and memory operation) as a row of its
own, with no CPU time, AND adds its time to the self device time of the op that launched it
(aten::cudnn_convolution); only the kernels' rows count, as in torch's own table total, so each
kernel counts once, under its own name.

Data loading is the inclusive time of the trainer's `data` range. In the CPU case the ops run
inside that range (augmentation: copies, indexing, elementwise) are also in their categories;
their time (the range's inclusive minus self time) is taken out of memory copy, then
normalisation+elementwise, then other, so it is counted once.

Communication (CPU case): a collective's work shows up as its own row (`gloo:all_reduce`,
`nccl:all_reduce`) with no self time and, as total time, the collective's duration from launch to
completion, spent on the backend's threads; those durations are the communication time (and the
launching `c10d::` ops, which they contain, are not counted again). Without such rows the self
time of the communication ops is used.

Window: `profile_window.json` (`wall_s` over `steps` steps). Overlap (CPU case): the collectives
run on their own threads while the main thread computes, so the op times add up to more than the
wall time; the excess, up to the communication time, is the overlap lower bound
`min(comm, max(0, comm + other categories - window))` (see `breakdown`). No timeline is recorded,
so the exact overlap is not known.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd

from scalestudy.plan import runfiles
from scalestudy.profiling.breakdown import Labels, RankTotals
from scalestudy.profiling.categorize import category
from scalestudy.profiling.schema import COMM, DATA_RANGE, MEMCPY, NAMED_RANGES, NORM_ELEMENTWISE, OTHER
from scalestudy.profiling.tables import TableError, numeric, read_table, top_rows

US = 1e-6
OPS_COLUMNS = runfiles.PROFILE_OPS_COLUMNS
NESTED_DATA_ORDER = (MEMCPY, NORM_ELEMENTWISE, OTHER)
# The rows of a collective's asynchronous work (its duration is their total time).
COLLECTIVE_WORK = re.compile(r"^(gloo|nccl|mpi|ucc):")


def ops_table(path: Path) -> pd.DataFrame:
    frame = read_table(path, OPS_COLUMNS, "torch.profiler ops table")
    table = pd.DataFrame(
        {"name": frame["name"].str.strip(), "instances": numeric(frame, "count", path).fillna(0)}
    )
    for column in OPS_COLUMNS[2:]:
        table[column] = numeric(frame, column, path).fillna(0.0) * US
    table["category"] = table["name"].map(category)
    return table


def window_of(path: Path) -> tuple[float, int]:
    if not path.is_file():
        raise TableError(f"{path}: missing (the trainer's profiling window record)")
    window = json.loads(path.read_text())
    for key in ("wall_s", "steps"):
        if key not in window:
            raise TableError(f"{path}: no {key!r} (keys: {sorted(window)})")
    return float(window["wall_s"]), int(window["steps"])


def is_wrapper(name: str) -> bool:
    """Named ranges and the profiler's own step markers: their time is their children's."""
    return name in NAMED_RANGES or name.startswith("ProfilerStep#")


def device_rows(ops: pd.DataFrame) -> pd.Series:
    """The rows of device activities (kernels, memory operations): torch gives them no CPU time."""
    return (ops["self_cpu_us"] == 0) & (ops["cpu_total_us"] == 0)


def op_seconds(ops: pd.DataFrame, device: bool) -> pd.Series:
    """The time each row contributes: a device activity's device time (an op's would count its
    kernels again) or CPU self time; collectives' work: its duration."""
    if device:
        return ops["self_device_us"].where(device_rows(ops), 0.0)
    seconds = ops["self_cpu_us"].copy()
    work = ops["name"].str.match(COLLECTIVE_WORK)
    if work.any():
        seconds[work] = ops.loc[work, "cpu_total_us"]
        seconds[(ops["category"] == COMM) & ~work] = 0.0
    return seconds


def remove_nested(busy: dict[str, float], amount: float) -> dict[str, float]:
    """Take `amount` seconds out of the categories in NESTED_DATA_ORDER, none below 0."""
    busy = dict(busy)
    for key in NESTED_DATA_ORDER:
        taken = min(amount, busy.get(key, 0.0))
        busy[key] = busy.get(key, 0.0) - taken
        amount -= taken
    return busy


def rank_summary(ops_path: Path, window_path: Path) -> tuple[RankTotals, pd.DataFrame, str]:
    ops = ops_table(ops_path)
    window_s, steps = window_of(window_path)
    device = bool(ops["self_device_us"].sum() > 0)
    timed = ops.assign(total_time_s=op_seconds(ops, device))
    table = timed[~timed["name"].map(is_wrapper)][["name", "category", "total_time_s", "instances"]]
    table = table[table["total_time_s"] > 0]
    busy = table.groupby("category")["total_time_s"].sum().to_dict()
    data = ops[ops["name"] == DATA_RANGE]
    data_s = float(data["cpu_total_us"].sum())
    if not device:
        busy = remove_nested(busy, data_s - float(data["self_cpu_us"].sum()))
    totals = RankTotals(
        window_s=window_s, steps=steps, busy=busy, data_s=data_s, data_is_concurrent=not device
    )
    return totals, table, "torch_device" if device else "torch_cpu"


def summarize(
    run_dir: Path,
    world_size: int,
    top: int,
    ops_name: str = runfiles.PROFILE_OPS,
    window_name: str = runfiles.PROFILE_WINDOW,
) -> list[tuple[RankTotals, Labels, list[dict]]]:
    """Rank 0's totals, labels and top ops (the trainer writes the table from rank 0 only)."""
    totals, table, method = rank_summary(run_dir / ops_name, run_dir / window_name)
    labels = Labels(world_size, 0, "torch", method)
    kind = "kernel" if method == "torch_device" else "op"
    return [(totals, labels, top_rows(table, labels.as_dict(), kind, top))]
