# What a job asks for: threads, the local executor's `gpu` resource, and Slurm resources (training
# jobs, job-array tasks, light CPU jobs, the short jobs' groups). Reads point_of (rules/common/paths.smk);
# LOCAL_GPUS is set by prepare_workflow (rules/common/hooks.smk).

import functools
import os

from snakemake.logging import logger

from scalestudy.launch import gpus as _gpus
from scalestudy.plan import arrays, cluster, grid, groups


# GPUs as a scheduled resource of the local executor (docs/guide/gpu.md). Every job whose ranks use GPUs
# declares `gpu` = its ranks (one GPU each), and the workflow limits the sum to the GPUs of this
# machine: NVML's, within CUDA_VISIBLE_DEVICES, unless `--resources gpu=N` says otherwise. The
# launcher then holds the job's own GPUs by a lock per GPU (scalestudy.launch.gpus), also against
# another Snakemake on this machine. Under the Slurm executor (which has --jobs, hence nodes) or
# inside a Slurm allocation, Slurm binds the GPUs: no `gpu` resource (the Slurm plugin would turn it
# into --gpus=N beside the gres the jobs already ask for).
def schedule_local_gpus():
    """The GPUs the local executor schedules (registered as the global `gpu` resource unless the
    command line gives one), with one log line saying how many and from where; 0: none scheduled."""
    if workflow.nodes is not None or os.environ.get("SLURM_JOB_ID") or not cluster.uses_gpus(config):
        return 0
    if "gpu" in workflow.global_resources:
        count = int(workflow.global_resources["gpu"].value or 0)
        where = f"--resources gpu={count}"
    else:
        offer = _gpus.offered(os.environ)
        count, where = len(offer.gpus), offer.note
        if count:
            workflow.register_resource("gpu", count)
    if not workflow.is_main_process:
        return count
    device = cluster.train_device(config)
    if count:
        logger.info(
            f"scalestudy: the local executor schedules {count} GPU(s) ({where}): each GPU job gets one "
            "per rank, its own (docs/guide/gpu.md); --resources gpu=N overrides"
        )
        largest = grid.largest_world_size(config)
        if largest > count:
            logger.warning(
                f"warning: the study's largest job has {largest} ranks, one GPU each, but {count} GPU(s) "
                f"are scheduled here: such jobs stop at once (exit 2); world sizes up to {count} run here"
            )
    elif device == "cuda":
        logger.warning(
            f"warning: train.device is cuda but this machine offers no GPU ({where}): every GPU job "
            "will stop at once (exit 2). Run the study under Slurm (profiles/slurm), or set train.device"
            " auto (the CPU here) or cpu"
        )
    else:
        logger.info(f"scalestudy: no GPU on this machine ({where}): train.device auto, CPU ranks")
    return count


LOCAL_GPUS = 0  # the GPUs the local executor schedules: set by prepare_workflow()


def gpu_resource(world_of):
    """resources: gpu= of a job of world_of(wildcards) ranks, one GPU each, where the local executor
    schedules GPUs (None elsewhere: Snakemake drops it). Capped at the GPUs scheduled, so that a job
    larger than the machine runs alone and its launcher stops it, naming both numbers."""
    return lambda wc: min(world_of(wc), LOCAL_GPUS) if LOCAL_GPUS else None


