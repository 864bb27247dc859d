"""Training and evaluation batches from the packed arrays, one disjoint shard per rank.

Sharding follows torch's DistributedSampler exactly (permutation of all N indices from a generator
seeded with seed + epoch; rank r takes every world_size-th index starting at r), with drop_last for
training: every rank gets N // world_size samples and every step a full batch, so all ranks run the
same number of steps and no sample repeats within an epoch. With that striding, the global batch at
step s of W ranks x batch b is exactly the batch at step s of 1 rank x batch W*b.

Augmentation (random 32x32 crop of the image zero-padded by 4, horizontal flip, then CIFAR-10
normalisation) runs on whole uint8 batches as tensor ops, on the GPU when there is one. Its random
draws are made per sample index from a generator seeded by (seed, epoch), not per rank, so a sample
is augmented the same way whatever the world size, and a resumed epoch replays exactly.

No host stall per step. On a GPU the uint8 split and the labels live on the device; once per epoch
the rank's sample order and its augmentation draws (crop offsets, flips) are computed on the CPU
(the same generators as above, so the data are identical on every device and a resumed epoch
replays), packed into one int64 [4, samples] tensor and copied to the device in ONE transfer, from
pinned memory on CUDA. Every step then only slices that device tensor: no host-to-device copy, no
`.item()`, no tensor built from Python values, so the CPU can queue steps ahead of the GPU. Every
host-to-device transfer of this module goes through `to_device` (a test counts them: per epoch, not
per step). On the CPU the memory map stays put and each batch reads only its own images.

How to confirm it on a GPU: docs/reference/methods.md, "The GPU step path".

`--loader dataloader` is the classic baseline: torchvision transforms on PIL images in a DataLoader
with DistributedSampler and worker processes (pinned batches on CUDA), copied to the device every
step, as a tutorial does.
"""

from __future__ import annotations

import functools
import itertools
import signal
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from scalestudy import contract
from scalestudy.data.preprocess import load_packed

CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
IMAGE_SIZE = 32
CROP_PADDING = 4

Batch = tuple[torch.Tensor, torch.Tensor]


