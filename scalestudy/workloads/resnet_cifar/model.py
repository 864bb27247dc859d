"""ResNet-18, CIFAR variant: torchvision's ResNet-18 network with a 3x3 stride-1 stem and no max-pool.

`width` scales every stage (w, 2w, 4w, 8w; 64 is the standard network, 11,173,962 parameters).
`norm` picks the normalisation: "batch" (plain BatchNorm, per-rank statistics under DDP),
"sync" (SyncBatchNorm, statistics over all ranks; GPU only), or "frozen" (BatchNorm that always
normalises with its running statistics and never updates them; its affine weights still train).
"frozen" makes the network's output per sample independent of the rest of the batch, which is
what the "2 ranks x batch b == 1 rank x batch 2b" test needs on CPU, where SyncBatchNorm refuses to run.

The network is written out here (BasicBlock, CifarResNet: torchvision's module names, shapes and
initialisation; tests/test_model.py checks them against torchvision.models.resnet) rather than
imported: any torchvision import runs torchvision/__init__.py, which loads its compiled operators
and every subpackage, on the critical path of every training job before its first step (issue 51;
issue 41 measured `config` 4-6 s on an H200, torchvision's import with torch._dynamo and the CUDA
context). The FLOP count runs on the `meta` device (count_flops_per_image): no forward on the GPU.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

NORMS = ("batch", "sync", "frozen")


class FrozenStatsBatchNorm2d(nn.BatchNorm2d):
    """BatchNorm that normalises with its running statistics in training too, and never updates them."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.batch_norm(
            x, self.running_mean, self.running_var, self.weight, self.bias, training=False, eps=self.eps
        )


class BasicBlock(nn.Module):
    """torchvision's BasicBlock: two 3x3 convolutions with batch norm, and the shortcut."""

    expansion = 1

    def __init__(
        self, inplanes: int, planes: int, stride: int = 1, downsample=None, norm_layer=nn.BatchNorm2d
    ):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, kernel_size=3, stride=stride, padding=1, bias=False)
        self.bn1 = norm_layer(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn2 = norm_layer(planes)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += identity
        return self.relu(out)


class CifarResNet(nn.Module):
    """ResNet-18 with stage widths w, 2w, 4w, 8w and the CIFAR stem (3x3, stride 1, no max-pool),
    built as torchvision's ResNet-18 is and then given the CIFAR stem and head, as the package built
    it from torchvision: the same random draws in the same order, so a seed gives the same initial
    weights (Kaiming-normal convolutions, BatchNorm weight 1 and bias 0; tests/test_model.py)."""

    def __init__(self, width: int = 64, num_classes: int = 10, norm_layer: type[nn.Module] = nn.BatchNorm2d):
        if not isinstance(width, int) or width < 1:
            raise ValueError(f"model width must be a positive integer, got width={width!r}")
        super().__init__()
        self.width = width
        self.conv1 = nn.Conv2d(3, 64, kernel_size=7, stride=2, padding=3, bias=False)  # ImageNet's, replaced
        self.bn1 = norm_layer(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.Identity()
        self.inplanes = width
        self.layer1 = self._make_layer(width, 1, norm_layer)
        self.layer2 = self._make_layer(2 * width, 2, norm_layer)
        self.layer3 = self._make_layer(4 * width, 2, norm_layer)
        self.layer4 = self._make_layer(8 * width, 2, norm_layer)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512 * BasicBlock.expansion, num_classes)  # ImageNet's, replaced
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(module, nn.BatchNorm2d | nn.GroupNorm):
                nn.init.constant_(module.weight, 1)
                nn.init.constant_(module.bias, 0)
        self.conv1 = nn.Conv2d(3, width, kernel_size=3, stride=1, padding=1, bias=False)
        nn.init.kaiming_normal_(self.conv1.weight, mode="fan_out", nonlinearity="relu")
        self.fc = nn.Linear(8 * width * BasicBlock.expansion, num_classes)

    def _make_layer(self, planes: int, stride: int, norm_layer) -> nn.Sequential:
        """Two BasicBlocks; the first takes the stride, with a 1x1 shortcut where the shape changes."""
        downsample = None
        if stride != 1 or self.inplanes != planes:
            downsample = nn.Sequential(
                nn.Conv2d(self.inplanes, planes, kernel_size=1, stride=stride, bias=False), norm_layer(planes)
            )
        first = BasicBlock(self.inplanes, planes, stride, downsample, norm_layer)
        self.inplanes = planes
        return nn.Sequential(first, BasicBlock(planes, planes, norm_layer=norm_layer))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


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


def count_flops_per_image(width: int) -> int:
    """Forward FLOPs per 32x32 image of the width-`width` network, counted on a copy of it on the
    `meta` device: shapes only, no memory and no kernel (a job's fixed cost: no forward on its GPU,
    no cuDNN autotuning before its first step)."""
    with torch.device("meta"):
        return count_flops(CifarResNet(width=width), torch.empty(1, 3, 32, 32))
