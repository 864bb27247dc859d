"""Every attempt of a training job keeps its log: `<log stem>.attempt<N>.log` beside the rule's log.

Snakemake removes a job's declared log before each attempt runs, so the log of an attempt that hit
its time limit (the signal, the checkpoint) would be lost when the retry starts. The launcher calls
`keep(log, attempt)` once the rule's shell has opened the log: the attempt's file becomes a hard
link to the same file (same contents as it grows, no copy, survives a kill at the time limit), and
files of attempts >= N left by an earlier run of the same point are removed first. The declared
log is always the latest attempt's; the run catalog counts the attempts (scalestudy.provenance
records the attempt number, SCALESTUDY_ATTEMPT). `set_aside` renames an earlier run's log before its
job is submitted to a cluster again. Standard library only.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path


def attempt_log(log: str | os.PathLike, attempt: int) -> Path:
    """results/logs/scaling/strong/w2_r0.log, 2 -> results/logs/scaling/strong/w2_r0.attempt2.log"""
    log = Path(log)
    return log.with_name(f"{log.stem}.attempt{attempt}{log.suffix}")


def attempt_logs(log: str | os.PathLike) -> dict[int, Path]:
    """The kept attempt logs of one declared log, by attempt number."""
    log = Path(log)
    pattern = re.compile(rf"{re.escape(log.stem)}\.attempt([1-9]\d*){re.escape(log.suffix)}")
    found = {}
    if log.parent.is_dir():
        for path in log.parent.iterdir():
            match = pattern.fullmatch(path.name)
            if match:
                found[int(match[1])] = path
    return dict(sorted(found.items()))


def keep(log: str | os.PathLike, attempt: int) -> Path:
    """Make `attempt_log(log, attempt)` a second name of `log` (created if absent); remove the
    files of attempts >= `attempt` that an earlier run left. Returns the attempt's file."""
    if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 1:
        raise ValueError(f"attempt must be an integer >= 1, got {attempt!r}")
    log = Path(log)
    for number, path in attempt_logs(log).items():
        if number >= attempt:
            path.unlink(missing_ok=True)
    log.touch()
    target = attempt_log(log, attempt)
    try:
        os.link(log, target)
    except OSError as error:  # a file system without hard links: the attempt's file stays empty
        shutil.copyfile(log, target)
        print(
            f"attemptlog: cannot link {target} to {log} ({error}): on this file system only the last "
            "attempt's log is kept, in the declared log",
            file=sys.stderr,
        )
    return target


def earlier_log(log: str | os.PathLike) -> Path:
    """results/logs/comm/w2.log -> results/logs/comm/w2.earlier.log"""
    log = Path(log)
    return log.with_name(f"{log.stem}.earlier{log.suffix}")


def set_aside(log: str | os.PathLike) -> Path | None:
    """Rename an earlier run's declared log to `earlier_log(log)` (replacing an older one) before its
    job is submitted again; the file it became, or None where there was none.

    Snakemake removes a job's log when the job starts, but a cluster executor starts it on a node: a
    job that sbatch refuses never starts, and Snakemake then prints the earlier run's log as the
    failed job's. Set aside, that log is neither shown as this run's nor lost."""
    log = Path(log)
    if not log.is_file():
        return None
    target = earlier_log(log)
    os.replace(log, target)
    return target
