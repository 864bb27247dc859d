"""The study's grid points, and the run config of each.

A grid point is named by its run folder under results/runs/ (see docs/reference/files.md). Its run
config holds only what changes the run: one sensitivity value's change touches only the points that
carry it, so Snakemake re-runs only those (and what depends on them).

Pure standard library: the Snakefile imports this when it parses the workflow.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from scalestudy.plan import cluster, compilekeys, runconfig, schema, workloads
from scalestudy.plan.paths import CHECKPOINTS_DIR, INDUCTOR_CACHE_DIR, PACKED_DIR, RUNS_DIR

# Keys a run config holds only where they differ from the trainer's defaults (runconfig.DEFAULTS): a
# study that does not use them keeps its run configs byte for byte, so none of its results is re-run.
OMITTED_AT_DEFAULT = ("workload", *runconfig.OPTIONAL_TRAIN_KEYS, *workloads.run_sections())
# model.gpt keys whose null means "the preset's" (scalestudy.workloads.gpt.model.config_from): left
# out of the run config so that the preset fills them. A null vocab_size stays: the tokenizer's.
GPT_PRESET_KEYS = ("layers", "heads", "d_model", "seq_len")

# Run-config keys a sensitivity axis may not set: the grid, the stage or the study's workload sets them.
NOT_AXES = (
    "stage",
    "point",
    "mode",
    "repeat",
    "nodes",
    "world_size",
    "global_batch",
    "epochs",
    "data_dir",
    "checkpoint_dir",
    "profile",
    "inductor_cache_dir",
    "workload",
    *workloads.run_sections(),  # a workload's sections (gpt, command)
)
# How a sensitivity axis appears in its points' names: prefix + value (other keys: "<key>-").
AXIS_PREFIXES = {"per_gpu_batch": "bs", "bucket_cap_mb": "bucket"}
# bucket_cap_mb values go into the run config as floats, as the sweep's names were parsed before
# (existing results keep their run configs).
FLOAT_AXES = ("bucket_cap_mb",)
NAME_PART = re.compile(r"[A-Za-z0-9_.=+-]+")
# What no parallelism means: a scaling point's name without a parallelism prefix, and a row of a
# table written before FSDP existed (no parallelism column, or an empty cell), are DDP.
DEFAULT_PARALLELISM = "ddp"


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


def format_value(value: Any) -> str:
    """A setting's value as it appears in a point's name: 1.0 -> '1', True -> 'true', None -> 'null'."""
    if isinstance(value, bool):
        return str(value).lower()
    if value is None:
        return "null"
    if isinstance(value, int | float):
        return format_number(value)
    return str(value)


def is_name_part(text: str) -> bool:
    """Whether `text` can be one folder of a point's name (no path syntax, nothing a shell reads)."""
    return bool(NAME_PART.fullmatch(text)) and text not in (".", "..")


def baseline_point(config: dict) -> Point:
    base = config["baseline"]
    overrides = {
        "per_gpu_batch": base["per_gpu_batch"],
        "global_batch": base["per_gpu_batch"],
        "precision": base["precision"],
        "loader": base["loader"],
        "channels_last": base["channels_last"],
        "compile": base.get("compile") or schema.defaults("baseline")["compile"],  # a raw config too
    }
    model_keys = workloads.of_config(config).model_keys
    for key in ("channels_last", "compile"):  # model settings of the workloads that have them
        if key not in model_keys:
            del overrides[key]
    if base.get("epochs") is not None:
        overrides["epochs"] = base["epochs"]
    return Point("baseline", "default", 1, tuple(overrides.items()))


def scaling_point(
    config: dict, mode: str, world: int, repeat: int, parallelism: str = DEFAULT_PARALLELISM
) -> Point:
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
        "parallelism": parallelism,
    }
    prefix = "" if parallelism == DEFAULT_PARALLELISM else f"{parallelism}-"
    return Point("scaling", f"{mode}/{prefix}w{world}_r{repeat}", world, tuple(overrides.items()))


# The order of the axes in a point's name: these first (the default sweep's fp32/bs16_bucket1), then
# the other keys alphabetically. Not the config's order: a tool that rewrites the YAML with sorted
# keys must not rename (and so re-run) every point.
NAME_ORDER = ("precision", "per_gpu_batch", "bucket_cap_mb")


