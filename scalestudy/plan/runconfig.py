"""The trainer's run config: its keys, their defaults and allowed values, and its validation.

A run config is one JSON object (the grid writes it: scalestudy.plan.grid.run_config); the trainer fills
the keys it is not given from DEFAULTS and refuses, before any training starts, a config whose
values it cannot run, with one message that names every bad key (RunConfigError, exit code
EXIT_BAD_CONFIG). RULES holds each key's type and range, read from the schema (schema.yaml: a study
setting's own entry, or $defs/run_config); this module adds only the checks across keys.
"""

from __future__ import annotations

import argparse
import copy
import functools
import importlib
import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from scalestudy.plan import schema, workloads

log = logging.getLogger("scalestudy.train")

REQUIRED = ("data_dir", "checkpoint_dir", "world_size", "per_gpu_batch", "global_batch", "epochs")

# config["train"][key] too, written into a run config only where it differs from its default
OPTIONAL_TRAIN_KEYS = (
    *("parallelism", "reshard_after_forward", "optimizer", "grad_clip"),
    *("optimizer_impl", "compile_mode"),  # how the step runs: scalestudy.train.optim, trainer.build_model
    "micro_batch",  # gradient accumulation: scalestudy.train.accumulation
    "cudnn_benchmark",  # cuDNN autotuning: scalestudy.train.process.process_settings
    "cudnn_benchmark_limit",  # how many algorithms it times: process_settings
    "cuda_graphs_required",  # a skipped CUDA graph fails the run: scalestudy.train.compiled
    "min_step_s",  # a step's least duration, for tests of signals on small jobs: bookkeeping.hold_step
)
# config["train"]["measure"][key] -> the run config's key (the steady-state window, scalestudy.train.steady)
MEASURE_KEYS = {
    "warmup_steps": "measure_warmup_steps",
    "steps": "measure_steps",
    "intervals": "measure_intervals",
    "seconds": "measure_seconds",  # absent unless set: other studies' run configs stay as they were
}
# config["model"][key] of one value, over the workloads (their specs' model_keys; the ResNet's)
MODEL_KEYS = workloads.model_keys()


class _FromSchema(Mapping):
    """A mapping built from the schema on first use (the Snakefile imports this module before any
    config exists, and reading the schema costs a YAML parse); values deep-copied with `copied`."""

    def __init__(self, build, copied: bool = False):
        self._build, self._copied = build, copied

    @functools.cached_property
    def _values(self) -> dict[str, Any]:
        return self._build()

    def __getitem__(self, key: str) -> Any:
        value = self._values[key]
        return copy.deepcopy(value) if self._copied else value

    def __iter__(self):
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)


def train_keys() -> tuple[str, ...]:
    """config["train"][key] every run config holds: the schema's train section but the optional
    keys and the measurement window's section (MEASURE_KEYS)."""
    return tuple(
        key for key in schema.node("train")["properties"] if key not in (*OPTIONAL_TRAIN_KEYS, "measure")
    )


def _study_keys() -> dict[str, tuple[str, ...]]:
    return {
        **{key: ("train", key) for key in (*train_keys(), *OPTIONAL_TRAIN_KEYS) if key not in REQUIRED},
        **{run_key: ("train", "measure", key) for key, run_key in MEASURE_KEYS.items()},
        **{key: ("model", key) for key in MODEL_KEYS},
    }


# The run-config keys that are study settings, and where the study config holds each: their defaults
# are the schema's (scalestudy/plan/schema.yaml, the one home of every default), whoever starts the
# trainer (Snakemake, `python -m scalestudy.train`, the benchmark). The grid copies them from the config.
STUDY_KEYS: Mapping[str, tuple[str, ...]] = _FromSchema(_study_keys)
# The run config's own keys, which no study setting gives: labels the trainer records, its own choices.
OWN_DEFAULTS: dict[str, Any] = {
    "stage": None,  # stage, point, mode, repeat, nodes: recorded, not used
    "point": None,
    "mode": None,
    "repeat": 0,
    "nodes": 1,
    "norm": "batch",  # not in the grid's run config (yet): "frozen" serves the equivalence test
    "profile": None,
    "inductor_cache_dir": None,  # TORCHINDUCTOR_CACHE_DIR with compile, unless the environment sets it
    "compile_cache_load": None,  # the compile key's artifacts to load (scalestudy.train.compiled)
    "compile_cache_save": None,  # where a compile job saves its artifacts
    "keep_checkpoints": False,  # leave a finished run's checkpoints (its weights); never resumed
    "workload": workloads.DEFAULT,  # what is trained (scalestudy.workloads)
    # a workload's section: its model's (gpt: scalestudy.workloads.gpt.model.config_from), its own
    # (command: the script, args and sample_unit)
    **{key: None for key in workloads.run_sections()},
}


