"""Host time per step of the trainer's wrapped step on the CPU: a 12-layer GPT (GPT-2 small's block
and parameter count: 13 FSDP2 groups, 148 parameters) of width 8, so the arithmetic is negligible and
what is measured is Python and dispatch overhead. One rank without FSDP2 (the model and its loss) and
FSDP2, each eager and compiled (Inductor), built by scalestudy.train.build.prepare_model as the
trainer builds them; fused AdamW as the trainer's. Rounds of 20 steps, interleaved; the fastest and
the median round per variant (a shared machine: the fastest is the least disturbed).

    OMP_NUM_THREADS=1 .venv/bin/python docs/measurements/cpu-epyc-2026-11-29/host_overhead.py
"""

from __future__ import annotations

import statistics
import time

import torch

from scalestudy.train import build, optim, parallel
from scalestudy.train.parallel import ParallelSettings
from scalestudy.workloads.gpt.model import GPT, GPTConfig

VARIANTS = ("ddp-eager", "fsdp-eager", "ddp-compiled", "fsdp-compiled")
CFG = GPTConfig(vocab_size=64, seq_len=8, layers=12, heads=1, d_model=8)
ROUNDS, STEPS = 7, 20


def make(variant: str):
    parallelism, mode = variant.split("-")
    torch.manual_seed(0)
    model = GPT(CFG)
    settings = ParallelSettings(
        parallelism, "fp32", "none", 25, True, mode == "compiled", "default", False, "gpt", None
    )
    wrapped, step = build.prepare_model(
        model, settings, torch.device("cpu"), 1, list(model.blocks), None, 0.0
    )
    adamw = optim.OptimizerSettings("adamw", "auto", 0.1, 0.9, False)
    return step, optim.build_optimizer(model, adamw, 1e-3, wrapped.sharded)


def run(step, optimizer, x, y) -> None:
    step(x, y)[1].backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def main() -> None:
    torch.set_num_threads(1)
    parallel.init_single_rank_group("gloo")
    x, y = torch.randint(0, 64, (1, 8)), torch.randint(0, 64, (1, 8))
    built = {}
    for variant in VARIANTS:
        started = time.perf_counter()
        built[variant] = make(variant)
        for _ in range(3):
            run(*built[variant], x, y)
        print(f"{variant}: built and 3 first steps in {time.perf_counter() - started:.1f} s", flush=True)
    rounds = {variant: [] for variant in VARIANTS}
    for _ in range(ROUNDS):
        for variant in VARIANTS:
            started = time.perf_counter()
            for _ in range(STEPS):
                run(*built[variant], x, y)
            rounds[variant].append((time.perf_counter() - started) / STEPS * 1e3)
    print(f"{'variant':15s} {'fastest ms/step':>16s} {'median':>8s}")
    for variant, times in rounds.items():
        print(f"{variant:15s} {min(times):16.1f} {statistics.median(times):8.1f}")


if __name__ == "__main__":
    main()
