"""The reference trainer, written the plain tutorial way: fp32, a DataLoader of PIL transforms, no
channels_last, no compile, no mixed precision, a bare SGD loop. Only the network is shared with the
project (scalestudy.workloads.resnet_cifar.model), so both train the same CIFAR ResNet-18 at the same width.

The benchmark runs it as it runs the project trainer: each sample in a fresh process
(`python -m scalestudy.benchmark.reference_trainer ...`, `spawn`), which warms up on one pass of the
steps, measures a second, prints its rate as one JSON line and exits. So the benchmark's own process
never holds a CUDA context while a trainer measures (a GPU monitor would count it as a process on
the GPU), and both sides of the ratio pay their own process, model and loader.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import nn, optim

from scalestudy.workloads.resnet_cifar.model import build_model


class ReferenceTrainer:
    """model + CrossEntropyLoss + SGD(momentum, weight decay), one step per batch."""

    def __init__(
        self, width: int, device, lr: float = 0.1, momentum: float = 0.9, weight_decay: float = 5e-4
    ):
        self.device = torch.device(device)
        self.model = build_model(width=width).to(self.device)
        self.criterion = nn.CrossEntropyLoss()
        self.optimizer = optim.SGD(
            self.model.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay
        )

    def step(self, images: torch.Tensor, labels: torch.Tensor) -> float:
        images, labels = images.to(self.device), labels.to(self.device)
        self.optimizer.zero_grad()
        outputs = self.model(images)
        loss = self.criterion(outputs, labels)
        loss.backward()
        self.optimizer.step()
        return loss.item()

    def train(self, batches: Iterable, steps: int) -> tuple[int, list[float]]:
        """Train on the next `steps` batches; return (images seen, loss of each step)."""
        self.model.train()
        images, losses = 0, []
        for inputs, labels in itertools.islice(batches, steps):
            losses.append(self.step(inputs, labels))
            images += len(labels)
        return images, losses


def reference_math(device: torch.device) -> str:
    """How the reference's fp32 runs: with torch's defaults, which on a GPU run cuDNN's convolutions
    in TF32 (measured on an H100: 2x the project trainer's IEEE fp32, docs/guide/benchmarks.md)."""
    from scalestudy.train.process import fp32_math

    if torch.device(device).type != "cuda":
        return "fp32"
    return f"fp32, torch's defaults (cuDNN convolutions in {fp32_math()['cudnn_conv']})"


@dataclass(frozen=True)
class ReferenceRun:
    """One reference sample, as its process reported it: the rate, the process, its fp32 math."""

    images_per_s: float
    pid: int
    math: str


@dataclass(frozen=True)
class Job:
    """What one reference sample trains on: the packed data (the project's), the model width, the
    batch, `steps` per pass (one warm-up pass, one measured), the DataLoader's workers, the device."""

    data_dir: str
    width: int
    batch: int
    steps: int
    workers: int
    device: str

    def argv(self) -> list[str]:
        return [f"--{key.replace('_', '-')}={value}" for key, value in vars(self).items()]


def measure_here(job: Job) -> ReferenceRun:
    """In this process: the rate of `job.steps` steps on a fresh pass, after a warm-up pass."""
    from scalestudy.benchmark import pipelines
    from scalestudy.benchmark.measure import timed_rate

    device = torch.device(job.device)
    trainer = ReferenceTrainer(job.width, device)
    loader = pipelines.tutorial_loader(job.data_dir, job.batch, device, job.workers)

    def trained_rate(batches) -> float:
        return timed_rate(lambda: trainer.train(batches, job.steps)[0], device)

    pipelines.on_fresh_pass(loader, trained_rate)  # warm-up: allocator, cuDNN, first touches
    rate = pipelines.on_fresh_pass(loader, trained_rate)
    return ReferenceRun(rate, os.getpid(), reference_math(device))


def spawn(job: Job, python: str = sys.executable, env: dict | None = None) -> ReferenceRun:
    """`measure_here(job)` in a fresh `python -m scalestudy.benchmark.reference_trainer`; its last stdout
    line is the run as JSON. RuntimeError with its stderr's tail if it fails."""
    command = [python, "-m", "scalestudy.benchmark.reference_trainer", *job.argv()]
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 or not lines:
        tail = "\n".join(result.stderr.strip().splitlines()[-30:])
        code = result.returncode
        raise RuntimeError(f"python -m scalestudy.benchmark.reference_trainer exited with {code}:\n{tail}")
    return ReferenceRun(**json.loads(lines[-1]))


def parse_args(argv: list[str]) -> Job:
    parser = argparse.ArgumentParser(
        prog="python -m scalestudy.benchmark.reference_trainer",
        description="One reference-trainer sample of the benchmark; prints it as one JSON line.",
    )
    parser.add_argument("--data-dir", required=True, help="the packed synthetic CIFAR-10 folder")
    for name in ("width", "batch", "steps", "workers"):
        parser.add_argument(f"--{name}", type=int, required=True)
    parser.add_argument("--device", choices=("cpu", "cuda"), required=True)
    return Job(**vars(parser.parse_args(argv)))


def main(argv: list[str] | None = None) -> int:
    run = measure_here(parse_args(sys.argv[1:] if argv is None else argv))
    print(json.dumps(vars(run)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
