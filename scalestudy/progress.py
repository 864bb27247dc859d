"""Progress lines for long work: done/total, rate, ETA, at most every `interval_s` seconds; and the
logging every command line shares (setup_logging, quiet)."""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import stat
import sys
import time
from collections.abc import Iterator


def format_seconds(seconds: float) -> str:
    if seconds != seconds or seconds == float("inf"):  # NaN or inf
        return "?"
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours:d}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:d}:{secs:02d}"


class Progress:
    """Logs `what: done/total (pct) rate unit/s ETA m:ss` as work advances.

    >>> p = Progress("download", total=1000, unit="B"); p.advance(500)
    """

    def __init__(
        self,
        what: str,
        total: float | None,
        unit: str = "it",
        logger: logging.Logger | None = None,
        interval_s: float = 2.0,
        start: float = 0,
    ) -> None:
        self.what = what
        self.total = total
        self.unit = unit
        self.log = logger or logging.getLogger("scalestudy")
        self.interval_s = interval_s
        self.done = start
        self._start_done = start
        self._t0 = time.monotonic()
        self._last = -float("inf")

    def advance(self, amount: float = 1, force: bool = False) -> None:
        self.done += amount
        now = time.monotonic()
        if force or now - self._last >= self.interval_s or (self.total and self.done >= self.total):
            self._last = now
            self.log.info(self.line(now))

    def rate(self, now: float | None = None) -> float:
        elapsed = (now or time.monotonic()) - self._t0
        return (self.done - self._start_done) / elapsed if elapsed > 0 else float("nan")

    def line(self, now: float | None = None) -> str:
        rate = self.rate(now)
        text = f"{self.what}: {_human(self.done, self.unit)}"
        if self.total:
            pct = 100.0 * self.done / self.total
            remaining = (self.total - self.done) / rate if rate and rate > 0 else float("nan")
            text += f"/{_human(self.total, self.unit)} ({pct:.0f}%) ETA {format_seconds(remaining)}"
        return text + f" at {_human(rate, self.unit)}/s"


def _human(value: float, unit: str) -> str:
    if unit != "B" or value != value:
        return (
            f"{value:,.1f} {unit}"
            if isinstance(value, float) and not value.is_integer()
            else f"{value:,.0f} {unit}"
        )
    for prefix in ("", "K", "M", "G", "T"):
        if abs(value) < 1024 or prefix == "T":
            return f"{value:.1f} {prefix}B"
        value /= 1024
    return f"{value:.1f} TB"


def setup_logging(level: int = logging.INFO) -> logging.Logger:
    """One log format for every command-line entry point (rules redirect stderr to their log:)."""
    logging.basicConfig(
        level=level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%Y-%m-%dT%H:%M:%S",
        force=True,
    )
    # matplotlib's PDF backend subsets fonts through fontTools, which logs every table at INFO.
    logging.getLogger("fontTools").setLevel(logging.WARNING)
    _log_command()
    return logging.getLogger("scalestudy")


_COMMAND_LOGGED: list[bool] = []


def _stderr_is_a_file() -> bool:
    try:
        return stat.S_ISREG(os.fstat(sys.stderr.fileno()).st_mode)
    except (OSError, ValueError, AttributeError):  # no descriptor (a test's captured stream)
        return False


def _log_command() -> None:
    """A job's log opens with the command that wrote it (the workflow's console does not print the
    commands): once per process, for `python -m scalestudy...` whose stderr is a file (a rule's log:,
    not a terminal or a pipe)."""
    from scalestudy.commandline import program

    name = program()
    if _COMMAND_LOGGED or name is None or not _stderr_is_a_file():
        return
    _COMMAND_LOGGED.append(True)
    logging.getLogger("scalestudy").info("command: %s", shlex.join([*name.split(), *sys.argv[1:]]))


@contextlib.contextmanager
def quiet(*names: str, level: int = logging.ERROR) -> Iterator[None]:
    """Inside: the loggers `names` (and theirs below) pass only `level` and above; restored after. For
    a program that reuses another's steps whose warnings are that program's, not its own."""
    loggers = [logging.getLogger(name) for name in names]
    before = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(level)
    try:
        yield
    finally:
        for logger, old in zip(loggers, before, strict=True):
            logger.setLevel(old)
