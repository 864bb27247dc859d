"""python -m scalestudy.benchmark.captured --run-config-json JSON --out RESULT.json

The study's eager step captured whole as one CUDA graph (torch.cuda.graph), the alternative to
Inductor's CUDA graphs (compile_mode reduce-overhead) that issue 51 asks to decide by measurement:
the variants benchmark runs it beside the trainer's eager and compiled steps (variant `captured`,
scalestudy.benchmark.variants), each in a fresh process.

The step is the trainer's (the workload's model and tensor loader, the run config's SGD with its
fused kernel, its warm-up-then-cosine schedule, autocast, the loss with label smoothing) at one
rank, made capturable the way PyTorch's CUDA semantics notes describe: static input buffers the next
batch is copied into, the learning rate a device tensor the schedule fills each step (no host
sync), the gradients allocated by the captured backward, autocast without its weight cache, and
`warmup` eager steps on a side stream first (cuDNN's autotuning, the allocator, the optimizer's
momentum buffers). Faithful, checked: from one saved state, `check` steps eager and `check` graph
replays on the same batches must give the same weights (their difference against the distance the
eager steps moved them, `check_error`); then `steps` replays are timed with CUDA events, a batch
copied in before each. What it leaves out against the trainer: the trainer's bookkeeping per step
(the epoch's loss and accuracy, the window's clocks) and its evaluation, so it is an upper bound of
what capturing would give the trainer. One rank only (DDP needs its hooks captured too).

On a CPU there is nothing to capture: the same loop runs eager (captured false), which is what the
tests check of it.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import sys
import time
from typing import Any

import torch

from scalestudy import atomic, contract
from scalestudy.plan import runconfig, workloads
from scalestudy.train import bookkeeping, optim
from scalestudy.train.process import autocast_dtype, device_name, process_settings


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m scalestudy.benchmark.captured", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--run-config-json", required=True, help="the run config (one rank)")
    parser.add_argument("--out", required=True, help="the result as JSON (atomic)")
    parser.add_argument("--warmup", type=int, default=30, help="eager steps before the capture")
    parser.add_argument("--check", type=int, default=5, help="steps compared eager against replayed")
    parser.add_argument("--steps", type=int, default=200, help="replays timed")
    return parser.parse_args(argv)


class Step:
    """One training step over static tensors: forward, loss, backward and the fused SGD step."""

    def __init__(self, config: dict[str, Any], model: torch.nn.Module, device: torch.device, example) -> None:
        self.model, self.device = model, device
        self.dtype = autocast_dtype(config["precision"], device)
        self.smoothing = config["label_smoothing"]
        schedule = optim.ScheduleSettings.from_config(config)
        self.peak_lr = schedule.peak_lr()
        self.lr = torch.tensor(self.peak_lr, device=device)  # filled by the schedule, read by the graph
        settings = optim.OptimizerSettings.from_config({**config, "optimizer_impl": "fused"})
        self.optimizer = optim.build_optimizer(model, settings, self.lr, sharded=False)
        self.x = torch.empty_like(example[0])  # the static inputs
        self.y = torch.empty_like(example[1])
        self.loss = torch.zeros((), device=device)

    def load(self, batch) -> None:
        self.x.copy_(batch[0], non_blocking=True)
        self.y.copy_(batch[1], non_blocking=True)

    def run(self) -> None:
        with torch.autocast(
            self.device.type, dtype=self.dtype, enabled=self.dtype is not None, cache_enabled=False
        ):
            logits = self.model(self.x)
            loss = bookkeeping.cross_entropy(logits, self.y, self.smoothing, reduction="mean")
        loss.backward()
        self.optimizer.step()
        self.loss.copy_(loss.detach())

    def state(self) -> dict:
        return copy.deepcopy({"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()})

    def restore(self, state: dict) -> None:
        """Back to `state`, in place: the graph's tensors keep their addresses."""
        with torch.no_grad():
            for name, tensor in self.model.state_dict().items():
                tensor.copy_(state["model"][name])
            for saved, param in zip(
                state["optimizer"]["state"].values(), self.optimizer.state.values(), strict=True
            ):
                param["momentum_buffer"].copy_(saved["momentum_buffer"])


