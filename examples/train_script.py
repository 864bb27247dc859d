"""An example of your own training script under scalestudy (`workload: command`; docs/guide/workloads.md).

A small MLP learns a synthetic classification task made from the run config's seed, with PyTorch
DDP over gloo on the CPU or NCCL on GPUs. What makes it a scalestudy workload:

- the run config (per_gpu_batch, epochs, lr, seed, device) comes from SCALESTUDY_RUN_CONFIG;
- every optimizer step, every epoch and the peak GPU memory are reported through the Reporter
  (JSON lines in SCALESTUDY_PROGRESS); samples are GLOBAL samples of the step;
- checkpoints go to SCALESTUDY_CHECKPOINT_DIR (written to a temporary name, then renamed) and a
  restart resumes from the newest;
- SIGTERM/SIGUSR1 (a Slurm time limit, a preemption): all ranks agree after the current step,
  rank 0 saves a checkpoint, and the script exits with 75 ("retry to resume").

Run by hand it trains too (one process, no progress file):
    python examples/train_script.py --samples 2048
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

try:
    from scalestudy.train.ranges import ProfileWindow
except ImportError:  # without scalestudy: no profiling window
    ProfileWindow = None

try:
    from scalestudy.contract import EXIT_RESUMABLE, Reporter
except ImportError:  # the script without scalestudy installed: the same lines, written by hand
    EXIT_RESUMABLE = 75

    class Reporter:
        def __init__(self) -> None:
            config = os.environ.get("SCALESTUDY_RUN_CONFIG")
            self.run_config = json.loads(Path(config).read_text()) if config else {}
            folder = os.environ.get("SCALESTUDY_CHECKPOINT_DIR")
            self.checkpoint_dir = Path(folder) if folder else None
            self.progress = os.environ.get("SCALESTUDY_PROGRESS")
            self.next_step, self.stop_requested = 0, False

        @classmethod
        def from_env(cls) -> Reporter:
            return cls()

        def step(self, samples, seconds, loss=None) -> None:
            line = {"event": "step", "step": self.next_step, "samples": samples, "seconds": seconds}
            self._write({**line, "loss": loss, "time": time.time()})
            self.next_step += 1

        def epoch(self, epoch, **metrics) -> None:
            self._write({"event": "epoch", "epoch": epoch, "end_step": self.next_step, **metrics})

        def memory(self, peak_bytes, source="script") -> None:
            self._write({"event": "memory", "peak_bytes": int(peak_bytes), "source": source})

        def model(self, parameters, train_flops_per_sample=None) -> None:
            self._write(
                {"event": "model", "parameters": parameters, "train_flops_per_sample": train_flops_per_sample}
            )

        def install_stop_handler(self) -> None:
            for signum in (signal.SIGTERM, signal.SIGUSR1):
                signal.signal(signum, lambda *_: setattr(self, "stop_requested", True))

        def _write(self, line) -> None:
            if self.progress:
                with open(self.progress, "a") as handle:
                    handle.write(json.dumps(line) + "\n")


def profile_window(config: dict, rank: int, world_size: int):
    """The study's profiling window (the run config's `profile`, set on the profile stage's runs):
    scalestudy's ProfileWindow writes the torch.profiler tables the profile rules read, or opens
    nsys's capture range on a GPU. None without scalestudy or outside the study."""
    out_dir = os.environ.get("SCALESTUDY_OUT_DIR")
    if ProfileWindow is None or not out_dir or not config.get("profile"):
        return None
    return ProfileWindow(config["profile"], out_dir, rank, world_size)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=8192, help="training samples")
    parser.add_argument("--test-samples", type=int, default=1024)
    parser.add_argument("--features", type=int, default=32)
    parser.add_argument("--classes", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--checkpoint-every", type=int, default=50, help="optimizer steps")
    return parser.parse_args()


def make_data(args, seed: int) -> tuple[torch.Tensor, ...]:
    """Inputs from a normal distribution, labels from a random linear teacher plus noise."""
    generator = torch.Generator().manual_seed(seed)
    count = args.samples + args.test_samples
    x = torch.randn(count, args.features, generator=generator)
    teacher = torch.randn(args.features, args.classes, generator=generator)
    y = (x @ teacher + 0.5 * torch.randn(count, args.classes, generator=generator)).argmax(1)
    return x[: args.samples], y[: args.samples], x[args.samples :], y[args.samples :]


def start_distributed(device_choice: str) -> tuple[int, int, torch.device]:
    """(rank, world size, device): scalestudy sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT."""
    rank, world_size = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    use_cuda = device_choice != "cpu" and torch.cuda.is_available()
    if use_cuda:
        index = 0 if torch.cuda.device_count() == 1 else int(os.environ.get("LOCAL_RANK", 0))
        device = torch.device("cuda", index)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if world_size > 1:
        dist.init_process_group("nccl" if use_cuda else "gloo", rank=rank, world_size=world_size)
    return rank, world_size, device


def sum_over_ranks(values: list[float], device: torch.device) -> list[float]:
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    if dist.is_initialized():
        dist.all_reduce(tensor)
    return tensor.tolist()


def any_rank(flag: bool, device: torch.device) -> bool:
    return sum_over_ranks([float(flag)], device)[0] > 0


def save_checkpoint(folder: Path | None, rank: int, state: dict) -> None:
    """Rank 0 writes checkpoint.pt atomically (temporary name, then rename); all ranks wait for it."""
    if folder is not None and rank == 0:
        temporary = folder / "checkpoint.pt.tmp"
        torch.save(state, temporary)
        os.replace(temporary, folder / "checkpoint.pt")
    if dist.is_initialized():
        dist.barrier()


def evaluate(model: nn.Module, x, y, rank: int, world_size: int, device) -> tuple[float, float]:
    model.eval()
    with torch.no_grad():
        x, y = x[rank::world_size].to(device), y[rank::world_size].to(device)
        logits = model(x)
        loss_sum = F.cross_entropy(logits, y, reduction="sum").item()
        correct = (logits.argmax(1) == y).sum().item()
    model.train()
    loss_sum, correct, count = sum_over_ranks([loss_sum, correct, len(y)], device)
    return loss_sum / count, correct / count


def main() -> int:
    args = parse_args()
    reporter = Reporter.from_env()
    reporter.install_stop_handler()
    config = reporter.run_config
    batch, epochs = config.get("per_gpu_batch", 64), config.get("epochs", 2)
    lr, seed = config.get("lr", 0.05), config.get("seed", 0)
    rank, world_size, device = start_distributed(config.get("device", "auto"))
    global_batch = batch * world_size
    steps_per_epoch = args.samples // global_batch
    if config.get("max_steps_per_epoch"):  # the study's cap (short demo and profile runs)
        steps_per_epoch = min(steps_per_epoch, config["max_steps_per_epoch"])

    train_x, train_y, test_x, test_y = make_data(args, seed)
    torch.manual_seed(seed)  # the same initial weights on every rank
    model = nn.Sequential(
        nn.Linear(args.features, args.hidden),
        nn.ReLU(),
        nn.Linear(args.hidden, args.hidden),
        nn.ReLU(),
        nn.Linear(args.hidden, args.classes),
    ).to(device)
    parameters = sum(p.numel() for p in model.parameters())
    # a linear layer's forward: 2 FLOPs per weight and sample; backward twice that
    reporter.model(parameters, train_flops_per_sample=6 * parameters)
    train_model = DistributedDataParallel(model) if world_size > 1 else model
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)

    state = {"epoch": 0, "step_in_epoch": 0, "global_step": 0, "loss_sum": 0.0, "loss_count": 0}
    checkpoint = reporter.checkpoint_dir / "checkpoint.pt" if reporter.checkpoint_dir else None
    if checkpoint is not None and checkpoint.exists():
        saved = torch.load(checkpoint, map_location=device)
        model.load_state_dict(saved.pop("model"))
        optimizer.load_state_dict(saved.pop("optimizer"))
        state = saved
        reporter.next_step = state["global_step"]  # the steps after it are reported again
        print(f"rank {rank}: resumed at step {state['global_step']}", file=sys.stderr)

    def snapshot() -> dict:
        return {**state, "model": model.state_dict(), "optimizer": optimizer.state_dict()}

    window = profile_window(config, rank, world_size)
    while state["epoch"] < epochs:
        order = torch.randperm(args.samples, generator=torch.Generator().manual_seed(seed + state["epoch"]))
        for step in range(state["step_in_epoch"], steps_per_epoch):
            if window is not None:
                window.step(state["global_step"])
            started = time.perf_counter()
            rows = order[step * global_batch : (step + 1) * global_batch][rank::world_size]
            x, y = train_x[rows].to(device), train_y[rows].to(device)
            loss = F.cross_entropy(train_model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            loss_value = loss.item()  # waits for the device: the step's time is complete
            reporter.step(global_batch, time.perf_counter() - started, loss=loss_value)
            state.update(step_in_epoch=step + 1, global_step=state["global_step"] + 1)
            state["loss_sum"] += loss_value
            state["loss_count"] += 1
            if any_rank(reporter.stop_requested, device):
                save_checkpoint(reporter.checkpoint_dir, rank, snapshot())
                reporter.saved()  # the runner may then kill a slow exit safely
                print(f"rank {rank}: stopped after step {state['global_step']}, saved", file=sys.stderr)
                return EXIT_RESUMABLE
            if state["global_step"] % args.checkpoint_every == 0:
                save_checkpoint(reporter.checkpoint_dir, rank, snapshot())
        loss_sum, loss_count = sum_over_ranks([state["loss_sum"], state["loss_count"]], device)
        test_loss, test_acc = evaluate(model, test_x, test_y, rank, world_size, device)
        reporter.epoch(
            state["epoch"] + 1, train_loss=loss_sum / loss_count, test_loss=test_loss, test_acc=test_acc
        )
        state.update(epoch=state["epoch"] + 1, step_in_epoch=0, loss_sum=0.0, loss_count=0)
        save_checkpoint(reporter.checkpoint_dir, rank, snapshot())
        if rank == 0:
            print(
                f"epoch {state['epoch']}/{epochs}: test loss {test_loss:.4f} acc {test_acc:.3f}",
                file=sys.stderr,
            )
    if window is not None:
        window.close()
    if device.type == "cuda":
        reporter.memory(torch.cuda.max_memory_allocated(device), "cuda_max_memory_allocated")
    return 0


if __name__ == "__main__":
    code = main()
    if dist.is_initialized():
        dist.destroy_process_group()
    sys.exit(code)
