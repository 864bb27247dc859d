"""What a finished run reports (summary.json's results and provenance, written with the run folder's
other files by RunResults.write): the steady-state window
(scalestudy.train.steady), whole-run rates, the workload, its loss, and the memory of every rank.
RunResults is given what it reports on (the run state, the window, what setup built and chose)."""

from __future__ import annotations

import logging
import math
import os
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from scalestudy import atomic, provenance
from scalestudy.plan import runfiles
from scalestudy.plan.runfiles import METRICS_COLUMNS, STEPS_COLUMNS, WHOLE_RUN_KEYS
from scalestudy.plan.workload_spec import WorkloadSpec
from scalestudy.train import gpu_monitor_files, optim, startup
from scalestudy.train import torch_options as torchopts
from scalestudy.train.built import Built
from scalestudy.train.checkpoint import policy
from scalestudy.train.compiled import CompiledStep
from scalestudy.train.process import effective_precision, fp32_math
from scalestudy.train.state import RunState
from scalestudy.train.steady import SteadyWindow

log = logging.getLogger("scalestudy.train")


def steady_result(steady: SteadyWindow, world_size: int, attempt: int) -> dict[str, Any]:
    """An attempt's measurement window (attempt 0 is the first, each resume adds one)."""
    return {**steady.result(world_size), "measure_attempt": attempt}


