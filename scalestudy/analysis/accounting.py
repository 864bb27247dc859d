"""Slurm accounting of the study's runs: sacct's elapsed time, state, peak memory and energy per job.

Standard library only: the rule that calls this runs on the submit host *outside* the container
(sacct and the Slurm client libraries are not in the image), and writes a small JSON file the
containerised catalog step (analysis.aggregate) merges into runs.csv:

    {"note": null | "why there is no accounting", "jobs": {"<job id>": {"state": ..., "elapsed_s": ...,
     "max_rss_mb": ..., "consumed_energy_j": ...}}}

`consumed_energy_j` is sacct's ConsumedEnergyRaw (joules) where the site accounts energy
(AcctGatherEnergyType: ipmi, rapl, gpu, ...): what that plugin measures on the job's nodes (a whole
node's, the CPUs' or the GPUs'), beside the study's own NVML figures (scalestudy.analysis.energy), not
the same quantity. A site without an energy plugin reports 0 (or nothing): None here, never a zero.

    python -m scalestudy.analysis.accounting --summaries .../summary.json ... --out results/tables/sacct.json
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import subprocess
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from scalestudy import atomic, commandline
from scalestudy.progress import setup_logging

log = logging.getLogger("scalestudy.analysis.accounting")


def parse_elapsed(text: str) -> float | None:
    """sacct Elapsed '[D-]HH:MM:SS' or 'MM:SS(.fff)' -> seconds."""
    match = re.fullmatch(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+(?:\.\d+)?)", text.strip())
    if not match:
        return None
    days, hours, minutes, seconds = match.groups()
    return int(days or 0) * 86400 + int(hours or 0) * 3600 + int(minutes) * 60 + float(seconds)


def parse_rss_mb(text: str) -> float | None:
    """sacct MaxRSS '123456K', '1.5G', '0' -> MiB."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([KMGT]?)", text.strip())
    if not match:
        return None
    value, unit = float(match.group(1)), match.group(2)
    return value * {"": 1 / 1024**2, "K": 1 / 1024, "M": 1.0, "G": 1024.0, "T": 1024.0**2}[unit]


def parse_energy_j(text: str) -> float | None:
    """sacct ConsumedEnergyRaw (joules) -> J; None where the site does not account energy ('', '0',
    or Slurm's NO_VAL64 for "unknown")."""
    text = text.strip()
    if not text.isdigit() or int(text) == 0 or int(text) >= 2**63:
        return None
    return float(text)


SACCT_FIELDS = "JobID,State,Elapsed,MaxRSS,ConsumedEnergyRaw"


def parse_sacct(text: str) -> dict[str, dict[str, Any]]:
    """`sacct --parsable2 --noheader -o JobID,State,Elapsed,MaxRSS,ConsumedEnergyRaw` -> per job id:
    state, elapsed, max RSS, consumed energy.

    State, Elapsed and ConsumedEnergyRaw come from the allocation line (JobID without a '.'); MaxRSS
    is a step property, so the maximum over the job's steps is taken. Where the allocation line has
    no energy, the largest step's is taken (steps on the same nodes overlap in time: never summed).
    """
    jobs: dict[str, dict[str, Any]] = {}
    step_energy: dict[str, float] = {}
    for line in text.splitlines():
        fields = line.split("|")
        if len(fields) < 4 or not fields[0]:
            continue
        job_id, _, step = fields[0].partition(".")
        entry = jobs.setdefault(
            job_id, {"state": None, "elapsed_s": None, "max_rss_mb": None, "consumed_energy_j": None}
        )
        energy = parse_energy_j(fields[4]) if len(fields) > 4 else None
        if not step:
            entry["state"] = fields[1] or None
            entry["elapsed_s"] = parse_elapsed(fields[2])
            entry["consumed_energy_j"] = energy
        elif energy is not None:
            step_energy[job_id] = max(energy, step_energy.get(job_id, 0.0))
        rss = parse_rss_mb(fields[3]) if fields[3] else None
        if rss is not None:
            entry["max_rss_mb"] = max(rss, entry["max_rss_mb"] or 0.0)
    for job_id, energy in step_energy.items():
        if jobs[job_id]["consumed_energy_j"] is None:
            jobs[job_id]["consumed_energy_j"] = energy
    return jobs


Runner = Callable[[list[str]], subprocess.CompletedProcess]


def _run(argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)


def query_sacct(job_ids: Sequence[str], runner: Runner = _run) -> dict[str, Any]:
    """{"note": ..., "jobs": {...}}: the note says why there is no accounting (None when sacct answered)."""
    if not job_ids:
        return {"note": "no Slurm job id in any run (runs outside Slurm)", "jobs": {}}
    if runner is _run and shutil.which("sacct") is None:
        return {"note": "sacct not found on this host", "jobs": {}}
    argv = ["sacct", "--parsable2", "--noheader", "-o", SACCT_FIELDS, "-j", ",".join(job_ids)]
    try:
        result = runner(argv)
    except (OSError, subprocess.TimeoutExpired) as err:
        return {"note": f"sacct failed: {err}", "jobs": {}}
    if result.returncode != 0:
        return {"note": f"sacct failed ({result.returncode}): {result.stderr.strip()[:200]}", "jobs": {}}
    jobs = parse_sacct(result.stdout)
    return {
        "note": None if jobs else "sacct returned no records (accounting disabled or purged?)",
        "jobs": jobs,
    }


def job_id(summary: dict) -> str | None:
    """The run's Slurm job id (as provenance.collect or the trainer records it), without a step suffix."""
    prov = summary.get("provenance") or {}
    value = (prov.get("slurm") or {}).get("job_id") or prov.get("slurm_job_id")
    return str(value).split(".")[0] if value not in (None, "") else None


def job_ids(summary_paths: Iterable[str | Path]) -> list[str]:
    ids = set()
    for path in summary_paths:
        try:
            found = job_id(json.loads(Path(path).read_text()))
        except (OSError, ValueError) as err:
            raise ValueError(f"{path}: cannot read the run summary ({err})") from err
        if found:
            ids.add(found)
    return sorted(ids)


def main(argv: Sequence[str] | None = None) -> int:
    parser = commandline.parser(__doc__)
    parser.add_argument("--summaries", nargs="+", required=True, help="summary.json of every run.")
    parser.add_argument("--out", required=True, help="The accounting JSON to write.")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    setup_logging(getattr(logging, args.log_level.upper(), logging.INFO))
    record = query_sacct(job_ids(args.summaries))
    atomic.write_json(args.out, record)
    if record["note"]:
        log.warning("Slurm accounting: %s", record["note"])
    log.info("accounting for %d job(s) -> %s", len(record["jobs"]), args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
