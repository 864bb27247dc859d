# Helpers shared by every stage: grid points, run folders, params, resources, container.
# The logic lives in the scalestudy package; these functions only adapt it to Snakemake's
# wildcards/attempt callables.

import json
import os

from scalestudy import cluster, grid

PACKED_DIR = grid.PACKED_DIR
PACKED = [
    f"{PACKED_DIR}/{split}_{kind}.npy" for split in ("train", "test") for kind in ("images", "labels")
]
PACKED_MANIFEST = f"{PACKED_DIR}/manifest.json"

# Files every training run writes into its run folder (docs/architecture.md).
RUN_FILES = {
    "summary": "summary.json",
    "metrics": "metrics.csv",
    "steps": "steps.csv",
    "gpu_monitor": "gpu_monitor.csv",
}

# The run folder of each stage's grid points, as a wildcard pattern.
STAGE_PATTERNS = {
    "baseline": f"{grid.RUNS_DIR}/baseline/default",
    "scaling": f"{grid.RUNS_DIR}/scaling/{{mode}}/w{{world}}_r{{repeat}}",
    "sensitivity": f"{grid.RUNS_DIR}/sensitivity/{{precision}}/bs{{batch}}_bucket{{bucket}}",
    "profile": f"{grid.RUNS_DIR}/profile/w{{world}}",
}

STAGE_POINTS = {
    "baseline": lambda: [grid.baseline_point(config)],
    "scaling": lambda: grid.scaling_points(config),
    "sensitivity": lambda: grid.sensitivity_points(config),
    "profile": lambda: grid.profile_points(config),
}

PROFILE_WORLDS = config["profiling"]["world_sizes"]

# The software of every rule, for --sdm conda and for the linter; the image has the same pins.
SOFTWARE_ENV = "../envs/scalestudy.yaml"


wildcard_constraints:
    mode="strong|weak",
    world=r"[1-9]\d*",
    repeat=r"\d+",
    precision="fp32|fp16|bf16",
    batch=r"[1-9]\d*",
    # The canonical form grid.format_number writes: 1, 25, 2.5 (never 1.0 or 01).
    bucket=r"(0|[1-9]\d*)(\.\d*[1-9])?",


def run_outputs(stage):
    """The declared run-folder files of a stage's training rule (with wildcards)."""
    return {key: f"{STAGE_PATTERNS[stage]}/{name}" for key, name in RUN_FILES.items()}


def run_log(stage):
    return STAGE_PATTERNS[stage].replace(grid.RUNS_DIR, "results/logs", 1) + ".log"


def run_benchmark(stage):
    return STAGE_PATTERNS[stage].replace(grid.RUNS_DIR, "results/benchmarks", 1) + ".tsv"


def run_files(stage, filename="summary.json"):
    """One file of every grid point of a stage, e.g. run_files("scaling", "metrics.csv")."""
    return [f"{point.run_dir}/{filename}" for point in STAGE_POINTS[stage]()]


def point_of(stage, wildcards):
    return grid.point_from_wildcards(config, stage, wildcards)


def run_params(stage):
    """params: the run config and the launch spec as JSON, and the run folder."""
    return {
        "run": lambda wc: json.dumps(grid.run_config(config, point_of(stage, wc)), sort_keys=True),
        "launch": lambda wc: json.dumps(
            cluster.launch_spec(config, point_of(stage, wc).world_size), sort_keys=True
        ),
        "out_dir": lambda wc, output: os.path.dirname(output.summary),
    }


def train_threads(stage):
    """One core per rank on the local executor (Snakemake caps it at --cores)."""
    return lambda wc: point_of(stage, wc).world_size


def train_resources(stage):
    """Slurm resources of a training job, from the grid point's world size and the attempt."""
    return {
        key: (
            lambda wc, attempt, key=key: cluster.train_resources(
                config, point_of(stage, wc).world_size, attempt
            )[key]
        )
        for key in cluster.TRAIN_RESOURCE_KEYS
    }


def light_resources():
    """Slurm resources of a cheap CPU job (data preparation, tables, figures)."""
    return {
        key: (lambda wc, attempt, key=key: cluster.light_resources(config, attempt)[key])
        for key in cluster.LIGHT_RESOURCE_KEYS
    }


def on_submit_host(rule_name):
    return cluster.on_submit_host(config, rule_name)


def container_image():
    """The image CPU rules run in under --sdm apptainer (training ranks get it from launch)."""
    return cluster.container_image(config)
