"""ResNet-18, CIFAR variant: torchvision's ResNet/BasicBlock with a 3x3 stride-1 stem, no max-pool.

`width` scales every stage (w, 2w, 4w, 8w; 64 is the standard network, 11,173,962 parameters).
`norm` picks the normalisation: "batch" (plain BatchNorm, per-rank statistics under DDP),
"sync" (SyncBatchNorm, statistics over all ranks; GPU only), or "frozen" (BatchNorm that always
normalises with its running statistics and never updates them; its affine weights still train).
"frozen" makes the network's output per sample independent of the rest of the batch, which is
what the "2 ranks x batch b == 1 rank x batch 2b" test needs on CPU, where SyncBatchNorm refuses to run.

Import cost (issue 41): any torchvision import runs torchvision/__init__.py, which imports all its
subpackages, and torchvision.ops imports torch._dynamo (~1.8 s); no narrower import avoids it. It is
no extra cost: the trainer's optimizer imports torch._dynamo anyway (torch.optim's constructor,
@torch._disable_dynamo); torchvision's own share is ~0.2 s.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torchvision.models.resnet import BasicBlock, ResNet

NORMS = ("batch", "sync", "frozen")
STANDARD_WIDTH = 64  # torchvision's stage-1 width; its _make_layer is called with 64/128/256/512


class FrozenStatsBatchNorm2d(nn.BatchNorm2d):
    """BatchNorm that normalises with its running statistics in training too, and never updates them."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.batch_norm(
            x, self.running_mean, self.running_var, self.weight, self.bias, training=False, eps=self.eps
        )


class CifarResNet(ResNet):
    """torchvision's ResNet with its stage widths scaled by width/64 and the CIFAR stem."""

    def __init__(self, width: int = 64, num_classes: int = 10, norm_layer: type[nn.Module] = nn.BatchNorm2d):
        if not isinstance(width, int) or width < 1:
            raise ValueError(f"model width must be a positive integer, got width={width!r}")
        self.width = width  # read by _make_layer, which ResNet.__init__ calls
        super().__init__(BasicBlock, [2, 2, 2, 2], num_classes=num_classes, norm_layer=norm_layer)
        self.conv1 = nn.Conv2d(3, width, kernel_size=3, stride=1, padding=1, bias=False)
        nn.init.kaiming_normal_(self.conv1.weight, mode="fan_out", nonlinearity="relu")  # as ResNet does
        self.bn1 = norm_layer(width)
        self.maxpool = nn.Identity()
        self.fc = nn.Linear(8 * width * BasicBlock.expansion, num_classes)

    def _make_layer(self, block, planes, blocks, stride=1, dilate=False):
        if planes == STANDARD_WIDTH:  # stage 1 takes the stem's output, which is `width` channels here
            self.inplanes = self.width
        return super()._make_layer(block, planes * self.width // STANDARD_WIDTH, blocks, stride, dilate)


def build_model(
    width: int = 64, num_classes: int = 10, norm: str = "batch", channels_last: bool = False
) -> nn.Module:
    if norm not in NORMS:
        raise ValueError(f"norm must be one of {NORMS}, got norm={norm!r}")
    norm_layer = FrozenStatsBatchNorm2d if norm == "frozen" else nn.BatchNorm2d
    model = CifarResNet(width=width, num_classes=num_classes, norm_layer=norm_layer)
    if norm == "sync":
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    return model


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def count_flops(model: nn.Module, batch: int | torch.Tensor = 1) -> int:
    """Forward FLOPs (a multiply-add counts 2) for one batch: an int (32x32 RGB images) or a tensor.

    Training costs about 3x this (forward, plus backward for inputs and for weights).
    """
    from torch.utils.flop_counter import FlopCounterMode

    param = next(model.parameters())
    x = batch if isinstance(batch, torch.Tensor) else torch.zeros(batch, 3, 32, 32, device=param.device)
    was_training = model.training
    model.eval()  # the count is the same; eval keeps BatchNorm's running statistics untouched
    try:
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            model(x)
    finally:
        model.train(was_training)
    return int(counter.get_total_flops())
