"""Data parallelism of a run: DDP, or FSDP2 (`torch.distributed.fsdp.fully_shard`), and what a rank
holds in memory. What the step calls is the model and its loss (scalestudy.train.model_loss).

- ddp: every rank keeps the whole model and optimizer state; gradients are all-reduced in buckets
  (bucket_cap_mb, the comm hook, scalestudy.train.torch_options.ddp_options). DDP's module is the
  model with its loss, so that compiling the DDP module compiles both (scalestudy.train.build).
- fsdp: parameters, gradients and optimizer state are sharded over the ranks (DTensors); each
  `shard_units` module (the LM's transformer blocks) is all-gathered before its forward and, with
  reshard_after_forward, freed again after it (gathered again for the backward): less memory for more
  communication. Precision bf16/fp16 runs through FSDP2's MixedPrecisionPolicy (parameters cast to
  that dtype for the compute, gradients reduced in fp32) instead of autocast. With one rank, FSDP2
  runs in a process group of its own (nothing to shard, but the same code path and its overheads).
  What is turned off where it only costs:
  - reshard_after_forward at one rank: nothing is gathered, but each unshard casts and copies every
    parameter of the unit (torch's one-rank path), so resharding after the forward would do that
    twice a step to free one copy of the parameters between forward and backward; the root module
    (embeddings, head) never reshards after forward (the backward needs its parameters first:
    resharding them would put an exposed all-gather at the start of every backward);
  - the forward inputs' cast to the compute dtype happens once, at the root (FSDP2's
    cast_forward_inputs): the blocks' inputs are the root's activations, already in that dtype.
  With `compile`, each shard unit is compiled (in place: the same state_dict keys; fullgraph, as
  torchtitan does) before it is sharded, and the loss on its own: compiling the whole model after
  fully_shard graph-breaks at FSDP2's dynamo-disabled hooks and leaves the root's forward eager.
"""

from __future__ import annotations

import contextlib
import logging
import resource
import sys
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from scalestudy.train import torch_options as torchopts
from scalestudy.train.model_loss import ModelAndLoss
from scalestudy.train.process import check_deterministic

COMM_HOOKS = {"fp16": default_hooks.fp16_compress_hook, "bf16": default_hooks.bf16_compress_hook}
FSDP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}

log = logging.getLogger("scalestudy.train")


@dataclass(frozen=True)
class ParallelSettings:
    """What wrapping a model reads of its run config (from_config)."""

    parallelism: str  # ddp or fsdp
    precision: str  # FSDP2's mixed-precision policy: bf16, fp16, else none
    comm_hook: str  # DDP's gradient compression: none, fp16, bf16
    bucket_cap_mb: float | None  # DDP's buckets
    reshard_after_forward: bool  # FSDP2's shard units
    compile: bool
    compile_mode: str
    deterministic: bool  # with workload: process.check_deterministic
    workload: str
    micro_batch: int | None  # gradient accumulation (scalestudy.train.accumulation): no static graph

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> ParallelSettings:
        return cls(**{name: config.get(name) for name in cls.__dataclass_fields__})

    def needs_process_group(self, world_size: int) -> bool:
        return world_size > 1 or self.parallelism == "fsdp"


@dataclass
class Wrapped:
    """What the training step calls, and what was chosen for it (recorded in summary.json)."""

    module: torch.nn.Module  # DDP, the FSDP2 root or the model with its loss: told when gradients sync
    step: torch.nn.Module  # forward(x, y) -> (logits, loss): the model and its loss (ModelAndLoss)
    options: dict[str, Any] | None  # DDP's options or FSDP2's choices; None with one plain rank
    sharded: bool  # parameters are FSDP2 DTensors
    autocast: bool  # the step runs under autocast (not with FSDP2's mixed-precision policy)
    compiled: bool = False  # the shard units and the loss are compiled (the caller compiles nothing more)

    def recorded_options(self) -> dict[str, Any] | None:
        """`options`, with FSDP2's modules that did reshard after their forward (once it ran),
        read from their FSDP2 state: what took effect, not only what was asked."""
        if not self.sharded or self.options is None:
            return self.options
        return {**self.options, "resharded_after_forward": resharding_modules(self.module)}


def resharding_modules(root: torch.nn.Module) -> list[str] | None:
    """The names of the FSDP2 modules under `root` ("" for the root) whose parameters are freed
    after their forward; None where the installed torch's FSDP2 state does not say."""
    names = []
    for name, module in root.named_modules():
        state = module._get_fsdp_state() if hasattr(module, "_get_fsdp_state") else None
        group = getattr(state, "_fsdp_param_group", None)
        if group is None:
            continue
        if not hasattr(group, "post_forward_mesh_info"):
            return None
        if group.post_forward_mesh_info is not None:
            names.append(name)
    return names


def wrap(
    model: torch.nn.Module,
    settings: ParallelSettings,
    device: torch.device,
    world_size: int,
    shard_units,
    label_smoothing: float = 0.0,
):
    """The model `model` (already on `device`) and its loss prepared for `settings.parallelism`;
    RunConfigError first where `deterministic` cannot run it on `device` (process.check_deterministic)."""
    check_deterministic(model, asdict(settings), device)
    if settings.parallelism == "fsdp":
        return _fully_shard(model, settings, shard_units, world_size, label_smoothing)
    step = ModelAndLoss(model, label_smoothing)
    if world_size == 1:
        if settings.comm_hook != "none":
            log.warning("comm_hook=%r has no effect with one rank (no DDP)", settings.comm_hook)
        return Wrapped(step, step, None, sharded=False, autocast=True)
    options = torchopts.ddp_options(settings.compile, accumulating=settings.micro_batch is not None)
    ddp = DistributedDataParallel(
        step,
        device_ids=[device.index] if device.type == "cuda" else None,
        bucket_cap_mb=settings.bucket_cap_mb,
        **options,
    )
    if settings.comm_hook != "none":
        ddp.register_comm_hook(None, COMM_HOOKS[settings.comm_hook])
    return Wrapped(ddp, ddp, options, sharded=False, autocast=True)


