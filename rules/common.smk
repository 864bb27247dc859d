# Helpers and values shared by all the rule files (grid points, run folders, params, resources,
# container, the checks training waits for and the rules that run on the submit host). The logic
# lives in the scalestudy package; these functions only adapt it to Snakemake's wildcards/attempt
# callables. A value two rule files use is defined here, never in whichever file is included first.

import functools
import json
import os
import shlex
import shutil
import time
from typing import NamedTuple

from snakemake.exceptions import WorkflowError
from snakemake.logging import logger
from snakemake.settings.types import DeploymentMethod

from scalestudy import compare as _compare
from scalestudy.launch import attempt_logs
from scalestudy.launch import container_image as imagedigest
from scalestudy.launch import gpus as _gpus
from scalestudy.launch import launcher as _launch
from scalestudy.launch import submit_retry as _submit_retry
from scalestudy.plan import arrays, cluster, grid, groups, paths, runfiles, slurm_names, windowtime, workloads
from scalestudy.preflight import site as sitecheck

# What the study trains (scalestudy.workloads), the data it reads and its unit.
WORKLOAD = workloads.of_config(config)
ARCHIVE = WORKLOAD.data.raw_path  # what fetch writes (None: a command workload brings its own data)
PACKED = WORKLOAD.data.packed_paths[:-1]  # the arrays preprocess writes (none for a command workload)
PACKED_MANIFEST = WORKLOAD.data.packed_paths[-1:]  # [manifest.json] (named input; [] for none)
# A command workload's script: every training job depends on it (a changed script re-runs them).
WORKLOAD_SCRIPT = [config["workload"]["command"]["script"]] if WORKLOAD.name == "command" else []
TRAIN_INPUTS = [*PACKED, *WORKLOAD_SCRIPT]

# The run folder of each stage's grid points, as a wildcard pattern: {point} is the point's name
# (grid.point_by_name finds it); profile keeps {world}, which its other rules use too.
STAGE_PATTERNS = {
    "baseline": f"{paths.RUNS_DIR}/baseline/default",
    "scaling": f"{paths.RUNS_DIR}/scaling/{{point}}",
    "sensitivity": f"{paths.RUNS_DIR}/sensitivity/{{point}}",
    "profile": f"{paths.RUNS_DIR}/profile/w{{world}}",
}

STAGE_POINTS = {
    stage: (lambda points_of=points_of: points_of(config)) for stage, points_of in grid.STAGES.items()
}

TABLES_DIR = paths.TABLES_DIR
# Labels say what one rank drives: a GPU, or (train.device cpu, the demo) a CPU rank.
PLOT_UNIT = "rank" if config["train"]["device"] == "cpu" else "GPU"
# The sensitivity sweep's run-config keys, in the order of the point names (grid.sensitivity_axes).
SENSITIVITY_AXES = grid.sensitivity_axes(config)


def warn_grid_points(problems, shown=5):
    """One warning per problem line of a grid point (the first `shown`, then how many more)."""
    for problem in problems[:shown]:
        logger.warning(f"warning: {problem}")
    if len(problems) > shown:
        logger.warning(f"warning: ... and {len(problems) - shown} more grid points like these")



PROFILE_WORLDS = config["profiling"]["world_sizes"]

# The software of every rule, for --sdm conda and for the linter; the image has the same pins.
SOFTWARE_ENV = "../envs/scalestudy.yaml"
APPTAINER_ENV = "../envs/apptainer.yaml"

# The container image (rules/container.smk builds it; docs/slurm.md, "The image").
CONTAINERIZED = DeploymentMethod.APPTAINER in workflow.deployment_settings.deployment_method
# The rules' `python` (issue 23, item 10): outside a container, the interpreter Snakemake runs in,
# first on the PATH its jobs inherit (a Slurm job's Snakemake reads this file again and does the
# same), so that a venv's snakemake started without activating the venv (cron, an editor) runs the
# venv's packages, not the system's. Not a params value: another venv path must not look like a
# changed job. Under --sdm apptainer each containerised job runs the image's own `python`.
# An sbatch that Slurm refuses for a submit limit (the site's MaxSubmitJobs) waits and tries again for
# cluster.submit_retry_minutes instead of failing the job (the Slurm plugin would count it as a failed
# attempt): a wrapper `sbatch` first on the PATH of the Snakemake that submits, wherever sbatch exists
# (only the Slurm executor calls it; a job's own Snakemake leaves PATH alone). docs/slurm.md, Queue limits.
SBATCH_LOG = os.path.join(paths.LOGS_DIR, "slurm", "sbatch-retries.log")  # the wrapper's waits and refusals
RUN_STARTED = time.time()
IMAGE = cluster.container_image(config)
IMAGE_BUILD = cluster.image_build_target(config)
CONTAINER = cluster.container_settings(config)


