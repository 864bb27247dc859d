"""Which jobs made each figure and table: the job that drew it, and, through its inputs, the training
runs whose numbers it shows. The crate links each product to the files it was drawn from (isBasedOn)
and names the jobs in its description; the job's CreateAction has the product as its result."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from scalestudy.plan import paths

if TYPE_CHECKING:
    from scalestudy.crate.jobs import Job

PRODUCT_FOLDERS = (paths.FIGURES_DIR, paths.TABLES_DIR, paths.PAPER_DIR, paths.COMPARE_DIR, paths.PROFILE_DIR)


def is_product(path: str) -> bool:
    """A figure or table of the report or the paper (a run's own files are not)."""
    return any(path.startswith(f"{folder}/") for folder in PRODUCT_FOLDERS)


def producers(jobs: Iterable[Job]) -> dict[str, Job]:
    """{output path: the job that wrote it}."""
    return {path: job for job in jobs for path in job.outputs}


def upstream_runs(job: Job, made_by: dict[str, Job]) -> list[Job]:
    """The training runs (jobs with a summary.json) that `job` depends on, directly or not."""
    found: dict[str, Job] = {}
    seen: set[str] = set()
    pending = list(job.inputs)
    while pending:
        path = pending.pop()
        if path in seen or path not in made_by:
            continue
        seen.add(path)
        maker = made_by[path]
        if maker.summary is not None:
            found[maker.key] = maker
        pending.extend(maker.inputs)
    return [found[key] for key in sorted(found)]


def describe_products(
    files: Mapping[str, Any], file_refs: Callable[[Iterable[str]], list], jobs: list[Job]
) -> None:
    """Each product among the crate's `files` (path -> its entity) based on the files of its job's
    inputs (`file_refs`: their references) and described by its job and training runs."""
    made_by = producers(jobs)
    for path, job in made_by.items():
        entity = files.get(path)
        if entity is None or not is_product(path):
            continue
        runs = upstream_runs(job, made_by)
        sources = file_refs(job.inputs)
        if sources:
            entity["isBasedOn"] = sources
        entity["description"] = f"made by job #job-{job.key}" + (
            f" from {len(runs)} training run(s): " + ", ".join(f"#job-{run.key}" for run in runs)
            if runs
            else ""
        )