def rank_threads(world_of):
    """threads: of a job of world_of(wildcards) ranks: one core per rank (CPU ranks; Snakemake caps
    it at --cores). With GPUs scheduled here, the job's share of the cores in proportion to its
    share of the GPUs: GPU jobs that have their GPUs never wait for cores, and light jobs never
    crowd the cores of a running measurement (e.g. 1 GPU and 16 cores: every core to that job)."""

    def threads(wc):
        world = world_of(wc)
        if not LOCAL_GPUS:
            return world
        return max(1, workflow.cores * min(world, LOCAL_GPUS) // LOCAL_GPUS)

    return threads


def train_threads(stage):
    """rank_threads of a stage's training job."""
    return rank_threads(lambda wc: point_of(stage, wc).world_size)


@functools.lru_cache(maxsize=None)
def train_resources_of(world_size, attempt):
    """Cached: Snakemake asks once per resource key and job, and a grid has thousands of jobs."""
    return cluster.train_resources(config, world_size, attempt)


def world_resources(world_of):
    """Slurm resources of a job shaped like a training job of world_of(wildcards) ranks."""
    return {
        key: (lambda wc, attempt, key=key: train_resources_of(world_of(wc), attempt)[key])
        for key in cluster.TRAIN_RESOURCE_KEYS
    }


@functools.lru_cache(maxsize=None)
def array_rules(setting):
    """The training rules the Slurm plugin's --slurm-array-jobs makes arrays; a setting that would put
    points of different shapes into one array, or more points than --jobs, stops the run
    (scalestudy.plan.arrays)."""
    per_timespan = getattr(workflow.scheduling_settings.max_jobs_per_timespan, "max_jobs", None)
    chunk = getattr(workflow.executor_settings, "array_limit", None)  # the profile's slurm-array-limit
    chunk = int(chunk) if chunk else None
    return arrays.check_setting(config, setting, workflow.resource_settings.nodes, per_timespan, chunk)


def is_array_task(rule_name):
    """Jobs of the named rule are (or run inside) job-array tasks, decided when jobs are made,
    after Snakemake has its executor settings; inside the task, SLURM_ARRAY_TASK_ID says so."""
    if os.environ.get("SLURM_ARRAY_TASK_ID"):
        return True
    return rule_name in array_rules(getattr(workflow.executor_settings, "array_jobs", None))


@functools.lru_cache(maxsize=None)
def point_resources(rule_name, world_size, attempt):
    if is_array_task(rule_name):
        return arrays.array_train_resources(config, world_size, attempt)  # no `mpi`: dropped
    return train_resources_of(world_size, attempt)


def train_resources(stage):
    """Slurm resources of a training job, from the grid point's world size and the attempt (the
    one-task shape of an array task where the rule is an array); and the attempt itself, for the
    launcher's per-attempt log (a resource, not a param: a param would make a point that needed a
    retry look changed to the next run)."""
    rule_name, world_of = f"{stage}_run", lambda wc: point_of(stage, wc).world_size
    return {
        **{
            key: (lambda wc, attempt, key=key: point_resources(rule_name, world_of(wc), attempt).get(key))
            for key in cluster.TRAIN_RESOURCE_KEYS
        },
        "attempt": lambda wc, attempt: attempt,
        "gpu": gpu_resource(world_of),
    }


def light_resources():
    """Slurm resources of a cheap CPU job (data preparation, tables, figures)."""
    return {
        key: (lambda wc, attempt, key=key: cluster.light_resources(config, attempt)[key])
        for key in cluster.LIGHT_RESOURCE_KEYS
    }


def groups_active():
    """The short jobs go into groups (scalestudy.plan.groups): jobs are submitted and the profile
    gives the `grouped` slot (`--resources grouped=0`: every job on its own)."""
    return groups.active(not workflow.local_exec, workflow.global_resources)


def short_job_group(rule_name):
    """A `group:` function: the rule's group of short jobs where groups are active, else none."""
    name = groups.group_of(rule_name)
    return lambda wildcards: name if groups_active() else None


@functools.lru_cache(maxsize=None)
def preflight_resources_of(runtime, attempt):
    """Cached like train_resources_of: Snakemake asks once per resource key and job."""
    return groups.preflight_resources(config, runtime, attempt)


def grouped_resources(rule_name, own):
    """Resources of a member of a short-job group, its `own` ({key: callable(wc, attempt)}) where
    groups are inactive, the group's shape (with its own wall time) where they are active."""
    preflight = groups.group_of(rule_name) == groups.PREFLIGHT

    def pick(key):
        def value(wildcards, attempt):
            if not groups_active():
                return own[key](wildcards, attempt) if key in own else None
            if preflight:
                runtime = own["runtime"](wildcards, attempt)
                return preflight_resources_of(runtime, attempt).get(key)
            return groups.summary_resources(config, attempt).get(key)

        return value

    return {key: pick(key) for key in groups.RESOURCE_KEYS}
