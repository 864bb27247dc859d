"""Options of the GPU step path that depend on the installed torch: DistributedDataParallel's
options, torch.compile's cache folder, the time spent compiling and its graph breaks (used by
scalestudy.train.trainer and scalestudy.train.parallel)."""

from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import Any

from torch.nn.parallel import DistributedDataParallel


def ddp_options(compiled: bool, accumulating: bool = False) -> dict[str, Any]:
    """DistributedDataParallel options for this study's model, as far as the installed torch has them.

    - BatchNorm statistics stay per rank (each rank normalises its own batch anyway): no buffer
      broadcast before every forward (`forward_sync_buffers`, torch >= 2.13; before it the now
      deprecated `broadcast_buffers`). Evaluation takes rank 0's (bookkeeping.evaluate).
    - `batched_grad_copy`: one foreach copy and one division per bucket instead of two kernels per
      parameter (with zero_grad(set_to_none=True), gradient_as_bucket_view cannot avoid the copies).
    - `static_graph`: ResNet-18 has no unused parameters and no step-dependent control flow; not
      combined with torch.compile, whose DDPOptimizer has had problems with it (pytorch#109261),
      nor with gradient accumulation (`accumulating`: train.micro_batch), whose no_sync() fails a
      static graph's first iteration (torch 2.x: "expect_autograd_hooks_ INTERNAL ASSERT FAILED").
    """
    accepted = inspect.signature(DistributedDataParallel.__init__).parameters
    static_graph = not (compiled or accumulating)
    options: dict[str, Any] = {"gradient_as_bucket_view": True, "static_graph": static_graph}
    buffers_key = "forward_sync_buffers" if "forward_sync_buffers" in accepted else "broadcast_buffers"
    options[buffers_key] = False
    if "batched_grad_copy" in accepted:
        options["batched_grad_copy"] = True
    return options


def use_inductor_cache(folder: str | None) -> None:
    """TorchInductor's cache in `folder` (kept with the results, shared by the runs) unless the
    environment names another one; without either, torch's default under /tmp.

    Importing torch's flop counter (scalestudy.workloads.resnet_cifar.model) already sets
    TORCHINDUCTOR_CACHE_DIR to
    torch's default, so that value counts as unset."""
    current = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if folder and (current is None or os.path.abspath(current) == torch_default_inductor_cache()):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(Path(folder).resolve())


def torch_default_inductor_cache() -> str | None:
    try:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir
    except ImportError:
        return None
    return os.path.abspath(default_cache_dir())


def compile_seconds() -> float:
    """Seconds this process has spent compiling with torch.compile: Dynamo's frames (Inductor's
    forward compile included) plus the backward graphs, compiled at their first use."""
    from torch._dynamo.utils import compilation_time_metrics

    return sum(sum(compilation_time_metrics.get(key, ())) for key in COMPILE_METRICS)


COMPILE_METRICS = ("_compile.compile_inner", "backward._backward_impl")


def log_graph_breaks() -> None:
    """Dynamo's graph breaks and recompiles in the run's log (TORCH_LOGS=graph_breaks,recompiles),
    each with its reason and where it happened; the environment's TORCH_LOGS wins if set."""
    import torch._logging

    if not os.environ.get("TORCH_LOGS"):
        torch._logging.set_logs(graph_breaks=True, recompiles=True)


def graph_breaks() -> int:
    """Graph breaks Dynamo has taken in this process (0 without compiling): its `graph_break`
    counter plus its `unimplemented` one (a call it cannot trace, such as FSDP2's
    dynamo-disabled hooks, which leaves the rest of that frame eager)."""
    from torch._dynamo.utils import counters

    return sum(counters["graph_break"].values()) + sum(counters["unimplemented"].values())
