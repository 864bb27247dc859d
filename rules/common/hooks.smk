# What the files in rules/ register, and what runs around the jobs. Registries: the outputs each
# provides, the checks training waits for, the hooks run at start (array setting, Slurm names,
# earlier logs) and exit (sbatch refusals). And the workflow's own setup: Snakemake's localrules and
# prepare_workflow, which the Snakefile calls once every rule file is included, as it calls
# run_hooks() from its onstart/onsuccess/onerror.

import os
import shutil
import time

from snakemake.exceptions import WorkflowError
from snakemake.logging import logger

from scalestudy.launch import attempt_logs
from scalestudy.launch import container_image as imagedigest
from scalestudy.launch import launcher as _launch
from scalestudy.launch import submit_retry as _submit_retry
from scalestudy.plan import arrays, cluster, grid, paths, slurm_names, windowtime

# An sbatch that Slurm refuses for a submit limit waits and tries again (prepare_workflow); the
# wrapper's waits and refusals go to this log, which report_sbatch_refusals reads at exit.
SBATCH_LOG = os.path.join(paths.LOGS_DIR, "slurm", "sbatch-retries.log")  # the wrapper's waits and refusals
RUN_STARTED = time.time()


def warn_grid_points(problems, shown=5):
    """One warning per problem line of a grid point (the first `shown`, then how many more)."""
    for problem in problems[:shown]:
        logger.warning(f"warning: {problem}")
    if len(problems) > shown:
        logger.warning(f"warning: ... and {len(problems) - shown} more grid points like these")


_WINDOWS_WARNED = []  # not empty once the window warnings were given


def warn_short_windows(after_smoke=False):
    """The grid points whose windows the smoke tests' step time shows too short (windowtime): when
    the workflow is parsed if a smoke test has timed a step, else once the smoke tests passed."""
    if _WINDOWS_WARNED or not (after_smoke or windowtime.smoke_step_times()):
        return
    _WINDOWS_WARNED.append(True)
    warn_grid_points(windowtime.short_window_problems(config))


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


# Rules a config may leave out (no data to fetch or pack, no loader smoke test, a prebuilt or no image).
OPTIONAL_RULES = (
    *("fetch", "preprocess", "smoke_io", "build_image", "image_digest"),
    *("track", "crate", "compare"),
)


def submit_host_rules():
    """Snakemake's localrules, from one list: the Snakefile calls this after every rule file is
    included. A name or cluster.submit_host_rules pattern that matches no rule fails loudly."""
    defined = [rule.name for rule in workflow.rules]
    return cluster.submit_host_rules(config, defined, optional=OPTIONAL_RULES)


# --- shared by the rule files, each registering by one explicit call (none reads another's globals) --
#
# provide(kind, paths): the outputs a rule file makes for the study, by kind ("analysis", "figures",
# "paper", ...); provided(*kinds) reads them as an input function, which Snakemake evaluates once all
# the rule files are included, so the order in which they register does not matter. (A rule file
# that names another file's rule, rules.X, does depend on the include order: the Snakefile states it.)
# gate_training_on(path): a check every training job waits for (rules/gate.smk). on_start(hook),
# on_exit(hook): run by the Snakefile's onstart and onsuccess/onerror, in the order registered (not in
# dry runs, not inside a job).
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
    # the smoke test's step time (once it ran on a GPU): their GPU would be judged on a handful; and
    # windows in seconds the points' steps cannot hold. Again once the smoke tests passed.
    warn_short_windows()
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
    # it; a job's own Snakemake leaves PATH alone). docs/guide/cluster.md, Queue limits.
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