def shard_indices(n: int, epoch: int, seed: int, rank: int, world_size: int) -> torch.Tensor:
    """This rank's sample indices for `epoch`: DistributedSampler(shuffle=True, drop_last=True)."""
    generator = torch.Generator().manual_seed(seed + epoch)
    permutation = torch.randperm(n, generator=generator)
    total = (n // world_size) * world_size
    return permutation[rank:total:world_size]


def augmentation_draws(n: int, epoch: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per sample index: crop offsets dy, dx in [0, 2 * padding] and a flip flag, for one epoch."""
    stream = int(np.random.SeedSequence([seed, epoch, 1]).generate_state(1)[0])
    generator = torch.Generator().manual_seed(stream)
    offsets = torch.randint(0, 2 * CROP_PADDING + 1, (2, n), generator=generator)
    flips = torch.randint(0, 2, (n,), generator=generator).bool()
    return offsets[0], offsets[1], flips


def augment(images: torch.Tensor, dy: torch.Tensor, dx: torch.Tensor, flip: torch.Tensor) -> torch.Tensor:
    """Random crop of the zero-padded image + horizontal flip, as one row gather on uint8 [B, H, W, C]."""
    batch, size, padded_size = len(images), IMAGE_SIZE, IMAGE_SIZE + 2 * CROP_PADDING
    padded = torch.nn.functional.pad(images, (0, 0, CROP_PADDING, CROP_PADDING, CROP_PADDING, CROP_PADDING))
    span = torch.arange(size, device=images.device)
    rows = dy[:, None] + span
    cols = dx[:, None] + torch.where(flip[:, None], size - 1 - span, span)
    first_row = torch.arange(batch, device=images.device)[:, None, None] * padded_size
    pixel = (first_row + rows[:, :, None]) * padded_size + cols[:, None, :]
    # index_select over pixels is ~3x faster on the CPU than the equivalent 3-index advanced indexing
    return padded.reshape(-1, 3).index_select(0, pixel.reshape(-1)).view(batch, size, size, 3)


def to_device(tensor: torch.Tensor, device: torch.device, pinned: bool = True) -> torch.Tensor:
    """Every host-to-device transfer of the loaders: pinned and asynchronous on CUDA.

    The one place a test hooks to count transfers (tests/test_loader.py). Pinning allocates from
    torch's caching host allocator, which keeps the pinned block until the copy has run (and then
    caches it): `pinned=False` for the one-off copies at setup (the whole split, 150 MB), which
    would otherwise keep that much pinned host memory per rank for the whole run.
    """
    asynchronous = pinned and device.type == "cuda"
    if asynchronous and not tensor.is_pinned():
        tensor = tensor.pin_memory()
    return tensor.to(device, non_blocking=asynchronous)


@functools.lru_cache(maxsize=8)
def _scale_and_shift(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    # Built once per device: torch.tensor(..., device=cuda) every batch is a blocking host copy.
    mean = torch.tensor(CIFAR10_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(CIFAR10_STD).view(1, 3, 1, 1)
    return to_device(1 / (255 * std), device), to_device(mean / std, device)


def normalize(images: torch.Tensor, channels_last: bool = False) -> torch.Tensor:
    """uint8 [B, H, W, C] -> float [B, C, H, W], (x / 255 - mean) / std, like ToTensor + Normalize."""
    scale, shift = _scale_and_shift(images.device)
    # The permuted uint8 view already has channels_last strides: the float conversion is the only
    # copy in either layout, and it reads 1-byte elements.
    layout = torch.channels_last if channels_last else torch.contiguous_format
    x = images.permute(0, 3, 1, 2).to(dtype=torch.float32, memory_format=layout)
    return x.mul_(scale).sub_(shift)


class TensorLoader:
    """Batches by tensor indexing. On a GPU the whole uint8 split is copied to the device once.

    train=True: shuffled disjoint shards, full batches only, augmentation.
    train=False: rank r takes test samples r, r + W, ...; no padding, so every sample counts once
    after the all-reduce; the last batch may be short; no augmentation.
    resident: keep the split in device memory (default: on any device but the CPU; True on the CPU
    runs the GPU path there, for tests).
    """

    def __init__(
        self,
        images: np.ndarray,
        labels: np.ndarray,
        *,
        batch_size: int,
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
        device: torch.device | str = "cpu",
        train: bool = True,
        channels_last: bool = False,
        max_steps: int | None = None,
        resident: bool | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        self.device = torch.device(device)
        self.n = len(images)
        self.batch_size, self.rank, self.world_size, self.seed = batch_size, rank, world_size, seed
        self.train, self.channels_last = train, channels_last
        self.resident = self.device.type != "cpu" if resident is None else resident
        if not self.resident and self.device.type != "cpu":
            raise ValueError(
                f"resident=False reads batches on the host: for device cpu only, not {self.device}"
            )
        # 50k x 3 KB = 150 MB on a GPU: indexing there beats any host pipeline. On the CPU the
        # memory map stays put and each batch reads only its own images.
        if self.resident:  # read from the memory map once; a blocking copy at setup
            self._images = to_device(torch.from_numpy(np.array(images)), self.device, pinned=False)
        else:
            self._images = images
        self._labels = to_device(
            torch.from_numpy(np.array(labels, dtype=np.int64)), self.device, pinned=False
        )
        _scale_and_shift(self._labels.device)  # its transfers now (keyed by cuda:N), not in a step
        per_rank = self.n // world_size if train else len(range(rank, self.n, world_size))
        full = per_rank // batch_size if train else -(-per_rank // batch_size)
        self.steps_per_epoch = min(full, max_steps) if max_steps is not None else full
        if self.steps_per_epoch < 1:
            raise ValueError(
                f"{self.n} samples over {world_size} ranks give no full batch of {batch_size} per rank"
            )

    def epoch_indices(self, epoch: int) -> torch.Tensor:
        if self.train:
            return shard_indices(self.n, epoch, self.seed, self.rank, self.world_size)
        return torch.arange(self.rank, self.n, self.world_size)

    def batch_indices(self, epoch: int, start_step: int = 0) -> Iterator[torch.Tensor]:
        indices = self.epoch_indices(epoch)
        for step in range(start_step, self.steps_per_epoch):
            yield indices[step * self.batch_size : (step + 1) * self.batch_size]

    def epoch_plan(self, epoch: int, start_step: int = 0) -> torch.Tensor:
        """int64 [4, samples] on the CPU: the sample indices of steps start_step.. of this epoch,
        then each sample's crop offsets dy, dx and flip flag (zeros for evaluation)."""
        first = start_step * self.batch_size
        indices = self.epoch_indices(epoch)[first : self.steps_per_epoch * self.batch_size]
        plan = torch.zeros(4, len(indices), dtype=torch.int64)
        plan[0] = indices
        if self.train:
            dy, dx, flip = augmentation_draws(self.n, epoch, self.seed)
            plan[1], plan[2], plan[3] = dy[indices], dx[indices], flip[indices]
        return plan

    def epoch(self, epoch: int, start_step: int = 0) -> Iterator[Batch]:
        """Batches (float images [B, 3, 32, 32], int64 labels) on the device, from step `start_step`.

        The epoch's plan is made and sent to the device here, when the epoch is asked for, not at
        its first batch; the batches then only slice it.
        """
        plan = self.epoch_plan(epoch, start_step)
        on_cpu = plan[0]
        if self.resident:
            plan = to_device(plan, self.device)
        return self._batches(plan, on_cpu, self.steps_per_epoch - start_step)

    def _batches(self, plan: torch.Tensor, on_cpu: torch.Tensor, steps: int) -> Iterator[Batch]:
        flips = plan[3].bool()  # one conversion per epoch
        for step in range(steps):
            part = slice(step * self.batch_size, (step + 1) * self.batch_size)
            if self.resident:
                index = plan[0, part]
                images = self._images[index]
            else:
                index = on_cpu[part]
                images = torch.from_numpy(self._images[index.numpy()])
            if self.train:
                images = augment(images, plan[1, part], plan[2, part], flips[part])
            yield normalize(images, self.channels_last), self._labels[index]


# --- the classic DataLoader baseline --------------------------------------------------------------


class PackedImageDataset(torch.utils.data.Dataset):
    """(PIL image -> transform, label) from a packed split; each worker opens its own memory map."""

    def __init__(self, data_dir: str | Path, split: str, transform) -> None:
        self.data_dir, self.split, self.transform = str(data_dir), split, transform
        self.length = len(load_packed(data_dir, split)[1])
        self._arrays: tuple[np.ndarray, np.ndarray] | None = None

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        from PIL import Image

        if self._arrays is None:
            self._arrays = load_packed(self.data_dir, self.split)
        images, labels = self._arrays
        return self.transform(Image.fromarray(np.asarray(images[index]))), int(labels[index])


def classic_train_transform():
    from torchvision import transforms

    return transforms.Compose(
        [
            transforms.RandomCrop(IMAGE_SIZE, padding=CROP_PADDING),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            transforms.Normalize(CIFAR10_MEAN, CIFAR10_STD),
        ]
    )


class _SkipSampler(torch.utils.data.Sampler):
    """The first `skip` indices of a sampler dropped: a resumed epoch continues where it stopped."""

    def __init__(self, sampler, skip: int) -> None:
        self.sampler, self.skip = sampler, skip

    def __iter__(self):
        return itertools.islice(iter(self.sampler), self.skip, None)

    def __len__(self) -> int:
        return max(len(self.sampler) - self.skip, 0)


def _ignore_stop_signals(_worker_id: int) -> None:
    # Slurm signals every process of the step; the workers must leave the checkpoint to the rank.
    for signum in contract.STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)


