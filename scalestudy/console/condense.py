"""Snakemake's console output, shortened as it streams (scalestudy.console's docstring).

Expected with `--quiet rules host` (scripts/demo.sh): Snakemake then prints no rule headers and no
host block. Per finished job it still prints a timestamp, "Finished jobid: N (Rule: R)" and "K of M
steps (P%) done": these become one line. A line that fits no pattern passes as it is, so an error,
a warning or a failed job's log is never lost; a held timestamp is printed before such a line.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Iterator

# The scheduler's and the report's own chatter, and MLflow's INFO lines (the tracking follower's
# stderr is Snakemake's): nothing a person acts on.
DROPPED = re.compile(
    r"^(Select jobs to execute\.\.\.|Execute \d+ jobs\.\.\.|Building DAG of jobs\.\.\.|Using shell: .*"
    r"|Provided cores: .*|Provided resources: .*|Rules claiming more threads will be scaled down\."
    r"|Conda environments: ignored|Singularity containers: ignored"
    r"|Assuming unrestricted shared filesystem usage\."
    r"|Using profile .* for setting default command line arguments\.|Updating checkpoint dependencies\."
    r"|DAG of jobs will be updated after completion\.|Creating report\.\.\."
    r"|Downloading resources and rendering HTML\."
    r"|Adding .+ \([\d.]+ ?[KMG]?B(ytes)?\)\.|Adding .+ \(\d+ bytes\)\."
    r"|\d{4}/\d\d/\d\d \d\d:\d\d:\d\d INFO mlflow\..*)$"
)
TIMESTAMP = re.compile(r"^\[\w{3} \w{3} +\d+ (\d\d:\d\d:\d\d) \d{4}\]$")
FINISHED = re.compile(r"^Finished jobid: \S+ \(Rule: (\S+)\)$")
PROGRESS = re.compile(r"^\d+ of \d+ steps \(\d+%\) done$")
STATS = re.compile(r"^Job stats:$")
TOTAL = re.compile(r"^total\s+(\d+)$")


def condense(lines: Iterable[str]) -> Iterator[str]:
    """The lines to show, each without its newline."""
    time = rule = ""
    rules_counted: list[str] | None = None
    for raw in lines:
        line = raw.rstrip("\n")
        if rules_counted is not None:  # inside the job-stats table
            total = TOTAL.match(line)
            if total:
                rules = len(rules_counted)
                yield f"Job stats: {total.group(1)} jobs of {rules} rules (the table: Snakemake's log)"
                rules_counted = None
            elif line.split() and line.split()[-1].isdigit():
                rules_counted.append(line.split()[0])
            continue
        if STATS.match(line):
            rules_counted = []
            continue
        stamp = TIMESTAMP.match(line)
        if stamp:
            if time:
                yield f"[{time}]"
            time, rule = stamp.group(1), ""
            continue
        finished = FINISHED.match(line)
        if finished and time:
            rule = finished.group(1)
            continue
        if PROGRESS.match(line) and time:
            yield f"[{time}] {line}" + (f": {rule}" if rule else "")
            time = rule = ""
            continue
        if DROPPED.match(line) or (not line.strip() and not time):
            continue
        if time:  # a timestamp that began something else (an error): shown with it
            yield f"[{time}]" + (f" Finished jobid (Rule: {rule})" if rule else "")
            time = rule = ""
        yield line
    if time:
        yield f"[{time}]"


def main(stream=sys.stdin, out=sys.stdout) -> int:
    for line in condense(stream):
        out.write(line + "\n")
        out.flush()
    return 0
