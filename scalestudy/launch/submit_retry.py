"""An `sbatch` that waits out a site's submit limit instead of failing the job (docs/guide/cluster.md,
Queue limits).

Sites cap the jobs a user may have queued (MaxSubmitJobs of the association or QOS). Slurm refuses a
submission over the cap (sbatch exits 1, "QOSMaxSubmitJobPerUserLimit" and "Job violates
accounting/QOS policy (job submit limit, user's size and/or time limits)" on stderr), and the Slurm
executor plugin (2.8) reports that as a failed job: Snakemake's retries then count it as an attempt,
raising the attempt's time and memory. The plugin has no hook for this, so rules/common/hooks.smk puts a
wrapper named `sbatch` first on the PATH of the Snakemake that submits (`install`, `put_first`). The
wrapper runs the real sbatch (the next `sbatch` on PATH) and, when Slurm refuses for a submit limit,
waits (30 s, doubling up to 5 min) and submits again with the same arguments and stdin, for up to
`cluster.submit_retry_minutes`; any other failure, and success, pass through at once and unchanged.
Each wait is one line on stderr and in the log file (results/logs/slurm/sbatch-retries.log); each
refusal passed through is one line in that file too, with sbatch's message, which the workflow prints
when it ends (`refusals_since`): Snakemake itself reports a refused group job as "message: None".

Standard library only: the wrapper runs this file as a script, and the Snakefile imports it.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, MutableMapping
from dataclasses import dataclass

# Slurm's job-reason names of the limits on jobs in the queue (src/common/slurm_protocol_defs.c,
# job_reason_string; 22.05 prints the reason on the line before "Batch job submission failed").
SUBMIT_LIMIT_REASONS = (
    "QOSMaxSubmitJobPerUserLimit",
    "QOSMaxSubmitJobPerAccountLimit",
    "QOSGrpSubmitJobsLimit",
    "AssocMaxSubmitJobLimit",
    "AssocGrpSubmitJobsLimit",
)
# ESLURM_ACCOUNTING_POLICY: the submit limits and (with the QOS flag DenyOnLimit) size and time limits.
POLICY_MESSAGE = "Job violates accounting/QOS policy"
# Any other limit's reason (QOSMaxWallDurationPerJobLimit, AssocMaxNodePerJobLimit, ...): waiting
# does not help a job that is too big or too long, so the refusal passes through.
OTHER_LIMIT = re.compile(r"\b(?:QOS|Assoc)[A-Za-z]+Limit\b")
MARKER = "scalestudy submit_retry wrapper"  # in the wrapper script: never taken for the real sbatch
FIRST_WAIT_S = 30.0
MAX_WAIT_S = 300.0
TIME_FORMAT = "%Y-%m-%dT%H:%M:%S"  # the log's time stamps (local time)
REFUSED = "refused"  # a log line of a refusal that was not retried


def refusal_reason(stderr: str) -> str | None:
    """The submit limit that refused a submission, from sbatch's stderr; None for any other failure."""
    for reason in SUBMIT_LIMIT_REASONS:
        if reason in stderr:
            return reason
    if POLICY_MESSAGE in stderr and not OTHER_LIMIT.search(stderr):
        return "job submit limit (accounting/QOS policy)"  # a Slurm that names no reason
    return None


def waits(first_s: float, max_s: float) -> Iterator[float]:
    """first_s, then twice as long each time, never more than max_s."""
    wait = first_s
    while True:
        yield min(wait, max_s)
        wait *= 2


@dataclass
class Retry:
    """How long to keep trying, and where each wait is logged."""

    patience_s: float
    first_wait_s: float = FIRST_WAIT_S
    max_wait_s: float = MAX_WAIT_S
    log_path: str | None = None
    label: str = ""  # which job: the plugin's --comment (rule and wildcards)
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic

    def log(self, line: str, echo: bool = True) -> None:
        """One line in the log file, and on stderr if `echo`."""
        label = f" {self.label}" if self.label else ""
        stamped = f"{time.strftime(TIME_FORMAT)} sbatch (scalestudy){label}: {line}"
        if echo:
            print(stamped, file=sys.stderr, flush=True)
        if self.log_path:
            os.makedirs(os.path.dirname(os.path.abspath(self.log_path)), exist_ok=True)
            with open(self.log_path, "a") as handle:  # one short line per write: appends do not interleave
                handle.write(stamped + "\n")


