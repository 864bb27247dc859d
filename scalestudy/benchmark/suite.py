"""The benchmark's sections; each measures on this machine and returns report rows.

Every section runs its comparators in interleaved rounds (scalestudy.benchmark.measure.interleave)
after a warm-up, so both sides of a ratio see the same machine load.
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from scalestudy.benchmark import matmul, pipelines, project, reference_trainer
from scalestudy.benchmark.measure import interleave, timed_rate
from scalestudy.benchmark.report import Row
from scalestudy.plan import runconfig
from scalestudy.plan.runconfig import RULES
from scalestudy.workloads.resnet_cifar import model

REFERENCE = "reference trainer"
TENSOR_FACTOR = 10  # the TensorLoader's samples are this many times longer: comparable wall times
DATALOADER = "DataLoader + PIL"


@dataclass(frozen=True)
class Variant:
    """One configuration of the project trainer: its row name and its run-config overrides."""

    name: str
    overrides: tuple[tuple[str, Any], ...] = ()


def project_variants(
    precisions, channels_last: bool | None, config_channels_last: bool, device_type: str
) -> tuple[Variant, ...]:
    """The project trainer at each precision with the config's memory format (or `channels_last`).

    On the CPU, when the config leaves channels_last off and the command does not decide it, fp32
    with channels_last on is measured too: it is the cheapest speed-up the trainer already offers.
    """
    forced = () if channels_last is None else (("channels_last", channels_last),)
    variants = [Variant(f"project trainer {p}", (("precision", p), *forced)) for p in precisions]
    if channels_last is None and not config_channels_last and device_type == "cpu":
        variants.append(
            Variant("project trainer fp32 channels_last", (("precision", "fp32"), ("channels_last", True)))
        )
    return tuple(variants)


@dataclass(frozen=True)
class Settings:
    """What one benchmark run measures, and how long (see __main__ for the defaults per device)."""

    device: torch.device
    width: int
    batch: int
    repeats: int
    steps: int  # training steps per epoch (project) and per sample (reference)
    epochs: int  # project runs: the first is the warm-up, the rest the measurement window
    pipeline_batches: int  # per DataLoader sample; the TensorLoader, ~10x faster, gets TENSOR_FACTOR x
    variants: tuple[Variant, ...]
    matmul_dtype: torch.dtype
    matmul_size: int
    matmul_iterations: int
    workers: int


def matmul_rows(s: Settings) -> list[Row]:
    def one() -> float:
        return matmul.matmul_rate(s.device, s.matmul_dtype, s.matmul_size, s.matmul_iterations) / 1e12

    samples = interleave({"matmul": one}, s.repeats)["matmul"]
    dtype = str(s.matmul_dtype).removeprefix("torch.")
    name = f"matmul {dtype} {s.matmul_size}x{s.matmul_size}"
    return [Row("matmul", name, "TFLOP/s", tuple(samples), settings=f"{s.matmul_iterations} per sample")]


def pipeline_rows(s: Settings, data_dir: Path) -> list[Row]:
    tensor = pipelines.tensor_stream(pipelines.tensor_loader(data_dir, s.batch, s.device))
    classic = pipelines.tutorial_loader(data_dir, s.batch, s.device, s.workers)

    def delivered_rate(batches, count: int) -> float:
        return timed_rate(lambda: pipelines.consume(batches, count, s.device), s.device)

    tensor_batches = TENSOR_FACTOR * s.pipeline_batches
    runs = {
        "tensor": lambda: delivered_rate(tensor, tensor_batches),
        "classic": lambda: pipelines.on_fresh_pass(classic, lambda b: delivered_rate(b, s.pipeline_batches)),
    }
    samples = interleave(runs, s.repeats)
    classic_name = f"{DATALOADER} ({s.workers} workers)"
    return [
        Row(
            "pipeline",
            classic_name,
            "img/s",
            tuple(samples["classic"]),
            settings=f"{s.pipeline_batches} batches of {s.batch} per sample",
        ),
        Row(
            "pipeline",
            "project TensorLoader",
            "img/s",
            tuple(samples["tensor"]),
            settings=f"augmentation on {s.device.type}; {tensor_batches} batches of {s.batch} per sample",
            baseline=classic_name,
        ),
    ]


def training_rows(s: Settings, config: dict, data_dir: Path, workdir: Path) -> list[Row]:
    """The reference and each project variant, every sample in a fresh process of its own: this
    process holds no CUDA context while they measure (a trainer's GPU monitor would see it)."""
    flops = 3 * model.count_flops(model.build_model(s.width), 1)
    job = reference_trainer.Job(str(data_dir), s.width, s.batch, s.steps, s.workers, s.device.type)
    references: list[reference_trainer.ReferenceRun] = []

    def reference_rate() -> float:
        references.append(reference_trainer.spawn(job))
        return references[-1].images_per_s

    runs = {REFERENCE: reference_rate}
    settings = {}
    for variant in s.variants:
        run = _project_run(s, config, data_dir, **dict(variant.overrides))
        runs[variant.name] = lambda run=run: project.spawn_fresh(run, workdir).images_per_s
        settings[variant.name] = describe_run(run)
    samples = interleave(runs, s.repeats, warmup=0)  # each process warms up before it measures
    steps = f"{s.steps} steps per sample after {s.steps} to warm up, a fresh process each"
    reference_settings = f"{references[0].math}, {DATALOADER} ({s.workers} workers), {steps}"
    rows = [Row("training", REFERENCE, "img/s", tuple(samples[REFERENCE]), reference_settings, None, flops)]
    rows += [
        Row("training", name, "img/s", tuple(samples[name]), settings[name], REFERENCE, flops)
        for name in settings
    ]
    return rows


def fixed_cost_rows(s: Settings, config: dict, data_dir: Path, workdir: Path) -> list[Row]:
    """Process start -> each marker of the first variant's trainer, on a one-step run."""
    run = _project_run(s, config, data_dir, **fixed_cost_overrides(s))
    samples = interleave(
        {"imports": import_seconds, "trainer": lambda: project.spawn_fresh(run, workdir)}, s.repeats, warmup=0
    )
    imports, processes = zip(*samples["imports"], strict=True)
    rows = [
        Row("fixed_cost", "import torch, torchvision", "s", imports, "in a fresh python"),
        Row("fixed_cost", "python -c 'import torch, torchvision'", "s", processes, "process start -> exit"),
    ]
    runs = samples["trainer"]
    for marker in project.MARKERS:
        name = f"trainer start -> {marker.replace('_', ' ')}"
        rows.append(Row("fixed_cost", name, "s", tuple(r.markers[marker] for r in runs), describe_run(run)))
    rows.append(
        Row("fixed_cost", "trainer start -> exit", "s", tuple(r.wall_s for r in runs), describe_run(run))
    )
    return rows


def fixed_cost_overrides(s: Settings) -> dict:
    """One step, so process start -> first step is the job's fixed cost; the window's smallest
    settings the trainer accepts (runconfig.RULES: it never measures the first step), left unfilled."""
    smallest = {key: int(RULES[key].minimum) for key in ("measure_warmup_steps", "measure_steps")}
    return {**dict(s.variants[0].overrides), "epochs": 1, "max_steps_per_epoch": 1, **smallest}


def run_configs(s: Settings, config: dict, data_dir: Path, sections) -> list[dict]:
    """The project trainer's run configs the chosen sections spawn, built (and so checked against the
    trainer's rules) before anything is measured: a config the trainer refuses fails in a second."""
    runs = []
    if "training" in sections:
        runs += [_project_run(s, config, data_dir, **dict(v.overrides)) for v in s.variants]
    if "fixed_cost" in sections:
        runs.append(_project_run(s, config, data_dir, **fixed_cost_overrides(s)))
    return runs


IMPORT_PROBE = (
    "import time; t = time.perf_counter(); import torch, torchvision; print(time.perf_counter() - t)"
)


def import_seconds(python: str = sys.executable) -> tuple[float, float]:
    """(seconds to import torch and torchvision in a fresh interpreter, its whole life: start -> exit)."""
    start = time.perf_counter()
    result = subprocess.run([python, "-c", IMPORT_PROBE], check=True, capture_output=True, text=True)
    return float(result.stdout), time.perf_counter() - start


def _project_run(s: Settings, config: dict, data_dir: Path, **overrides) -> dict:
    settings = {
        "per_gpu_batch": s.batch,
        "width": s.width,
        "epochs": s.epochs,
        "max_steps_per_epoch": s.steps,
        "device": s.device.type,
        "num_workers": s.workers,
        # The window pauses for checkpoints, but each pause costs two device synchronisations.
        "checkpoint_every_steps": 10**9,
        **window_settings(s),
    }
    return project.run_config(config, data_dir, "unused", **{**settings, **overrides})


def window_settings(s: Settings) -> dict:
    """The trainer's steady-state window: after the first epoch (warm-up), the other epochs'
    steps, counted across the epoch boundaries (their evaluation and checkpoint paused out)."""
    return {
        "measure_warmup_steps": s.steps,
        "measure_steps": (s.epochs - 1) * s.steps,
        "measure_intervals": min(4, (s.epochs - 1) * s.steps),
    }


def describe_run(run: dict) -> str:
    """A project run's settings as its benchmark row shows them ("precision=bf16, loader=tensor, ...";
    scalestudy.benchmark.studycheck reads them back)."""
    keys = (
        "precision",
        "loader",
        "channels_last",
        "compile",
        "compile_mode",
        "epochs",
        "max_steps_per_epoch",
    )
    window = f"window {run['measure_steps']} steps after {run['measure_warmup_steps']}"
    # a key left out of the run config at its default (compile_mode) shows the default
    values = {key: run[key] if key in run else runconfig.DEFAULTS[key] for key in keys}
    return ", ".join([*(f"{key}={value}" for key, value in values.items()), window])
