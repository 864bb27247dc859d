"""Where and how the study's jobs run on Slurm: resources, the launch spec and the image.

Every site-specific setting is in ONE place, the `cluster:` section of the config (with
`container:` for the image and `nccl:` for the ranks' network environment); the schema
(scalestudy/plan/schema.yaml) documents each key and gives its default, docs/guide/cluster.md how they fit
together. This module turns them into:

- `train_resources(config, world_size, attempt)`: the Snakemake resources of a training job, which
  the Slurm executor plugin (>= 2.7.1) turns into sbatch options (see docs/guide/cluster.md for the map);
- `light_resources(config, attempt)`: the resources of a cheap CPU job;
- `launch_spec(config, world_size)`: what `python -m scalestudy.launch` needs to start the ranks;
- `submit_host_rules(config, rules)` (Snakemake's localrules), `container_image(config)`,
  `image_build_target(config)`.

Pure standard library (the Snakefile imports it when it parses the workflow). `python -m
scalestudy.plan.slurm_requests --configfile config/config.yaml` prints every grid point's sbatch options.
"""

from __future__ import annotations

import fnmatch
import math
import re
import shlex
from collections.abc import Iterable
from typing import Any

from scalestudy import contract
from scalestudy.plan import patterns, schema

# The resources of a training job; every call returns every key. A value of None means "not set"
# (Snakemake drops a resource whose callable returns None, so the plugin adds no option for it).
TRAIN_RESOURCE_KEYS: tuple[str, ...] = (
    "nodes",
    "tasks",
    "tasks_per_gpu",
    "cpus_per_task",
    "mem_mb",
    "runtime",
    "gres",
    "slurm_partition",
    "slurm_account",
    "qos",
    "constraint",
    "slurm_extra",
    "mpi",
)
LIGHT_RESOURCE_KEYS: tuple[str, ...] = (
    "cpus_per_task",
    "mem_mb",
    "runtime",
    "slurm_partition",
    "slurm_account",
    "qos",
)

# Slurm names (partition, account, qos, GRES type) and features, image paths and the ranks'
# environment values: no whitespace or shell syntax (the patterns and why: scalestudy.plan.patterns).
_NAME = re.compile(patterns.SLURM_NAME)
_CONSTRAINT = re.compile(patterns.SLURM_CONSTRAINT)
_PATH = re.compile(patterns.SAFE_PATH)
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ENV_VALUE = re.compile(patterns.ENV_VALUE)


# --------------------------------------------------------------------------- settings


def settings(config: dict) -> dict[str, Any]:
    """The `cluster:` section with its defaults filled in, checked; errors name the key."""
    merged = _merged(config, "cluster")
    problems = schema.value_problems("cluster", merged)  # types, ranges, the launcher's enum
    if problems:
        raise ValueError("; ".join(problems))
    _check_across(merged)
    for key in ("partition", "cpu_partition", "account", "qos", "gpu_type"):
        _check_optional(merged, key, _NAME)
    _check_optional(merged, "constraint", _CONSTRAINT)
    _check_strings(merged, "sbatch_extra")
    _check_strings(merged, "submit_host_rules")
    return merged


def _check_across(cluster: dict[str, Any]) -> None:
    """What the schema cannot say of one key alone."""
    if cluster["ranks_per_node"] is None and cluster["gpus_per_node"] == 0:
        raise ValueError("cluster.ranks_per_node must be set when cluster.gpus_per_node is 0 (CPU nodes)")
    if cluster["signal_lead_s"] >= 60 * cluster["runtime_minutes"]:
        raise ValueError(
            f"cluster.signal_lead_s={cluster['signal_lead_s']} must be shorter than "
            f"cluster.runtime_minutes={cluster['runtime_minutes']} (the signal would come at the start)"
        )


def container_settings(config: dict) -> dict[str, Any]:
    """The `container:` section with its defaults filled in, checked."""
    merged = _merged(config, "container")
    for key in ("sif", "definition", "python"):
        _check_path(merged, key)
    if merged["prebuilt"] is not None:
        _check_path(merged, "prebuilt")
    for key in ("build_args", "apptainer_args", "binds"):
        _check_strings(merged, key)
    return merged


