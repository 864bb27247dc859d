"""Energy per run: joules in the measurement window and over the whole run, per sample, to the target.

From a run folder's GPU monitor files (scalestudy.train.gpu_monitor: one sampler per rank on its own
GPU) and its summary's results, every GPU's energy:

- `counter`: NVML's total energy counter, read at every sample (`energy_j`: joules since the
  monitor's first reading, wraps and resets handled by scalestudy.train.energy_counter), linearly
  interpolated at the window's bounds;
- `power integral`: where a GPU has no counter (before Volta; gpu_monitor.json says why), the trapezoid
  of its power samples (power interpolated at the bounds);
- `not measured`: no GPU was sampled (a CPU run: no NVML; the study reads no CPU energy, no RAPL),
  a rank had no monitor, or NVML lost a GPU during the run; the reason follows, never a zero.

The keys (ENERGY_KEYS; the trainer adds them to summary.json, scalestudy.analysis.aggregate to
runs.csv for a summary written before them), summed over the run's GPUs:

- `energy_source`: `counter`, `power integral: <which GPUs, why>` or `not measured: <why>`;
  `energy_note`: what is left out or bridged (no window in this attempt, a resumed run, a reset);
  `energy_gpus`: the GPUs summed;
- `energy_window_j` over the window's unpaused segments (monitor_window.window_of_results), their
  `mean_power_w`, and `joules_per_sample` = mean_power_w / images_per_s (the window's rate, in the
  workload's sample_unit: an image, a token);
- `energy_j` from the monitor's first sample (the end of setup) to its last (the run's end),
  `joules_per_sample_run` = energy_j / the samples trained (whole_run_images_per_s x
  whole_run_step_time_s x steps), `energy_to_target_j` = the run's mean power x time_to_target_s.
  A resumed run's monitor covers its last attempt only: these stay empty, the note says so;
- `gpu_hours` = world_size x total_time_s and `gpu_hours_to_target` = world_size x time_to_target_s
  (hours; ranks x hours on CPU ranks), whatever measures energy.

    python -m scalestudy.analysis.energy RUN_DIR    # prints the keys, and the counter against the integral
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from scalestudy import commandline
from scalestudy.analysis import monitor_window
from scalestudy.analysis.stats import repeat_stats
from scalestudy.analysis.tableio import read_csv, read_json
from scalestudy.plan import runfiles
from scalestudy.plan.runfiles import NOT_MEASURED

ENERGY_KEYS = ("energy_source", "energy_note", "energy_gpus", *runfiles.ENERGY_MEASURES)
COUNTER, INTEGRAL = "counter", "power integral"
NO_CPU_ENERGY = "the study reads GPU energy (NVML) only, no CPU energy (RAPL)"
ENERGY_UNITS = ((1e9, "GJ"), (1e6, "MJ"), (1e3, "kJ"), (1.0, "J"), (1e-3, "mJ"), (1e-6, "µJ"))
# Per-run quantities the scaling table summarises over repeats (mean, std, interval).
SCALING_STATS = (
    "joules_per_sample",
    "joules_per_sample_run",
    "energy_to_target_j",
    "gpu_hours_to_target",
    "mean_power_w",
)


@dataclass(frozen=True)
class GpuSeries:
    """One GPU's samples: cumulative joules (counter) or power in W (integral), by time_s."""

    name: str  # uuid on host
    source: str
    times: np.ndarray
    values: np.ndarray

    @property
    def span(self) -> tuple[float, float]:
        return float(self.times[0]), float(self.times[-1])

    def joules(self, start: float, end: float) -> float | None:
        """Energy between two times (seconds since t0); None where the samples do not cover them."""
        first, last = self.span
        if start < first or end > last or end < start:
            return None
        if self.source == COUNTER:
            return float(np.interp(end, self.times, self.values) - np.interp(start, self.times, self.values))
        inside = self.times[(self.times > start) & (self.times < end)]
        points = np.concatenate(([start], inside, [end]))
        power = np.interp(points, self.times, self.values)
        return float(np.sum((power[1:] + power[:-1]) / 2 * np.diff(points)))