def schema_default(path: tuple[str, ...]) -> Any:
    """The default schema.yaml gives the study setting at `path` ("train", "measure", "steps")."""
    return copy.deepcopy(schema.node(*path).get("default"))


def _defaults() -> dict[str, Any]:
    """Every key the trainer fills when a run config leaves it out, the study settings' from the schema."""
    return {**OWN_DEFAULTS, **{key: schema_default(path) for key, path in STUDY_KEYS.items()}}


DEFAULTS: Mapping[str, Any] = _FromSchema(_defaults, copied=True)


def _rules() -> dict[str, schema.Rule]:
    own = schema.definition("run_config")["properties"]
    study = {key: schema.node(*path) for key, path in {**STUDY_KEYS, "epochs": ("train", "epochs")}.items()}
    # the workload's name: the study's workload.name, one of scalestudy.plan.workloads.WORKLOADS
    study["workload"] = schema.node("workload", "name")
    return {key: schema.rule_of(node) for key, node in {**own, **study}.items()}


# What each run-config key accepts: the schema's entry of the study setting it copies (STUDY_KEYS),
# or $defs/run_config's for the trainer's own keys. JSON's true/false never pass as numbers.
RULES: Mapping[str, schema.Rule] = _FromSchema(_rules)


class RunConfigError(ValueError):
    """The run config (or the environment it runs in) is unusable; the message names the key."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command line every rank program takes: the run config (JSON or a file) and the run folder."""
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--run-config-json", help="the run config as a JSON object")
    source.add_argument("--run-config", type=Path, help="a JSON file holding the run config")
    parser.add_argument("--out-dir", type=Path, required=True, help="the run folder (rank 0 writes it)")
    parser.add_argument("--log-level", default="INFO")