def nccl_env(config: dict) -> dict[str, str]:
    """The `nccl:` section as environment variables (true/false -> 1/0)."""
    section = config.get("nccl") or {}
    if not isinstance(section, dict):
        raise ValueError(f"nccl must be a mapping of environment variables, got {section!r}")
    env = {}
    for name, value in section.items():
        if not isinstance(name, str) or not _ENV_NAME.match(name):
            raise ValueError(f"nccl: {name!r} is not a valid environment variable name")
        if isinstance(value, bool):
            value = int(value)
        if not isinstance(value, str | int | float):
            raise ValueError(f"nccl.{name} must be a string, number or boolean, got {value!r}")
        if isinstance(value, str) and not _ENV_VALUE.match(value):
            meaning = patterns.MEANINGS[patterns.ENV_VALUE]
            raise ValueError(f"nccl.{name} must be {meaning}, got {value!r}")
        env[name] = str(value)
    return env


def _merged(config: dict, section: str) -> dict[str, Any]:
    """A section of the config with the schema's defaults of the keys it does not give."""
    defaults = schema.defaults(section)
    given = config.get(section) or {}
    if not isinstance(given, dict):
        raise ValueError(f"{section} must be a mapping, got {given!r}")
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        raise ValueError(f"unknown {section} setting(s) {unknown}; known: {sorted(defaults)}")
    return {**defaults, **given}


def _check_optional(values: dict, key: str, pattern: re.Pattern) -> None:
    value = values[key]
    if value is not None and not (isinstance(value, str) and pattern.match(value)):
        raise ValueError(f"cluster.{key} must be null or a name like {pattern.pattern}, got {value!r}")


def _check_strings(values: dict, key: str) -> None:
    value = values[key]
    if not isinstance(value, list) or not all(isinstance(item, str) and item for item in value):
        raise ValueError(f"{key} must be a list of non-empty strings, got {value!r}")


def _check_path(values: dict, key: str) -> None:
    """A path Snakemake may put unquoted into a shell command (the image) or take for a pattern."""
    value = values[key]
    if not (isinstance(value, str) and _PATH.match(value)):
        meaning = patterns.MEANINGS[patterns.SAFE_PATH]
        raise ValueError(f"container.{key} must be {meaning}, got {value!r}")


# --------------------------------------------------------------------------- layout


def ranks_per_node(config: dict) -> int:
    """Ranks on one node: cluster.ranks_per_node, else one per GPU (cluster.gpus_per_node)."""
    return _ranks_per_node(settings(config))


def layout(config: dict, world_size: int) -> tuple[int, int]:
    """(nodes, ranks per node) of a world size: as few nodes as fit, the same ranks on each."""
    return _layout(settings(config), world_size)


def gres(config: dict, tasks_per_node: int) -> str | None:
    """The per-node GPU request ('gpu:4', 'gpu:a100:4'): one GPU per rank; None on CPU nodes."""
    return _gres(settings(config), tasks_per_node)


def _ranks_per_node(cluster: dict[str, Any]) -> int:
    return cluster["ranks_per_node"] or cluster["gpus_per_node"]


def _layout(cluster: dict[str, Any], world_size: int) -> tuple[int, int]:
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world size must be an integer >= 1, got {world_size!r}")
    per_node = _ranks_per_node(cluster)
    nodes = math.ceil(world_size / per_node)
    if world_size % nodes:
        raise ValueError(
            f"world size {world_size} does not split evenly over {nodes} nodes of at most {per_node} "
            "ranks (cluster.ranks_per_node / cluster.gpus_per_node); choose a world size that does"
        )
    return nodes, world_size // nodes


def _gres(cluster: dict[str, Any], tasks_per_node: int) -> str | None:
    if cluster["gpus_per_node"] == 0:
        return None
    if tasks_per_node > cluster["gpus_per_node"]:
        raise ValueError(
            f"cluster.ranks_per_node={tasks_per_node} exceeds cluster.gpus_per_node="
            f"{cluster['gpus_per_node']} (one GPU per rank)"
        )
    kind = f"{cluster['gpu_type']}:" if cluster["gpu_type"] else ""
    return f"gpu:{kind}{tasks_per_node}"


