"""The trainer's run config: its keys, their defaults and allowed values, and its validation.

A run config is one JSON object (the grid writes it: scalestudy.grid.run_config); the trainer fills
the keys it is not given from DEFAULTS and refuses, before any training starts, a config whose
values it cannot run, with one message that names every bad key (RunConfigError, exit code
EXIT_BAD_CONFIG).
"""

from __future__ import annotations

import argparse
import json
import logging
from typing import Any

from scalestudy import model
from scalestudy.ranges import check_profile

log = logging.getLogger("scalestudy.train")

REQUIRED = ("data_dir", "checkpoint_dir", "world_size", "per_gpu_batch", "global_batch", "epochs")
DEFAULTS: dict[str, Any] = {
    "stage": None,  # stage, point, mode, repeat, nodes: recorded, not used
    "point": None,
    "mode": None,
    "repeat": 0,
    "nodes": 1,
    "max_steps_per_epoch": None,
    "eval_max_batches": None,
    "lr": 0.1,
    "base_batch": 128,
    "lr_scaling": "linear",
    "warmup_epochs": 0,
    "momentum": 0.9,
    "weight_decay": 0.0005,
    "nesterov": True,
    "label_smoothing": 0.0,
    "precision": "fp32",
    "bucket_cap_mb": 25,
    "comm_hook": "none",
    "loader": "tensor",
    "num_workers": 2,
    "device": "auto",
    "backend": "auto",
    "width": 64,
    "norm": "batch",  # not in the grid's run config (yet): "frozen" serves the equivalence test
    "channels_last": False,
    "compile": False,
    "seed": 0,
    "deterministic": False,
    "checkpoint_every_steps": 200,
    "target_accuracy": 0.9,
    "step_timing_every": 10,
    "log_every_steps": 20,
    "pg_timeout_s": 600,
    "monitor_interval_s": 1.0,
    "profile": None,
}
CHOICES = {
    "lr_scaling": ("linear", "sqrt", "none"),
    "precision": ("fp32", "fp16", "bf16"),
    "comm_hook": ("none", "fp16", "bf16"),
    "loader": ("tensor", "dataloader"),
    "norm": model.NORMS,
}
POSITIVE_INTS = ("world_size", "per_gpu_batch", "global_batch", "epochs", "base_batch", "width")


class RunConfigError(ValueError):
    """The run config (or the environment it runs in) is unusable; the message names the key."""


def load_run_config(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the run config as given, the same with defaults filled in and validated)."""
    text = args.run_config.read_text() if args.run_config else args.run_config_json
    try:
        given = json.loads(text)
    except json.JSONDecodeError as error:
        raise RunConfigError(f"run config is not valid JSON: {error}") from None
    if not isinstance(given, dict):
        raise RunConfigError(f"run config must be a JSON object, got {type(given).__name__}")
    unknown = sorted(set(given) - set(DEFAULTS) - set(REQUIRED))
    if unknown:
        log.warning("run config keys this trainer does not know (ignored): %s", ", ".join(unknown))
    config = {**DEFAULTS, **given}
    validate(config)
    return given, config


def validate(config: dict[str, Any]) -> None:
    problems = [f"{key} is required" for key in REQUIRED if config.get(key) is None]
    problems += [
        f"{key}={config[key]!r} is not one of {allowed}"
        for key, allowed in CHOICES.items()
        if config[key] not in allowed
    ]
    problems += [
        f"{key}={config[key]!r} must be a positive integer"
        for key in POSITIVE_INTS
        if config.get(key) is not None and (not isinstance(config[key], int) or config[key] < 1)
    ]
    if not problems and config["global_batch"] != config["per_gpu_batch"] * config["world_size"]:
        problems.append(
            f"global_batch={config['global_batch']} is not per_gpu_batch={config['per_gpu_batch']} x "
            f"world_size={config['world_size']}"
        )
    if config["nesterov"] and not config["momentum"] > 0:
        problems.append(f"nesterov=true needs momentum > 0, got momentum={config['momentum']!r}")
    try:
        check_profile(config["profile"])
    except ValueError as error:
        problems.append(str(error))
    if problems:
        raise RunConfigError("run config: " + "; ".join(problems))
