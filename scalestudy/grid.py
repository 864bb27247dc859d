"""The study's grid points, and the run config of each.

A grid point is named by its run folder under results/runs/ (see docs/architecture.md). Its run
config holds only what changes the run: one sensitivity value's change touches only the points that
carry it, so Snakemake re-runs only those (and what depends on them).

Pure standard library: the Snakefile imports this when it parses the workflow.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from scalestudy import cluster

RUNS_DIR = "results/runs"
CHECKPOINTS_DIR = "results/checkpoints"
PACKED_DIR = "results/data/packed"
INDUCTOR_CACHE_DIR = "results/inductor-cache"  # torch.compile's cache, shared by every run

# Keys copied from config["train"] into every run config.
TRAIN_KEYS = (
    "epochs",
    "max_steps_per_epoch",
    "eval_max_batches",
    "lr",
    "base_batch",
    "lr_scaling",
    "warmup_epochs",
    "momentum",
    "nesterov",
    "weight_decay",
    "label_smoothing",
    "precision",
    "bucket_cap_mb",
    "comm_hook",
    "loader",
    "num_workers",
    "device",
    "backend",
    "seed",
    "deterministic",
    "checkpoint_every_steps",
    "target_accuracy",
    "step_timing_every",
    "log_every_steps",
    "pg_timeout_s",
    "monitor_interval_s",
)
MODEL_KEYS = ("width", "channels_last", "compile")
# config["train"]["measure"] -> the run config's keys (the steady-state window, scalestudy.steady)
MEASURE_KEYS = {
    "warmup_steps": "measure_warmup_steps",
    "steps": "measure_steps",
    "intervals": "measure_intervals",
}


@dataclass(frozen=True)
class Point:
    """One training run of the study: its stage, its name inside the stage and its settings."""

    stage: str
    name: str
    world_size: int
    overrides: tuple[tuple[str, Any], ...] = ()

    @property
    def run_dir(self) -> str:
        return f"{RUNS_DIR}/{self.stage}/{self.name}"

    @property
    def checkpoint_dir(self) -> str:
        return f"{CHECKPOINTS_DIR}/{self.stage}/{self.name}"


def format_number(value: float) -> str:
    """1.0 -> '1', 2.5 -> '2.5': the form a number takes in a path."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def baseline_point(config: dict) -> Point:
    base = config["baseline"]
    overrides = {
        "per_gpu_batch": base["per_gpu_batch"],
        "global_batch": base["per_gpu_batch"],
        "precision": base["precision"],
        "loader": base["loader"],
        "channels_last": base["channels_last"],
    }
    return Point("baseline", "default", 1, tuple(overrides.items()))


def scaling_point(config: dict, mode: str, world: int, repeat: int) -> Point:
    scaling = config["scaling"]
    if mode == "strong":
        global_batch = scaling["strong_global_batch"]
        if global_batch % world:
            raise ValueError(
                f"scaling.strong_global_batch={global_batch} does not split evenly over {world} ranks"
            )
        per_gpu = global_batch // world
    elif mode == "weak":
        per_gpu = scaling["weak_per_gpu_batch"]
        global_batch = per_gpu * world
    else:
        raise ValueError(f"unknown scaling mode {mode!r} (strong or weak)")
    overrides = {
        "mode": mode,
        "per_gpu_batch": per_gpu,
        "global_batch": global_batch,
        "seed": config["train"]["seed"] + repeat,
        "repeat": repeat,
    }
    return Point("scaling", f"{mode}/w{world}_r{repeat}", world, tuple(overrides.items()))


def sensitivity_point(config: dict, precision: str, batch: int, bucket: float) -> Point:
    world = config["sensitivity"]["world_size"]
    overrides = {
        "precision": precision,
        "per_gpu_batch": batch,
        "global_batch": batch * world,
        "bucket_cap_mb": bucket,
        "epochs": config["sensitivity"]["epochs"],
    }
    name = f"{precision}/bs{batch}_bucket{format_number(bucket)}"
    return Point("sensitivity", name, world, tuple(overrides.items()))


