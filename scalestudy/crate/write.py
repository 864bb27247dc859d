"""Write the study's crate: a folder (results/crate/) and its zip (results/crate.zip).

The folder is built beside the old one and swapped in when complete, so a failed write leaves the
previous crate whole; the zip is written atomically. Inside the folder the study keeps its own
layout (Snakefile, rules/, config/, results/...), so a crate can be read as a study folder
(scalestudy.compare reads its results/tables/runs.csv).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from scalestudy import __version__, atomic, provenance
from scalestudy.crate import jobs as jobinfo
from scalestudy.crate import payload
from scalestudy.crate.build import CrateBuilder

log = logging.getLogger("scalestudy.crate.write")

CONFIG_JSON = "config.json"  # the effective config (defaults filled in), written into the crate
README = "README.md"


def study_identity(study: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
    """Name, description, license, author and version (the commit) of the crate's root."""
    git = provenance.git_state()
    commit = git["git_commit"] + (" (dirty)" if git["git_dirty"] else "")
    return {
        "name": study.get("title") or study.get("name") or "scalestudy study",
        "description": (
            f"A scaling study run by scalestudy {__version__} (Snakemake workflow, commit {commit}): "
            "every job's provenance, outputs with checksums, tables, figures and the paper draft."
        ),
        "license": study.get("license"),
        "author": study.get("author"),
        "version": f"scalestudy {__version__}, commit {commit}",
        "config_hash": provenance.config_hash(config),
        "url": study.get("url"),
    }


