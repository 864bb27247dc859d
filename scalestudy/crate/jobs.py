"""What each job of the study did, from what Snakemake and the jobs recorded (no rocrate here).

Sources, per job:

* Snakemake's metadata (`.snakemake/metadata/`, one JSON record per output file, record format 6 of
  Snakemake 9): the rule, its inputs, logs and shell command, start and end time, the external
  (Slurm) job id where an executor submitted it, and whether the job was left incomplete;
* the rule's output patterns (passed by rules/crate.smk): the job's wildcards;
* the rule's `benchmark:` TSV (Snakemake's): wall time, CPU time, peak RSS;
* a training run's summary.json (`provenance`: Slurm job id, nodes, attempt, image and its sha256,
  software versions; `results`: world size, device, and energy where a measurement wrote `energy_j`);
* the kept attempt logs (scalestudy.launch.attempt_logs): how many attempts a job took; a job of a
  rule Snakemake never retries (`retries` 0: the local profile) that completed took one;
* a job the local executor ran (no external job id): the host that writes the crate, where Snakemake
  and its local jobs run (rule crate runs on the submit host).

The study's jobs are those that made the crate rule's inputs, and transitively their inputs; a
record of a file no job of the study needs (a grid point since removed from the config) is left out.
The other jobs of the workflow's run (`run_jobs`: the run's DAG, scalestudy.crate.record_run_jobs)
are added: the crate's own job (running: it cannot record its end or hash its own outputs), one
that finished in this run before the crate (its record), and one still to finish (beside or after
the crate: `rule track`, `rule all`), each with its state.
"""

from __future__ import annotations

import base64
import datetime as dt
import functools
import json
import logging
import os
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scalestudy.launch import attempt_logs
from scalestudy.plan import runfiles

log = logging.getLogger("scalestudy.crate.jobs")

# A result key the energy measurement writes (another issue adds it): picked up where present.
ENERGY_KEY = "energy_j"
NOT_RECORDED = "not recorded"
# A job of the run that had not finished when the crate was written: the crate's own, or another.
WRITING_THE_CRATE = "running: writing this crate (its end and outputs' checksums cannot be in it)"
NOT_FINISHED = "not finished when this crate was written (it runs beside or after the crate's job)"


@dataclass
class Job:
    """One job of the study, as far as it was recorded."""

    rule: str
    outputs: list[str]
    inputs: list[str]
    logs: list[str]
    start: float | None
    end: float | None
    shellcmd: str = ""
    external_jobid: str | None = None
    incomplete: bool = False
    wildcards: dict[str, str] = field(default_factory=dict)
    benchmark: dict[str, float] = field(default_factory=dict)
    summary: dict[str, Any] | None = None
    attempts: int | None = None
    local_host: str | None = None  # the host of the local executor, for a job it ran
    state: str = ""  # WRITING_THE_CRATE or NOT_FINISHED; "" for a job that ended (its record)

    @property
    def key(self) -> str:
        """A stable name: the rule and its wildcards (a rule without wildcards runs once)."""
        if not self.wildcards:
            return self.rule
        return self.rule + ":" + ",".join(f"{k}={v}" for k, v in sorted(self.wildcards.items()))

    @property
    def provenance(self) -> dict[str, Any]:
        return (self.summary or {}).get("provenance") or {}

    @property
    def results(self) -> dict[str, Any]:
        return (self.summary or {}).get("results") or {}

    def slurm_job_ids(self) -> list[str]:
        ids = [self.external_jobid, (self.provenance.get("slurm") or {}).get("job_id")]
        return sorted({str(i) for i in ids if i})

    def nodes(self) -> str | None:
        slurm = self.provenance.get("slurm") or {}
        hosts = self.provenance.get("hosts")
        if isinstance(hosts, list) and hosts:
            return ",".join(sorted(set(map(str, hosts))))
        return slurm.get("job_nodelist") or self.provenance.get("host") or self.local_host

    def image(self) -> tuple[str | None, str | None]:
        return self.provenance.get("image"), self.provenance.get("image_sha256")

    def energy_j(self) -> float | None:
        """The measured energy of the job in J, where its summary has it (`energy_j`, or a key ending
        in it); None: not measured."""
        for key, value in self.results.items():
            if (key == ENERGY_KEY or key.endswith(f"_{ENERGY_KEY}")) and isinstance(value, int | float):
                return float(value)
        return None

    def gpu_hours(self) -> float | None:
        """GPUs (ranks, on CPU ranks) x the run's hours: the summary's `gpu_hours`, the value runs.csv
        holds (scalestudy.analysis.energy.hours); None where the job trained nothing (its resources
        are its benchmark's)."""
        value = self.results.get("gpu_hours")
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        world, seconds = self.results.get("world_size"), self.results.get("total_time_s")
        return float(world) * float(seconds) / 3600.0 if world and seconds else None


