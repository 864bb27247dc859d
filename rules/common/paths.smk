# Where the workflow writes, as Snakemake patterns: each stage's run folders (their files, logs and
# benchmarks), a grid point from a training rule's wildcards, the site check's result. The folder
# names are scalestudy.plan.paths' (scalestudy.plan.runfiles': the files inside a run folder).

import functools

from scalestudy.plan import cluster, compilejobs, grid, paths, runfiles
from scalestudy.preflight import site as sitecheck

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

# The site check (rules/sitecheck.smk): its result, which the other checks (smoke tests, system
# description, collective benchmark) wait for too, so that a wrong site fails once, with its message.
SITE_CHECK = config["site_check"]
SITE_NAME = sitecheck.site_name(cluster.settings(config)["partition"])
SITE_RESULT = f"{paths.SITE_DIR}/{{site}}.json"
SITE_CHECKED = [SITE_RESULT.format(site=SITE_NAME)] if SITE_CHECK["enabled"] else []


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


# The compile jobs (rules/compile.smk): one per compile key that several grid points share.
COMPILE_JOBS = compilejobs.jobs(config)


def compile_input(stage):
    """An input function of a stage's training rule: the artifacts of its point's compile key, where
    that key has a compile job (rules/compile.smk); else nothing (no compile, or a key of one point)."""
    return lambda wc: compilejobs.artifacts_of(config, point_of(stage, wc), COMPILE_JOBS)


def compile_world(wildcards):
    """The world size of the compile job named by the `key` wildcard."""
    return COMPILE_JOBS[wildcards.key].world_size
