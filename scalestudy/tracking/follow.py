"""The study's follower: the run folders' journals into MLflow while the study runs (imports mlflow).

One process per Snakemake run, on the submit host (started by the Snakefile's onstart, stopped by
rule `track` and at Snakemake's end: scalestudy.tracking.start_follower, stop_follower), at nice 19:
it first makes the grid's points SCHEDULED (once a journal appears, or ATTACH_AFTER_SECONDS after
its start: a short run that trains nothing never imports mlflow), then once a second reads what
the training jobs' rank 0 appended to their journals (scalestudy.train.journal) and replays it (a
status at once, metrics every BATCH_SECONDS): a `start` record marks the point's run RUNNING
(found by the run id in the point's checkpoint folder, else by its tags, else created) and adds the
attempt's Slurm job and nodes, steps and epochs become metrics, an `end` record marks it FINISHED,
KILLED or FAILED with the reason. Compute nodes need not reach the tracking server, and no training
job pays for mlflow.

Each record is replayed once: the run's tag RECORDS_TAG counts the records of its config hash
already replayed, so the follower after a restart, and rule `track`'s sync (which replays the
journals with the same Replayer before it fills the runs), skip them. If the store fails, the
follower warns once and tries again every RETRY_SECONDS; nothing is lost, rule `track` replays
what is missing.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scalestudy import atomic, provenance
from scalestudy.tracking import point_of, point_tags, store
from scalestudy.train.journal import JOURNAL

log = logging.getLogger("scalestudy.tracking")

POLL_SECONDS = 1.0  # how often the journals are read; a start or an end goes out at once
# The first attach (importing mlflow, opening the store, the SCHEDULED runs) waits this long unless a
# journal appears first: a short Snakemake run that trains nothing (a table, a fetch) ends without
# paying for it.
ATTACH_AFTER_SECONDS = 10.0
BATCH_SECONDS = 5.0  # how long steps and epochs gather before they go out (store writes cost CPU)
RETRY_SECONDS = 30.0  # after the store failed
RECORDS_TAG = "scalestudy.journal_records"
STEP_KEY = "samples_per_s"  # a per-step metric every logged step has
EPOCH_KEY = "epoch_train_loss"  # a per-epoch metric every epoch has
FOLLOWING = "store attached"  # logged once the first pass is done


def read_records(data: bytes) -> list[dict[str, Any]]:
    """The journal records in `data` (complete lines); a line that is not one is skipped."""
    records = []
    for line in data.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("config_hash"):
            records.append(record)
    return records


def journal_records(run_dir: Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / JOURNAL
    return read_records(path.read_bytes()) if path.is_file() else []


@dataclass
class Attached:
    """A point's MLflow run as the replay of one journal's records of its config hash sees it."""

    run_id: str
    done: int  # records the run had replayed when attached (RECORDS_TAG)
    last_step: int  # the highest step it has (a resumed attempt repeats steps)
    last_epoch: int
    seen: int = 0  # records read since, of this journal and config hash


class Replayer:
    """Replays journal records into MLflow, in order, each once."""

    def __init__(self, client, experiment: str, parent: str, tracking: dict[str, Any]):
        self.client, self.experiment, self.parent, self.tracking = client, experiment, parent, tracking
        self.runs: dict[tuple[str, str], Attached] = {}

    def forget(self, run_dir: Path) -> None:
        """Drops what it knows of a journal (it was replaced: read it from the start again)."""
        self.runs = {key: run for key, run in self.runs.items() if key[0] != str(run_dir)}

    def replay(self, run_dir: Path, records: list[dict[str, Any]]) -> int:
        """Replays the journal's records that follow the ones given before; how many were new."""
        from mlflow.entities import Metric

        metrics: dict[str, list[Metric]] = {}
        touched: dict[str, Attached] = {}
        new = 0
        for record in records:
            run = self._run(run_dir, record)
            if run is None:
                continue
            run.seen += 1
            if run.seen <= run.done:
                continue
            new += 1
            touched[run.run_id] = run
            kind = record.get("kind")
            if kind in ("start", "end"):
                self._send(run.run_id, metrics.pop(run.run_id, []))
                self._status(run, record)
            elif kind in ("step", "epoch"):
                metrics.setdefault(run.run_id, []).extend(self._metrics(run, kind, record["at"]))
        for run_id, run in touched.items():
            self._send(run_id, metrics.pop(run_id, []))
            self.client.set_tag(run_id, RECORDS_TAG, str(run.seen))
        return new

    def _run(self, run_dir: Path, record: dict[str, Any]) -> Attached | None:
        key = (str(run_dir), record["config_hash"])
        if key not in self.runs:
            run_id = self._find(point_of(run_dir), record)
            if run_id is None:
                return None  # no run yet and no start record to make one from
            have = self.client.get_run(run_id).data.tags
            self.runs[key] = Attached(
                run_id,
                done=int(have.get(RECORDS_TAG, 0)),
                last_step=max(store.logged_steps(self.client, run_id, STEP_KEY), default=-1),
                last_epoch=max(store.logged_steps(self.client, run_id, EPOCH_KEY), default=0),
            )
        return self.runs[key]

    def _find(self, point: str, record: dict[str, Any]) -> str | None:
        """The point's run: the one its checkpoint folder names, else found by its tags, else a new
        one (from a start record) under the study's run; the checkpoint folder then names it."""
        config_hash, uri = record["config_hash"], self.tracking["uri"]
        checkpoint_dir = record.get("checkpoint_dir")
        if checkpoint_dir and (run_id := store.read_run_id(checkpoint_dir, config_hash, uri)):
            try:
                self.client.get_run(run_id)
                return run_id
            except Exception:  # noqa: BLE001 - the store was replaced since: find or make it anew
                pass
        if record.get("kind") != "start":
            found = store.find_runs(self.client, self.experiment, point, config_hash)
            return found[-1].info.run_id if found else None
        given = record.get("given") or {}
        tags = point_tags(point, config_hash, given, self.tracking["study"])
        started = record.get("at") if isinstance(record.get("at"), int | float) else None
        run_id, _ = store.point_run(
            self.client, self.experiment, tags, given, self.parent, "RUNNING", started
        )
        if checkpoint_dir:
            store.write_run_id(checkpoint_dir, config_hash, uri, run_id)
        return run_id

    def _status(self, run: Attached, record: dict[str, Any]) -> None:
        if record["kind"] == "end":
            ended = record.get("at") if isinstance(record.get("at"), int | float) else None
            status = record.get("status") or "FAILED"
            store.set_status(self.client, run.run_id, status, record.get("reason"), ended)
            return
        store.set_status(self.client, run.run_id, "RUNNING")
        store.append_tag(self.client, run.run_id, "slurm.job_ids", record.get("slurm_job_id"))
        store.append_tag(self.client, run.run_id, "slurm.nodelists", record.get("slurm_nodelist"))
        if record.get("attempt"):
            self.client.set_tag(run.run_id, "attempt", str(record["attempt"]))

    def _metrics(self, run: Attached, kind: str, at: list) -> list:
        """A step's or an epoch's metrics, unless the run has them (a resumed attempt's repeats)."""
        from mlflow.entities import Metric

        index, values, stamp = at
        if kind == "step":
            if index <= run.last_step:
                return []
            run.last_step, prefix = index, ""
        else:
            if index <= run.last_epoch:
                return []
            run.last_epoch, prefix = index, "epoch_"
        return [
            Metric(prefix + key, value, int(stamp * 1000), index)
            for key, raw in values.items()
            if (value := store.metric_value(raw)) is not None
        ]

    def _send(self, run_id: str, metrics: list) -> None:
        for start in range(0, len(metrics), 1000):
            self.client.log_batch(run_id, metrics=metrics[start : start + 1000])


