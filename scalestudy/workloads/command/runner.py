"""The command workload's rank program: your own training script through the study.

Every rank runs `python -m scalestudy.train` as for any workload; scalestudy.train.program reads and
checks the run config (scalestudy.plan.runconfig) and hands a command workload's to `run()`, which
runs the run config's `command.script` with `command.args` as a child process (`python SCRIPT
ARGS...`, the script relative to the current directory, the workflow's) under the contract of
scalestudy.contract (docs/guide/workloads.md, "Your own script"): the environment
tells the script its run config, run folder, checkpoint folder and progress file; the script
reports its steps, epochs and peak memory as JSON lines. The runner forwards SIGTERM/SIGUSR1 to the
script and exits with its exit code (75: saved, retry to resume); a script still running a grace
period after the stop is killed with its whole process tree (scalestudy.workloads.command.process:
its own process group, a reaper that outlives the runner). A failing script is logged at ERROR
with its last lines of stderr. Each rank samples its own GPU (scalestudy.train.gpu_monitor) while
the script runs.

The ranks share no process group: they meet through files in the run's checkpoint_dir (which, like
the run folder, is on the file system every node sees). Under `<checkpoint_dir>/scalestudy/`:
`run_config.json`, `progress-rank<r>.jsonl` (kept over retries), `command_run.json` (the run
config's hash: before any rank starts its script, rank 0 empties a checkpoint_dir of a finished
run, and moves one of another run config into `superseded/<its hash>/`, never deleting it; the
other ranks wait for it) and `reports/<launch>/rank<r>.json` (each
rank's exit code, GPU monitor report and peak memory, merged by rank 0). After a finished run rank 0
writes the run folder (summary.json last) and empties checkpoint_dir, or with keep_checkpoints
marks it finished, so a run asked for again measures anew.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import resource
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

from scalestudy import atomic, contract, provenance
from scalestudy.launch import slurm_job
from scalestudy.plan import runfiles
from scalestudy.plan.runconfig import RunConfigError
from scalestudy.plan.runfiles import METRICS_COLUMNS, STEPS_COLUMNS
from scalestudy.train import gpu_monitor as monitor
from scalestudy.train import gpu_monitor_files
from scalestudy.workloads.command import progress as command_progress
from scalestudy.workloads.command.process import ScriptProcess, stop_grace_s
from scalestudy.workloads.command.progress import ProgressError
from scalestudy.workloads.command.support import (
    SUPERSEDED,
    UNKNOWN_TO_THE_RUNNER,
    device_name,
    drop_cut_line,
    empty_folder,
    launch_id,
    model_results,
    rank_device,
    rebased,
    supersede_folder,
)
from scalestudy.workloads.command.support import read_json as _read_json

STATE_DIR = "scalestudy"  # the runner's own files inside checkpoint_dir
RUN_MARK, FINISHED_MARK = "command_run.json", runfiles.FINISHED_MARK
POLL_S = 0.2

log = logging.getLogger("scalestudy.workloads.command")


# --- the run's files ------------------------------------------------------------------------------


def check_paths(config: dict[str, Any], out_dir: Path) -> Path:
    """The script (an existing file) and the folders; checkpoint_dir is emptied after a finished run,
    so it must not hold the workflow, the run folder or the script."""
    script = Path(config["command"]["script"])
    if not script.is_file():
        where = "" if script.is_absolute() else f" (relative to {Path.cwd()})"
        raise RunConfigError(
            f"command.script {script}{where} is not a file" + ("" if script.exists() else " (missing)")
        )
    checkpoint_dir = Path(config["checkpoint_dir"]).resolve()
    for what, path in (
        ("the current directory", Path.cwd()),
        ("--out-dir", out_dir),
        ("command.script", script),
    ):
        if path.resolve().is_relative_to(checkpoint_dir):
            raise RunConfigError(
                f"checkpoint_dir {config['checkpoint_dir']} holds {what}: it is emptied after the run"
            )
    for what, folder in (("checkpoint_dir", checkpoint_dir), ("--out-dir", out_dir)):
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise RunConfigError(f"{what} {folder}: cannot be created: {error.strerror or error}") from None
        if not os.access(folder, os.W_OK | os.X_OK):
            raise RunConfigError(f"{what} {folder} is not writable")
    return script


# --- the rank --------------------------------------------------------------------------------------


class Runner:
    def __init__(self, config, given, out_dir: Path, script: Path, dist_env) -> None:
        self.config, self.given, self.out_dir, self.script = config, given, out_dir, script
        self.rank, self.world_size, self.is_main = dist_env.rank, dist_env.world_size, dist_env.is_main
        self.dist_env = dist_env
        self.config_hash = provenance.config_hash(given)
        self.checkpoint_dir = Path(config["checkpoint_dir"])
        self.state_dir = self.checkpoint_dir / STATE_DIR
        self.progress_path = self.state_dir / f"progress-rank{self.rank}.jsonl"
        self.child: ScriptProcess | None = None
        self.signals: list[int] = []
        self.stop_offset: int | None = None  # the progress file's size when the first stop arrived

    def run(self) -> int:
        device = rank_device(self.config["device"], self.dist_env.local_rank)
        self.claim_checkpoint_dir()
        self.start_attempt()
        with self.forwarding_signals():
            self.child = ScriptProcess(  # before the monitor's thread: no thread at the fork
                [sys.executable, str(self.script), *self.config["command"]["args"]],
                {**os.environ, **self.child_env()},
                stop_grace_s(),
            )
            for signum in self.signals:  # arrived before the script existed
                self.child.signal(signum)
            job = monitor.JobProcesses(frozenset({os.getpid(), self.child.pid}))  # the script's children too
            sampler = monitor.for_device(
                device, self.config["monitor_interval_s"], self.t0, self.rank, job=job
            ).start()
            try:
                code = self.child.wait()
            finally:
                self.child.close()
        code = self.exit_code(code)
        seconds = time.time() - self.t0
        self.append({"event": "exit", "code": code, "seconds": seconds})
        if code in (0, contract.EXIT_RESUMABLE):
            log.info("rank %d: script exited with %d after %.1f s", self.rank, code, seconds)
        else:
            tail = "\n".join(self.child.tail) or "(nothing on stderr)"
            log.error(
                "rank %d: script exited with %d after %.1f s; its last lines of stderr:\n%s",
                self.rank,
                code,
                seconds,
                tail,
            )
        report = self.rank_report(code, sampler.stop(), device)
        if self.world_size > 1:
            atomic.write_json(self.report_dir() / f"rank{self.rank}.json", report)
        if code != 0 or not self.is_main:
            return code
        reports = self.gather_reports() if self.world_size > 1 else [report]
        failed = [r for r in reports if r["exit_code"] != 0 or r.get("error")]
        if failed:
            for r in failed:
                log.error("rank %d: exit code %d %s", r["rank"], r["exit_code"], r.get("error") or "")
            return next((r["exit_code"] for r in failed if r["exit_code"]), contract.EXIT_BAD_CONFIG)
        try:
            progress = command_progress.read_progress(self.progress_path)
            results = self.results(progress, reports)
        except ProgressError as error:
            log.error("%s", error)
            return contract.EXIT_BAD_CONFIG
        self.write_run_folder(progress, results, reports)
        self.retire_checkpoint_dir()
        return 0

    # -- the checkpoint folder --

    def claim_checkpoint_dir(self) -> None:
        """Rank 0 empties checkpoint_dir if a finished run left it, and sets another run config's
        files aside (superseded/<its hash>/); every other rank waits for rank 0's mark of this run
        config."""
        mark, finished = self.state_dir / RUN_MARK, self.state_dir / FINISHED_MARK
        if self.is_main:
            theirs = _read_json(mark).get("config_hash")
            if finished.exists():
                log.warning(
                    "%s is of a finished run: a re-run measures anew; emptying it", self.checkpoint_dir
                )
                mark.unlink(missing_ok=True)  # first: the other ranks wait for the new one
                empty_folder(self.checkpoint_dir)
            elif theirs not in (None, self.config_hash):
                mark.unlink(missing_ok=True)
                kept = supersede_folder(self.checkpoint_dir, str(theirs))
                log.warning(
                    "%s holds the checkpoints of another run config (%s, this run's is %s): set aside as %s "
                    "(delete it when it is not wanted); starting from scratch",
                    self.checkpoint_dir,
                    theirs,
                    self.config_hash,
                    kept,
                )
            atomic.write_json(mark, {"config_hash": self.config_hash})
            return
        deadline = time.monotonic() + self.config["pg_timeout_s"]
        while _read_json(mark).get("config_hash") != self.config_hash or finished.exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"rank 0 did not mark {mark} within pg_timeout_s")
            time.sleep(POLL_S)

    def retire_checkpoint_dir(self) -> None:
        if self.config["keep_checkpoints"]:
            atomic.write_json(self.state_dir / FINISHED_MARK, {"config_hash": self.config_hash})
        else:
            empty_folder(self.checkpoint_dir)
            with contextlib.suppress(OSError):
                self.checkpoint_dir.rmdir()

    def start_attempt(self) -> None:
        self.t0 = time.time()
        atomic.write_json(self.state_dir / "run_config.json", self.config)
        drop_cut_line(self.progress_path)
        self.append({"event": "attempt", "time": self.t0, "attempt": slurm_job.attempt()})

    def append(self, record: dict[str, Any]) -> None:
        with open(self.progress_path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")

    def exit_code(self, status: int) -> int:
        """The script's exit code (killed by a signal: the shell's 128 + signal number); a script
        killed after the stop grace gives EXIT_RESUMABLE only if it reported "saved" after the stop."""
        code = 128 - status if status < 0 else status
        if self.child is not None and self.child.killed and status == -signal.SIGKILL:
            saved = self.saved_since(self.stop_offset or 0)
            log.error(
                "rank %d: the script was killed %.0f s after the stop signal; %s",
                self.rank,
                self.child.grace_s,
                "it had reported a checkpoint (saved): exit 75, retry to resume"
                if saved
                else f'it reported no checkpoint after the stop (no "saved" line): exit {code}',
            )
            return contract.EXIT_RESUMABLE if saved else code
        return code

    def saved_since(self, offset: int) -> bool:
        """Whether the progress file holds a "saved" line after byte `offset`."""
        try:
            with open(self.progress_path, "rb") as handle:
                handle.seek(offset)
                for line in handle:
                    with contextlib.suppress(ValueError):
                        record = json.loads(line)
                        if isinstance(record, dict) and record.get("event") == "saved":
                            return True
        except OSError:
            return False
        return False

    def child_env(self) -> dict[str, str]:
        """The contract's variables, and torch's env:// rendezvous (srun sets only SLURM_*)."""
        env = self.dist_env
        return {
            "RANK": str(env.rank),
            "LOCAL_RANK": str(env.local_rank),
            "WORLD_SIZE": str(env.world_size),
            "MASTER_ADDR": env.master_addr,
            "MASTER_PORT": str(env.master_port),
            contract.RUN_CONFIG_ENV: str((self.state_dir / "run_config.json").resolve()),
            contract.OUT_DIR_ENV: str(self.out_dir.resolve()),
            contract.CHECKPOINT_DIR_ENV: str(self.checkpoint_dir.resolve()),
            contract.PROGRESS_ENV: str(self.progress_path.resolve()),
        }

    @contextlib.contextmanager
    def forwarding_signals(self):
        def forward(signum, _frame) -> None:
            self.signals.append(signum)
            if self.stop_offset is None:
                with contextlib.suppress(OSError):
                    self.stop_offset = self.progress_path.stat().st_size
            if self.child is not None:
                self.child.signal(signum)

        previous = {signum: signal.signal(signum, forward) for signum in contract.STOP_SIGNALS}
        try:
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    # -- the ranks' reports --

    def rank_report(self, code: int, monitor_report: dict, device) -> dict[str, Any]:
        peak, source, error = None, None, None
        if code == 0:
            try:
                peak, source = command_progress.peak_memory(
                    command_progress.read_progress(self.progress_path)
                )
            except ProgressError as failure:
                error = str(failure)
        if peak is None:
            peak, source = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024, "cpu_peak_rss"
        return {
            "rank": self.rank,
            "local_rank": self.dist_env.local_rank,
            "host": socket.gethostname(),
            "device": str(device),
            "device_name": device_name(device, monitor_report),
            "gpu_uuid": monitor.device_uuid(device),  # the GPU this rank's script ran on (None: CPU)
            "t0": self.t0,
            "exit_code": code,
            "error": error,
            "peak_memory_bytes": peak,
            "peak_memory_source": source,
            "monitor": monitor_report,
        }

    def report_dir(self) -> Path:
        return self.state_dir / "reports" / launch_id(os.environ, self.config_hash)

    def gather_reports(self) -> list[dict[str, Any]]:
        """Every rank's report, waiting up to pg_timeout_s for the others to write theirs."""
        paths = [self.report_dir() / f"rank{rank}.json" for rank in range(self.world_size)]
        deadline = time.monotonic() + self.config["pg_timeout_s"]
        while not all(path.exists() for path in paths):
            if time.monotonic() > deadline:
                missing = [str(path) for path in paths if not path.exists()]
                raise TimeoutError(f"no report from the other ranks within pg_timeout_s: {missing}")
            time.sleep(POLL_S)
        return [_read_json(path) for path in paths]

    # -- results --

    def results(self, progress, reports: list[dict[str, Any]]) -> dict[str, Any]:
        c = self.config
        peaks = [report["peak_memory_bytes"] for report in reports]
        sources = sorted({report["peak_memory_source"] for report in reports})
        return {
            **command_progress.step_results(progress, c, self.t0),
            "workload": "command",
            "sample_unit": c["command"]["sample_unit"],
            "parallelism": c["parallelism"],
            "metric": "none",
            "final_test_perplexity": None,
            "peak_memory_bytes": max(peaks),
            "peak_memory_bytes_per_rank": peaks,
            "peak_memory_source": ",".join(sources),
            "model_state_bytes_per_rank": None,
            "target_accuracy": c["target_accuracy"],
            "time_to_target_s": None,
            "superseded_checkpoints": sorted(str(p) for p in (self.checkpoint_dir / SUPERSEDED).glob("*")),
            "device": reports[0]["device"].split(":")[0],
            "device_name": reports[0]["device_name"],
            **dict.fromkeys(UNKNOWN_TO_THE_RUNNER),
            **model_results(progress.model),
        }

    def write_run_folder(self, progress, results: dict[str, Any], reports: list[dict[str, Any]]) -> None:
        import pandas as pd

        from scalestudy.analysis import contention, energy

        monitors = [rebased(report["monitor"], report["t0"] - self.t0) for report in reports]
        gpu_monitor_files.write_outputs(self.out_dir, monitors, self.config["monitor_interval_s"])
        rows = command_progress.epoch_rows(progress, self.config)
        atomic.write_csv(self.out_dir / runfiles.METRICS, pd.DataFrame(rows, columns=METRICS_COLUMNS))
        steps = command_progress.step_columns(progress)
        frame = pd.DataFrame(
            {
                "epoch": pd.array([epoch or None for epoch in steps["epoch"]], dtype="Int64"),
                "step": pd.array(steps["step"], dtype="int64"),
                "step_s": pd.array(steps["step_s"], dtype="float64"),
            },
            columns=STEPS_COLUMNS,
        )
        atomic.write_csv(self.out_dir / runfiles.STEPS, frame)
        results = {**results, **contention.of_folder(self.out_dir, results)}
        results.update(energy.of_folder(self.out_dir, results))
        summary = {"run": self.given, "results": results, "provenance": self.provenance(reports)}
        atomic.write_json(self.out_dir / runfiles.SUMMARY, summary)
        log.info("wrote %s", self.out_dir)

    def provenance(self, reports: list[dict[str, Any]]) -> dict[str, Any]:
        keys = ("rank", "local_rank", "host", "device", "device_name", "gpu_uuid")
        extra = {
            "world_size": self.world_size,
            "hosts": sorted({report["host"] for report in reports}),
            "ranks": [{key: report[key] for key in keys} for report in reports],
            "device_names": sorted({report["device_name"] for report in reports}),
            "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
            "slurm_nodelist": os.environ.get("SLURM_JOB_NODELIST"),
            "launcher": self.dist_env.launcher,
            "script": {  # not "command": provenance's key for this process's argv
                "path": self.config["command"]["script"],
                "sha256": hashlib.sha256(self.script.read_bytes()).hexdigest(),
                "args": self.config["command"]["args"],
            },
        }
        return provenance.collect(config=self.given, seed=self.config["seed"], extra=extra)


# --- entry point ------------------------------------------------------------------------------------


def run(config: dict[str, Any], given: dict[str, Any], out_dir: Path, dist_env) -> int:
    """One rank of a command run, its run config read and checked (scalestudy.train.program); the
    exit code: the script's, EXIT_RESUMABLE after a stop it saved for, EXIT_BAD_CONFIG for bad input."""
    try:
        script = check_paths(config, Path(out_dir))
        stop_grace_s()  # a bad SCALESTUDY_STOP_GRACE_S is named before the script starts
        return Runner(config, given, Path(out_dir), script, dist_env).run()
    except (RunConfigError, ValueError) as error:
        log.error("%s", error)
        return contract.EXIT_BAD_CONFIG
    except TimeoutError as error:
        log.error("%s", error)
        return 1