def _fully_shard(
    model: torch.nn.Module, settings: ParallelSettings, shard_units, world_size: int, label_smoothing: float
) -> Wrapped:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    dtype = FSDP_DTYPES.get(settings.precision)
    reduce_dtype = torch.float32 if dtype else None
    # the root casts the forward inputs; the units' inputs are its activations, already in `dtype`
    root_policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=reduce_dtype)
    unit_policy = MixedPrecisionPolicy(
        param_dtype=dtype, reduce_dtype=reduce_dtype, cast_forward_inputs=False
    )
    reshard = unit_reshard_after_forward(settings.reshard_after_forward, world_size)
    compiled = bool(settings.compile) and bool(shard_units)
    if compiled:
        torchopts.log_graph_breaks()
    for unit in shard_units:
        if compiled:
            # before fully_shard: its hooks stay outside the compiled frame
            unit.compile(mode=settings.compile_mode, fullgraph=True)
        fully_shard(unit, reshard_after_forward=reshard, mp_policy=unit_policy)
    fully_shard(model, reshard_after_forward=False, mp_policy=root_policy)
    step = ModelAndLoss(model, label_smoothing)
    if compiled:
        step.compile_loss(settings.compile_mode)
    if settings.comm_hook != "none":
        log.warning("comm_hook=%r is DDP's; FSDP2 reduces in its reduce_dtype", settings.comm_hook)
    options = {
        "reshard_after_forward": reshard,
        "root_reshard_after_forward": False,
        "unit_cast_forward_inputs": False,
        "compiled_units": len(shard_units) if compiled else 0,
        "compiled_loss": compiled,
        "param_dtype": str(dtype).removeprefix("torch.") if dtype else None,
        "reduce_dtype": "float32" if dtype else None,
        "shard_units": len(shard_units),
    }
    return Wrapped(model, step, options, sharded=True, autocast=dtype is None, compiled=compiled)


def unit_reshard_after_forward(configured: bool, world_size: int) -> bool:
    """The shard units' reshard_after_forward: the run config's (train.reshard_after_forward), off
    at one rank, where it frees one copy of the parameters for a second cast and copy of each of
    them every step, and gathers nothing either way."""
    if configured and world_size == 1:
        log.info("FSDP2 at one rank: the blocks keep their parameters after the forward (no reshard)")
    return bool(configured) and world_size > 1


def init_single_rank_group(backend: str) -> None:
    """A process group of one rank (FSDP2 needs a device mesh even then), in memory: no port.

    It serves CPU tensors too (single_rank_backend): with one rank there is no separate gloo
    control group, so the stop agreement (StopRequest.agreed) and the object collectives run on
    this group, and NCCL alone serves CUDA tensors only ("No backend type associated with device
    type cpu" at the first step)."""
    import torch.distributed as dist

    dist.init_process_group(single_rank_backend(backend), store=dist.HashStore(), rank=0, world_size=1)


def single_rank_backend(backend: str) -> str:
    """`backend` ("nccl", "gloo" or "device:backend,...") with gloo added for the CPU where it
    serves no CPU tensors: "nccl" -> "cpu:gloo,cuda:nccl"."""
    from torch.distributed.distributed_c10d import Backend, BackendConfig

    devices = BackendConfig(Backend(backend)).get_device_backend_map()
    if "cpu" in devices:
        return backend
    return ",".join(f"{device}:{name}" for device, name in {"cpu": "gloo", **devices}.items())


# --- memory --------------------------------------------------------------------------------------


def local_bytes(tensor: torch.Tensor) -> int:
    """Bytes of `tensor` this rank holds: a DTensor's local shard, else the whole tensor."""
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return local.numel() * local.element_size()


def memory_report(device: torch.device, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """This rank's peak memory, what it is (peak_memory), and its model state (model_state_bytes)."""
    peak, source = peak_memory(device)
    return {"peak": peak, "source": source, "state": model_state_bytes(model, optimizer)}


def model_state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Parameters, their gradients (one per parameter: they exist between backward and zero_grad)
    and the optimizer's tensors, as this rank holds them: FSDP2's 1/N shards, DDP's full copies."""
    parameters = sum(local_bytes(p) for p in model.parameters())
    states = sum(
        local_bytes(value)
        for state in optimizer.state.values()
        for value in state.values()
        if isinstance(value, torch.Tensor) and value.dim() > 0
    )
    return 2 * parameters + states


def peak_memory(device: torch.device) -> tuple[int, str]:
    """(bytes, what they are): the CUDA caching allocator's peak of allocated tensors on a GPU; the
    process's peak resident set on the CPU (libraries and data included, so it shows sharding less
    clearly than model_state_bytes)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device), "cuda_max_memory_allocated"
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak * (1 if sys.platform == "darwin" else 1024), "cpu_peak_rss"


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        with contextlib.suppress(RuntimeError):
            torch.cuda.reset_peak_memory_stats(device)
