"""The optimizer and the learning-rate schedule of a run (scalestudy.train.trainer builds them from the
run config).

- Learning rate lr x scale, scale = global_batch / base_batch ("linear"), its square root ("sqrt")
  or 1 ("none"); linear warm-up over warmup_epochs (step k of W runs at (k+1)/W of it), then cosine
  decay to zero at the last step, updated every step.
- `optimizer`: sgd (momentum, nesterov, weight decay on all parameters) or adamw (betas 0.9/0.95,
  decoupled weight decay on weight matrices and embeddings, none on biases and norms); null: the
  workload's default_optimizer (its spec: sgd for the ResNet, adamw for the LM). Fused kernels:
  AdamW's fused step has DTensor sharding strategies, so it runs fused under FSDP2 too, and a fused
  step takes GradScaler's found-inf flag as a tensor (no host sync; the foreach step reads it with
  `.item()` every fp16 step). SGD's fused step has none (torch 2.14: "aten._fused_sgd_ ... no
  sharding strategy"), so SGD over FSDP2's DTensors runs foreach (and syncs once per fp16 step).
- `optimizer_impl` (auto, fused, foreach, forloop) picks the kernels of the same update: auto is the
  above; the others force one (the variants benchmark compares them, scalestudy.benchmark.variants;
  tests/test_step_variants.py checks that they train the same weights).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from scalestudy.plan import runconfig, workloads
from scalestudy.plan.runconfig import RunConfigError

ADAMW_BETAS = (0.9, 0.95)


def lr_scale(rule: str, global_batch: int, base_batch: int) -> float:
    ratio = global_batch / base_batch
    return {"linear": ratio, "sqrt": math.sqrt(ratio), "none": 1.0}[rule]


def lr_schedule(warmup_steps: int, total_steps: int):
    """Step -> factor of the peak learning rate: linear warm-up, then cosine to zero."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))

    return factor


def optimizer_name(config: dict[str, Any]) -> str | None:
    """The run config's optimizer, else its workload's default (its spec's default_optimizer)."""
    return config.get("optimizer") or workloads.default_optimizer(config.get("workload"))


@dataclass(frozen=True)
class OptimizerSettings:
    """What building the optimizer reads of its run config (from_config)."""

    name: str  # sgd or adamw: the run config's optimizer, else its workload's (optimizer_name)
    impl: str  # optimizer_impl: auto, fused, foreach, forloop
    weight_decay: float
    momentum: float  # sgd's
    nesterov: bool  # sgd's

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> OptimizerSettings:
        """The settings of a run config; keys it leaves out take the trainer's defaults."""
        filled = {**runconfig.DEFAULTS, **config}
        keys = ("weight_decay", "momentum", "nesterov")
        return cls(optimizer_name(config), filled["optimizer_impl"] or "auto", *(filled[k] for k in keys))


@dataclass(frozen=True)
class ScheduleSettings:
    """What the learning rate and its schedule read of a run config (from_config)."""

    lr: float  # at base_batch
    lr_scaling: str  # linear, sqrt or none (lr_scale)
    global_batch: int
    base_batch: int
    warmup_epochs: float

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> ScheduleSettings:
        keys = ("lr", "lr_scaling", "global_batch", "base_batch", "warmup_epochs")
        return cls(*(config[key] for key in keys))

    def peak_lr(self) -> float:
        """lr scaled for the global batch."""
        return self.lr * lr_scale(self.lr_scaling, self.global_batch, self.base_batch)


def implementation(settings: OptimizerSettings, sharded: bool) -> dict[str, bool]:
    """The optimizer's keyword for `optimizer_impl`: {"fused": True}, {"foreach": True} or
    {"foreach": False} (a loop over the parameters); auto: fused, but foreach for SGD over DTensors."""
    impl = settings.impl
    if impl == "fused" and sharded and settings.name == "sgd":
        raise RunConfigError(
            "run config: optimizer_impl='fused' with sgd over FSDP2 (parallelism fsdp): torch's fused "
            "SGD has no DTensor sharding strategy; use auto or foreach"
        )
    if impl == "auto":
        impl = "foreach" if sharded and settings.name == "sgd" else "fused"
    return {"fused": {"fused": True}, "foreach": {"foreach": True}, "forloop": {"foreach": False}}[impl]


def build_optimizer(model: torch.nn.Module, settings: OptimizerSettings, peak_lr: float, sharded: bool):
    kernels = implementation(settings, sharded)
    if settings.name == "adamw":
        matrices = [p for p in model.parameters() if p.dim() >= 2]
        vectors = [p for p in model.parameters() if p.dim() < 2]
        groups = [
            {"params": matrices, "weight_decay": settings.weight_decay},
            {"params": vectors, "weight_decay": 0.0},
        ]
        return torch.optim.AdamW(groups, lr=peak_lr, betas=ADAMW_BETAS, **kernels)
    return torch.optim.SGD(
        model.parameters(),
        lr=peak_lr,
        momentum=settings.momentum,
        nesterov=settings.nesterov,
        weight_decay=settings.weight_decay,
        **kernels,
    )


def build_scheduler(optimizer, warmup_steps: int, total_steps: int):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_schedule(warmup_steps, total_steps))
