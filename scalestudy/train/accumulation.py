"""Gradient accumulation: one optimizer step over a per-GPU batch run in chunks (train.micro_batch).

Each chunk of `micro_batch` samples runs its forward and backward; its mean loss is scaled by
chunk / batch before the backward, so the gradients summed over the chunks are the whole batch's
mean-loss gradient (for the GPT exactly, up to float summation order). Only the last chunk's
backward synchronises the gradients over the ranks (DDP's no_sync, FSDP2's
set_requires_gradient_sync on the others): one all-reduce (FSDP2: reduce-scatter) per optimizer
step, as without accumulation. The global batch, the learning rate and the step count stay the
config's; what changes is the memory the activations take (a chunk's, not the batch's).

Batch norm (the ResNet) normalises over each chunk: its batch statistics, running statistics and
gradients are a chunk's, so a ResNet run with micro_batch is not the same training as one without.

With micro_batch null (or not smaller than the batch) the step is the one pass it always was.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch.nn.parallel import DistributedDataParallel


def chunks(
    x: torch.Tensor, y: torch.Tensor, micro_batch: int | None
) -> list[tuple[torch.Tensor, torch.Tensor, float]]:
    """(inputs, targets, weight) per chunk of the batch along its first dimension; weight: the
    chunk's share of the batch (its mean loss times it sums to the batch's mean). One chunk of
    weight 1.0, the tensors as they are, without micro_batch or where it covers the batch."""
    batch = len(y)
    if micro_batch is None or micro_batch >= batch:
        return [(x, y, 1.0)]
    return [
        (xc, yc, len(yc) / batch) for xc, yc in zip(x.split(micro_batch), y.split(micro_batch), strict=True)
    ]


@contextlib.contextmanager
def gradient_sync(module: torch.nn.Module, sync: bool) -> Iterator[None]:
    """The backward inside synchronises gradients over the ranks only with `sync`: DDP's no_sync()
    otherwise; an FSDP2 module is told set_requires_gradient_sync(sync); a plain module (one rank)
    has nothing to synchronise."""
    if isinstance(module, DistributedDataParallel) and not sync:
        with module.no_sync():
            yield
        return
    if hasattr(module, "set_requires_gradient_sync"):  # FSDP2 (fully_shard's FSDPModule)
        module.set_requires_gradient_sync(sync)
    yield