def measure(
    config: dict[str, Any], device: torch.device, warmup: int, check: int, steps: int
) -> dict[str, Any]:
    runtime = workloads.get(config["workload"]).runtime_module()
    train, _ = runtime.build_data(config, 0, 1, device)
    model = runtime.build_model(config, device).model.train()
    factor = optim.lr_schedule(round(config["warmup_epochs"] * train.steps_per_epoch), 10**9)
    batches = endless(train)
    step = Step(config, model, device, next(batches))
    capture = device.type == "cuda"
    side = torch.cuda.Stream() if capture else None
    position = 0

    def eager(count: int) -> None:
        nonlocal position
        for _ in range(count):
            step.lr.fill_(step.peak_lr * factor(position))
            step.load(next(batches))
            step.run()
            step.optimizer.zero_grad(set_to_none=True)
            position += 1

    if capture:
        side.wait_stream(torch.cuda.current_stream())  # the model and the first batch made there
    with torch.cuda.stream(side) if capture else contextlib.nullcontext():
        eager(warmup)  # side stream: what the capture must not see allocated on the main one
    if capture:
        torch.cuda.current_stream().wait_stream(side)
    saved, fixed = step.state(), [next(batches) for _ in range(check)]
    eager_weights = weights_after(
        step, fixed, lambda: (step.run(), step.optimizer.zero_grad(set_to_none=True))
    )
    moved = (eager_weights - flat(saved["model"])).norm().item()
    step.restore(saved)
    graph, capture_s = None, 0.0
    if capture:
        started = time.perf_counter()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step.run()
        torch.cuda.synchronize()
        capture_s = time.perf_counter() - started
        step.restore(saved)  # capturing runs nothing, but the warm-up's allocations are re-made
    replay = (
        graph.replay
        if graph is not None
        else lambda: (step.run(), step.optimizer.zero_grad(set_to_none=True))
    )
    replayed = weights_after(step, fixed, replay)
    check_error = (replayed - eager_weights).norm().item() / moved if moved else float("nan")
    seconds = timed(step, batches, replay, steps, device, lambda k: step.peak_lr * factor(position + k))
    batch = config["per_gpu_batch"]
    return {
        "captured": graph is not None,
        "images_per_s": steps * batch / seconds,
        "step_time_s": seconds / steps,
        "capture_s": capture_s,
        "check_error": check_error,
        "check_steps": check,
        "warmup_steps": warmup,
        "steps": steps,
        "per_gpu_batch": batch,
        "precision": config["precision"],
        "device_name": device_name(device),
        "peak_memory_bytes": torch.cuda.max_memory_allocated(device) if capture else None,
        "final_loss": float(step.loss),
    }


def endless(loader):
    epoch = 0
    while True:
        yield from loader.epoch(epoch, 0)
        epoch += 1


def flat(state: dict) -> torch.Tensor:
    return torch.cat([t.detach().flatten().double() for t in state.values() if t.is_floating_point()])


def weights_after(step: Step, fixed: list, run) -> torch.Tensor:
    """The weights after running `run` once per batch of `fixed` (copied into the static inputs)."""
    for batch in fixed:
        step.load(batch)
        run()
    return flat(step.model.state_dict())


def timed(step: Step, batches, run, steps: int, device: torch.device, lr_at) -> float:
    """Seconds of `steps` steps, each as the trainer's: the loader's next batch (its gather and
    augmentation on the device) copied in, the learning rate set, the step; by CUDA events on a GPU,
    the host clock on a CPU."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
    begun = time.perf_counter()
    for k in range(steps):
        step.lr.fill_(lr_at(k))
        step.load(next(batches))
        run()
    if device.type == "cuda":
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 1000
    return time.perf_counter() - begun


CHECK_TOLERANCE = 1e-2  # check_error above this: the replayed step is not the eager one


def spawn_fresh(run: dict[str, Any], workdir, python: str = sys.executable):
    """The harness in a fresh process on `run` (a variants cell's run config), as a TrainerRun the
    variants table reads (its capture in compile_s); RuntimeError where it fails or is not faithful."""
    import subprocess
    import tempfile
    from pathlib import Path

    from scalestudy.benchmark.project import TrainerRun

    out = Path(tempfile.mkdtemp(prefix="captured-", dir=workdir)) / "result.json"
    command = [python, "-m", "scalestudy.benchmark.captured", "--run-config-json", json.dumps(run)]
    window = {"--warmup": run["measure_warmup_steps"], "--steps": run["measure_steps"]}
    command += [*(str(part) for pair in window.items() for part in pair), "--out", str(out)]
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if result.returncode != 0:
        tail = result.stderr[-3000:]
        raise RuntimeError(
            f"python -m scalestudy.benchmark.captured exited with {result.returncode}:\n{tail}"
        )
    found = json.loads(out.read_text())["results"]
    if not found["check_error"] <= CHECK_TOLERANCE:
        raise RuntimeError(f"the replayed step is not the eager one: check_error {found['check_error']:.3g}")
    results = {**found, "compile_s": found["capture_s"], "window_filled": True, "images_per_s_cv": 0.0}
    return TrainerRun({"results": results}, wall_s=wall)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    given = json.loads(args.run_config_json)
    config = {**runconfig.DEFAULTS, **given}
    runconfig.validate(config)
    if config["world_size"] != 1:
        print("python -m scalestudy.benchmark.captured: one rank only (world_size 1)", file=sys.stderr)
        return contract.EXIT_BAD_CONFIG
    device = torch.device("cuda" if config["device"] != "cpu" and torch.cuda.is_available() else "cpu")
    with process_settings(config):
        result = measure(config, device, args.warmup, args.check, args.steps)
    atomic.write_json(args.out, {"run": given, "results": result})
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