def iso_time(timestamp: float | None) -> str | None:
    """ISO 8601 in UTC with milliseconds, the form the Process Run Crate profile asks for."""
    if timestamp is None:
        return None
    return dt.datetime.fromtimestamp(timestamp, dt.UTC).isoformat(timespec="milliseconds")


def read_records(metadata_dir: str | os.PathLike) -> dict[str, dict]:
    """Snakemake's metadata: {output path: record}. A name too long for one file is split into
    folders whose names start with '@' (snakemake.persistence.file)."""
    root = Path(metadata_dir)
    if not root.is_dir():
        raise ValueError(f"{root}: no Snakemake metadata (run the crate rule inside the workflow)")
    records = {}
    for path in root.rglob("*"):
        if not path.is_file():
            continue
        parts = path.relative_to(root).parts
        encoded = "".join(part.removeprefix("@") for part in parts)
        try:
            name = base64.urlsafe_b64decode(encoded).decode()
            records[name] = json.loads(path.read_text())
        except (ValueError, UnicodeDecodeError) as error:
            log.warning("%s: not a Snakemake metadata record (%s); skipped", path, error)
    return records


def study_jobs(
    records: Mapping[str, dict],
    targets: Iterable[str],
    rule_patterns: Mapping[str, Mapping[str, Any]],
    local_host: str | None = None,
) -> list[Job]:
    """The jobs that made `targets`, and transitively their inputs, ordered by start time; a job the
    local executor ran (no external job id) ran on `local_host`."""
    _holds_attempt_logs.cache_clear()
    # one job's records share its rule, hash and command (each output's start and end time is its own:
    # Snakemake records them one after the other, a millisecond apart)
    outputs_of: dict[tuple, list[str]] = {}
    for path, record in records.items():
        outputs_of.setdefault(_job_key(record), []).append(path)
    seen: set[str] = set()
    pending = [str(t) for t in targets]
    groups: dict[tuple, list[str]] = {}
    while pending:
        path = pending.pop()
        if path in seen:
            continue
        seen.add(path)
        record = records.get(path)
        if record is None:
            continue  # a source file (the config, the Snakefile) or one made outside Snakemake
        key = _job_key(record)
        if key not in groups:
            groups[key] = outputs_of[key]
            for output in outputs_of[key]:
                pending.extend(records[output].get("input") or [])
    jobs = [_job(sorted(outputs), records, rule_patterns) for outputs in groups.values()]
    for job in jobs:
        job.local_host = None if job.external_jobid else local_host
    return sorted(jobs, key=lambda job: (job.start or 0.0, job.key))


def run_jobs(
    run: Mapping[str, Any] | None,
    study: list[Job],
    records: Mapping[str, dict],
    rule_patterns: Mapping[str, Mapping[str, Any]],
    crate_outputs: Iterable[str],
    local_host: str | None = None,
) -> list[Job]:
    """The jobs of the workflow's run (`run`: scalestudy.crate.record_run_jobs) not among `study`: one
    that finished in the run before now with its record; the crate's own (its outputs are
    `crate_outputs`) started now; any other not finished."""
    known = {job.key for job in study} | {output for job in study for output in job.outputs}
    own = {os.path.abspath(path) for path in crate_outputs}
    found = []
    for entry in (run or {}).get("jobs", []):
        outputs = [str(path) for path in entry.get("outputs", [])]
        job = Job(
            rule=str(entry.get("rule")),
            outputs=outputs,
            inputs=[],
            logs=[str(path) for path in entry.get("logs", [])],
            start=None,
            end=None,
            wildcards={str(k): str(v) for k, v in (entry.get("wildcards") or {}).items()},
            local_host=local_host if entry.get("local", True) else None,
        )
        if job.key in known or any(output in known for output in outputs):
            continue
        ended = [path for path in outputs if (records.get(path) or {}).get("starttime", 0) >= run["started"]]
        if ended:
            found.append(_job(sorted(ended), records, rule_patterns))
            found[-1].local_host = None if found[-1].external_jobid else local_host
            continue
        mine = bool(outputs) and {os.path.abspath(path) for path in outputs} <= own
        job.state = WRITING_THE_CRATE if mine else NOT_FINISHED
        job.start = time.time() if mine else None
        job.local_host = local_host if mine else job.local_host  # it runs here, now
        if mine and (rule_patterns.get(job.rule) or {}).get("retries") == 0:
            job.attempts = 1  # this one, of a rule Snakemake never retries
        found.append(job)
    return found


