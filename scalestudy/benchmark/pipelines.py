"""The two data pipelines compared: the project's batched tensor augmentation
(scalestudy.workloads.resnet_cifar.loader)
and the tutorial one, torchvision transforms on PIL images in a DataLoader with worker processes.

Both deliver what a training step consumes: normalised float batches [B, 3, 32, 32] and int64
labels, on the training device.
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset
from torchvision import transforms

from scalestudy.data.preprocess import load_packed, output_names
from scalestudy.data.synthetic_cifar import generate_arrays
from scalestudy.workloads.resnet_cifar import loader as project_loader

Batch = tuple[torch.Tensor, torch.Tensor]
T = TypeVar("T")


def cpu_count() -> int:
    """Cores this process may run on (the DataLoader gets one worker per core)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def write_packed(data_dir: str | Path, train_per_class: int, test_per_class: int, seed: int = 0) -> Path:
    """Synthetic CIFAR-10 as the packed arrays the trainer memory-maps (docs/reference/files.md)."""
    folder = Path(data_dir)
    folder.mkdir(parents=True, exist_ok=True)
    train_images, train_labels, test_images, test_labels = generate_arrays(
        train_per_class, test_per_class, seed
    )
    arrays = {"train": (train_images, train_labels), "test": (test_images, test_labels)}
    for split, pair in arrays.items():
        for name, array in zip(output_names(split), pair, strict=True):
            np.save(folder / name, array)
    return folder


class PilCifar(Dataset):
    """CIFAR-10 held in memory as uint8 HWC, one PIL image per sample (as torchvision.datasets.CIFAR10)."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, transform: Callable) -> None:
        self.images, self.labels, self.transform = images, labels, transform

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int):
        return self.transform(Image.fromarray(self.images[index])), int(self.labels[index])


def tutorial_transform() -> Callable:
    return transforms.Compose(
        [
            transforms.RandomCrop(32, padding=4),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            transforms.Normalize(project_loader.CIFAR10_MEAN, project_loader.CIFAR10_STD),
        ]
    )


def tutorial_loader(data_dir: str | Path, batch: int, device, workers: int | None = None) -> DataLoader:
    """The tutorial pipeline: shuffled DataLoader over PIL images, one worker per core by default."""
    images, labels = load_packed(data_dir, "train", mmap=False)
    workers = cpu_count() if workers is None else workers
    return DataLoader(
        PilCifar(images, labels, tutorial_transform()),
        batch_size=batch,
        shuffle=True,
        drop_last=True,
        num_workers=workers,
        pin_memory=torch.device(device).type == "cuda",
    )


def prefetch_depth(loader: DataLoader) -> int:
    """Batches a DataLoader's workers prepare ahead of the consumer."""
    return loader.num_workers * loader.prefetch_factor if loader.num_workers else 0


def images_per_class(batches: int, batch: int, workers: int, prefetch_factor: int = 2) -> int:
    """Training images per class for one `on_fresh_pass` of `batches` batches (10 classes)."""
    return math.ceil((batches + 1 + workers * prefetch_factor) * batch / 10)


def on_fresh_pass(loader: DataLoader, work: Callable[[Iterator[Batch]], T]) -> T:
    """`work(batches)` on a new pass over `loader` that is already in its steady state.

    Before `work` starts, the pass's workers start and deliver the first batch and the batches they
    had prepared ahead, so a measurement inside `work` neither pays the start nor gains from the
    head start. Returning drops the last reference to the pass, which stops its workers at once:
    they do not compete with whatever is measured next.
    """
    batches = iter(loader)
    for _ in itertools.islice(batches, 1 + prefetch_depth(loader)):
        pass
    return work(batches)


def tensor_loader(data_dir: str | Path, batch: int, device, channels_last: bool = False, seed: int = 0):
    """The project's batched pipeline (scalestudy.workloads.resnet_cifar.loader.TensorLoader) over the
    packed training split."""
    images, labels = load_packed(data_dir, "train")
    return project_loader.TensorLoader(
        images, labels, batch_size=batch, device=device, channels_last=channels_last, seed=seed
    )


def endless(epoch: Callable[[int], Iterator[Batch]]) -> Iterator[Batch]:
    """Batches of epoch 0, 1, 2, ... as one stream (a steady state with no end)."""
    for number in itertools.count():
        yield from epoch(number)


def tensor_stream(pipeline) -> Iterator[Batch]:
    return endless(pipeline.epoch)


def to_device(batch: Batch, device) -> Batch:
    images, labels = batch
    return images.to(device, non_blocking=True), labels.to(device, non_blocking=True)


def consume(stream: Iterator[Batch], batches: int, device) -> int:
    """Pull `batches` batches onto `device`; return the number of images delivered."""
    images = 0
    for batch in itertools.islice(stream, batches):
        images += len(to_device(batch, device)[1])
    return images
