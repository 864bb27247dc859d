# Values and params helpers shared by the rule files (what the study trains and reads, the container,
# the inputs and params of the jobs). The other helpers of rules/common/ by role (paths.smk: where the
# workflow writes; resources.smk: threads, GPUs and Slurm resources; report.smk: tables and figures;
# hooks.smk: what rule files register and what runs at start and exit), which the Snakefile includes
# right after this file, in that order. The logic lives in the scalestudy package; these functions
# only adapt it to Snakemake's wildcards/attempt callables. A value two rule files use is defined
# here or in rules/common/, never in whichever rule file is included first.

import json
import os

from snakemake.settings.types import DeploymentMethod

from scalestudy import commandline as _commandline
from scalestudy import compare as _compare
from scalestudy.launch import container_image as imagedigest
from scalestudy.plan import cluster, grid, workloads

# What the study trains (scalestudy.workloads), the data it reads and its unit.
WORKLOAD = workloads.of_config(config)
ARCHIVE = WORKLOAD.data.raw_path  # what fetch writes (None: a command workload brings its own data)
PACKED = WORKLOAD.data.packed_paths[:-1]  # the arrays preprocess writes (none for a command workload)
PACKED_MANIFEST = WORKLOAD.data.packed_paths[-1:]  # [manifest.json] (named input; [] for none)
# A command workload's script: every training job depends on it (a changed script re-runs them).
WORKLOAD_SCRIPT = [config["workload"][WORKLOAD.name][key] for key in WORKLOAD.section_files]
TRAIN_INPUTS = [*PACKED, *WORKLOAD_SCRIPT]

# Labels say what one rank drives: a GPU, or (train.device cpu, the demo) a CPU rank.
PLOT_UNIT = "rank" if config["train"]["device"] == "cpu" else "GPU"
# The sensitivity sweep's run-config keys, in the order of the point names (grid.sensitivity_axes).
SENSITIVITY_AXES = grid.sensitivity_axes(config)

PROFILE_WORLDS = config["profiling"]["world_sizes"]

# The software of every rule, for --sdm conda and for the linter; the image has the same pins.
SOFTWARE_ENV = "../envs/scalestudy.yaml"
APPTAINER_ENV = "../envs/apptainer.yaml"

# The container image (rules/container.smk builds it; docs/guide/cluster.md, "The image").
CONTAINERIZED = DeploymentMethod.APPTAINER in workflow.deployment_settings.deployment_method
IMAGE = cluster.container_image(config)
IMAGE_BUILD = cluster.image_build_target(config)
CONTAINER = cluster.container_settings(config)
# The file with the image's sha256, which rule image_digest (container.smk) computes once per image
# (nothing is hashed here); prepare_workflow (rules/common/hooks.smk) hands both to the jobs.
IMAGE_DIGEST = imagedigest.digest_path(IMAGE)


def after_training_gate(wildcards):
    """An input function of the training rules: order only. Until the gate has passed once, asking
    for it makes the job wait for the checkpoint; afterwards it adds no input at all, so a check
    run again (new settings, a new site) never re-runs the grid, and a changed training setting is
    still seen by every training job (an ancient() input would hide it: Snakemake does not check
    the jobs below one that re-runs)."""
    checkpoints.training_gate.get()
    warn_short_windows(after_smoke=True)
    return []


def image_input():
    """Inputs of every containerized job: the image when this workflow builds it, and its digest."""
    if not CONTAINERIZED:
        return []
    return [IMAGE_BUILD, IMAGE_DIGEST] if IMAGE_BUILD else [IMAGE_DIGEST]


def run_params(stage):
    """params: the run config and the launch spec as JSON, and the run folder."""
    return {
        "run": lambda wc: json.dumps(grid.run_config(config, point_of(stage, wc)), sort_keys=True),
        "launch": launch_json(lambda wc: point_of(stage, wc).world_size),
        "out_dir": lambda wc, output: os.path.dirname(output.summary),
    }


def launch_json(world_of):
    """A params function: the launch spec of a job of world_of(wildcards) ranks, as JSON (a function,
    so that no config value in it is ever formatted as a wildcard)."""
    return lambda wc: json.dumps(
        cluster.launch_spec(config, world_of(wc), containerized=CONTAINERIZED), sort_keys=True
    )


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
    """The parts of the config's analysis: section a rule uses, as "@FILE" of JSON named by its
    content (scalestudy.commandline.json_file: a params value, so changing one setting re-runs only
    the rules that read it; the tools fill the rest with the schema's defaults, so a rule must name
    every section it reads). Returned as a params function, because Snakemake formats a params
    string for wildcards and a `{` in a setting (a name) is none."""
    chosen = {key: config["analysis"][key] for key in sections}
    if "comm_model" in chosen and chosen["comm_model"]["gpus_per_node"] is None:
        # null: the cluster's ranks per node (one place to say how many GPUs a node has)
        chosen["comm_model"] = {**chosen["comm_model"], "gpus_per_node": cluster.ranks_per_node(config)}
    return lambda wildcards: _commandline.json_file(chosen, "analysis")


def fetch_command():
    """The fetch job of the workload's data kind (scalestudy.plan.workload_spec.DataKind): its shell
    command, and its --source and arguments (every value quoted by Snakemake's :q in the shell)."""
    source, args = WORKLOAD.data.fetch_command(config)
    shell = (
        f"python -m {WORKLOAD.data.fetch} --source {{params.source:q}} --out {{output.archive:q}}"
        " {params.args:q} > {log:q} 2>&1"
    )
    return shell, source, args


def preprocess_command():
    """The preprocess job of the workload's data kind: its shell command (the raw file as the input
    named after the kind's raw_option, each option a params entry) and the options."""
    data = WORKLOAD.data
    options = data.preprocess_command(config)
    shell = f"python -m {data.preprocess} --{data.raw_option} {{input.{data.raw_option}:q}}"
    shell += " --out-dir {params.out_dir:q}"
    shell += "".join(f" --{name.replace('_', '-')} {{params.{name}:q}}" for name in options)
    return shell + " > {log:q} 2>&1", options
