"""The Slurm job a process belongs to, and the attempt of the Snakemake job that started it.

Inside the rule's shell the Slurm jobstep plugin has removed the allocation's variables, and in a step
srun started SLURM_JOB_NAME is the step's program: the launcher (scalestudy.launch.launcher) reads the
job's record with `scontrol show job` in the batch step and passes it to the ranks (SLURM_JOB_ENV),
which may run in an image without scontrol; scalestudy.provenance records it with every result.
Standard library only.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from typing import Any

# Set by scalestudy.launch.launcher in a Slurm job's batch step: the job as `scontrol show job` describes it
# (JSON), and the attempt (Snakemake's retry count, from the rule; scalestudy.launch.attempt_logs).
SLURM_JOB_ENV = "SCALESTUDY_SLURM_JOB"
ATTEMPT_ENV = "SCALESTUDY_ATTEMPT"

SLURM_VARIABLES = (
    "SLURM_JOB_ID",
    "SLURM_JOB_NAME",
    "SLURM_JOB_NODELIST",
    "SLURM_JOB_NUM_NODES",
    "SLURM_NTASKS",
    "SLURM_JOB_PARTITION",
    "SLURM_JOB_ACCOUNT",
    "SLURM_CLUSTER_NAME",
    "SLURM_RESTART_COUNT",
    # the srun step the process runs in (one per point inside one allocation, profiles/slurm-allocation)
    "SLURM_STEP_ID",
    # a job array's task (scalestudy.plan.arrays): SLURM_JOB_ID is the task's own id
    "SLURM_ARRAY_JOB_ID",
    "SLURM_ARRAY_TASK_ID",
)


# `scontrol show job` fields -> slurm_state keys. Inside the rule's shell the Slurm jobstep plugin
# has removed the allocation's variables (SLURM_JOB_NUM_NODES, SLURM_JOB_ACCOUNT, ...), and in a
# step srun started SLURM_JOB_NAME is the step's program ("python"): the job's own record is used.
SCONTROL_FIELDS = {
    "JobName": "job_name",
    "NumNodes": "job_num_nodes",
    "NodeList": "job_nodelist",
    "NumTasks": "ntasks",
    "Partition": "job_partition",
    "Account": "job_account",
    "Restarts": "restart_count",
}


def parse_scontrol_job(text: str) -> dict[str, str]:
    """`scontrol show job --oneliner <id>` -> {field: value} (a value with spaces stays whole)."""
    fields: dict[str, str] = {}
    key = None
    for word in text.split():
        name, equals, value = word.partition("=")
        if equals and re.fullmatch(r"[A-Za-z][A-Za-z0-9/:_-]*", name):
            key = name
            fields[key] = value
        elif key is not None:
            fields[key] += f" {word}"
    return fields


def slurm_job_record(job_id: str, runner=subprocess.run) -> dict[str, str | None]:
    """The slurm_state keys of a job, from scontrol; {} where scontrol is absent or fails."""
    try:
        result = runner(
            ["scontrol", "show", "job", "--oneliner", str(job_id)],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return {}
    if result.returncode != 0:
        return {}
    fields = parse_scontrol_job(result.stdout)
    if fields.get("JobId") != str(job_id):
        return {}
    return {key: _scontrol_value(fields.get(field)) for field, key in SCONTROL_FIELDS.items()}


def _scontrol_value(value: str | None) -> str | None:
    return None if value in (None, "", "(null)") else value


def slurm_job_env(environ=os.environ, runner=subprocess.run) -> dict[str, str]:
    """{SLURM_JOB_ENV: JSON of the job's record} for the ranks (scalestudy.launch.launcher), where this is a
    Slurm job and scontrol answers; the ranks may run in an image without scontrol."""
    job_id = environ.get("SLURM_JOB_ID")
    record = slurm_job_record(job_id, runner) if job_id else {}
    return {SLURM_JOB_ENV: json.dumps({"job_id": job_id, **record})} if record else {}


def slurm_state(environ=os.environ, runner=subprocess.run) -> dict[str, Any]:
    """The Slurm job this process belongs to (None outside Slurm): its variables, completed from the
    job's record (SLURM_JOB_ENV from the launcher, else scontrol where it exists)."""
    state = {name.lower().removeprefix("slurm_"): environ.get(name) for name in SLURM_VARIABLES}
    array_task = (state["array_job_id"], state["array_task_id"])
    # how Slurm names an array task (squeue, sacct, scancel): <array job id>_<task id>
    state["jobid_taskid"] = "_".join(array_task) if all(array_task) else None
    job_id = state.get("job_id")
    if not job_id:
        return state
    record = _passed_record(environ.get(SLURM_JOB_ENV), job_id)
    if record is None and shutil.which("scontrol"):
        record = slurm_job_record(job_id, runner)
    for key, value in (record or {}).items():
        if key != "job_id" and value is not None:
            state[key] = value
    return state


def _passed_record(text: str | None, job_id: str) -> dict | None:
    try:
        record = json.loads(text) if text else None
    except ValueError:
        return None
    return record if isinstance(record, dict) and record.get("job_id") == job_id else None


def attempt(environ=os.environ) -> int | None:
    """The Snakemake attempt of the job that made this result (1 = first try), where the rule says."""
    value = environ.get(ATTEMPT_ENV, "")
    return int(value) if value.isdigit() else None
