"""What the pre-flight checks share: their command line's frame, the launcher's argv for a rank
module, running a command with its output copied into the job's log, result records with
provenance, and the CSV tables made of those records.

Standard library only at module level (the Snakefile imports preflight.site and preflight.smoke).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import logging
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from scalestudy import atomic, contract, provenance
from scalestudy.progress import setup_logging

log = logging.getLogger("scalestudy.preflight")

NONE = "none"  # a table's word for what a host does not have (no GPU, no InfiniBand)
KILL_AFTER_S = 30  # after SIGTERM to a command past its time, SIGKILL this much later


# --------------------------------------------------------------------------- command line


def command_parser(module: str, doc: str, log_level: bool = True) -> tuple[argparse.ArgumentParser, Any]:
    """`python -m scalestudy.preflight.<module>`, described by its docstring's first line (with
    --log-level before the subcommand unless `log_level` is False), and the subparsers of its
    subcommands (one required)."""
    parser = argparse.ArgumentParser(
        prog=f"python -m scalestudy.preflight.{module}", description=doc.splitlines()[0]
    )
    if log_level:
        add_log_level(parser)
    return parser, parser.add_subparsers(dest="command", required=True)


def add_log_level(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--log-level", default="INFO")


def add_launch_json(parser: argparse.ArgumentParser, what: str, required: bool = True) -> None:
    """--launch-json: the job's launch spec (plan.cluster.launch_spec) as JSON."""
    parser.add_argument("--launch-json", required=required, help=f"the launch spec (JSON): {what}")


def add_out(parser: argparse.ArgumentParser, what: str) -> None:
    """--out: the file the subcommand writes (atomically)."""
    parser.add_argument("--out", required=True, type=Path, help=what)


def add_table_command(sub: Any, inputs: str, inputs_help: str, out: str) -> argparse.ArgumentParser:
    """The `table` subcommand: the records (or lists of them) given to `inputs`, as the table `out`."""
    table = sub.add_parser("table", help=f"{out} from the records")
    table.add_argument(inputs, nargs="+", required=True, help=inputs_help)
    add_out(table, out)
    return table


def run_command(
    args: argparse.Namespace, handlers: Mapping[str, Callable[[argparse.Namespace], int]], name: str
) -> int:
    """Log at --log-level and run the subcommand's handler; a ValueError (bad input: JSON, a launch
    spec, settings) is one line `<name>: error: ...` on stderr and exit 2."""
    setup_logging(getattr(logging, str(args.log_level).upper(), logging.INFO))
    try:
        return handlers[args.command](args)
    except ValueError as error:
        print(f"{name}: error: {error}", file=sys.stderr)
        return contract.EXIT_BAD_CONFIG


# --------------------------------------------------------------------------- running commands


def launch_argv(spec: Mapping[str, Any], rank_args: Sequence[str], module: str | None = None) -> list[str]:
    """`python -m scalestudy.launch` as a training job runs it (srun, the image around each rank, the
    `nccl:` environment), every rank running the trainer or, with `module`, that module."""
    argv = [sys.executable, "-m", "scalestudy.launch", "--launch-json", json.dumps(spec, sort_keys=True)]
    return [*argv, *(["--module", module] if module else []), "--", *rank_args]


def run_logged(argv: Sequence[str], timeout_s: float | None = None) -> tuple[int | None, list[str]]:
    """Run `argv`, its output (stdout and stderr) copied line by line to this process's stderr (the
    job's log) and kept: (exit code, lines). With `timeout_s` it runs in its own process group; past
    the time the group gets SIGTERM, then SIGKILL KILL_AFTER_S later, and the code is None."""
    log.info("running: %s", shlex.join(argv))
    lines: list[str] = []
    process = subprocess.Popen(
        list(argv),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=timeout_s is not None,
    )
    reader = threading.Thread(target=_copy_lines, args=(process.stdout, lines), daemon=True)
    reader.start()
    try:
        code: int | None = process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _stop_group(process)
        code = None
    # past the deadline, a process that left the group may hold the pipe: its lines are not awaited
    reader.join(None if code is not None else KILL_AFTER_S)
    return code, list(lines)


def _copy_lines(stream: IO[str], lines: list[str]) -> None:
    with stream:
        for line in stream:
            sys.stderr.write(line)
            lines.append(line)


def _stop_group(process: subprocess.Popen) -> None:
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=KILL_AFTER_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def command_output(argv: Sequence[str], timeout: float = 30) -> str | None:
    """stdout of a tool, or None if it is missing, fails or takes longer than `timeout` seconds."""
    if shutil.which(argv[0]) is None:
        return None
    try:
        result = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout if result.returncode == 0 else None


# --------------------------------------------------------------------------- records and tables


def with_provenance(record: Mapping[str, Any], config: Any = None, seed: int | None = None) -> dict[str, Any]:
    """`record` with the provenance of this process (and the hash of `config`) under "provenance"."""
    return {**record, "provenance": provenance.collect(config=config, seed=seed)}


def write_record(
    out: str | os.PathLike, record: Mapping[str, Any], config: Any = None, seed: int | None = None
) -> dict[str, Any]:
    """Write `record` with its provenance as JSON, atomically; the record as written."""
    written = with_provenance(record, config=config, seed=seed)
    atomic.write_json(out, written)
    return written


def read_records(paths: Iterable[str | os.PathLike]) -> list[dict[str, Any]]:
    """The JSON records at `paths`, in order; ValueError naming a file that is not JSON."""
    records = []
    for path in paths:
        try:
            records.append(json.loads(Path(path).read_text()))
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}: not a JSON record ({error})") from error
    return records


def write_table(out: str | os.PathLike, columns: Sequence[str], rows: Iterable[Mapping[str, Any]]) -> None:
    """`rows` as a CSV with `columns` (header first, '\\n' line ends), written atomically."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(columns), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    atomic.write_text(out, buffer.getvalue())