# The site check (rules/sitecheck.smk): its result, which the other checks (smoke tests, system
# description, collective benchmark) wait for too, so that a wrong site fails once, with its message.
SITE_CHECK = config["site_check"]
SITE_NAME = sitecheck.site_name(cluster.settings(config)["partition"])
SITE_RESULT = f"{paths.SITE_DIR}/{{site}}.json"
SITE_CHECKED = [SITE_RESULT.format(site=SITE_NAME)] if SITE_CHECK["enabled"] else []



def after_training_gate(wildcards):
    """An input function of the training rules: order only. Until the gate has passed once, asking
    for it makes the job wait for the checkpoint; afterwards it adds no input at all, so a check
    run again (new settings, a new site) never re-runs the grid, and a changed training setting is
    still seen by every training job (an ancient() input would hide it: Snakemake does not check
    the jobs below one that re-runs)."""
    checkpoints.training_gate.get()
    return []


def image_input():
    """Inputs of every containerized job: the image when this workflow builds it, and its digest."""
    if not CONTAINERIZED:
        return []
    return [IMAGE_BUILD, IMAGE_DIGEST] if IMAGE_BUILD else [IMAGE_DIGEST]


# Provenance (scalestudy.launch.launcher and scalestudy.provenance read these): the image, and the file with
# its sha256, which rule image_digest (container.smk) computes once per image; nothing is hashed
# here. APPTAINERENV_* survive apptainer's --cleanenv.
IMAGE_DIGEST = imagedigest.digest_path(IMAGE)


wildcard_constraints:
    world=r"[1-9]\d*",
    # A grid point's name: folders of the characters grid.NAME_PART allows (strong/fsdp-w2_r0).
    point=r"[A-Za-z0-9_.=+-]+(/[A-Za-z0-9_.=+-]+)*",


def run_outputs(stage):
    """The declared run-folder files of a stage's training rule (with wildcards)."""
    return {key: f"{STAGE_PATTERNS[stage]}/{name}" for key, name in runfiles.RUN_FILES.items()}


def run_log(stage):
    return STAGE_PATTERNS[stage].replace(paths.RUNS_DIR, paths.LOGS_DIR, 1) + ".log"


def run_benchmark(stage):
    return STAGE_PATTERNS[stage].replace(paths.RUNS_DIR, paths.BENCHMARKS_DIR, 1) + ".tsv"


def run_files(stage, filename=runfiles.SUMMARY):
    """One file of every grid point of a stage, e.g. run_files("scaling", runfiles.METRICS)."""
    return [f"{point.run_dir}/{filename}" for point in STAGE_POINTS[stage]()]


def point_name(stage, wildcards):
    """The grid point's name in a training rule's wildcards (see STAGE_PATTERNS)."""
    if stage == "baseline":
        return "default"
    if stage == "profile":
        return f"w{wildcards.world}"
    return wildcards.point


@functools.lru_cache(maxsize=None)
def stage_points_by_name(stage):
    """Cached: Snakemake asks for each job's params, threads and resources separately."""
    return grid.points_by_name(config, stage)


def point_of(stage, wildcards):
    name = point_name(stage, wildcards)
    return grid.point_by_name(config, stage, name, points=stage_points_by_name(stage))


def run_params(stage):
    """params: the run config and the launch spec as JSON, and the run folder."""
    return {
        "run": lambda wc: json.dumps(grid.run_config(config, point_of(stage, wc)), sort_keys=True),
        "launch": launch_json(lambda wc: point_of(stage, wc).world_size),
        "out_dir": lambda wc, output: os.path.dirname(output.summary),
    }


# GPUs as a scheduled resource of the local executor (docs/gpus.md). Every job whose ranks use GPUs
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
            "per rank, its own (docs/gpus.md); --resources gpu=N overrides"
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


def launch_json(world_of):
    """A params function: the launch spec of a job of world_of(wildcards) ranks, as JSON (a function,
    so that no config value in it is ever formatted as a wildcard)."""
    return lambda wc: json.dumps(
        cluster.launch_spec(config, world_of(wc), containerized=CONTAINERIZED), sort_keys=True
    )


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


def check_array_setting():
    """Refuse a --slurm-array-jobs setting before the first job is submitted (an onstart hook): the
    training rules' resources, which also check it, are made only after the preflight has run."""
    try:
        array_rules(getattr(workflow.executor_settings, "array_jobs", None))
    except arrays.ArrayError as error:
        raise WorkflowError(str(error)) from None