def axis_rank(key: str) -> tuple[int, str]:
    return (NAME_ORDER.index(key) if key in NAME_ORDER else len(NAME_ORDER), key)


def sensitivity_axes(config: dict) -> list[str]:
    """The sweep's run-config keys in NAME_ORDER: the order of the names, the table's columns and
    the heatmap's axes, whatever order the config lists them in."""
    return sorted(config["sensitivity"]["axes"], key=axis_rank)


def sensitivity_name(values: dict[str, Any]) -> str:
    """The point's name: `<prefix><value>` of each axis (precision's bare value), in NAME_ORDER; the
    first is a folder, the others are joined by '_' (the default axes: fp32/bs16_bucket1)."""
    labels = [
        format_value(value)
        if key == "precision"
        else f"{AXIS_PREFIXES.get(key, f'{key}-')}{format_value(value)}"
        for key, value in sorted(values.items(), key=lambda item: axis_rank(item[0]))
    ]
    return "/".join([labels[0], "_".join(labels[1:])]) if len(labels) > 1 else labels[0]


def sensitivity_point(config: dict, values: dict[str, Any]) -> Point:
    """The sweep point of one value per axis ({run-config key: value}, in the axes' order)."""
    sweep = config["sensitivity"]
    world = sweep["world_size"]
    values = {key: float(value) if key in FLOAT_AXES else value for key, value in values.items()}
    overrides = {**values, "epochs": sweep["epochs"]}
    if "per_gpu_batch" in values:
        overrides["global_batch"] = values["per_gpu_batch"] * world
    return Point("sensitivity", sensitivity_name(values), world, tuple(overrides.items()))


def profile_point(config: dict, world: int) -> Point:
    profiling = config["profiling"]
    per_gpu = profiling["per_gpu_batch"]
    # The run only has to reach the end of the profiling window (plus one step to close it): one
    # short epoch, or as many whole epochs as that takes where an epoch is shorter (large N). An
    # epoch of unknown length (known only after preprocessing) is taken to be long enough.
    needed = profiling["start_step"] + profiling["steps"] + 1
    samples = samples_per_epoch(config)
    per_epoch = needed if samples is None else samples // world // per_gpu
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
        scaling_point(config, mode, world, repeat, parallelism)
        for mode in scaling["modes"]
        for parallelism in scaling.get("parallelism") or schema.defaults("scaling")["parallelism"]
        for world in scaling["world_sizes"]
        for repeat in range(scaling["repeats"])
    ]


def sensitivity_points(config: dict) -> list[Point]:
    """The product of the axes' values (the first axis of sensitivity_axes varies slowest)."""
    axes = {key: config["sensitivity"]["axes"][key] for key in sensitivity_axes(config)}
    return [
        sensitivity_point(config, dict(zip(axes, values, strict=True)))
        for values in itertools.product(*axes.values())
    ]


def profile_points(config: dict) -> list[Point]:
    return [profile_point(config, world) for world in config["profiling"]["world_sizes"]]


STAGES: dict[str, Callable[[dict], list[Point]]] = {
    "baseline": lambda config: [baseline_point(config)],
    "scaling": scaling_points,
    "sensitivity": sensitivity_points,
    "profile": profile_points,
}


def all_points(config: dict) -> list[Point]:
    return [point for points_of in STAGES.values() for point in points_of(config)]


def largest_world_size(config: dict) -> int:
    """The largest world size of any grid point (the shape the preflight jobs take)."""
    return max(point.world_size for point in all_points(config))


def points_by_name(config: dict, stage: str) -> dict[str, Point]:
    """The grid points of `stage` by name."""
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}: one of {', '.join(STAGES)}")
    return {point.name: point for point in STAGES[stage](config)}


def point_by_name(config: dict, stage: str, name: str, points: dict[str, Point] | None = None) -> Point:
    """The grid point of `stage` named `name` (its run folder below results/runs/<stage>/);
    `points`: the stage's points_by_name, where the caller keeps them (a large grid's jobs)."""
    points = points_by_name(config, stage) if points is None else points
    try:
        return points[name]
    except KeyError:
        shown = ", ".join(list(points)[:4]) + (", ..." if len(points) > 4 else "")
        raise ValueError(f"stage {stage} has no grid point {name!r} in this config ({shown})") from None


