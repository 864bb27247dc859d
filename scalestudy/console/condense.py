"""Snakemake's console output, shortened as it streams (scalestudy.console's docstring).

Per finished job Snakemake prints a timestamp, "Finished jobid: N (Rule: R)" and "K of M steps (P%)
done": these become one line. Left out: each job's header (a timestamp, "rule R:" or "localrule R:",
its indented fields), the host block ("SNAKEMAKE" ...), the job-stats table (one line instead) and
the lines in DROPPED. Snakemake's own log (.snakemake/log/) keeps all of it. A line that fits no
pattern passes as it is, so an error, a warning or a failed job's log is never lost; a held
timestamp is printed before such a line.
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
HEADER = re.compile(r"^(local)?(rule|checkpoint) \w+:$")  # a job's header; its fields are indented
FIELD = "    "
HOST = "SNAKEMAKE"  # the host block: its title, a rule of "=", indented lines, a blank line
FINISHED = re.compile(r"^Finished jobid: \S+ \(Rule: (\S+)\)$")
PROGRESS = re.compile(r"^\d+ of \d+ steps \(\d+%\) done$")
STATS = "Job stats:"
TOTAL = re.compile(r"^total\s+(\d+)$")


class Condenser:
    """One stream's state: a held timestamp and finished rule, or the block being skipped."""

    def __init__(self) -> None:
        self.time = self.rule = ""
        self.skipping = ""  # "header", "host" or "stats" while inside one
        self.rules: list[str] = []

    def feed(self, line: str) -> list[str]:
        """The lines to show for one input line (without its newline)."""
        if self.skipping:
            shown = self._skip(line)
            if shown is not None:
                return shown
        if line == STATS:
            self.skipping, self.rules = "stats", []
            return []
        if line == HOST:
            self.skipping = "host"
            return []
        stamp = TIMESTAMP.match(line)
        if stamp:
            shown = self._held()
            self.time = stamp.group(1)
            return shown
        if HEADER.match(line) and self.time:
            self.time = self.rule = ""
            self.skipping = "header"
            return []
        finished = FINISHED.match(line)
        if finished and self.time:
            self.rule = finished.group(1)
            return []
        if PROGRESS.match(line) and self.time:
            shown = [f"[{self.time}] {line}" + (f": {self.rule}" if self.rule else "")]
            self.time = self.rule = ""
            return shown
        if DROPPED.match(line) or not line.strip():
            return []
        return [*self._held(), line]

    def _skip(self, line: str) -> list[str] | None:
        """[] for a line of the block being skipped; None once the block ended (the line is then
        read as any other)."""
        if self.skipping == "stats":
            total = TOTAL.match(line)
            if total:
                self.skipping = ""
                rules = len(self.rules)
                return [f"Job stats: {total.group(1)} jobs of {rules} rules (the table: Snakemake's log)"]
            if line.split() and line.split()[-1].isdigit():
                self.rules.append(line.split()[0])
            return []
        if self.skipping == "host":
            if line.strip():
                return []
            self.skipping = ""
            return []
        if line.startswith(FIELD):
            return []
        self.skipping = ""
        return None

    def _held(self) -> list[str]:
        """A held timestamp (and finished rule) that no progress line followed."""
        shown = [f"[{self.time}]" + (f" Finished jobid (Rule: {self.rule})" if self.rule else "")]
        held = shown if self.time else []
        self.time = self.rule = ""
        return held


def condense(lines: Iterable[str]) -> Iterator[str]:
    """The lines to show, each without its newline."""
    condenser = Condenser()
    for line in lines:
        yield from condenser.feed(line.rstrip("\n"))
    yield from condenser._held()


def main(stream=sys.stdin, out=sys.stdout) -> int:
    try:
        for line in condense(stream):
            out.write(line + "\n")
            out.flush()
    except BrokenPipeError:  # the reader went away (| head): nothing left to show
        sys.stderr.close()
    return 0