def check_slurm_names():
    """Under a cluster executor, before anything is submitted: the partition, account and QOS the
    config names, against the cluster's own sinfo/sacctmgr (scalestudy.plan.slurm_names)."""
    if workflow.local_exec:
        return
    findings = slurm_names.check(config)
    for warning in findings.warnings:
        logger.warning(f"warning: {warning}")
    if findings.errors:
        raise WorkflowError(
            "the cluster does not know names the config gives (nothing was submitted):\n  "
            + "\n  ".join(findings.errors)
        )


def set_aside_earlier_logs():
    """Under a cluster executor: the logs an earlier run left for the jobs about to run, renamed
    (scalestudy.launch.attempt_logs.set_aside), so a job sbatch refuses shows no earlier run's log."""
    if workflow.local_exec:
        return
    for job in workflow.dag.needrun_jobs():
        for log in job.log:
            attempt_logs.set_aside(log)


def report_sbatch_refusals():
    """The submissions sbatch refused during this run, with sbatch's own message (Snakemake reports a
    refused group job as "message: None")."""
    refusals = _submit_retry.refusals_since(SBATCH_LOG, RUN_STARTED)
    if refusals:
        logger.error("sbatch refused these submissions of this run:\n  " + "\n  ".join(refusals))




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


# Rules a config may leave out (no data to fetch or pack, no loader smoke test, a prebuilt or no image).
OPTIONAL_RULES = ("fetch", "preprocess", "smoke_io", "build_image", "image_digest", "track", "crate", "compare")


def submit_host_rules():
    """Snakemake's localrules, from one list: the Snakefile calls this after every rule file is
    included. A name or cluster.submit_host_rules pattern that matches no rule fails loudly."""
    defined = [rule.name for rule in workflow.rules]
    return cluster.submit_host_rules(config, defined, optional=OPTIONAL_RULES)


def compared_label():
    """The study this one is compared with (compare.against): compare.label, else its folder's name
    (scalestudy.compare.default_label); None without a comparison."""
    compare = config["compare"]
    if not compare["against"]:
        return None
    return compare["label"] or _compare.default_label(compare["against"])


def container_image():
    """The image CPU rules run in under --sdm apptainer (training ranks get it from launch)."""
    return cluster.container_image(config)


def analysis_json(*sections):
    """The parts of the config's analysis: section a rule uses, as JSON (a params value, so changing
    one setting re-runs only the rules that read it; the tools fill the rest with the schema's
    defaults, so a rule must name every section it reads). Returned as a params function, because
    Snakemake formats a params string for wildcards and a `{` in a setting (a name) is none."""
    chosen = {key: config["analysis"][key] for key in sections}
    if "comm_model" in chosen and chosen["comm_model"]["gpus_per_node"] is None:
        # null: the cluster's ranks per node (one place to say how many GPUs a node has)
        chosen["comm_model"] = {**chosen["comm_model"], "gpus_per_node": cluster.ranks_per_node(config)}
    text = json.dumps(chosen, sort_keys=True)
    return lambda wildcards: text



def table_report(name, category, subcategory=None):
    """A table shown in the report, with its caption report/table_<stem>.rst."""
    return report(
        f"{TABLES_DIR}/{name}",
        caption=f"../report/table_{name.rsplit('.', 1)[0]}.rst",
        category=category,
        subcategory=subcategory,
    )


class Figure(NamedTuple):
    category: str  # the report's category
    command: str  # the `python -m scalestudy.plots` subcommand
    inputs: dict  # {option name: file(s)}
    extra: str = ""  # further arguments
    sections: tuple = ()  # the analysis: sections it reads (see analysis_json)


def input_args(names):
    """A params function: `--<name> <files>` for each named input, shell-quoted.

    (A params value rather than a shell template, because the rules below are made in a loop and a
    shell: template would see the loop variables of the last iteration when it runs.)
    """

    def args(wildcards, input):
        parts = []
        for name in names:
            files = getattr(input, name)
            files = [files] if isinstance(files, str) else list(files)
            parts.append(" ".join([f"--{name}", *map(shlex.quote, files)]))
        return " ".join(parts)

    return args


def fetch_source():
    """fetch's --source: what the study's data.source means for its workload's data."""
    source = config["data"]["source"]
    if WORKLOAD.data is workloads.TEXT:
        return "synthetic-text" if source == "synthetic" else "text"
    return source


