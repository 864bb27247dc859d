"""Size of the CIFAR ResNet-18 (3x3 stride-1 stem, no max-pool) as a function of its base width,
and the gradient bytes DDP all-reduces for a model of any size (gradient_bytes_of).

Closed forms, counted layer by layer (BasicBlocks [2, 2, 2, 2], widths w, 2w, 4w, 8w at 32, 16, 8
and 4 pixels, 1x1 downsample convs, 10 classes):

* parameters = 2724 w^2 + 257 w + 10 -> 11,173,962 at w = 64;
* forward FLOPs per 32x32 image (2 x multiply-accumulates of the convolutions and the classifier,
  what torch.utils.flop_counter counts) = 270336 w^2 + 55456 w -> 1.111 GFLOP at w = 64, the value
  measured with the flop counter (FORWARD_GFLOP_W64_MEASURED).

Training costs ~3x the forward pass (backward ~2x), see analysis.train_flops_factor. Batch norm,
ReLU and the optimizer step are not counted, as in the usual MFU definition.
"""

from __future__ import annotations

import math

FORWARD_GFLOP_W64_MEASURED = 1.111  # torch.utils.flop_counter, one 32x32 image, width 64
PARAMS_W64 = 11_173_962
BYTES_PER_GRADIENT = {"none": 4, "fp16": 2, "bf16": 2}  # DDP comm_hook -> bytes on the wire
MIB = 1024 * 1024  # DDP's bucket_cap_mb counts MiB


def parameters(width: int = 64) -> int:
    return 2724 * width * width + 257 * width + 10


def forward_flops_per_image(width: int = 64) -> float:
    return float(270336 * width * width + 55456 * width)


def train_flops_per_image(width: int = 64, factor: float = 3.0) -> float:
    return factor * forward_flops_per_image(width)


def gradient_bytes(width: int = 64, comm_hook: str = "none") -> float:
    """Bytes one all-reduce of the ResNet-18 of this width moves per step (gradient_bytes_of)."""
    return gradient_bytes_of(parameters(width), comm_hook)


def gradient_bytes_of(parameter_count: int, comm_hook: str = "none") -> float:
    """Bytes DDP's all-reduce moves per step for a model of any workload: every parameter's gradient
    (fp32, or 16-bit with a comm hook)."""
    try:
        return float(parameter_count * BYTES_PER_GRADIENT[comm_hook])
    except KeyError as err:
        raise ValueError(f"unknown comm_hook {comm_hook!r} (one of {sorted(BYTES_PER_GRADIENT)})") from err


def bucket_count(grad_bytes: float, bucket_cap_mb: float) -> int:
    """All-reduce calls per step: DDP packs gradients into buckets of bucket_cap_mb MiB."""
    if bucket_cap_mb <= 0:
        raise ValueError(f"bucket_cap_mb must be > 0, got {bucket_cap_mb}")
    return max(1, math.ceil(grad_bytes / (bucket_cap_mb * MIB)))