def _grown(base: float, growth: float, attempt: int) -> int:
    if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 1:
        raise ValueError(f"attempt must be an integer >= 1, got {attempt!r}")
    return math.ceil(base * growth ** (attempt - 1))


# --------------------------------------------------------------------------- resources


def train_resources(config: dict, world_size: int, attempt: int) -> dict[str, Any]:
    """Snakemake resources of a training job (keys: TRAIN_RESOURCE_KEYS; None = not set).

    The job runs the rule's shell once in the batch step (the `mpi` key, present for every world
    size, tells the jobstep plugin so; its value is falsy for one rank because the plugin refuses
    an MPI job with one task) and scalestudy.launch.launcher starts the ranks with srun. Wall time and
    memory grow with the attempt; the trainer checkpoints on the --signal and resumes when retried.
    """
    cluster = settings(config)
    nodes, per_node = _layout(cluster, world_size)
    runtime = min(
        _grown(cluster["runtime_minutes"], cluster["runtime_growth"], attempt), cluster["max_runtime_minutes"]
    )
    mem_mb = _grown(cluster["mem_mb_per_rank"] * per_node, cluster["mem_growth"], attempt)
    resources = {
        "nodes": nodes,
        "tasks": world_size,
        # 0: the plugin adds no --ntasks-per-gpu (it conflicts with --ntasks-per-node, and it
        # would bind each rank to one GPU, which breaks CUDA IPC/NVLink between the node's ranks).
        "tasks_per_gpu": 0,
        "cpus_per_task": cluster["cpus_per_rank"],
        "mem_mb": mem_mb,
        "runtime": runtime,
        "gres": _gres(cluster, per_node),
        "slurm_partition": cluster["partition"],
        "slurm_account": cluster["account"],
        "qos": cluster["qos"],
        "constraint": cluster["constraint"],
        "slurm_extra": slurm_extra(cluster, per_node),
        "mpi": "srun" if world_size > 1 else "",
    }
    assert tuple(resources) == TRAIN_RESOURCE_KEYS
    return resources


def slurm_extra(cluster: dict, tasks_per_node: int) -> str:
    """sbatch options the plugin has no resource for, each shell-quoted (the plugin runs a shell)."""
    options = [f"--ntasks-per-node={tasks_per_node}"]
    if cluster["signal_lead_s"]:
        # To every job step (the ranks), not the batch shell (Snakemake) -- hence no "B:".
        options.append(
            f"--signal={contract.WARNING_SIGNAL.name.removeprefix('SIG')}@{cluster['signal_lead_s']}"
        )
    if cluster["exclusive"]:
        options.append("--exclusive")
    options.extend(cluster["sbatch_extra"])
    return " ".join(shlex.quote(option) for option in options)


def light_resources(config: dict, attempt: int) -> dict[str, Any]:
    """Resources of a cheap CPU job (data preparation, tables, figures) on cluster.cpu_partition."""
    cluster = settings(config)
    resources = {
        "cpus_per_task": cluster["light_cpus"],
        "mem_mb": _grown(cluster["light_mem_mb"], cluster["mem_growth"], attempt),
        "runtime": min(
            _grown(cluster["light_runtime_minutes"], cluster["runtime_growth"], attempt),
            cluster["max_runtime_minutes"],
        ),
        "slurm_partition": cluster["cpu_partition"] or cluster["partition"],
        "slurm_account": cluster["account"],
        "qos": cluster["qos"],
    }
    assert tuple(resources) == LIGHT_RESOURCE_KEYS
    return resources


# Rules that run where Snakemake runs whatever the config says: one read of the image, the gate
# (which only lists the checks that passed), the MLflow replay (it reaches the tracking server), the
# crate (it reads Snakemake's metadata) and the comparison (the other study is where the host sees it).
ALWAYS_ON_SUBMIT_HOST = ("image_digest", "training_gate", "track", "crate", "compare")


def on_submit_host(config: dict, rule_name: str) -> bool:
    """Whether a rule runs on the submit host (Snakemake's localrule) rather than as a job."""
    patterns = settings(config)["submit_host_rules"]
    return rule_name in ALWAYS_ON_SUBMIT_HOST or any(fnmatch.fnmatchcase(rule_name, p) for p in patterns)