def fetch_args(wildcards):
    """The fetch command's arguments; every value is quoted by Snakemake's :q in the shell."""
    data = config["data"]
    if data["source"] == "synthetic" and WORKLOAD.data is workloads.TEXT:
        synthetic = data["synthetic_text"]
        return ["--text-bytes", str(synthetic["bytes"]), "--seed", str(synthetic["seed"])]
    if data["source"] == "synthetic":
        synthetic = data["synthetic"]
        return [
            "--train-per-class", synthetic["train_per_class"],
            "--test-per-class", synthetic["test_per_class"],
            "--seed", synthetic["seed"],
        ]
    args = ["--url", data["url"], "--md5", data["md5"], "--size", data["size_bytes"]]
    args += ["--timeout", data["timeout_s"], "--retries", data["retries"]]
    if data["sha256"]:
        args += ["--sha256", data["sha256"]]
    for mirror in data["mirrors"]:
        args += ["--mirror", mirror]
    return [str(arg) for arg in args]


# --- shared by the rule files, each registering by one explicit call (none reads another's globals) --
#
# provide(kind, paths): the outputs a rule file makes for the study, by kind ("analysis", "figures",
# "paper", ...); provided(*kinds) reads them as an input function, evaluated once every rule file is
# included, so the include order does not matter. gate_training_on(path): a check every training
# job waits for (rules/gate.smk). on_start(hook), on_exit(hook): run by the Snakefile's onstart and
# onsuccess/onerror, in the order registered (not in dry runs, not inside a job).
_PROVIDED: dict[str, list] = {}
_TRAINING_GATES: list = []
_HOOKS: dict[str, list] = {"start": [], "exit": []}


def provide(kind, paths):
    _PROVIDED.setdefault(kind, []).extend(paths)


def provided(*kinds, keep=lambda path: True):
    """An input function: the outputs registered under `kinds` (those `keep` accepts)."""
    return lambda wildcards: [path for kind in kinds for path in _PROVIDED.get(kind, []) if keep(path)]


def gate_training_on(path):
    _TRAINING_GATES.append(path)


def training_gates():
    return list(_TRAINING_GATES)


def on_start(hook):
    _HOOKS["start"].append(hook)


def on_exit(hook):
    _HOOKS["exit"].append(hook)


def run_hooks(when):
    for hook in _HOOKS[when]:
        hook()


for _path in SITE_CHECKED:  # the site check's result: every training job waits for it
    gate_training_on(_path)
for _hook in (check_array_setting, check_slurm_names, set_aside_earlier_logs):
    on_start(_hook)
on_exit(report_sbatch_refusals)


def prepare_workflow():
    """What the workflow changes beyond its rules, called once by the Snakefile after every rule
    file is included: the warnings about the grid, the environment the jobs inherit (the rules'
    `python`, the sbatch wrapper, the image's variables) and the GPUs the local executor schedules."""
    global LOCAL_GPUS
    # Grid points too short for train.measure's window: their throughput would be marked, not used.
    warn_grid_points(grid.window_problems(config))
    # Windows that would hold fewer GPU monitor samples than analysis.monitor.min_window_samples at
    # the smoke test's step time (once it ran on a GPU): their GPU would be judged on a handful.
    warn_grid_points(windowtime.short_window_problems(config))
    # The rules' `python` (issue 23, item 10): outside a container, the interpreter Snakemake runs
    # in, first on the PATH its jobs inherit (a Slurm job's Snakemake reads the workflow again and
    # does the same), so that a venv's snakemake started without activating the venv (cron, an
    # editor) runs the venv's packages, not the system's. Not a params value: another venv path must
    # not look like a changed job. Under --sdm apptainer each containerised job runs the image's.
    if not CONTAINERIZED:
        _launch.put_interpreter_first()
    # An sbatch that Slurm refuses for a submit limit (the site's MaxSubmitJobs) waits and tries
    # again for cluster.submit_retry_minutes instead of failing the job: a wrapper `sbatch` first on
    # the PATH of the Snakemake that submits, wherever sbatch exists (only the Slurm executor calls
    # it; a job's own Snakemake leaves PATH alone). docs/slurm.md, Queue limits.
    if workflow.is_main_process and shutil.which("sbatch"):
        wrapper = _submit_retry.install(
            os.path.join(".snakemake", "scalestudy-sbatch"),
            patience_minutes=cluster.settings(config)["submit_retry_minutes"],
            log_path=SBATCH_LOG,
        )
        _submit_retry.put_first(os.environ, wrapper)
    # Provenance (scalestudy.launch.launcher and scalestudy.provenance read these): the image, and
    # the file with its sha256 (rule image_digest); APPTAINERENV_* survive apptainer's --cleanenv.
    if CONTAINERIZED:
        for name, value in {
            imagedigest.IMAGE_ENV: os.path.abspath(IMAGE),
            imagedigest.DIGEST_ENV: os.path.abspath(IMAGE_DIGEST),
        }.items():
            os.environ[name] = os.environ[f"APPTAINERENV_{name}"] = value
    LOCAL_GPUS = schedule_local_gpus()