def schedule_in(
    client, experiment: str, parent: str, tracking: dict, points: list[dict[str, Any]]
) -> list[str]:
    """A SCHEDULED run, under the study's run `parent`, for each point ({point, run}) that has no run
    of its run config; the points made."""
    created = []
    for item in points:
        config_hash = provenance.config_hash(item["run"])
        tags = point_tags(item["point"], config_hash, item["run"], tracking["study"])
        run_id, new = store.point_run(client, experiment, tags, item["run"], parent, status="SCHEDULED")
        if new:
            created.append(item["point"])
    return created


class Follower:
    """The follower's loop: SCHEDULED runs first, then the journals under `roots` once a second,
    until SIGTERM or the parent (Snakemake) is gone; then one last pass."""

    def __init__(self, tracking: dict, roots: list[Path], points: list[dict] | None, parent_pid: int | None):
        self.tracking, self.roots, self.points, self.parent_pid = tracking, roots, points, parent_pid
        self.offsets: dict[Path, int] = {}
        self.pending: dict[Path, list[dict[str, Any]]] = {}  # read, not yet replayed
        self.sent_at: dict[Path, float] = {}
        self.replayer: Replayer | None = None
        self.stopping, self.warned, self.retry_at, self.following = False, False, 0.0, False

    def run(self) -> None:
        signal.signal(signal.SIGTERM, self._stop)
        started = time.monotonic()
        while True:
            last = self.stopping or not self._parent_alive()
            waiting = self.replayer is None and time.monotonic() - started < ATTACH_AFTER_SECONDS
            if waiting and not self._journals():
                if last:
                    log.info("tracking: stopped before any journal appeared: nothing to send")
                    return
            elif last or time.monotonic() >= self.retry_at:
                self._guard(self._pass)
            if last:
                return
            time.sleep(POLL_SECONDS)

    def _stop(self, *_) -> None:
        self.stopping = True

    def _parent_alive(self) -> bool:
        return self.parent_pid is None or os.getppid() == self.parent_pid

    def _pass(self) -> None:
        """The grid's SCHEDULED runs (once), then what the journals hold that was not replayed."""
        if self.replayer is None:
            client = store.client(self.tracking)
            experiment = store.experiment_id(client, self.tracking)
            parent = store.study_run(client, experiment, self.tracking["study"])
            self.replayer = Replayer(client, experiment, parent, self.tracking)
        if self.points:
            replayer = self.replayer
            created = schedule_in(
                replayer.client, replayer.experiment, replayer.parent, self.tracking, self.points
            )
            log.info("%d SCHEDULED run(s) created in %s", len(created), self.tracking["experiment"])
            self.points = None
        for path in self._journals():
            records = self._read(path)
            self.pending.setdefault(path, []).extend(records)
            if self._due(path):
                new = self.replayer.replay(path.parent, self.pending.pop(path))
                self.sent_at[path] = time.monotonic()
                if new:
                    log.info("%s: %d record(s)", point_of(path.parent), new)
        if not self.following:
            self.following = True
            log.info("%s: following %s", FOLLOWING, ", ".join(map(str, self.roots)))

    def _due(self, path: Path) -> bool:
        """The journal's new records go out: a status among them, BATCH_SECONDS since the last
        ones went, or the last pass."""
        records = self.pending.get(path)
        if not records:
            return False
        if (
            self.stopping
            or not self._parent_alive()
            or any(r.get("kind") in ("start", "end") for r in records)
        ):
            return True
        return time.monotonic() - self.sent_at.get(path, 0.0) >= BATCH_SECONDS

    def _journals(self) -> list[Path]:
        return sorted(path for root in self.roots if root.is_dir() for path in root.glob(f"**/{JOURNAL}"))

    def _read(self, path: Path) -> list[dict[str, Any]]:
        """The journal's complete lines past what was read before (from the start if it shrank)."""
        offset = self.offsets.get(path, 0)
        try:
            if path.stat().st_size < offset:  # replaced: its records so far are another file's
                offset = 0
                self.pending.pop(path, None)
                self.replayer.forget(path.parent)
            with open(path, "rb") as handle:
                handle.seek(offset)
                data = handle.read()
        except OSError:
            return []
        complete = data[: data.rfind(b"\n") + 1]
        self.offsets[path] = offset + len(complete)
        return read_records(complete)

    def _guard(self, function) -> None:
        try:
            function()
            self.retry_at = 0.0
        except Exception as error:  # the store is down or refuses: try again later, warn once
            if not self.warned:
                self.warned = True
                log.warning(
                    "tracking: MLflow at %s failed (%s: %s); the study goes on, trying again every %.0f s, "
                    "and rule `track` replays the run folders",
                    self.tracking["uri"],
                    type(error).__name__,
                    str(error)[:300],
                    RETRY_SECONDS,
                )
            else:
                log.info("tracking: MLflow failed again (%s)", type(error).__name__)
            self._start_over()
            self.retry_at = time.monotonic() + RETRY_SECONDS

    def _start_over(self) -> None:
        """Forgets every journal and the store: the next pass reads all again (the runs' tags
        say which records were replayed)."""
        self.replayer, self.offsets, self.pending = None, {}, {}


