"""The study as a Workflow Run RO-Crate (Provenance Run Crate profile): written, checked, validated.

Standard library only here: rules/crate.smk calls rule_specs() for the crate job's parameters and
record_run_jobs() when the workflow's run starts.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

RUN_JOBS = ".snakemake/scalestudy/run-jobs.json"  # the jobs of the workflow's latest run
# Set (to RUN_JOBS) by the run that wrote it, for its jobs: a crate written outside such a run (by
# hand, --no-hooks) lists the study's jobs only, never an earlier run's.
RUN_JOBS_ENV = "SCALESTUDY_RUN_JOBS"


def record_run_jobs(jobs: Iterable, local_executor: bool = False, path: str | os.PathLike = RUN_JOBS) -> None:
    """The jobs a run of the workflow is about to run (Snakemake's DAG, when the run starts: rule,
    wildcards, outputs, logs), for the crate to list those its outputs do not stand on (itself, the
    jobs beside and after it; `local_executor`: every job runs on this host); RUN_JOBS_ENV names the
    file to this run's jobs. Written atomically; not a parameter of any job (it changes every run)."""
    record = {
        "started": time.time(),
        "jobs": [
            {
                "rule": job.rule.name,
                "wildcards": {str(k): str(v) for k, v in dict(job.wildcards_dict).items()},
                "outputs": sorted(str(path) for path in job.output),
                "logs": sorted(str(path) for path in job.log),
                "local": bool(local_executor or job.is_local),  # it runs on this host
            }
            for job in jobs
        ],
    }
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w") as handle:
        json.dump(record, handle, indent=1, sort_keys=True)
    os.replace(tmp, path)
    os.environ[RUN_JOBS_ENV] = str(path)


def rule_specs(rules: Iterable, basedir: str) -> dict:
    """Every Snakemake rule's output regexes (a job's wildcards from its outputs), benchmark
    pattern, rule file and retries: what `python -m scalestudy.crate write --rules-json` takes."""
    specs = {
        rule.name: {
            "output": [item.regex().pattern for item in rule.output],
            "benchmark": str(rule.benchmark) if rule.benchmark else None,
            "snakefile": os.path.relpath(rule.snakefile, basedir) if rule.snakefile else None,
            "retries": _retries(rule),
        }
        for rule in rules
    }
    return specs


def _retries(rule) -> int | None:
    """Snakemake's retries of the rule's jobs (0: one attempt each); None where this Snakemake has no
    execution settings to say (`--report`, `--summary`: nothing runs)."""
    try:
        return rule.restart_times
    except AttributeError:
        return None