class ClassicLoader:
    """DataLoader + DistributedSampler(drop_last=True) + torchvision transforms on PIL images.

    Same data order as TensorLoader (same sampler semantics); the augmentation draws come from the
    workers' own generators, so they differ from TensorLoader's and do not replay after a resume.
    """

    def __init__(
        self,
        data_dir: str | Path,
        *,
        batch_size: int,
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
        device: torch.device | str = "cpu",
        num_workers: int = 2,
        channels_last: bool = False,
        max_steps: int | None = None,
    ) -> None:
        self.device = torch.device(device)
        self.batch_size, self.num_workers, self.channels_last = batch_size, num_workers, channels_last
        self.dataset = PackedImageDataset(data_dir, "train", classic_train_transform())
        self.sampler = torch.utils.data.DistributedSampler(
            self.dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=seed, drop_last=True
        )
        full = len(self.sampler) // batch_size
        self.steps_per_epoch = min(full, max_steps) if max_steps is not None else full
        if self.steps_per_epoch < 1:
            raise ValueError(
                f"{len(self.dataset)} samples over {world_size} ranks give no batch of {batch_size}"
            )

    def epoch(self, epoch: int, start_step: int = 0) -> Iterator[Batch]:
        self.sampler.set_epoch(epoch)
        loader = torch.utils.data.DataLoader(
            self.dataset,
            batch_size=self.batch_size,
            sampler=_SkipSampler(self.sampler, start_step * self.batch_size),
            drop_last=True,
            num_workers=self.num_workers,
            pin_memory=self.device.type == "cuda",
            worker_init_fn=_ignore_stop_signals if self.num_workers else None,
            persistent_workers=False,
        )
        memory_format = torch.channels_last if self.channels_last else torch.contiguous_format
        for images, labels in itertools.islice(loader, self.steps_per_epoch - start_step):
            # the classic path: a (pinned, on CUDA) copy of every batch
            images = to_device(images, self.device).contiguous(memory_format=memory_format)
            yield images, to_device(labels, self.device)