def main(
    tracking: dict,
    roots: list[Path],
    points: list[dict] | None,
    parent_pid: int | None,
    pid_file: Path | None,
    log_file: Path | None,
) -> int:
    """`python -m scalestudy.tracking follow`: the follower until it is stopped."""
    with_handlers(log_file)
    with contextlib.suppress(OSError):
        os.nice(19)  # training jobs on this host come first
    if pid_file:
        atomic.write_json(pid_file, {"pid": os.getpid(), "host": socket.gethostname()})
    try:
        Follower(tracking, roots, points, parent_pid).run()
    finally:
        if pid_file:
            pid_file.unlink(missing_ok=True)
    log.info("tracking: the follower stopped")
    return 0


def with_handlers(log_file: Path | None) -> None:
    """Everything to the follower's log; warnings also to stderr (Snakemake's terminal)."""
    form = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%Y-%m-%dT%H:%M:%S")
    logging.getLogger("urllib3").setLevel(logging.ERROR)  # its retries: our one warning says it
    root = logging.getLogger()
    root.handlers.clear()
    root.setLevel(logging.INFO)
    terminal = logging.StreamHandler(sys.stderr)
    terminal.setLevel(logging.WARNING)
    handlers = [terminal]
    if log_file:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(log_file))
    for handler in handlers:
        handler.setFormatter(form)
        root.addHandler(handler)
