"""Compile keys (issue 51): the runs that compile the same graphs share one compile job.

torch.compile's graphs of a training step depend on what the step's tensors look like and on what
wraps the model, not on the point's seed, epochs or world size beyond one rank: the key of a run
config is its workload and model settings (width, channels_last; the LM's section), the per-GPU
batch and micro-batch, the precision, the compile mode, the device, the loader (the inputs'
layout), deterministic and norm, and the wrapper: `bare` at world size 1, DDP with its bucket size
above (DDPOptimizer splits the graph at the buckets), FSDP2 with its resharding. A run config
without compile has no key. The software (torch, Triton, the GPU) is not known when the workflow
is planned: the compile job records it beside the artifacts and a run loads them only where it
matches its own (scalestudy.train.compiled); Inductor's own cache keys include it too.

key_name gives the key a readable, unique folder name under results/compile/; artifacts_path the
artifacts its compile job writes and every run of the key loads (the run config's
compile_cache_load). The jobs themselves: scalestudy.plan.compilejobs. Standard library only.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from scalestudy.plan import runconfig, workloads
from scalestudy.plan.paths import COMPILE_DIR

ARTIFACTS = "artifacts.bin"
# run-config keys of every key (the workload's model keys, compile excepted, come on top)
KEY_FIELDS = (
    "workload",
    "device",
    "precision",
    "per_gpu_batch",
    "micro_batch",
    "compile_mode",
    "loader",
    "deterministic",
    "norm",
)


def wrapper(run: dict[str, Any]) -> str:
    """What wraps the compiled model: bare (one DDP rank), DDP with its buckets, FSDP2."""
    value = {**runconfig.DEFAULTS, **run}
    if value["parallelism"] == "fsdp":
        return f"fsdp-reshard{'on' if value['reshard_after_forward'] else 'off'}"
    if value["world_size"] == 1:
        return "bare"
    return f"ddp-bucket{float(value['bucket_cap_mb']):g}"


def key_of(run: dict[str, Any]) -> dict[str, Any] | None:
    """The compile key of a run config (keys it leaves out at their defaults filled in), None
    without compile."""
    value = {**runconfig.DEFAULTS, **run}
    if not value.get("compile"):
        return None
    model_keys = workloads.get(value["workload"]).model_keys
    key = {name: value[name] for name in (*KEY_FIELDS, *model_keys) if name != "compile"}
    key["wrapper"] = wrapper(run)
    return key


def key_name(key: dict[str, Any]) -> str:
    """A folder name for the key: its batch, precision, mode and wrapper, and a hash of the whole key."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:10]
    parts = (f"bs{key['per_gpu_batch']}", str(key["precision"]), str(key["compile_mode"]), key["wrapper"])
    return "_".join([*parts, digest])


def artifacts_path(name: str) -> str:
    return f"{COMPILE_DIR}/{name}/{ARTIFACTS}"
