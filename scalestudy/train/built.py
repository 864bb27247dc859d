"""What a workload's build_model returns to the trainer."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Built:
    model: torch.nn.Module  # on the rank's device, not yet wrapped for data parallelism
    parameters: int
    forward_flops_per_sample: int  # in the workload's unit (image, token)
    train_flops_per_sample: int  # forward + backward
    description: str  # one log line
    shard_units: list[torch.nn.Module] = field(default_factory=list)  # FSDP2 shards each, then the root
