"""The project's trainer as a job runs it: `python -m scalestudy.train` in a fresh process.

Each spawn reads the trainer's stderr as it comes and notes when marker lines arrive (seconds since
the spawn): the model built (its first log line: imports, data and model done), the training
loop entered (optimizer, resume), and the first step logged. A run config with max_steps_per_epoch=1 logs
step 1 (the epoch's last step is always logged), so process start -> first step is the job's
fixed cost. Throughput is the trainer's own images_per_s from summary.json: its steady-state
window (scalestudy.train.steady), which the benchmark's run config makes the epochs after the first.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scalestudy.plan import grid, runconfig, runfiles

MARKERS = {
    "model_built": re.compile(r"scalestudy\.train: model: "),
    "loop_entered": re.compile(r"scalestudy\.train: training: "),
    "first_step": re.compile(r"scalestudy\.train: epoch 1/\d+ step 1/\d+ "),
}


@dataclass
class TrainerRun:
    """One finished trainer process: its summary, when each marker line arrived, its wall time."""

    summary: dict[str, Any]
    markers: dict[str, float] = field(default_factory=dict)
    wall_s: float = 0.0

    @property
    def images_per_s(self) -> float:
        """The trainer's steady-state window rate; an error if the run did not fill its window or
        shared its GPU with a foreign process (scalestudy.analysis.contention)."""
        results = self.summary["results"]
        if not results.get("window_filled", True):
            raise RuntimeError(
                f"the trainer's measurement window was not filled ({results['measured_steps']} of "
                f"{results['measure_steps']} steps after {results['warmup_steps']}): no steady-state rate"
            )
        if results.get("contended"):
            raise RuntimeError(f"the GPU was shared while the trainer measured: {results['contention']}")
        return float(results["images_per_s"])


def run_config(config: dict, data_dir: str | Path, checkpoint_dir: str | Path, **overrides: Any) -> dict:
    """The baseline point's run config from the study config, with the benchmark's settings on top.

    The project's own choices (tensor loader, the config's channels_last and compile) replace the
    baseline's deliberately plain ones, unless `overrides` names them.
    """
    run = grid.run_config(config, grid.baseline_point(config))
    run.update(
        stage="benchmark",
        point="benchmark",
        data_dir=str(data_dir),
        checkpoint_dir=str(checkpoint_dir),
        loader="tensor",
        channels_last=config["model"]["channels_last"],
        compile=config["model"]["compile"],
        warmup_epochs=0,
        eval_max_batches=1,
        profile=None,
    )
    run.update(overrides)
    if "per_gpu_batch" in overrides:
        run["global_batch"] = run["per_gpu_batch"] * run["world_size"]
    return checked(run)


def checked(run: dict) -> dict:
    """`run`, once the trainer's own rules accept it with its defaults filled in (runconfig.DEFAULTS,
    RULES): the benchmark's settings cannot drift from what `python -m scalestudy.train` runs.
    RunConfigError (naming every bad key) otherwise, before anything is spawned."""
    runconfig.validate({**runconfig.DEFAULTS, **run})
    unknown = sorted(set(run) - set(runconfig.DEFAULTS) - set(runconfig.REQUIRED))
    if unknown:
        raise runconfig.RunConfigError(f"run config: keys the trainer does not know: {', '.join(unknown)}")
    return run


def marker_times(lines_with_times, markers=MARKERS) -> dict[str, float]:
    """For each marker, the arrival time of the first line it matches."""
    seen: dict[str, float] = {}
    for line, seconds in lines_with_times:
        for name, pattern in markers.items():
            if name not in seen and pattern.search(line):
                seen[name] = seconds
    return seen


def _timed_lines(stream, start: float):
    for line in stream:
        yield line, time.perf_counter() - start


def spawn(
    run: dict, out_dir: str | Path, python: str = sys.executable, env: dict | None = None
) -> TrainerRun:
    """Run the trainer on `run` (its checkpoint_dir must be new: no resume) and wait for it.

    `env`: the process environment (default: this one's).
    """
    command = [
        python,
        "-m",
        "scalestudy.train",
        "--run-config-json",
        json.dumps(run),
        "--out-dir",
        str(out_dir),
    ]
    start = time.perf_counter()
    pipes = {"stderr": subprocess.PIPE, "stdout": subprocess.DEVNULL, "text": True, "env": env}
    with subprocess.Popen(command, **pipes) as process:
        lines = list(_timed_lines(process.stderr, start))
        code = process.wait()
    wall = time.perf_counter() - start
    if code != 0:
        tail = "".join(line for line, _ in lines[-30:])
        raise RuntimeError(f"python -m scalestudy.train exited with {code}:\n{tail}")
    summary = json.loads((Path(out_dir) / runfiles.SUMMARY).read_text())
    return TrainerRun(summary, marker_times(lines), wall)


def spawn_fresh(run: dict, workdir: str | Path, **spawn_args) -> TrainerRun:
    """`spawn` with a new run folder and checkpoint folder under `workdir` (so nothing resumes)."""
    folder = Path(tempfile.mkdtemp(prefix="run-", dir=workdir))
    return spawn({**run, "checkpoint_dir": str(folder / "checkpoints")}, folder / "out", **spawn_args)