@dataclass
class RunResults:
    """summary.json of a run: `summary(memory)`, memory being every rank's memory_report."""

    config: dict[str, Any]
    given: dict[str, Any]  # the run config as given (summary.json's "run")
    state: RunState
    steady: SteadyWindow  # this attempt's window
    workload: WorkloadSpec
    built: Built
    wrapped_options: dict[str, Any] | None  # parallel.Wrapped.recorded_options()
    world_size: int
    steps_per_epoch: int
    device: torch.device
    backend: str
    ranks: list[dict[str, Any]]  # every rank's host, device and start time
    launcher: str
    amp_dtype: torch.dtype | None
    peak_lr: float
    compiled: CompiledStep  # the compiled step's mode, cache and CUDA graphs

    def write(self, out_dir: Path, monitor_reports: list, memory: list[dict[str, Any]]) -> None:
        """The run folder, each file atomically: the GPU monitor's files, metrics.csv, steps.csv,
        then summary.json (from every rank's monitor report and memory_report)."""
        import pandas as pd

        history = self.state.history
        gpu_monitor_files.write_outputs(out_dir, monitor_reports, self.config["monitor_interval_s"])
        atomic.write_csv(out_dir / runfiles.METRICS, pd.DataFrame(history.metrics, columns=METRICS_COLUMNS))
        atomic.write_csv(out_dir / runfiles.STEPS, pd.DataFrame(history.steps, columns=STEPS_COLUMNS))
        summary = self.summary(memory, out_dir)
        summary["results"].update(startup.of_attempt(self.steady.first_step_s))
        atomic.write_json(out_dir / runfiles.SUMMARY, summary)
        log.info("wrote %s", out_dir)

    def summary(self, memory: list[dict[str, Any]], run_dir=None) -> dict[str, Any]:
        """`run_dir`: the run folder whose GPU monitor files (written first) judge contention in the
        reported window (scalestudy.analysis.contention) and give the run's energy
        (scalestudy.analysis.energy)."""
        results = self.results(memory)
        if run_dir is not None:
            from scalestudy.analysis import (
                contention,
                energy,
            )  # pandas: imported at the end, as the files are

            results.update(contention.of_folder(run_dir, results))
            results.update(energy.of_folder(run_dir, results))
            if results["contended"]:
                log.warning("the GPUs were shared while measuring: %s", results["contention"])
        return {"run": self.given, "results": results, "provenance": self.provenance()}

    def results(self, memory: list[dict[str, Any]]) -> dict[str, Any]:
        c, metrics = self.config, self.state.history.metrics
        later = metrics[1:] or metrics
        compile_s = torchopts.compile_seconds() if c["compile"] else None
        test_accs = [row["test_acc"] for row in metrics]
        return {
            "epochs": len(metrics),
            "steps": self.state.position.global_step,
            "steps_per_epoch": self.steps_per_epoch,
            "world_size": self.world_size,
            "global_batch": c["global_batch"],
            "per_gpu_batch": c["per_gpu_batch"],
            **self.steady_results(),
            **self.whole_run_rates(),
            "epoch_time_s": statistics.median(row["epoch_time_s"] for row in later) if later else None,
            "compile_s": compile_s,
            "inductor_cache_dir": os.environ.get("TORCHINDUCTOR_CACHE_DIR") if c["compile"] else None,
            **self.compiled.result(compile_s),  # compile (mode, cache, artifacts), cuda_graphs
            "ddp_options": self.parallel_options("ddp"),
            "final_test_acc": test_accs[-1] if test_accs else None,
            "best_test_acc": max(test_accs) if test_accs else None,
            "final_train_loss": metrics[-1]["train_loss"] if metrics else None,
            "time_to_target_s": self.state.history.time_to_target_s,
            "target_accuracy": c["target_accuracy"],
            "total_time_s": self.state.elapsed_s(),
            # other run configs' checkpoints set aside in checkpoint_dir (the run catalog shows them)
            "superseded_checkpoints": policy.superseded(c["checkpoint_dir"]),
            "resumed_from_step": self.state.resumed_from_step,
            "resumes": self.state.history.resumes,
            "device": self.device.type,
            "device_name": self.ranks[0]["device_name"],
            "backend": self.backend,  # chosen for the device even with one rank (no process group)
            "precision_effective": effective_precision(c["precision"], self.amp_dtype),
            "parameters": self.built.parameters,
            "forward_flops_per_image": self.built.forward_flops_per_sample,
            "train_flops_per_image": self.built.train_flops_per_sample,
            "peak_lr": self.peak_lr,
            **self.workload_results(memory),
        }

    def workload_results(self, memory: list[dict[str, Any]]) -> dict[str, Any]:
        """What is trained and how, its loss, and the memory of every rank."""
        metrics = self.state.history.metrics
        test_loss = metrics[-1]["test_loss"] if metrics else None
        perplexity = self.workload.metric == "perplexity" and test_loss is not None
        return {
            "workload": self.workload.name,
            "sample_unit": self.workload.sample_unit,
            "metric": self.workload.metric,
            "parallelism": self.config["parallelism"],
            "fsdp_options": self.parallel_options("fsdp"),
            "optimizer": optim.optimizer_name(self.config),
            "final_test_loss": test_loss,
            "final_test_perplexity": math.exp(test_loss) if perplexity else None,
            "peak_memory_bytes": max(rank["peak"] for rank in memory),
            "peak_memory_bytes_per_rank": [rank["peak"] for rank in memory],
            "peak_memory_source": memory[0]["source"],
            "model_state_bytes_per_rank": max(rank["state"] for rank in memory),
        }

    def parallel_options(self, parallelism: str) -> dict[str, Any] | None:
        return self.wrapped_options if self.config["parallelism"] == parallelism else None

    def steady_results(self) -> dict[str, Any]:
        """The window the run reports: this attempt's if it filled one, else the last filled window
        of an earlier attempt (kept in the checkpoints), else this attempt's unfilled one.

        A window from an earlier attempt has no measure_start_s / measure_end_s / measure_segments_s:
        they would be on that attempt's clock, and gpu_monitor.csv covers only this (the last)
        attempt, so its GPU monitor summary is "not measured".
        """
        current = steady_result(self.steady, self.world_size, self.state.attempt)
        earlier = self.state.history.steady_window
        if current["window_filled"]:
            return current
        if earlier is not None:
            log.info("window not filled in this attempt: reporting attempt %d's", earlier["measure_attempt"])
            return {**earlier, "measure_start_s": None, "measure_end_s": None, "measure_segments_s": None}
        log.warning(
            "measurement window not filled: %d of %d steps measured after %d warm-up steps (%d steps in "
            "this attempt); images_per_s is left empty, whole_run_* hold whole-run rates",
            current["measured_steps"],
            current["measure_steps"],
            current["warmup_steps"],
            self.steady.seen,
        )
        return current

    def whole_run_rates(self) -> dict[str, Any]:
        """Images over the training time of every epoch, the first one's one-off costs included."""
        metrics = self.state.history.metrics
        seconds = sum(row["epoch_time_s"] for row in metrics)
        images = sum(row["images_per_s"] * row["epoch_time_s"] for row in metrics)
        if not seconds > 0:
            return dict.fromkeys(WHOLE_RUN_KEYS)
        steps = len(metrics) * self.steps_per_epoch
        return dict(
            zip(
                WHOLE_RUN_KEYS,
                (images / seconds, images / seconds / self.world_size, seconds / steps),
                strict=True,
            )
        )

    def provenance(self) -> dict[str, Any]:
        extra = {
            "world_size": self.world_size,
            "hosts": sorted({r["host"] for r in self.ranks}),
            "ranks": [{k: v for k, v in r.items() if k != "time"} for r in self.ranks],
            "device_names": sorted({r["device_name"] for r in self.ranks}),
            "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
            "slurm_nodelist": os.environ.get("SLURM_JOB_NODELIST"),
            "launcher": self.launcher,
            "ddp_options": self.parallel_options("ddp"),
            "fp32_math": fp32_math(),  # how fp32 convolutions and matmuls ran (process_settings)
            "graph_breaks": torchopts.graph_breaks() if self.config["compile"] else None,
        }
        return provenance.collect(config=self.given, seed=self.config["seed"], extra=extra)