def submit(command: list[str], stdin: bytes | None, retry: Retry) -> subprocess.CompletedProcess:
    """Run `command` (the real sbatch and its arguments) until Slurm accepts it, refuses it for another
    reason, or retry.patience_s has passed; stdin (None: inherited) is fed again to every try."""
    started = retry.clock()
    for refusals, wait in enumerate(waits(retry.first_wait_s, retry.max_wait_s), start=1):
        result = subprocess.run(command, input=stdin, capture_output=True)
        reason = None if result.returncode == 0 else refusal_reason(result.stderr.decode(errors="replace"))
        if reason is None:
            if result.returncode != 0:
                # sbatch's stderr passes through as it is: the log only
                retry.log(f"{REFUSED} (exit {result.returncode}): {_message(result)}", echo=False)
            if refusals > 1 and result.returncode == 0:
                took = retry.clock() - started
                retry.log(f"accepted after {refusals - 1} refusal(s), {took:.0f} s: {_job(result)}")
            return result
        if retry.clock() - started + wait > retry.patience_s:
            minutes = retry.patience_s / 60
            note = (
                f"still refused by the submit limit {reason} after {refusals} tries in "
                f"{retry.clock() - started:.0f} s (cluster.submit_retry_minutes = {minutes:g}): the site "
                "caps the jobs you may have queued (MaxSubmitJobs); set the profile's `jobs:` below it "
                "(docs/guide/cluster.md, 'Queue limits')"
            )
            retry.log(note)
            return subprocess.CompletedProcess(
                result.args, result.returncode, result.stdout, result.stderr + f"{note}\n".encode()
            )
        retry.log(f"refused by the submit limit {reason} (try {refusals}): trying again in {wait:.0f} s")
        retry.sleep(wait)
    raise AssertionError("unreachable: waits() never ends")


def _job(result: subprocess.CompletedProcess) -> str:
    return result.stdout.decode(errors="replace").strip() or "(no job id printed)"


def _message(result: subprocess.CompletedProcess) -> str:
    """sbatch's stderr on one line (a log line per refusal)."""
    lines = [line.strip() for line in result.stderr.decode(errors="replace").splitlines() if line.strip()]
    return " | ".join(lines) or "(sbatch printed nothing)"


def refusals_since(log_path: str, since: float) -> list[str]:
    """The refusals the wrapper logged at or after `since` (time.time()), as logged: label and sbatch's
    message. Snakemake reports a refused group job as "message: None"; the workflow prints these
    instead (rules/common/hooks.smk)."""
    try:
        with open(log_path) as handle:
            lines = handle.read().splitlines()
    except FileNotFoundError:
        return []
    found = []
    for line in lines:
        stamp, _, rest = line.partition(" ")
        try:
            logged = time.mktime(time.strptime(stamp, TIME_FORMAT))
        except ValueError:
            continue
        if logged >= int(since) and f": {REFUSED} (exit " in rest:
            found.append(rest.removeprefix("sbatch (scalestudy) ").strip())
    return found


def label_of(args: list[str]) -> str:
    """The value of sbatch's --comment (the plugin's `rule_<rule>_wildcards_<...>`), else ""."""
    for index, arg in enumerate(args):
        if arg.startswith("--comment="):
            return arg.split("=", 1)[1]
        if arg == "--comment" and index + 1 < len(args):
            return args[index + 1]
    return ""


