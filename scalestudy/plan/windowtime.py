"""How long each grid point's measurement window will last, from the smoke test's step time: the
points whose window holds too few GPU monitor samples to judge the GPU (standard library only: the
Snakefile warns with it when it is parsed, rules/common.smk).

A fast GPU fills a 60-step window in under a second, and the GPU monitor samples every
train.monitor_interval_s: such a window is judged on a handful of samples (four GPM SM-activity
values on an H200). Once the smoke test has run (results/smoke/train_w<N>.json and its run folder
train_w<N>/steps.csv), a point's window is estimated as train.measure steps x the smoke test's time
per step at the nearest smaller world size (the median over its timed steps after the first,
scaled by the point's per-GPU batch over the smoke test's; precision and other settings are not
scaled: an estimate), at least train.measure.seconds where that is set. Fewer than
analysis.monitor.min_window_samples samples in it is a problem line naming the point; so is a
window in seconds that the point's steps cannot hold. A CPU smoke test (no GPU monitor) gives none.
"""

from __future__ import annotations

import csv
import json
import math
import statistics
from pathlib import Path

from scalestudy.plan import grid, paths, runconfig
from scalestudy.plan.runfiles import STEPS


def smoke_step_times(smoke_dir: str | Path = paths.SMOKE_DIR) -> dict[int, tuple[float, int]]:
    """{world size: (seconds per step, per-GPU batch)} of the smoke tests that ran on a GPU."""
    timed = {}
    for path in sorted(Path(smoke_dir).glob("train_w*.json")):
        try:
            record = json.loads(path.read_text())
            world, batch = int(record["world_size"]), int(record["run_config"]["per_gpu_batch"])
        except (OSError, ValueError, KeyError, TypeError):
            continue  # a smoke test being rewritten, or of an older format: no estimate from it
        if record.get("device") == "cpu":
            continue
        per_step = _median_step(path.with_suffix("") / STEPS) or record.get("step_time_s")
        if isinstance(per_step, int | float) and per_step > 0:
            timed[world] = (float(per_step), batch)
    return timed


def _median_step(steps_csv: Path) -> float | None:
    """The median step_s of the timed steps after the first (compile, autotuning)."""
    try:
        with open(steps_csv, newline="") as handle:
            times = [float(row["step_s"]) for row in csv.DictReader(handle) if row.get("step_s")]
    except (OSError, ValueError, KeyError):
        return None
    return statistics.median(times[1:]) if len(times) > 1 else None


def short_window_problems(config: dict, smoke_dir: str | Path = paths.SMOKE_DIR) -> list[str]:
    """One line per grid point (profile runs excepted) whose window would hold fewer GPU monitor
    samples than analysis.monitor.min_window_samples, or whose steps cannot hold its seconds."""
    timed = smoke_step_times(smoke_dir)
    if not timed:
        return []
    floor = config["analysis"]["monitor"]["min_window_samples"]
    interval = config["train"]["monitor_interval_s"]
    samples_per_epoch = grid.samples_per_epoch(config)
    problems = []
    for point in [
        grid.baseline_point(config),
        *grid.scaling_points(config),
        *grid.sensitivity_points(config),
    ]:
        run = {**runconfig.DEFAULTS, **grid.run_config(config, point)}
        world = max((w for w in timed if w <= run["world_size"]), default=min(timed))
        per_step, batch = timed[world]
        step_s = per_step * run["per_gpu_batch"] / batch
        window_s = max(run["measure_steps"] * step_s, run["measure_seconds"] or 0.0)
        if window_s / interval < floor:
            smoke = f"the smoke test at world size {world} ran {per_step:.3g} s per step at batch {batch}"
            problems.append(
                f"{point.run_dir}: its measurement window of {run['measure_steps']} steps would last "
                f"about {window_s:.2g} s ({smoke}): {round(window_s / interval)} GPU monitor samples at "
                f"{interval:g} s, fewer than analysis.monitor.min_window_samples={floor}; set "
                f"train.measure.seconds to at least {floor * interval:g} or raise train.measure.steps"
            )
        elif run["measure_seconds"] and samples_per_epoch is not None:
            problems += _seconds_problem(point, run, step_s, samples_per_epoch)
    return problems


def _seconds_problem(point: grid.Point, run: dict, step_s: float, samples_per_epoch: int) -> list[str]:
    """A window in seconds the point's steps cannot hold: warm-up, a first window of measure_steps,
    then the steps the seconds take (the trainer's re-planned window)."""
    per_epoch = samples_per_epoch // run["world_size"] // run["per_gpu_batch"]
    if run.get("max_steps_per_epoch") is not None:
        per_epoch = min(per_epoch, run["max_steps_per_epoch"])
    total = per_epoch * run["epochs"]
    planned = math.ceil(run["measure_seconds"] / step_s)
    needed = run["measure_warmup_steps"] + run["measure_steps"] + planned
    if planned <= run["measure_steps"] or total >= needed:
        return []  # the steps alone last long enough (grid.window_problems checks those)
    return [
        f"{point.run_dir}: {run['epochs']} epochs x {per_epoch} steps = {total} steps may not fill a "
        f"window of {run['measure_seconds']:g} s (about {needed} steps with warm-up at the smoke test's "
        "step time): raise its epochs or lower train.measure.seconds"
    ]