def write_crate(
    out_dir: str | os.PathLike,
    zip_path: str | os.PathLike,
    *,
    metadata_dir: str | os.PathLike,
    targets: Sequence[str],
    rules: Mapping[str, Mapping[str, Any]],
    sources: Sequence[str],
    config_files: Sequence[str],
    config: Mapping[str, Any],
    study: Mapping[str, Any],
    exclude: Sequence[str] = (),
    run_jobs: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Build and write the crate; returns counts and the seconds it took. `run_jobs`: the jobs of the
    workflow's run (scalestudy.crate.record_run_jobs), listed too where the study's outputs do not
    stand on them (their files are not carried: they are not the study's)."""
    started = time.perf_counter()
    out_dir = Path(out_dir)
    records = jobinfo.read_records(metadata_dir)
    host = socket.gethostname()
    study_jobs = jobinfo.study_jobs(records, targets, rules, local_host=host)
    outputs = [
        path
        for job in study_jobs
        for path in (*job.outputs, *job.logs, *jobinfo.kept_attempt_logs(job.logs), *_benchmarks(job, rules))
    ]
    study_jobs += jobinfo.run_jobs(run_jobs, study_jobs, records, rules, [str(out_dir), str(zip_path)], host)
    inside, outside = _split_config_files(config_files)
    files = payload.describe([*sources, *inside, *targets, *outputs], exclude)
    missing = sorted(target for target in targets if not Path(target).exists())
    if missing:
        raise ValueError(f"crate: the study's outputs are missing: {', '.join(missing[:5])}")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        payload.place(files.values(), building)
        identity = study_identity(study, config)
        count = len({job.key for job in study_jobs})  # the jobs the crate describes, one action each
        generated = _write_generated(building, config, identity, count, outside)
        files.update(payload.describe(generated, root=building))
        builder = CrateBuilder(identity)
        builder.add_files(files.values(), building)
        builder.crate.root_dataset["hasPart"] = [{"@id": p} for p in sorted(files) if files[p].carried]
        builder.add_run(
            study_jobs,
            {rule: spec.get("snakefile") for rule, spec in rules.items()},
            [*inside, *generated[2:], CONFIG_JSON],
            list(targets),
            provenance.software_versions(),
        )
        readme = builder.files[README]
        readme["about"] = {"@id": "./"}
        builder.compact()
        builder.crate.metadata.write(building)
        _swap_in(building, out_dir)
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    payload.write_zip(out_dir, zip_path)
    seconds = time.perf_counter() - started
    carried = sum(1 for f in files.values() if f.carried)
    log.info(
        "crate: %d jobs, %d files (%d carried, %.1f MB) -> %s and %s in %.2f s",
        len(study_jobs),
        len(files),
        carried,
        sum(f.size for f in files.values() if f.carried) / 1e6,
        out_dir,
        zip_path,
        seconds,
    )
    return {"jobs": len(study_jobs), "files": len(files), "carried": carried, "seconds": seconds}


def add_files(crate_dir: str | os.PathLike, zip_path: str | os.PathLike, paths: Sequence[str]) -> int:
    """Adds files made after the crate's jobs (results/report.html: `snakemake --report` runs once the
    workflow is done) to a written crate: each carried at its path with its sha256, part of the root,
    the metadata and the zip written again atomically. Returns how many."""
    from scalestudy.crate import check

    crate_dir = Path(crate_dir)
    missing = [path for path in paths if not Path(path).is_file()]
    if missing:
        raise ValueError(f"no such file to add to the crate: {', '.join(missing)}")
    metadata = {"@context": None, "@graph": check.graph(crate_dir)}
    metadata["@context"] = json.loads((crate_dir / check.METADATA).read_text())["@context"]
    graph = {entity["@id"]: entity for entity in metadata["@graph"]}
    root = graph["./"]
    parts = root.get("hasPart") or []
    parts = parts if isinstance(parts, list) else [parts]
    added = payload.describe(paths)
    for item in added.values():
        with atomic.atomic_path(crate_dir / item.path) as tmp:
            shutil.copyfile(item.path, tmp)
        graph[item.path] = {
            "@id": item.path,
            "@type": "File",
            "name": item.path,
            "description": "made after the study's jobs (snakemake --report), added to the crate then",
            "sha256": item.sha256,
            "contentSize": str(item.size),
            "encodingFormat": item.media_type,
        }
        if {"@id": item.path} not in parts:
            parts.append({"@id": item.path})
    root["hasPart"] = parts
    metadata["@graph"] = list(graph.values())
    atomic.write_text(crate_dir / check.METADATA, json.dumps(metadata, indent=4) + "\n")
    payload.write_zip(crate_dir, zip_path)
    return len(added)


def _benchmarks(job: jobinfo.Job, rules: Mapping[str, Mapping[str, Any]]) -> list[str]:
    path = jobinfo.fill_wildcards((rules.get(job.rule) or {}).get("benchmark"), job.wildcards)
    return [path] if path and Path(path).is_file() else []


def _split_config_files(config_files: Sequence[str]) -> tuple[list[str], list[Path]]:
    """The config files inside the workflow folder (carried under their path) and those outside it
    (copied into the crate's config/)."""
    inside, outside = [], []
    for name in config_files:
        path = Path(name)
        relative = os.path.relpath(path.resolve(), Path.cwd())
        if relative.startswith(".."):
            outside.append(path)
        else:
            inside.append(relative)
    return inside, outside


def _write_generated(
    building: Path, config: Mapping[str, Any], identity: Mapping[str, Any], jobs: int, outside: list[Path]
) -> list[str]:
    """config.json, README.md, then the config files from outside the workflow folder (config/<name>)."""
    atomic.write_text(
        building / CONFIG_JSON, json.dumps(config, indent=1, sort_keys=True, default=str) + "\n"
    )
    atomic.write_text(building / README, readme_text(identity, jobs))
    copied = []
    for path in outside:
        target = f"config/{path.name}"
        (building / "config").mkdir(exist_ok=True)
        shutil.copyfile(path, building / target)
        copied.append(target)
    return [CONFIG_JSON, README, *copied]


def readme_text(identity: Mapping[str, Any], jobs: int) -> str:
    return f"""# {identity["name"]}

A Workflow Run RO-Crate (Provenance Run Crate 0.5) of a scaling study made by scalestudy
({identity["version"]}; config hash {identity["config_hash"]}), with {jobs} jobs.

- `ro-crate-metadata.json`: every job as a CreateAction (rule, wildcards, start and end, Slurm job
  ids and nodes, attempts, container image and sha256, resource usage), every file with its sha256.
- `Snakefile`, `rules/`, `config/`, `{CONFIG_JSON}`: the workflow and the config it ran with.
- `results/`: the study's outputs in the workflow's layout (`results/tables/runs.csv` is the run
  catalog), every job's log and each kept attempt's (`results/logs/`), and `results/report.html`
  where the study's report was added (`python -m scalestudy.crate add`, after `snakemake --report`).

Check it: `python -m scalestudy.crate check crate.zip` (every file and its checksum).
Compare a study against it: `python -m scalestudy.compare crate.zip results/`, or set
`compare.against` in a study's config (docs/guide/compare-and-crate.md).
"""


def _swap_in(building: Path, out_dir: Path) -> None:
    old = None
    if out_dir.exists():
        old = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}")
        out_dir.rename(old)
    building.rename(out_dir)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