def series(samples: pd.DataFrame, source: str | None = None) -> list[GpuSeries]:
    """Every GPU's series: the counter where it has readings (or `source` forces one), else its power.
    A GPU that several ranks sampled (ranks sharing it) counts once: its lowest rank's samples."""
    found = []
    for (host, uuid), rows in samples.groupby(["host", "gpu_uuid"], sort=True):
        if "rank" in rows and rows["rank"].nunique() > 1:
            rows = rows[rows["rank"] == rows["rank"].min()]
        times = pd.to_numeric(rows["time_s"], errors="coerce")
        counter = _numeric(rows, "energy_j")
        power = _numeric(rows, "power_w")
        use = source or (COUNTER if counter.notna().sum() >= 2 else INTEGRAL)
        values = counter if use == COUNTER else power
        kept = times.notna() & values.notna()
        order = np.argsort(times[kept].to_numpy(), kind="stable")
        found.append(
            GpuSeries(
                f"{uuid} on {host}",
                use,
                times[kept].to_numpy(float)[order],
                values[kept].to_numpy(float)[order],
            )
        )
    return found


def _numeric(rows: pd.DataFrame, column: str) -> pd.Series:
    if column not in rows:
        return pd.Series(math.nan, index=rows.index)
    return pd.to_numeric(rows[column], errors="coerce")


def hours(results: dict) -> dict[str, float | None]:
    """GPU-hours of the run and to the target (ranks x hours on CPU ranks)."""
    world = results.get("world_size")
    total, target = results.get("total_time_s"), results.get("time_to_target_s")
    return {
        "gpu_hours": world * total / 3600.0 if world and _number(total) else None,
        "gpu_hours_to_target": world * target / 3600.0 if world and _number(target) else None,
    }


def energy_unit(joules: float) -> tuple[float, str]:
    """The unit `joules` reads best in (its size in J, its name): GJ, MJ, kJ, J, mJ or µJ."""
    return next(((size, name) for size, name in ENERGY_UNITS if abs(joules) >= size), ENERGY_UNITS[-1])


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


# --- one run ------------------------------------------------------------------------------------------


def of_folder(run_dir: str | Path, results: dict) -> dict[str, Any]:
    """The energy keys of a run folder's monitor files and `results` (summary.json's)."""
    run_dir = Path(run_dir)
    csv_path = run_dir / runfiles.GPU_MONITOR
    if not csv_path.is_file():
        return unmeasured(results, f"no {runfiles.GPU_MONITOR} in {run_dir}")
    info_path = run_dir / runfiles.GPU_MONITOR_INFO
    info = read_json(info_path) if info_path.is_file() else {}
    return of_samples(read_csv(csv_path, ("time_s", "host", "gpu_uuid", "power_w")), info, results)


def unmeasured(results: dict, reason: str) -> dict[str, Any]:
    keys = {**dict.fromkeys(ENERGY_KEYS), **hours(results), "energy_gpus": 0}
    if str(results.get("device") or "").startswith("cpu") and "RAPL" not in reason:
        reason += f"; {NO_CPU_ENERGY}"
    return {**keys, "energy_source": f"{NOT_MEASURED}: {reason}", "energy_note": ""}


def of_samples(samples: pd.DataFrame, info: dict, results: dict) -> dict[str, Any]:
    """The energy keys of one run's samples (gpu_monitor.csv), its monitor summary (gpu_monitor.json)
    and its results (the window, the rates, time to target)."""
    why = _why_not(samples, info)
    if why:
        return unmeasured(results, why)
    gpus = series(samples)
    unread = [gpu.name for gpu in gpus if len(gpu.times) < 2]
    if unread:
        return unmeasured(results, f"fewer than two energy or power samples of {', '.join(unread)}")
    keys = {**dict.fromkeys(ENERGY_KEYS), **hours(results), "energy_gpus": len(gpus)}
    keys["energy_source"] = _source(gpus, info)
    notes = _reset_notes(info)
    keys.update(_window(gpus, results, notes))
    keys.update(_whole_run(gpus, results, notes))
    keys["energy_note"] = "; ".join(notes)
    return keys


