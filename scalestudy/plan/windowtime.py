"""How long each grid point's measurement window will last, from the smoke test's step time: the
points whose window holds too few GPU monitor samples to judge the GPU (standard library only: the
Snakefile warns with it when it is parsed, rules/common/hooks.smk).

A fast GPU fills a 60-step window in under a second, and the GPU monitor samples every
train.monitor_interval_s: such a window is judged on a handful of samples (four GPM SM-activity
values on an H200). Once the smoke test has run (results/smoke/train_w<N>.json and its run folder
train_w<N>/steps.csv), a point's window is estimated as train.measure steps x the smoke test's time
per step at the nearest smaller world size (the fastest of its timed steps after the first: a
few smoke steps still warm up, and the fastest errs towards more steps needed;
scaled by the point's per-GPU batch over the smoke test's; precision and other settings are not
scaled: an estimate), at least train.measure.seconds where that is set. Fewer than
analysis.monitor.min_window_samples samples in it is a problem line naming the point; so is a
window in seconds that the point's steps cannot hold (warm-up + the steps the trainer will plan for
the seconds: steps_for_seconds below, which the trainer's window uses too), with the epochs it
needs. The workflow warns with these when it is parsed and again once the smoke tests passed
(before any grid job starts). A CPU smoke test (no GPU monitor) gives none.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

from scalestudy.plan import grid, paths, runconfig
from scalestudy.plan.runfiles import STEPS

MARGIN = 1.05  # a window planned to last min_seconds gets this much more, so that jitter does not extend it


def steps_for_seconds(seconds: float, step_s: float, steps: int) -> int:
    """The steps of a window asked for `steps` steps and at least `seconds` at `step_s` per step (plus
    MARGIN): what the trainer's SteadyWindow plans from its warm-up, and what the plan checks a run
    against."""
    return max(steps, math.ceil(seconds * MARGIN / step_s))


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
        per_step = _fastest_step(path.with_suffix("") / STEPS) or record.get("step_time_s")
        if isinstance(per_step, int | float) and per_step > 0:
            timed[world] = (float(per_step), batch)
    return timed


def _fastest_step(steps_csv: Path) -> float | None:
    """The fastest step_s of the timed steps after the first (compile, autotuning)."""
    try:
        with open(steps_csv, newline="") as handle:
            times = [float(row["step_s"]) for row in csv.DictReader(handle) if row.get("step_s")]
    except (OSError, ValueError, KeyError):
        return None
    return min(times[1:]) if len(times) > 1 else None


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
    for point, run in grid_runs(config):
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
            problems += seconds_problem(point, run, step_s, samples_per_epoch)
    return problems


def grid_runs(config: dict) -> list[tuple[grid.Point, dict]]:
    """Every grid point whose throughput is analysed (profile runs excepted), with its full run config."""
    points = [grid.baseline_point(config), *grid.scaling_points(config), *grid.sensitivity_points(config)]
    return [(point, {**runconfig.DEFAULTS, **grid.run_config(config, point)}) for point in points]


def seconds_problem(point: grid.Point, run: dict, step_s: float, samples_per_epoch: int) -> list[str]:
    """A window in seconds the point's steps cannot hold: warm-up, then the steps the trainer plans
    from the warm-up's rate (at least measure_steps, and the seconds plus MARGIN)."""
    planned = steps_for_seconds(run["measure_seconds"], step_s, run["measure_steps"])
    if planned <= run["measure_steps"]:
        return []  # the steps alone last long enough (grid.window_problems checks those)
    needed = run["measure_warmup_steps"] + planned
    problem = grid.too_few_steps(point, run, samples_per_epoch, needed)
    if problem is None:
        return []
    return [
        f"{problem} a window of {run['measure_seconds']:g} s ({run['measure_warmup_steps']} warm-up steps + "
        f"{planned} steps of {step_s * 1e3:.3g} ms, the smoke test's step time at this batch): raise its "
        "epochs or lower train.measure.seconds"
    ]
