"""What a training step calls: the model and its loss as one module, forward(x, y) -> (logits, the
batch's mean loss), so that compiling the module compiles both as one region.

Why one region: the loss runs in fp32 (bookkeeping.cross_entropy upcasts the logits). Eager, that
upcast writes an fp32 copy of the logits and the log-softmax writes another, kept for the backward:
for GPT-2 small, 16 x 1024 tokens x 50,304 classes x 4 bytes = 3.3 GB each, every step. Compiled
with the model, Inductor fuses the upcast into the loss's reductions and its backward (the logits
stay in the model's dtype; nanoGPT computes its loss in the model's forward for the same reason).

Where it sits (scalestudy.train.parallel.wrap):
- one rank: the module itself; DDP: DDP's module (DDP(ModelAndLoss(model))), so that compiling the
  DDP module puts the loss in the graph of the model's last bucket;
- FSDP2: around the FSDP2 root (ModelAndLoss(root)): the root stays the bare model, which the
  evaluation and the checkpoints call. The blocks are compiled one by one before they are sharded
  and the loss is compiled on its own (`compile_loss`), as torchtitan does: FSDP2's hooks cannot be
  traced, so the root's own layers (embeddings, final norm, head) run eager.
"""

from __future__ import annotations

import torch
from torch import nn

from scalestudy.train.bookkeeping import cross_entropy


class ModelAndLoss(nn.Module):
    """`model` (the bare model, or the FSDP2 root) and its mean cross-entropy with `label_smoothing`."""

    def __init__(self, model: nn.Module, label_smoothing: float) -> None:
        super().__init__()
        self.model = model
        self.label_smoothing = label_smoothing
        self.loss = mean_cross_entropy
        self.loss_compiled = False

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.model(x)
        return logits, self.loss(logits, y, self.label_smoothing)

    def compile_loss(self, mode: str) -> None:
        """The loss as a compiled region of its own (where the model cannot be compiled with it)."""
        self.loss = torch.compile(mean_cross_entropy, mode=mode, fullgraph=True)
        self.loss_compiled = True


def mean_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, label_smoothing: float) -> torch.Tensor:
    return cross_entropy(logits, targets, label_smoothing, reduction="mean")