def _job_key(record: dict) -> tuple:
    return (record.get("rule"), record.get("job_hash"), record.get("shellcmd"))


def _job(
    outputs: list[str], records: Mapping[str, dict], rule_patterns: Mapping[str, Mapping[str, Any]]
) -> Job:
    record = records[outputs[0]]
    starts = [records[path]["starttime"] for path in outputs if records[path].get("starttime")]
    ends = [records[path]["endtime"] for path in outputs if records[path].get("endtime")]
    rule = record.get("rule") or "unknown"
    patterns = rule_patterns.get(rule) or {}
    job = Job(
        rule=rule,
        outputs=outputs,
        inputs=sorted(record.get("input") or []),
        logs=sorted(record.get("log") or []),
        start=min(starts) if starts else None,
        end=max(ends) if ends else None,
        shellcmd=record.get("shellcmd") or "",
        external_jobid=str(record["external_jobid"]) if record.get("external_jobid") else None,
        incomplete=any(records[path].get("incomplete") for path in outputs),
        wildcards=wildcards_of(outputs, patterns.get("output") or []),
    )
    job.benchmark = read_benchmark(fill_wildcards(patterns.get("benchmark"), job.wildcards))
    summaries = [path for path in outputs if Path(path).name == runfiles.SUMMARY]
    job.summary = _read_json(summaries[0]) if summaries else None
    never_retried = patterns.get("retries") == 0 and not job.incomplete
    job.attempts = job.provenance.get("attempt") or _kept_attempts(job.logs) or (1 if never_retried else None)
    return job


_WILDCARD = re.compile(r"\{\s*([A-Za-z_]\w*)\s*(?:,((?:[^{}]|\{[^{}]*\})*))?\}")


def wildcards_of(outputs: Iterable[str], regexes: Iterable[str]) -> dict[str, str]:
    """The wildcards of a job: its first output that one of the rule's output regexes matches."""
    for regex in regexes:
        compiled = re.compile(regex)
        for path in outputs:
            match = compiled.fullmatch(path)
            if match:
                return {k: v for k, v in match.groupdict().items() if v is not None}
    return {}


def fill_wildcards(pattern: str | None, wildcards: Mapping[str, str]) -> str | None:
    """A rule's file pattern with the job's wildcards put in (None where a wildcard is missing)."""
    if not pattern:
        return None
    try:
        return _WILDCARD.sub(lambda m: wildcards[m.group(1)], pattern)
    except KeyError:
        return None


def read_benchmark(path: str | None) -> dict[str, float]:
    """The last row of Snakemake's benchmark TSV (s, max_rss, cpu_time, ...); {} where there is none."""
    if not path or not Path(path).is_file():
        return {}
    lines = [line.split("\t") for line in Path(path).read_text().splitlines() if line.strip()]
    if len(lines) < 2:
        return {}
    values = {}
    for name, text in zip(lines[0], lines[-1], strict=False):
        try:
            values[name] = float(text)
        except ValueError:
            continue  # "-" where psutil could not measure, or the h:m:s column
    return values


def kept_attempt_logs(logs: Iterable[str]) -> list[str]:
    """The kept attempt logs of a job's logs (`<log stem>.attempt<N>.log`), in the crate beside them."""
    return [
        str(path)
        for log_path in logs
        if _holds_attempt_logs(os.path.dirname(log_path) or ".")
        for path in attempt_logs.attempt_logs(log_path).values()
    ]


def _kept_attempts(logs: Iterable[str]) -> int | None:
    """The highest attempt whose log was kept; listed only in folders that hold any attempt log (one
    listing per folder: a grid's thousand logs share a folder)."""
    kept = [
        max(attempt_logs.attempt_logs(path), default=0)
        for path in logs
        if _holds_attempt_logs(os.path.dirname(path) or ".")
    ]
    return max(kept, default=0) or None


@functools.cache
def _holds_attempt_logs(folder: str) -> bool:
    try:
        return any(".attempt" in name for name in os.listdir(folder))
    except OSError:
        return False


def _read_json(path: str) -> dict | None:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as error:
        log.warning("%s: unreadable (%s); its job's provenance is not recorded", path, error)
        return None
