"""The training job's side of live tracking (rank 0, scalestudy.train.program): the run's journal.

The study's tracking settings (config `tracking:`) reach a job in one environment variable (ENV,
scalestudy.tracking.to_environ); scalestudy.tracking (the follower, rule `track`) reads the journal.

Rank 0 appends to its run folder's journal (tracking.jsonl) a `start` record when the job starts
(the run config, the checkpoint folder, the attempt, the Slurm job and nodes), a record per logged
step and per epoch, and an `end` record with the job's outcome: FINISHED, KILLED (stopped for a
retry: the retry continues the same MLflow run) or FAILED (with the reason). Each line is flushed
(log steps only, where the trainer already waits for the device's loss). The job imports no mlflow
and starts no thread: the study's follower (scalestudy.tracking.follow, one process on the submit
host, at nice 19) sends the journals to MLflow while they grow, and rule `track` replays what it
has not. On two busy cores, a thread importing mlflow and writing SQLite in every job cost 2 - 12 %
of the steady-state throughput and 2 s per job (docs/guide/benchmarks.md). Without ENV (tracking off)
`follow` gives NULL_RUN, which does nothing.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from pathlib import Path
from typing import IO, Any

from scalestudy import provenance
from scalestudy.contract import EXIT_RESUMABLE

ENV = "SCALESTUDY_TRACKING"  # the study's tracking settings, as JSON (scalestudy.tracking.to_environ)
# In the run folder, written only with tracking on: the per-step metrics rank 0 streamed.
JOURNAL = "tracking.jsonl"
# metrics.csv columns logged per epoch (as epoch_<column>, step = epoch), live and by the sync.
EPOCH_COLUMNS = (
    "train_loss",
    "train_acc",
    "test_loss",
    "test_acc",
    "images_per_s",
    "images_per_s_per_gpu",
    "lr",
)


def from_environ(environ: dict[str, str] | None = None) -> dict[str, Any] | None:
    """The settings a job was given (None: tracking off, or a value that does not parse)."""
    text = (os.environ if environ is None else environ).get(ENV)
    if not text:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) and value.get("uri") else None


log = logging.getLogger("scalestudy.tracking")

END_STATUS = {0: "FINISHED", EXIT_RESUMABLE: "KILLED"}


class NullRun:
    """Tracking off, or not rank 0: every call does nothing."""

    def step(self, step: int, metrics: dict[str, float]) -> None:
        pass

    def epoch(self, epoch: int, metrics: dict[str, float]) -> None:
        pass

    def ended(self, code: int) -> None:
        pass

    def close(self, status: str, reason: str | None = None) -> None:
        pass


NULL_RUN = NullRun()


class JournalRun(NullRun):
    """One attempt of a grid point, written to its run folder's journal."""

    def __init__(self, given: dict[str, Any], out_dir: Path, checkpoint_dir: str):
        self.config_hash = provenance.config_hash(given)
        self.closed = False
        self.out = self._open(Path(out_dir))
        self._write("start", time.time(), **start_fields(given, checkpoint_dir))

    def step(self, step: int, metrics: dict[str, float]) -> None:
        self._write("step", [step, metrics, time.time()])

    def epoch(self, epoch: int, metrics: dict[str, float]) -> None:
        kept = {key: metrics[key] for key in EPOCH_COLUMNS if key in metrics}
        self._write("epoch", [epoch, kept, time.time()])

    def ended(self, code: int) -> None:
        self.close(END_STATUS.get(code, "FAILED"), None if code in END_STATUS else f"exit code {code}")

    def close(self, status: str, reason: str | None = None) -> None:
        """Ends the attempt (once): its status record, flushed, and the journal closed."""
        if self.closed:
            return
        self.closed = True
        self._write("end", time.time(), status=status, reason=reason)
        if self.out is not None:
            self.out.close()

    def _open(self, out_dir: Path) -> IO[str] | None:
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
            return open(out_dir / JOURNAL, "a", encoding="utf-8")  # noqa: SIM115 - closed by close()
        except OSError as error:
            log.warning("tracking: no journal in %s (%s); rule `track` replays the folder", out_dir, error)
            return None

    def _write(self, kind: str, at: Any, **fields: Any) -> None:
        if self.out is None:
            return
        record = {"kind": kind, "config_hash": self.config_hash, "at": at, **fields}
        try:
            self.out.write(json.dumps(record) + "\n")
            self.out.flush()
        except OSError as error:  # a full disk: the run folder's own files say what happened
            log.warning("tracking: the journal stopped (%s)", error)
            self.out = None


def start_fields(given: dict[str, Any], checkpoint_dir: str) -> dict[str, Any]:
    """What the follower needs to find or create the point's MLflow run, and the attempt's job."""
    return {
        "given": given,
        "checkpoint_dir": str(checkpoint_dir),
        "attempt": os.environ.get("SCALESTUDY_ATTEMPT"),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "slurm_nodelist": os.environ.get("SLURM_JOB_NODELIST"),
    }


@contextlib.contextmanager
def follow(trainer):
    """Journals `trainer`'s attempt on rank 0 while the block runs (trainer.live); an exception
    ends it FAILED with its reason. Tracking off or not live, or another rank: NULL_RUN."""
    tracking = from_environ()
    if tracking is None or not tracking["live"] or not trainer.is_main:
        yield NULL_RUN
        return
    trainer.live = JournalRun(trainer.given, trainer.out_dir, trainer.config["checkpoint_dir"])
    try:
        yield trainer.live
    except BaseException as error:
        trainer.live.close("FAILED", f"{type(error).__name__}: {error}")
        raise
    finally:
        trainer.live.close("FAILED", "the job ended without reporting")  # a no-op after ended()
