"""Live tracking of a training job, on rank 0 (scalestudy.train.trainer): its MLflow run goes
RUNNING when the job starts, receives the per-step and per-epoch metrics while it trains, and ends
FINISHED, KILLED (stopped for a retry: the retry continues the same run) or FAILED (with the reason
as a tag).

Nothing here is on the step's critical path: the trainer only puts metrics on a queue; a
background thread imports mlflow, attaches to the run, appends every item to the run folder's
journal (tracking.jsonl, the sync's source) and sends them in batches. When the store cannot be
reached the thread warns once and stops sending (no retries); training and the journal go on, and
rule `track` fills MLflow afterwards. Steps an earlier attempt already logged are not sent twice.
Without ENV (tracking off) `follow` gives NULL_RUN, which does nothing and imports nothing.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import threading
import time
from pathlib import Path
from typing import Any

from scalestudy import provenance
from scalestudy.tracking import EPOCH_COLUMNS, JOURNAL, from_environ, point_of, point_tags

log = logging.getLogger("scalestudy.tracking")

BATCH_SECONDS = 1.0  # how long the thread gathers metrics before one log_batch
STEP_KEY = "samples_per_s"  # a per-step metric every logged step has (resumes skip steps it has)
END_STATUS = {0: "FINISHED", 75: "KILLED"}


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


class LiveRun(NullRun):
    """The MLflow run of one attempt of a grid point, fed from a queue by a background thread."""

    def __init__(self, tracking: dict[str, Any], given: dict[str, Any], out_dir: Path, checkpoint_dir: str):
        self.tracking, self.given = tracking, given
        self.out_dir, self.checkpoint_dir = Path(out_dir), checkpoint_dir
        self.config_hash = provenance.config_hash(given)
        self.point = point_of(out_dir)
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.client, self.run_id, self.skip_through = None, None, -1
        self.warned, self.closed = False, False
        self.thread = threading.Thread(target=self._work, name="mlflow-live", daemon=True)
        self.thread.start()

    # -- the trainer's side: never blocks --

    def step(self, step: int, metrics: dict[str, float]) -> None:
        self.queue.put(("step", step, metrics, time.time()))

    def epoch(self, epoch: int, metrics: dict[str, float]) -> None:
        kept = {key: metrics[key] for key in EPOCH_COLUMNS if key in metrics}
        self.queue.put(("epoch", epoch, kept, time.time()))

    def ended(self, code: int) -> None:
        self.close(END_STATUS.get(code, "FAILED"), None if code in END_STATUS else f"exit code {code}")

    def close(self, status: str, reason: str | None = None, timeout_s: float | None = None) -> None:
        """Ends the run (once); waits for the thread a bounded time (a hung store cannot hold the job)."""
        if self.closed:
            return
        self.closed = True
        self.queue.put(("end", status, reason, time.time()))
        self.thread.join(timeout_s if timeout_s is not None else 6 * self.tracking.get("timeout_s", 5) + 10)

    # -- the thread --

    def _work(self) -> None:
        self._guard(self._attach)
        with (
            open(self.out_dir / JOURNAL, "a", encoding="utf-8")
            if self._journal_ready()
            else _nowhere() as out
        ):
            while True:
                items = self._gather()
                for kind, *rest in items:
                    if kind != "end" and out is not None:
                        out.write(
                            json.dumps({"kind": kind, "config_hash": self.config_hash, "at": rest}) + "\n"
                        )
                if out is not None:
                    out.flush()
                self._guard(self._send, items)
                if any(kind == "end" for kind, *_ in items):
                    return

    def _journal_ready(self) -> bool:
        try:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            return True
        except OSError as error:
            self._warn(f"no journal in {self.out_dir}: {error}")
            return False

    def _gather(self) -> list[tuple]:
        items = [self.queue.get()]
        deadline = time.monotonic() + BATCH_SECONDS
        while items[-1][0] != "end" and (left := deadline - time.monotonic()) > 0:
            try:
                items.append(self.queue.get(timeout=left))
            except queue.Empty:
                break
        return items

    def _guard(self, function, *args) -> None:
        if self.warned:
            return
        try:
            function(*args)
        except Exception as error:  # the store is down or unreachable: training goes on
            self._warn(
                f"MLflow at {self.tracking['uri']} failed ({type(error).__name__}: {str(error)[:300]}); "
                "training goes on, the run folder keeps everything and rule `track` replays it"
            )

    def _warn(self, message: str) -> None:
        if not self.warned:
            self.warned = True
            log.warning("tracking: %s", message)

    def _attach(self) -> None:
        from scalestudy.tracking import store

        client = store.client(self.tracking)
        experiment = store.experiment_id(client, self.tracking)
        run_id = store.read_run_id(self.checkpoint_dir, self.config_hash, self.tracking["uri"])
        if run_id is None:
            parent = store.study_run(client, experiment, self.tracking["study"])
            tags = point_tags(self.point, self.config_hash, self.given, self.tracking["study"])
            run_id, _ = store.point_run(client, experiment, tags, self.given, parent, status="RUNNING")
            store.write_run_id(self.checkpoint_dir, self.config_hash, self.tracking["uri"], run_id)
        store.set_status(client, run_id, "RUNNING")
        attempt = os.environ.get("SCALESTUDY_ATTEMPT")
        for key, value in job_tags().items():
            store.append_tag(client, run_id, key, value)
        if attempt:
            client.set_tag(run_id, "attempt", attempt)
        self.skip_through = max(store.logged_steps(client, run_id, STEP_KEY), default=-1)
        self.client, self.run_id = client, run_id

    def _send(self, items: list[tuple]) -> None:
        from mlflow.entities import Metric

        if self.client is None:
            return
        metrics = []
        for kind, at, values, stamp in items:
            if kind == "end" or (kind == "step" and at <= self.skip_through):
                continue
            prefix = "epoch_" if kind == "epoch" else ""
            metrics += [Metric(prefix + k, float(v), int(stamp * 1000), at) for k, v in values.items()]
        for start in range(0, len(metrics), 1000):
            self.client.log_batch(self.run_id, metrics=metrics[start : start + 1000])
        for kind, status, reason, _ in items:
            if kind == "end":
                from scalestudy.tracking import store

                store.set_status(self.client, self.run_id, status, reason)


def job_tags() -> dict[str, str | None]:
    """The Slurm job and nodes of this attempt (accumulated over attempts by append_tag)."""
    return {
        "slurm.job_ids": os.environ.get("SLURM_JOB_ID"),
        "slurm.nodelists": os.environ.get("SLURM_JOB_NODELIST"),
    }


@contextlib.contextmanager
def _nowhere():
    yield None


@contextlib.contextmanager
def follow(trainer):
    """Tracks `trainer`'s run on rank 0 while the block runs (trainer.live); an exception ends the
    run FAILED with its reason. Tracking off, or another rank: NULL_RUN."""
    tracking = from_environ()
    if tracking is None or not tracking.get("live", True) or not trainer.is_main:
        yield NULL_RUN
        return
    trainer.live = LiveRun(tracking, trainer.given, trainer.out_dir, trainer.config["checkpoint_dir"])
    try:
        yield trainer.live
    except BaseException as error:
        trainer.live.close("FAILED", f"{type(error).__name__}: {error}")
        raise
    finally:
        trainer.live.close("FAILED", "the job ended without reporting")  # a no-op after ended()