def run_config(config: dict, point: Point) -> dict[str, Any]:
    """The trainer's run config for one grid point (see docs/reference/files.md)."""
    workload = workloads.of_config(config)
    run: dict[str, Any] = {key: config["train"][key] for key in runconfig.train_keys()}
    run.update({key: _model_value(config, key, workload) for key in workload.model_keys})
    measure = config["train"].get("measure", {})
    measured = runconfig.MEASURE_KEYS.items()
    run.update({run_key: measure[key] for key, run_key in measured if measure.get(key) is not None})
    run.update(
        {key: config["train"].get(key, runconfig.DEFAULTS[key]) for key in runconfig.OPTIONAL_TRAIN_KEYS}
    )
    run["workload"] = workload.name
    if workload.run_section:  # the workload's own section (the command workload's script)
        run[workload.name] = dict((config.get("workload") or {}).get(workload.name) or {})
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
    for key in OMITTED_AT_DEFAULT:
        if key in run and _same(run[key], runconfig.DEFAULTS[key]):
            del run[key]
    if run.get("compile"):  # its own cache folder, loaded with its compile key's artifacts
        run["inductor_cache_dir"] = f"{INDUCTOR_CACHE_DIR}/{point.stage}/{point.name}"
        run["compile_cache_load"] = compilekeys.artifacts_path(compilekeys.key_name(compilekeys.key_of(run)))
    return run


def _model_value(config: dict, key: str, workload: workloads.WorkloadSpec) -> Any:
    if key not in workload.model_sections:
        return config["model"][key]
    section = config["model"].get(key) or {}
    return {
        name: value for name, value in section.items() if value is not None or name not in GPT_PRESET_KEYS
    }


def _same(value: Any, default: Any) -> bool:
    return type(value) is type(default) and value == default


def samples_per_epoch(config: dict) -> int | None:
    """Training samples per epoch, in what per_gpu_batch counts, as the workload's spec tells them
    (CIFAR-10's images, the LM's sequences of a synthetic corpus); None where only preprocessing or
    the user's script can tell (a downloaded corpus, the command workload)."""
    return workloads.of_config(config).epoch_samples(config)


def window_problems(config: dict) -> list[str]:
    """One line per grid point whose run has fewer steps than train.measure needs (warm-up +
    window), naming the point and the epochs it needs. Profile runs are left out: they stop after the
    profiled steps and their throughput is not analysed; so are workloads whose epoch length is not
    known yet."""
    samples = samples_per_epoch(config)
    if samples is None:
        return []
    problems = []
    for point in [baseline_point(config), *scaling_points(config), *sensitivity_points(config)]:
        run = run_config(config, point)
        needed = run["measure_warmup_steps"] + run["measure_steps"]
        problem = too_few_steps(point, run, samples, needed)
        if problem:
            problems.append(
                f"{problem} the measurement window of {needed} (train.measure warmup_steps + steps)"
            )
    return problems


def steps_per_epoch(run: dict, samples: int) -> int:
    """A run's optimizer steps per epoch over `samples` training samples (max_steps_per_epoch too)."""
    per_epoch = samples // run["world_size"] // run["per_gpu_batch"]
    if run.get("max_steps_per_epoch") is not None:
        per_epoch = min(per_epoch, run["max_steps_per_epoch"])
    return per_epoch


def epochs_key(point: Point) -> str:
    """The config key that sets a grid point's epochs."""
    if point.stage == "baseline" and "epochs" in dict(point.overrides):
        return "baseline.epochs"
    return "sensitivity.epochs" if point.stage == "sensitivity" else "train.epochs"


def too_few_steps(point: Point, run: dict, samples: int, needed: int) -> str | None:
    """The start of a problem line if the point's steps are fewer than `needed`, with the epochs it
    needs ("...: E epochs x S steps = T steps (needs N epochs, <key>) cannot fill"); else None."""
    per_epoch = steps_per_epoch(run, samples)
    total = per_epoch * run["epochs"]
    if total >= needed:
        return None
    epochs = math.ceil(needed / per_epoch) if per_epoch else None
    need = f"needs {epochs} epochs, {epochs_key(point)}" if epochs else "an epoch holds no step"
    return f"{point.run_dir}: {run['epochs']} epochs x {per_epoch} steps = {total} steps ({need}) cannot fill"
