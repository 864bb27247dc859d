"""The contract between scalestudy and your own training script (`workload: command`).

Standard library only: import it (`from scalestudy import contract`) or copy this file next to
your script. docs/guide/workloads.md ("Your own script") has the whole contract. In short: scalestudy
runs `python SCRIPT ARGS...` on every rank with torch's rendezvous variables and
SCALESTUDY_RUN_CONFIG (the run config, a JSON file), SCALESTUDY_OUT_DIR, SCALESTUDY_CHECKPOINT_DIR
(kept over retries: save and resume there) and SCALESTUDY_PROGRESS (this rank's progress file).
`Reporter` appends the script's progress to that file, one flushed JSON line per event: "step"
(every optimizer step), "epoch", and optionally "memory", "model" and "saved" (a checkpoint is on
disk); after a resume a step reported again counts once, its last occurrence wins. The script
exits 0 when finished, or EXIT_RESUMABLE (75) when it stopped on SIGTERM/SIGUSR1 after saving a
checkpoint (`install_stop_handler()` turns the signals into `stop_requested`).
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

EXIT_RESUMABLE = 75  # stopped by SIGTERM/SIGUSR1 after a checkpoint: the retry resumes
EXIT_BAD_CONFIG = 2  # scalestudy's programs: bad input (run config, data, settings), nothing done
RUN_CONFIG_ENV = "SCALESTUDY_RUN_CONFIG"
OUT_DIR_ENV = "SCALESTUDY_OUT_DIR"
CHECKPOINT_DIR_ENV = "SCALESTUDY_CHECKPOINT_DIR"
PROGRESS_ENV = "SCALESTUDY_PROGRESS"
# What Slurm sends the ranks before the time limit (sbatch --signal, cluster.signal_lead_s).
WARNING_SIGNAL = signal.SIGUSR1
STOP_SIGNALS = (signal.SIGTERM, WARNING_SIGNAL)


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

    def saved(self, step: int | None = None) -> None:
        """A checkpoint is on disk; `step`: the step it resumes at (default: the next)."""
        self._write({"event": "saved", "step": self.next_step if step is None else int(step)})

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