def profile_point(config: dict, world: int) -> Point:
    profiling = config["profiling"]
    per_gpu = profiling["per_gpu_batch"]
    # The run only has to reach the end of the profiling window (plus one step to close it): one
    # short epoch, or as many whole epochs as that takes where an epoch is shorter (large N).
    needed = profiling["start_step"] + profiling["steps"] + 1
    per_epoch = train_images(config) // world // per_gpu
    epochs = 1 if per_epoch >= needed else math.ceil(needed / max(per_epoch, 1))
    overrides = {
        "per_gpu_batch": per_gpu,
        "global_batch": per_gpu * world,
        "epochs": epochs,
        "max_steps_per_epoch": needed if epochs == 1 else None,
        "eval_max_batches": 1,
        "profile": {
            "tool": profiling["tool"],
            "start_step": profiling["start_step"],
            "steps": profiling["steps"],
        },
    }
    return Point("profile", f"w{world}", world, tuple(overrides.items()))


def scaling_points(config: dict) -> list[Point]:
    scaling = config["scaling"]
    return [
        scaling_point(config, mode, world, repeat)
        for mode in scaling["modes"]
        for world in scaling["world_sizes"]
        for repeat in range(scaling["repeats"])
    ]


def sensitivity_points(config: dict) -> list[Point]:
    sweep = config["sensitivity"]
    return [
        sensitivity_point(config, precision, batch, bucket)
        for precision in sweep["precision"]
        for batch in sweep["per_gpu_batch"]
        for bucket in sweep["bucket_cap_mb"]
    ]


def profile_points(config: dict) -> list[Point]:
    return [profile_point(config, world) for world in config["profiling"]["world_sizes"]]


def all_points(config: dict) -> list[Point]:
    return [
        baseline_point(config),
        *scaling_points(config),
        *sensitivity_points(config),
        *profile_points(config),
    ]


def run_config(config: dict, point: Point) -> dict[str, Any]:
    """The trainer's run config for one grid point (see docs/architecture.md)."""
    run: dict[str, Any] = {key: config["train"][key] for key in TRAIN_KEYS}
    run.update({key: config["model"][key] for key in MODEL_KEYS})
    measure = config["train"].get("measure", {})
    run.update({run_key: measure[key] for key, run_key in MEASURE_KEYS.items() if key in measure})
    if config["model"]["compile"]:
        run["inductor_cache_dir"] = INDUCTOR_CACHE_DIR
    run.update(
        stage=point.stage,
        point=point.name,
        data_dir=PACKED_DIR,
        checkpoint_dir=point.checkpoint_dir,
        world_size=point.world_size,
        # The layout Slurm gets (cluster.ranks_per_node, else one rank per GPU; CPU nodes too): the
        # trainer checks its ranks' hosts against it.
        nodes=cluster.layout(config, point.world_size)[0],
        mode=None,
        repeat=0,
        profile=None,
    )
    run.update(dict(point.overrides))
    return run


def train_images(config: dict) -> int:
    """Training images per epoch: CIFAR-10's 50,000, or the synthetic archive's."""
    data = config["data"]
    if data["source"] == "synthetic":
        return 10 * data.get("synthetic", {}).get("train_per_class", 5000)
    return 50_000


def window_problems(config: dict) -> list[str]:
    """One line per grid point whose run has fewer steps than train.measure needs (warm-up +
    window), naming the point. Profile runs are left out: they stop after the profiled steps and
    their throughput is not analysed."""
    images = train_images(config)
    problems = []
    for point in [baseline_point(config), *scaling_points(config), *sensitivity_points(config)]:
        run = run_config(config, point)
        per_epoch = images // run["world_size"] // run["per_gpu_batch"]
        if run.get("max_steps_per_epoch") is not None:
            per_epoch = min(per_epoch, run["max_steps_per_epoch"])
        needed = run.get("measure_warmup_steps", 0) + run.get("measure_steps", 0)
        total = per_epoch * run["epochs"]
        if total < needed:
            problems.append(
                f"{point.run_dir}: {run['epochs']} epochs x {per_epoch} steps = {total} steps cannot fill "
                f"the measurement window of {needed} (train.measure warmup_steps + steps): raise its epochs"
            )
    return problems


def point_from_wildcards(config: dict, stage: str, wildcards: Any) -> Point:
    """The Point behind a rule's wildcards (the inverse of the run-folder paths)."""
    if stage == "baseline":
        return baseline_point(config)
    if stage == "scaling":
        return scaling_point(config, wildcards.mode, int(wildcards.world), int(wildcards.repeat))
    if stage == "sensitivity":
        return sensitivity_point(config, wildcards.precision, int(wildcards.batch), float(wildcards.bucket))
    if stage == "profile":
        return profile_point(config, int(wildcards.world))
    raise ValueError(f"unknown stage {stage!r}")
