"""How long `snakemake -n` takes to parse the workflow and plan a large grid, and where that time goes.

The dry-run runs in the repository (with --nolock, so it can run beside a real run) as a user
would type it; `profile_dry_run` runs the same command under cProfile and keeps the calls made
from the workflow's own code (Snakefile, rules/*.smk, scalestudy/).
"""

from __future__ import annotations

import pstats
import re
import subprocess
import sys
import time
from pathlib import Path

from scalestudy.benchmark.studyconfig import REPO
from scalestudy.plan import grid

WORKFLOW_FILES = ("Snakefile", "/rules/", "/scalestudy/")


def count_points(config: dict) -> int:
    return len(grid.all_points(config))


def dry_run_command(configfile: str | Path, python: str = sys.executable) -> list[str]:
    return [
        python,
        "-m",
        "snakemake",
        "--dry-run",
        "--nolock",
        "--cores",
        "1",
        "--configfile",
        str(configfile),
    ]


def time_dry_run(configfile: str | Path, cwd: Path = REPO) -> tuple[float, str]:
    """Wall seconds of one dry-run (process start to exit) and its output; raises if it fails."""
    start = time.perf_counter()
    result = subprocess.run(dry_run_command(configfile), cwd=cwd, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if result.returncode != 0:
        raise RuntimeError(f"snakemake --dry-run failed ({result.returncode}):\n{result.stderr[-4000:]}")
    return seconds, result.stdout + result.stderr


def planned_jobs(output: str) -> int | None:
    """The job total of a dry-run's 'Job stats' table (job_counts added up); None without one."""
    counts = job_counts(output)
    return sum(counts.values()) if counts else None


def job_counts(output: str) -> dict[str, int]:
    """Rule name -> job count of the first 'Job stats' table in Snakemake's output (a plan's or a
    run's; the total left out); {} where it printed none."""
    match = re.search(r"Job stats:\n.*?\n-+\s+-+\n(.*?)\ntotal\s+\d+", output, re.S)
    if match is None:
        return {}
    rows = (line.split() for line in match.group(1).splitlines() if line.strip())
    return {name: int(count) for name, count in rows}


def profile_dry_run(configfile: str | Path, stats_path: str | Path, cwd: Path = REPO) -> pstats.Stats:
    """The dry-run under cProfile; the raw stats are kept at `stats_path` (snakeviz/pstats can open it)."""
    command = dry_run_command(configfile)
    command[1:1] = ["-m", "cProfile", "-o", str(Path(stats_path).resolve())]
    subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=True)
    return pstats.Stats(str(stats_path))


def workflow_hotspots(stats: pstats.Stats, limit: int = 20) -> list[tuple[str, int, float, float]]:
    """(function, calls, own seconds, cumulative seconds) of the workflow's own code, costliest first."""
    rows = []
    for (filename, line, function), (_, calls, own, cumulative, _) in stats.stats.items():
        if any(part in filename for part in WORKFLOW_FILES) and "site-packages" not in filename:
            where = filename.replace(str(REPO) + "/", "")
            rows.append((f"{where}:{line}({function})", calls, own, cumulative))
    return sorted(rows, key=lambda row: row[3], reverse=True)[:limit]


def top_functions(stats: pstats.Stats, limit: int = 25) -> list[tuple[str, int, float, float]]:
    """The same for every function (Snakemake's own included), by own time."""
    rows = [
        (f"{Path(filename).name}:{line}({function})", calls, own, cumulative)
        for (filename, line, function), (_, calls, own, cumulative, _) in stats.stats.items()
    ]
    return sorted(rows, key=lambda row: row[2], reverse=True)[:limit]
