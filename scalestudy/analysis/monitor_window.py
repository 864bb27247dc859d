"""The GPU monitor's samples for the analysis: read, limited to the measurement window, summarised.

A run's `gpu_monitor.csv` (scalestudy.train.gpu_monitor: columns and units) covers the whole run, start-up and
evaluation included. When the run's summary.json (written by the same job, in the same folder)
records its measurement window, only the samples inside it count in the per-GPU summary that the
acceptance criteria use: inside `results.measure_segments_s` (the window's unpaused stretches, so
evaluation and checkpoint writing at epoch ends inside the window are left out), else between
`results.measure_start_s` and `results.measure_end_s` (seconds since the run's t0, the base of the
samples' time_s). A run that reports an earlier attempt's window (these keys present but null: the
samples are of another attempt) has no sample inside: its GPUs are "not measured". A summary
without the keys (older runs) counts the whole run, and the summary says so.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from scalestudy.analysis.tableio import read_csv, read_json
from scalestudy.plan import runfiles

REQUIRED = (
    "time_s",
    "host",
    "gpu_index",
    "gpu_uuid",
    "sm_active_pct",
    "kernel_active_pct",
    "power_w",
    "power_fraction",
    "pcie_rx_mb_s",
    "pcie_tx_mb_s",
)
RUN_NAME = re.compile(r"runs/(?P<name>.+)/gpu_monitor\.csv$")
WINDOW_KEYS = ("measure_start_s", "measure_end_s")


def run_label(path: str | Path) -> str:
    match = RUN_NAME.search(Path(path).as_posix())
    return match["name"] if match else Path(path).parent.name


def world_of(run: str) -> int:
    match = re.search(r"w(\d+)", run)
    return int(match.group(1)) if match else 0


def measurement_window(csv_path: str | Path) -> list[tuple[float, float]] | None:
    """The window's [start, end] stretches in seconds since t0 from the summary.json beside a
    gpu_monitor.csv; [] where the run reports a window of an earlier attempt; None without one."""
    summary = Path(csv_path).with_name(runfiles.SUMMARY)
    if not summary.is_file():
        return None
    return window_of_results(read_json(summary).get("results") or {})


def window_of_results(results: dict) -> list[tuple[float, float]] | None:
    """measurement_window from a summary's results (the trainer's, before it writes them)."""
    if results.get("window_filled") is False:
        return None  # the throughput is whole-run too (marked): so is the monitor's summary
    segments = results.get("measure_segments_s")
    if isinstance(segments, list) and segments:
        return [(float(start), float(end)) for start, end in segments if end > start]
    start, end = (results.get(key) for key in WINDOW_KEYS)
    if isinstance(start, int | float) and isinstance(end, int | float) and end > start:
        return [(float(start), float(end))]
    if all(key in results for key in (*WINDOW_KEYS, "measure_segments_s")):
        return []  # an earlier attempt's window: this file's samples are of another attempt
    return None


def inside(times: pd.Series, segments: list[tuple[float, float]]) -> pd.Series:
    """Which sample times fall inside any of the segments."""
    mask = pd.Series(False, index=times.index)
    for start, end in segments:
        mask |= times.between(start, end)
    return mask


def load(paths: Sequence[str | Path]) -> tuple[pd.DataFrame, list[str]]:
    """Samples of every file (with `run`, `pcie_gb_s`, `in_window`, `windowed` columns), and the
    reasons files gave for having none."""
    frames, reasons = [], []
    for path in paths:
        frame = read_csv(path, REQUIRED)
        if frame.empty:
            reasons.append(no_gpu_reason(Path(path)))
            continue
        window = measurement_window(path)
        in_window = (
            inside(frame["time_s"], window) if window is not None else pd.Series(True, index=frame.index)
        )
        frame = frame.assign(
            run=run_label(path),
            pcie_gb_s=(frame["pcie_rx_mb_s"] + frame["pcie_tx_mb_s"]) / 1000.0,
            in_window=in_window,
            windowed=window is not None,
        )
        frames.append(frame)
    samples = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    return samples, sorted(set(reasons))


def no_gpu_reason(csv_path: Path) -> str:
    note = csv_path.with_suffix(".json")
    try:
        return str(json.loads(note.read_text()).get("reason") or "no reason given")
    except (OSError, ValueError):
        return "no samples and no gpu_monitor.json"


SUMMARY_COLUMNS = (
    "run",
    "world_size",
    "host",
    "gpu_uuid",
    "gpu_name",
    "samples",
    "foreign_samples",
    "windowed",
    "sm_active_pct",
    "kernel_active_pct",
    "power_w",
    "power_fraction",
    "pcie_gb_s",
)


def per_gpu(samples: pd.DataFrame) -> pd.DataFrame:
    """One row per run and GPU: means over the samples in the measurement window (NaN: not reported),
    and how many of them saw a foreign process on the GPU (scalestudy.analysis.contention)."""
    if samples.empty:
        return pd.DataFrame(columns=list(SUMMARY_COLUMNS))
    inside = samples[samples["in_window"]]
    if "gpu_name" not in inside:
        inside = inside.assign(gpu_name="")
    foreign = (
        inside["foreign_processes"] if "foreign_processes" in inside else pd.Series(0, index=inside.index)
    )
    inside = inside.assign(foreign_seen=pd.to_numeric(foreign, errors="coerce").fillna(0) > 0)
    grouped = inside.groupby(["run", "host", "gpu_uuid"], sort=True)
    means = grouped[["sm_active_pct", "kernel_active_pct", "power_w", "power_fraction", "pcie_gb_s"]].mean()
    table = means.join(
        grouped.agg(
            gpu_name=("gpu_name", "first"),
            windowed=("windowed", "all"),
            foreign_samples=("foreign_seen", "sum"),
        )
    )
    table = table.join(grouped.size().rename("samples")).reset_index()
    table["world_size"] = table["run"].map(world_of)
    return table[list(SUMMARY_COLUMNS)]
