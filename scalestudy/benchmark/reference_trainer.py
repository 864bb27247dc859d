"""The reference trainer, written the plain tutorial way: fp32, a DataLoader of PIL transforms, no
channels_last, no compile, no mixed precision, a bare SGD loop. Only the network is shared with the
project (scalestudy.workloads.resnet_cifar.model), so both train the same CIFAR ResNet-18 at the same width.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable

import torch
from torch import nn, optim

from scalestudy.workloads.resnet_cifar.model import build_model


class ReferenceTrainer:
    """model + CrossEntropyLoss + SGD(momentum, weight decay), one step per batch."""

    def __init__(
        self, width: int, device, lr: float = 0.1, momentum: float = 0.9, weight_decay: float = 5e-4
    ):
        self.device = torch.device(device)
        self.model = build_model(width=width).to(self.device)
        self.criterion = nn.CrossEntropyLoss()
        self.optimizer = optim.SGD(
            self.model.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay
        )

    def step(self, images: torch.Tensor, labels: torch.Tensor) -> float:
        images, labels = images.to(self.device), labels.to(self.device)
        self.optimizer.zero_grad()
        outputs = self.model(images)
        loss = self.criterion(outputs, labels)
        loss.backward()
        self.optimizer.step()
        return loss.item()

    def train(self, batches: Iterable, steps: int) -> tuple[int, list[float]]:
        """Train on the next `steps` batches; return (images seen, loss of each step)."""
        self.model.train()
        images, losses = 0, []
        for inputs, labels in itertools.islice(batches, steps):
            losses.append(self.step(inputs, labels))
            images += len(labels)
        return images, losses