def stdin_for(args: list[str], stream=None) -> bytes | None:
    """What to feed every try: all of stdin (a script on /dev/stdin, as the plugin sends it), or None
    (inherit it) for a terminal or a --wrap job, whose sbatch reads no stdin (and the caller may
    never close it)."""
    stream = sys.stdin if stream is None else stream
    if stream is None or stream.closed or any(arg == "--wrap" or arg.startswith("--wrap=") for arg in args):
        return None
    if stream.isatty():
        return None
    return stream.buffer.read()


def real_sbatch(path: str, skip_dir: str) -> str | None:
    """The first `sbatch` on path that is neither in skip_dir nor a wrapper like this one."""
    skip = os.path.realpath(skip_dir)
    for folder in path.split(os.pathsep):
        if not folder or os.path.realpath(folder) == skip:
            continue
        candidate = os.path.join(folder, "sbatch")
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK) and not _is_wrapper(candidate):
            return candidate
    return None


def _is_wrapper(path: str) -> bool:
    try:
        with open(path, "rb") as handle:
            return MARKER.encode() in handle.read(512)
    except OSError:
        return False


def install(
    folder: str,
    patience_minutes: float | None = None,
    log_path: str | None = None,
    first_wait_s: float = FIRST_WAIT_S,
    max_wait_s: float = MAX_WAIT_S,
) -> str:
    """Write the wrapper `folder/sbatch` (this interpreter runs this file) and return the folder;
    patience_minutes: cluster.submit_retry_minutes, by default the schema's."""
    from scalestudy.atomic import atomic_path
    from scalestudy.plan import schema

    if patience_minutes is None:
        patience_minutes = schema.node("cluster", "submit_retry_minutes")["default"]

    folder = os.path.abspath(folder)
    options = [
        "--skip-dir", folder, "--patience-minutes", str(patience_minutes),
        "--first-wait-s", str(first_wait_s), "--max-wait-s", str(max_wait_s),
        *(["--log", os.path.abspath(log_path)] if log_path else []),
    ]  # fmt: skip
    # -I -S: no site-packages, no PYTHONPATH: the standard library only, whatever the environment.
    command = shlex.join([sys.executable, "-I", "-S", os.path.abspath(__file__), *options, "--"])
    wrapper = os.path.join(folder, "sbatch")
    with atomic_path(wrapper) as tmp:
        tmp.write_text(f'#!/bin/sh\n# {MARKER} (scalestudy/launch/submit_retry.py)\nexec {command} "$@"\n')
    os.chmod(wrapper, 0o755)
    return folder


def put_first(environ: MutableMapping[str, str], folder: str) -> None:
    """Put folder first on environ's PATH (once)."""
    parts = [part for part in environ.get("PATH", "").split(os.pathsep) if part]
    if parts[:1] != [folder]:
        environ["PATH"] = os.pathsep.join([folder, *parts])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    own, sbatch_args = argv[:split], argv[split + 1 :]
    parser = argparse.ArgumentParser(prog="sbatch (scalestudy)", description=__doc__.split("\n")[0])
    parser.add_argument("--skip-dir", required=True, help="the wrapper's folder: the real sbatch is after it")
    parser.add_argument("--patience-minutes", type=float, required=True, help="install() passes it")
    parser.add_argument("--first-wait-s", type=float, default=FIRST_WAIT_S)
    parser.add_argument("--max-wait-s", type=float, default=MAX_WAIT_S)
    parser.add_argument("--log", default=None, help="append each wait to this file")
    options = parser.parse_args(own)
    sbatch = real_sbatch(os.environ.get("PATH", ""), options.skip_dir)
    if sbatch is None:
        print(f"sbatch (scalestudy): no sbatch on PATH after {options.skip_dir}", file=sys.stderr)
        return 127
    retry = Retry(options.patience_minutes * 60, options.first_wait_s, options.max_wait_s, options.log)
    retry.label = label_of(sbatch_args)
    try:
        result = submit([sbatch, *sbatch_args], stdin_for(sbatch_args), retry)
    except KeyboardInterrupt:
        return 130
    sys.stdout.buffer.write(result.stdout)
    sys.stderr.buffer.write(result.stderr)
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