def _why_not(samples: pd.DataFrame, info: dict) -> str | None:
    if samples.empty:
        return str(info.get("reason") or "no GPU samples")
    if info and not info.get("available", True):
        return f"not every rank sampled its GPU ({info.get('reason')})"
    failed = info.get("failed_gpus") or []
    if failed:
        return f"NVML lost {', '.join(failed)} during the run (its samples stop early)"
    return None


def _source(gpus: list[GpuSeries], info: dict) -> str:
    integrated = [gpu.name for gpu in gpus if gpu.source == INTEGRAL]
    if not integrated:
        return COUNTER
    reasons = sorted({_counter_reason(info, gpu.name) for gpu in gpus if gpu.source == INTEGRAL})
    without = f"{len(integrated)} of {len(gpus)} GPU(s) without the energy counter"
    return f"{INTEGRAL}: {without} ({'; '.join(reasons)})"


def _gpu_reports(info: dict) -> list[dict]:
    return [gpu for node in info.get("nodes") or [] for gpu in node.get("gpus") or []]


def _counter_reason(info: dict, name: str) -> str:
    for gpu in _gpu_reports(info):
        if name.startswith(f"{gpu.get('uuid')} on"):
            reason = (gpu.get("energy") or {}).get("reason")
            if reason:
                return str(reason)
    return "no energy_j samples (a GPU monitor before the counter was read)"


def _reset_notes(info: dict) -> list[str]:
    notes = []
    for gpu in _gpu_reports(info):
        energy = gpu.get("energy") or {}
        for reset in energy.get("resets") or []:
            notes.append(
                f"{gpu.get('uuid')}: counter reset at {reset['at_s']} s, bridged by {reset['bridged_by']}"
            )
        if energy.get("wraps"):
            notes.append(f"{gpu.get('uuid')}: counter wrapped {energy['wraps']}x")
    return notes


def _window(gpus: list[GpuSeries], results: dict, notes: list[str]) -> dict[str, Any]:
    window = monitor_window.window_of_results(results)
    if window is None:
        notes.append("window energy not measured: no filled measurement window")
        return {}
    if not window:
        notes.append("window energy not measured: the window reported is an earlier attempt's")
        return {}
    parts = [gpu.joules(start, end) for start, end in window for gpu in gpus]
    if any(part is None for part in parts):
        spans = ", ".join(f"{gpu.name} {gpu.span[0]:.2f}-{gpu.span[1]:.2f} s" for gpu in gpus)
        notes.append(f"window energy not measured: the samples ({spans}) do not cover the window")
        return {}
    energy = math.fsum(parts)
    seconds = math.fsum(end - start for start, end in window)
    power = energy / seconds if seconds > 0 else None
    rate = results.get("images_per_s")
    per_sample = power / rate if power is not None and _number(rate) and rate > 0 else None
    return {"energy_window_j": energy, "mean_power_w": power, "joules_per_sample": per_sample}


def _whole_run(gpus: list[GpuSeries], results: dict, notes: list[str]) -> dict[str, Any]:
    resumed = results.get("resumed_from_step")
    if resumed is not None:
        notes.append(
            f"whole-run energy not measured: resumed at step {resumed}, "
            "the GPU monitor covers the last attempt only"
        )
        return {}
    energies = [gpu.joules(*gpu.span) for gpu in gpus]
    energy = math.fsum(energies)
    power = math.fsum(e / (gpu.span[1] - gpu.span[0]) for e, gpu in zip(energies, gpus, strict=True))
    trained = _samples_trained(results)
    target = results.get("time_to_target_s")
    return {
        "energy_j": energy,
        "joules_per_sample_run": energy / trained if trained else None,
        "energy_to_target_j": power * target if _number(target) else None,
    }