def load_run_config(
    args: argparse.Namespace, validated: bool = True
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the run config as given, the same with defaults filled in and, with `validated`, checked)."""
    source = f"run config file {args.run_config}" if args.run_config else "run config"
    try:
        text = args.run_config.read_bytes().decode() if args.run_config else args.run_config_json
        given = json.loads(text)
    except OSError as error:
        raise RunConfigError(f"{source}: cannot be read: {error.strerror or error}") from None
    except UnicodeDecodeError as error:
        raise RunConfigError(f"{source} is not UTF-8 text: {error}") from None
    except json.JSONDecodeError as error:
        raise RunConfigError(f"{source} is not valid JSON: {error}") from None
    if not isinstance(given, dict):
        raise RunConfigError(f"{source} must be a JSON object, got {type(given).__name__}")
    config = {**DEFAULTS, **given}
    if validated:
        unknown = sorted(set(given) - set(DEFAULTS) - set(REQUIRED))
        if unknown:
            log.warning("run config keys this trainer does not know (ignored): %s", ", ".join(unknown))
        validate(config)
    return given, config


def validate(config: dict[str, Any]) -> None:
    """RunConfigError naming every key of a filled run config the trainer cannot run with."""
    needed = required(config)
    problems = [f"{key} is required" for key in needed if config.get(key) is None]
    problems += [
        f"{key}={config[key]!r} must be {rule.describe()}"
        for key, rule in RULES.items()
        if key in config and not (key in needed and config[key] is None) and not rule.accepts(config[key])
    ]
    section = _run_section(config)
    if section is not None:
        problems += section.problems(config.get(config["workload"]))
    if problems:  # the checks across keys assume the values have their types
        raise RunConfigError("run config: " + "; ".join(problems))
    if config["global_batch"] != config["per_gpu_batch"] * config["world_size"]:
        problems.append(
            f"global_batch={config['global_batch']} is not per_gpu_batch={config['per_gpu_batch']} x "
            f"world_size={config['world_size']}"
        )
    problems += micro_batch_problems(config["micro_batch"], config["per_gpu_batch"])
    problems += ignored_problems(config)
    if config["nesterov"] and not config["momentum"] > 0:
        problems.append(f"nesterov=true needs momentum > 0, got momentum={config['momentum']!r}")
    problems += _profile_problems(config["profile"])
    if problems:
        raise RunConfigError("run config: " + "; ".join(problems))
    if section is not None:  # the section filled in: what the workload's runner reads
        config[config["workload"]] = section.filled(config[config["workload"]])


def micro_batch_problems(micro_batch: int | None, per_gpu_batch: int) -> list[str]:
    """micro_batch (gradient accumulation's chunk, scalestudy.train.accumulation) divides per_gpu_batch."""
    if micro_batch is None or per_gpu_batch % micro_batch == 0:
        return []
    return [
        f"micro_batch={micro_batch} does not divide per_gpu_batch={per_gpu_batch}: "
        "use a divisor of it, or null (the whole per-GPU batch in one pass)"
    ]


PROFILE_TOOLS = ("none", "torch", "nsys")  # what the trainer runs (scalestudy.train.ranges)


def check_profile(profile: dict[str, Any] | None) -> tuple[str, int, int]:
    """(tool, start_step, steps) of a run config's `profile`; ValueError naming what is wrong."""
    if not profile:
        return "none", 0, 0
    tool = profile.get("tool") or "none"
    if tool not in PROFILE_TOOLS:
        hint = (
            " (scalestudy.profiling.run resolves 'auto' before the trainer starts)" if tool == "auto" else ""
        )
        raise ValueError(f"profile tool must be one of {PROFILE_TOOLS} or null, got tool={tool!r}{hint}")
    start_step, steps = profile.get("start_step", 0), profile.get("steps", 0)
    window_ok = isinstance(start_step, int) and isinstance(steps, int) and start_step >= 0 and steps >= 1
    if tool != "none" and not window_ok:
        raise ValueError(f"profile window needs start_step >= 0 and steps >= 1, got {profile}")
    return tool, start_step, steps


def _profile_problems(profile: dict[str, Any] | None) -> list[str]:
    window = {key: (profile or {}).get(key) for key in ("start_step", "steps")}
    flags = [f"profile.{key}={value!r} must be an integer" for key, value in window.items() if value is True]
    try:
        check_profile(profile)
    except ValueError as error:
        return [*flags, str(error)]
    return flags


# The command workload's section: the user's script, its arguments and the unit it counts in.
def _workload(config: dict[str, Any]) -> workloads.WorkloadSpec | None:
    name = config.get("workload") or workloads.DEFAULT
    return workloads.WORKLOADS.get(name) if isinstance(name, str) else None


def ignored_problems(config: dict[str, Any]) -> list[str]:
    """A setting the workload's runs would ignore (its spec's `ignores`: the command workload's
    micro_batch) that is set."""
    spec = _workload(config)
    return [
        f"{key}={config[key]!r} is ignored by the {spec.name} workload ({why}): leave it null"
        for key, why in (spec.ignores if spec else ())
        if config.get(key) is not None
    ]


def _run_section(config: dict[str, Any]):
    """The module that checks and fills the workload's own run-config section (the command
    workload's: scalestudy.workloads.command.section), or None."""
    spec = _workload(config)
    return importlib.import_module(spec.run_section) if spec and spec.run_section else None


def required(config: dict[str, Any]) -> tuple[str, ...]:
    """The keys a run config must give: a workload without packed data (the command workload: its
    script reads its own) needs no data_dir."""
    spec = _workload(config)
    no_data = spec is not None and not spec.data.packed_files
    return tuple(key for key in REQUIRED if not (key == "data_dir" and no_data))


def check_locations(config: dict[str, Any], out_dir: str | os.PathLike) -> None:
    """The folders the run reads and writes, checked before anything starts (RunConfigError)."""
    problems = []
    data_dir = Path(config["data_dir"])
    if not data_dir.is_dir():
        problems.append(f"data_dir {data_dir} is not a folder" + ("" if data_dir.exists() else " (missing)"))
    for what, folder in (("checkpoint_dir", config["checkpoint_dir"]), ("--out-dir", out_dir)):
        problem = _writable_folder_problem(Path(folder))
        if problem:
            problems.append(f"{what} {folder}: {problem}")
    if problems:
        raise RunConfigError("; ".join(problems))


def _writable_folder_problem(folder: Path) -> str | None:
    """Why `folder` cannot be (created as) a folder this process writes in, or None."""
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return "is a file, not a folder" if existing == folder else f"{existing} is a file, not a folder"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{existing} is not writable"
    return None