def submit_host_rules(
    config: dict,
    rule_names: Iterable[str],
    always: Iterable[str] = ALWAYS_ON_SUBMIT_HOST,
    optional: Iterable[str] = (),
) -> list[str]:
    """The workflow's rules that run on the submit host (Snakemake's `localrules:`): those named by
    `always` and those cluster.submit_host_rules matches, among `rule_names` (the rules defined).

    A name or pattern that matches no rule the workflow can have (`rule_names`, plus the `optional`
    rules this config leaves out) is an error naming it: a typo would otherwise send the rule to
    Slurm without a word.
    """
    defined, optional = set(rule_names), set(optional)
    known = defined | optional
    unknown = [name for name in always if name not in known]
    if unknown:
        raise ValueError(f"rules run on the submit host {unknown} are no rules of the workflow")
    chosen = set(always)
    for pattern in settings(config)["submit_host_rules"]:
        matched = fnmatch.filter(sorted(known), pattern)
        if not matched:
            raise ValueError(
                f"cluster.submit_host_rules: {pattern!r} matches no rule of the workflow "
                f"(rules: {', '.join(sorted(known))})"
            )
        chosen.update(matched)
    return sorted(chosen & defined)


# --------------------------------------------------------------------------- container


def container_image(config: dict) -> str:
    """The image every containerized job uses: container.prebuilt, else the one built here."""
    container = container_settings(config)
    return container["prebuilt"] or container["sif"]


def image_build_target(config: dict) -> str | None:
    """The .sif rules/container.smk builds, or None when a prebuilt image is configured."""
    container = container_settings(config)
    return None if container["prebuilt"] else container["sif"]


# --------------------------------------------------------------------------- launch


THREAD_POOL_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def train_device(config: dict) -> str:
    """train.device (auto, cuda or cpu), the schema's default where the config gives none."""
    return (config.get("train") or {}).get("device") or schema.defaults("train")["device"]


def uses_gpus(config: dict) -> bool:
    """Whether the study's ranks use GPUs (one each): GPU nodes (cluster.gpus_per_node > 0) and
    train.device not cpu. With device auto, a machine without GPUs still runs them on its CPU."""
    return settings(config)["gpus_per_node"] > 0 and train_device(config) != "cpu"


def launch_spec(config: dict, world_size: int, containerized: bool = False) -> dict[str, Any]:
    """The launch spec of scalestudy.launch.launcher for one grid point (docs/reference/cli.md).

    `gpus_per_node`: the GPUs the ranks of one node use, one per rank; 0 for CPU ranks (CPU nodes or
    train.device cpu). With GPUs, `device` says whether they are required (cuda) or used where the
    machine has them (auto); a CPU spec has no `device` (its JSON is as before).
    `containerized`: run each rank in the image (the workflow passes True when it runs with
    --software-deployment-method apptainer, see rules/container.smk).
    """
    cluster = settings(config)
    container = container_settings(config)
    nodes, per_node = _layout(cluster, world_size)
    gpus = uses_gpus(config)
    # Every thread pool of a rank sized to its CPUs. Snakemake exports MKL_NUM_THREADS (and
    # OMP_NUM_THREADS) = the job's threads, i.e. all ranks' CPUs: left so, two ranks on two cores ran
    # 4 MKL threads and trained 3.7x slower (27 s vs 7.4 s, measured on the demo's w2 point).
    threads = str(cluster["cpus_per_rank"])
    env = {name: threads for name in THREAD_POOL_ENV}
    env.update(nccl_env(config))
    return {
        "launcher": cluster["launcher"],
        "world_size": world_size,
        "nodes": nodes,
        "tasks_per_node": per_node,
        "cpus_per_task": cluster["cpus_per_rank"],
        "gpus_per_node": per_node if gpus else 0,
        **({"device": train_device(config)} if gpus else {}),
        "gres": _gres(cluster, per_node),
        "image": container_image(config) if containerized else None,
        "apptainer_args": list(container["apptainer_args"]),
        "binds": list(container["binds"]),
        "python": container["python"],
        "env": env,
    }