def _samples_trained(results: dict) -> float | None:
    """Samples (in the workload's unit) of every step: the whole-run rate x step time x steps."""
    rate, step_s, steps = (
        results.get(k) for k in ("whole_run_images_per_s", "whole_run_step_time_s", "steps")
    )
    if not all(_number(value) and value > 0 for value in (rate, step_s, steps)):
        return None
    return rate * step_s * steps


# --- the counter against the power integral (scripts/gpu_check.sh's study check) -----------------


def counter_vs_integral(run_dir: str | Path) -> dict[str, Any]:
    """One run's window energy (the whole run's without a window) from the counter and from the power
    integral, both over the same GPUs and times; the reason where either is missing."""
    run_dir = Path(run_dir)
    summary = read_json(run_dir / runfiles.SUMMARY)
    samples = read_csv(run_dir / runfiles.GPU_MONITOR, ("time_s", "host", "gpu_uuid", "power_w"))
    results = summary.get("results") or {}
    if samples.empty or "energy_j" not in samples or samples["energy_j"].isna().all():
        return {"counter_j": None, "integral_j": None, "over": None, "reason": "no energy counter samples"}
    window = monitor_window.window_of_results(results)
    counted, integrated = series(samples, COUNTER), series(samples, INTEGRAL)
    short = [gpu.name for gpu in (*counted, *integrated) if len(gpu.times) < 2]
    if short:
        reason = f"fewer than two counter and power samples of {', '.join(sorted(set(short)))}"
        return {"counter_j": None, "integral_j": None, "over": None, "reason": reason}
    spans = window or [(max(g.span[0] for g in counted), min(g.span[1] for g in counted))]
    totals = [_total(found, spans) for found in (counted, integrated)]
    return {
        "counter_j": totals[0],
        "integral_j": totals[1],
        "over": "the measurement window" if window else "the whole run",
        "reason": None if None not in totals else "the samples do not cover the window",
    }


def _total(gpus: list[GpuSeries], spans: list[tuple[float, float]]) -> float | None:
    parts = [gpu.joules(start, end) for start, end in spans for gpu in gpus]
    return None if any(part is None for part in parts) else math.fsum(parts)


# --- the scaling table's columns ----------------------------------------------------------------------


def scaling_columns(group: pd.DataFrame, confidence: float) -> dict[str, Any]:
    """One scaling point's energy statistics over its repeats, and where the energy came from."""
    row: dict[str, Any] = {}
    for column in SCALING_STATS:
        values = _numeric(group, column)
        stats = repeat_stats(values, confidence)
        row.update({f"{column}_{key}": value for key, value in stats.items() if key != "n"})
    row["energy_source"] = sources(group)
    return row


def sources(group: pd.DataFrame) -> str:
    """The repeats' energy sources, each once ("not recorded" for a catalog from before energy)."""
    if "energy_source" not in group:
        return f"{NOT_MEASURED}: runs.csv has no energy_source column (runs recorded before energy was)"
    found = [str(value) for value in group["energy_source"] if not pd.isna(value) and str(value)]
    return "; ".join(dict.fromkeys(found)) or f"{NOT_MEASURED}: no energy_source recorded"


def measured(frame: pd.DataFrame) -> pd.Series:
    """Rows whose energy_source says a measurement (the counter or the power integral)."""
    if "energy_source" not in frame:
        return pd.Series(False, index=frame.index)
    text = frame["energy_source"].map(lambda value: "" if pd.isna(value) else str(value))
    return text.str.startswith((COUNTER, INTEGRAL))


def main(argv: Sequence[str] | None = None) -> int:
    parser = commandline.parser(__doc__)
    parser.add_argument("run_dir", type=Path, help="A run folder (summary.json, gpu_monitor.csv/.json).")
    args = parser.parse_args(argv)
    results = read_json(args.run_dir / runfiles.SUMMARY).get("results") or {}
    print(json.dumps({**of_folder(args.run_dir, results), **counter_vs_integral(args.run_dir)}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
