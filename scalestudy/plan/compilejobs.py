"""The study's compile jobs (issue 51): one per compile key (scalestudy.plan.compilekeys) that at
least MIN_RUNS grid points share.

A compile job is a short training run of the key's first grid point (in the grid's order): a few
steps at that point's settings, at the key's smallest world size (one rank for `bare`, the DDP
points' smallest world size for DDP), with its own cache folder, saving what it compiled to the
key's artifacts (compile_cache_save). Every grid point of the key waits for them and loads them
(grid.run_config sets its compile_cache_load), so it pays the tracing and the load, not the
compile. A key of one grid point has no job: the job would add a job's start and exit (and its GPUs)
to save one compile, so that point compiles in its own warm-up (its run config still names the
key's artifacts; there are none, and summary.json says so). A study without compile plans none,
and its run configs do not change. Standard library only (the Snakefile imports this).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from scalestudy.plan import compilekeys, grid
from scalestudy.plan.paths import CHECKPOINTS_DIR, COMPILE_DIR, INDUCTOR_CACHE_DIR

STEPS = 2  # the first step compiles the forward and the backward; the second runs them compiled
MIN_RUNS = 2  # a compile job for a key of this many grid points or more


@dataclass(frozen=True)
class CompileJob:
    """One compile key's job: its name (the folder under results/compile/), the grid point whose
    settings it compiles, and its world size."""

    name: str
    point: grid.Point
    world_size: int
    points: int  # the grid points that load its artifacts (MIN_RUNS or more)

    @property
    def folder(self) -> str:
        return f"{COMPILE_DIR}/{self.name}"


def jobs(config: dict) -> dict[str, CompileJob]:
    """The compile job of every key of MIN_RUNS grid points or more, by name, in the grid's order
    (none without compile)."""
    found: dict[str, list[grid.Point]] = {}
    for point in grid.all_points(config):
        key = compilekeys.key_of(grid.run_config(config, point))
        if key is not None:
            found.setdefault(compilekeys.key_name(key), []).append(point)
    return {
        name: CompileJob(name, points[0], min(p.world_size for p in points), len(points))
        for name, points in found.items()
        if len(points) >= MIN_RUNS
    }


def run_config(config: dict, job: CompileJob) -> dict[str, Any]:
    """The compile job's run config: its point's, for STEPS steps at the job's world size, saving the
    artifacts; its measurement window is left unfilled (it measures nothing)."""
    point = grid.Point(job.point.stage, job.point.name, job.world_size, job.point.overrides)
    run = grid.run_config(config, point)
    per_gpu = run["per_gpu_batch"]
    run.update(
        stage="compile",
        point=job.name,
        world_size=job.world_size,
        global_batch=per_gpu * job.world_size,
        epochs=1,
        max_steps_per_epoch=STEPS,
        eval_max_batches=1,
        measure_warmup_steps=1,
        measure_steps=1,
        measure_intervals=1,
        checkpoint_dir=f"{CHECKPOINTS_DIR}/compile/{job.name}",
        checkpoint_every_steps=0,
        log_every_steps=1,
        step_timing_every=0,
        profile=None,
        inductor_cache_dir=f"{INDUCTOR_CACHE_DIR}/compile/{job.name}",
        compile_cache_save=compilekeys.artifacts_path(job.name),
    )
    run.pop("compile_cache_load", None)
    run.pop("measure_seconds", None)
    return run


def artifacts_of(config: dict, point: grid.Point, names) -> list[str]:
    """The artifacts a grid point's job waits for: its key's, where that key has a compile job
    (`names`: the jobs' names), else none."""
    run = grid.run_config(config, point)
    key = compilekeys.key_of(run)
    if key is None or compilekeys.key_name(key) not in names:
        return []
    return [run["compile_cache_load"]]
