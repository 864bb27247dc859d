"""The contract between scalestudy and your own training script (`workload: command`).

Standard library only: import it (`from scalestudy import contract`) or copy this file next to
your script. docs/workloads.md ("Your own script") has the whole contract; in short:

scalestudy starts `python -m scalestudy.workloads.command` on every rank (torchrun or srun set
RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT, or SLURM_* variables), which runs your
script as a child process, `python SCRIPT ARGS...` (run config `command.script` and
`command.args`, the script relative to the workflow directory), with the environment plus

    SCALESTUDY_RUN_CONFIG      a JSON file with the full run config (per_gpu_batch, global_batch,
                               world_size, epochs, lr, seed, precision, device, ...)
    SCALESTUDY_OUT_DIR         a folder the script may write into (the run folder)
    SCALESTUDY_CHECKPOINT_DIR  the run's checkpoint folder, kept over retries: save there, resume
                               from there
    SCALESTUDY_PROGRESS        this rank's progress file: JSON lines, appended to

The script reports, one JSON object per line (Reporter writes them and flushes each line):

    {"event": "step", "step": k, "samples": n, "seconds": s, "loss": l, "time": t}
        one per optimizer step: k the global step (from 0), n the GLOBAL samples of the step in the
        workload's unit (command.sample_unit: samples, tokens, ...), s that step's wall time on
        this rank; loss (optional), time (optional: time.time() at the step's end, places the
        measurement window on the GPU monitor's clock)
    {"event": "epoch", "epoch": e, "end_step": k, "train_loss": ..., "test_loss": ...,
     "test_acc": ..., "train_acc": ..., "lr": ...}
        after each epoch (e counts from 1; end_step = steps done at the epoch's end; every other
        field optional)
    {"event": "memory", "peak_bytes": b, "source": "cuda_max_memory_allocated"}
        optional: this rank's peak memory (the largest reported counts)
    {"event": "model", "parameters": n, "train_flops_per_sample": f}
        optional: the model's parameter count (the communication model's gradient bytes) and its
        training FLOPs per sample, forward + backward (MFU); the last reported counts

A script that resumes APPENDS to the same file; a step reported again (the steps after the last
checkpoint, repeated after a resume) counts once: its last occurrence wins.

Exit codes: 0 = finished (rank 0's runner then writes the run folder), EXIT_RESUMABLE (75) =
stopped on SIGTERM/SIGUSR1 after saving a checkpoint, retry to resume. The runner forwards SIGTERM
and SIGUSR1 to the script: `install_stop_handler()` turns them into `stop_requested`.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

EXIT_RESUMABLE = 75
RUN_CONFIG_ENV = "SCALESTUDY_RUN_CONFIG"
OUT_DIR_ENV = "SCALESTUDY_OUT_DIR"
CHECKPOINT_DIR_ENV = "SCALESTUDY_CHECKPOINT_DIR"
PROGRESS_ENV = "SCALESTUDY_PROGRESS"
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class Reporter:
    """Writes this rank's progress lines. Outside scalestudy (no SCALESTUDY_PROGRESS) it writes
    nothing, so the same script also runs by hand."""

    def __init__(
        self,
        progress: str | os.PathLike | None,
        run_config: dict[str, Any] | None = None,
        checkpoint_dir: str | os.PathLike | None = None,
        out_dir: str | os.PathLike | None = None,
    ) -> None:
        self.progress = Path(progress) if progress else None
        self.run_config = run_config or {}
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir else None
        self.out_dir = Path(out_dir) if out_dir else None
        self.next_step = 0  # set it to the step a checkpoint resumes at
        self.stop_requested = False

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> Reporter:
        environ = os.environ if environ is None else environ
        config_path = environ.get(RUN_CONFIG_ENV)
        run_config = json.loads(Path(config_path).read_text()) if config_path else {}
        return cls(
            environ.get(PROGRESS_ENV),
            run_config,
            environ.get(CHECKPOINT_DIR_ENV),
            environ.get(OUT_DIR_ENV),
        )

    def step(
        self, samples: float, seconds: float, loss: float | None = None, step: int | None = None
    ) -> None:
        """One optimizer step: GLOBAL samples, this rank's wall seconds; step defaults to the next."""
        step = self.next_step if step is None else step
        line: dict[str, Any] = {"event": "step", "step": step, "samples": samples, "seconds": seconds}
        if loss is not None:
            line["loss"] = float(loss)
        self._write({**line, "time": time.time()})
        self.next_step = step + 1

    def epoch(self, epoch: int, **metrics: float | None) -> None:
        """After epoch `epoch` (from 1): train_loss, test_loss, test_acc, train_acc, lr, ..."""
        self._write({"event": "epoch", "epoch": epoch, "end_step": self.next_step, **metrics})

    def memory(self, peak_bytes: int, source: str = "script") -> None:
        self._write({"event": "memory", "peak_bytes": int(peak_bytes), "source": source})

    def model(self, parameters: int, train_flops_per_sample: float | None = None) -> None:
        """The model's size: `parameters` (the communication model's gradient bytes) and the training
        FLOPs per sample, forward and backward (MFU); optional, once is enough."""
        line = {"event": "model", "parameters": int(parameters)}
        if train_flops_per_sample is not None:
            line["train_flops_per_sample"] = float(train_flops_per_sample)
        self._write(line)

    def install_stop_handler(self) -> None:
        """SIGTERM/SIGUSR1 set `stop_requested`: save a checkpoint and exit EXIT_RESUMABLE."""

        def handle(_signum, _frame) -> None:
            self.stop_requested = True

        for signum in STOP_SIGNALS:
            signal.signal(signum, handle)

    def _write(self, line: dict[str, Any]) -> None:
        if self.progress is None:
            return
        with open(self.progress, "a", encoding="utf-8") as handle:  # one line per write, flushed on close
            handle.write(json.dumps(line) + "\n")
