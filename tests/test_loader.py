"""Sharding, augmentation and the two loaders, on small packed arrays whose label is the sample index."""

import numpy as np
import pytest
import torch
import torchvision.transforms.functional as TF
from PIL import Image

from scalestudy.data.preprocess import load_packed
from scalestudy.workloads.resnet_cifar import loader
from scalestudy.workloads.resnet_cifar.loader import ClassicLoader, TensorLoader
from tests.op_log import OpLog

N_TRAIN, N_TEST = 203, 37  # not multiples of the batch or the world size, on purpose


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """Packed arrays where label == sample index, so a batch's labels say which samples it holds."""
    folder = tmp_path_factory.mktemp("packed")
    rng = np.random.default_rng(0)
    for split, n in (("train", N_TRAIN), ("test", N_TEST)):
        np.save(folder / f"{split}_images.npy", rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8))
        np.save(folder / f"{split}_labels.npy", np.arange(n, dtype=np.int64))
    return folder


def _train_loader(packed, rank, world, batch=8, **kwargs):
    return TensorLoader(
        *load_packed(packed, "train"), batch_size=batch, rank=rank, world_size=world, **kwargs
    )


@pytest.mark.parametrize(
    ("n", "world", "epoch", "seed"), [(203, 2, 0, 0), (203, 3, 4, 7), (64, 4, 1, 1), (10, 1, 2, 3)]
)
def test_shards_are_distributed_samplers(n, world, epoch, seed):
    for rank in range(world):
        sampler = torch.utils.data.DistributedSampler(
            range(n), num_replicas=world, rank=rank, shuffle=True, seed=seed, drop_last=True
        )
        sampler.set_epoch(epoch)
        assert loader.shard_indices(n, epoch, seed, rank, world).tolist() == list(sampler)


@pytest.mark.parametrize("world", [2, 3, 4])
def test_no_sample_is_seen_twice_in_an_epoch_across_ranks(packed, world):
    for epoch in range(2):
        seen = []
        for rank in range(world):
            data = _train_loader(packed, rank, world, seed=5)
            seen += [label for _, labels in data.epoch(epoch) for label in labels.tolist()]
            steps = data.steps_per_epoch
        assert steps == N_TRAIN // world // 8
        assert len(seen) == len(set(seen)) == steps * 8 * world


def test_every_epoch_has_its_own_order(packed):
    data = _train_loader(packed, 0, 2)
    first, second = ([labels.tolist() for _, labels in data.epoch(e)] for e in (0, 1))
    assert first != second
    assert first == [labels.tolist() for _, labels in data.epoch(0)]


def test_two_ranks_together_see_the_batches_of_one_rank_with_twice_the_batch(packed):
    one = _train_loader(packed, 0, 1, batch=16)
    halves = [_train_loader(packed, rank, 2, batch=8) for rank in range(2)]
    assert one.steps_per_epoch == halves[0].steps_per_epoch
    for big, *small in zip(one.batch_indices(3), *(h.batch_indices(3) for h in halves), strict=True):
        assert sorted(big.tolist()) == sorted(torch.cat(small).tolist())


def test_augmentation_matches_torchvision_crop_and_flip():
    images = torch.from_numpy(np.random.default_rng(1).integers(0, 256, (40, 32, 32, 3), dtype=np.uint8))
    dy, dx, flip = (draw[:40] for draw in loader.augmentation_draws(40, epoch=0, seed=0))
    assert flip.any() and not flip.all() and (dy != 4).any() and (dx != 4).any()  # the draws vary
    for channels_last in (False, True):
        ours = loader.normalize(loader.augment(images, dy, dx, flip), channels_last)
        assert ours.is_contiguous(
            memory_format=torch.channels_last if channels_last else torch.contiguous_format
        )
        for i in range(len(images)):
            padded = TF.pad(Image.fromarray(images[i].numpy()), loader.CROP_PADDING)
            crop = TF.crop(padded, int(dy[i]), int(dx[i]), 32, 32)
            crop = TF.hflip(crop) if flip[i] else crop
            expected = TF.normalize(TF.to_tensor(crop), loader.CIFAR10_MEAN, loader.CIFAR10_STD)
            torch.testing.assert_close(ours[i], expected, rtol=0, atol=1e-5)


def test_a_sample_is_augmented_alike_whatever_the_world_size(packed):
    def by_sample(data):
        return {int(y): x for images, labels in data.epoch(2) for x, y in zip(images, labels, strict=True)}

    alone = by_sample(_train_loader(packed, 0, 1, seed=3))
    shared = by_sample(_train_loader(packed, 1, 2, seed=3))
    assert shared
    for index, image in shared.items():
        torch.testing.assert_close(image, alone[index], rtol=0, atol=0)


def test_a_resumed_epoch_continues_the_same_batches(packed):
    data = _train_loader(packed, 1, 2)
    full = list(data.epoch(1))
    tail = list(data.epoch(1, start_step=5))
    assert len(tail) == len(full) - 5
    for (x, y), (tx, ty) in zip(full[5:], tail, strict=True):
        assert torch.equal(x, tx) and torch.equal(y, ty)


def test_max_steps_caps_the_epoch(packed):
    data = _train_loader(packed, 0, 1, max_steps=3)
    assert data.steps_per_epoch == 3 and len(list(data.epoch(0))) == 3


@pytest.mark.parametrize("world", [1, 2, 3])
def test_evaluation_covers_the_test_split_once_over_all_ranks(packed, world):
    seen = []
    for rank in range(world):
        data = TensorLoader(
            *load_packed(packed, "test"), batch_size=8, rank=rank, world_size=world, train=False
        )
        batches = list(data.epoch(0))
        assert len(batches) == data.steps_per_epoch
        seen += [label for _, labels in batches for label in labels.tolist()]
        images, labels = batches[0]
        raw = load_packed(packed, "test")[0][labels.numpy()]
        torch.testing.assert_close(images, loader.normalize(torch.from_numpy(raw)))  # no augmentation
    assert sorted(seen) == list(range(N_TEST))


@pytest.mark.parametrize("workers", [0, 2])
def test_classic_loader_follows_the_distributed_sampler_and_resumes(packed, workers):
    data = ClassicLoader(packed, batch_size=8, rank=1, world_size=2, seed=4, num_workers=workers)
    tensor = _train_loader(packed, 1, 2, seed=4)
    assert data.steps_per_epoch == tensor.steps_per_epoch
    batches = list(data.epoch(2))
    assert [labels.tolist() for _, labels in batches] == [b.tolist() for b in tensor.batch_indices(2)]
    images = batches[0][0]
    assert images.shape == (8, 3, 32, 32) and images.dtype == torch.float32
    resumed = [labels.tolist() for _, labels in data.epoch(2, start_step=4)]
    assert resumed == [labels.tolist() for _, labels in batches[4:]]


def test_too_little_data_for_one_batch_is_an_error(packed):
    with pytest.raises(ValueError, match="no full batch of 128"):
        _train_loader(packed, 0, 2, batch=128)


# --- the GPU step path: per-epoch transfers, no per-step copy or sync -----------------------------


@pytest.fixture
def transfers(monkeypatch):
    """Every host-to-device transfer of the loaders, through the hook `loader.to_device`."""
    calls = []
    real = loader.to_device

    def counted(tensor, device, **options):
        calls.append(tuple(tensor.shape))
        return real(tensor, device, **options)

    monkeypatch.setattr(loader, "to_device", counted)
    return calls


def _per_step_transfers(data, epochs, transfers, start_step=0):
    """Transfers made when each epoch is asked for, and while each of its batches is made."""
    at_epoch, in_steps = [], []
    for epoch in epochs:
        before = len(transfers)
        batches = iter(data.epoch(epoch, start_step))
        at_epoch.append(len(transfers) - before)
        while True:
            before = len(transfers)
            if next(batches, None) is None:
                break
            in_steps.append(len(transfers) - before)
    return at_epoch, in_steps


@pytest.mark.parametrize("resident", [True, False])
@pytest.mark.parametrize("train", [True, False])
def test_host_to_device_transfers_are_per_epoch_not_per_step(packed, transfers, resident, train):
    split = "train" if train else "test"
    data = TensorLoader(*load_packed(packed, split), batch_size=8, train=train, resident=resident)
    assert len(transfers) == (2 if resident else 1)  # the split and the labels / the labels only
    at_epoch, in_steps = _per_step_transfers(data, range(3), transfers, start_step=0)
    assert len(in_steps) == 3 * data.steps_per_epoch > 3
    assert in_steps == [0] * len(in_steps)  # nothing per step
    assert at_epoch == [1 if resident else 0] * 3  # one [4, samples] plan per epoch on the device path
    if resident:
        samples = data.steps_per_epoch * 8 if train else N_TEST
        assert transfers[-1] == (4, samples)


def test_the_classic_baseline_copies_every_batch(packed, transfers):
    """The control: the hook sees per-step copies where there are some (the DataLoader baseline)."""
    data = ClassicLoader(packed, batch_size=8, num_workers=0)
    _, in_steps = _per_step_transfers(data, [0], transfers)
    assert in_steps == [2] * data.steps_per_epoch  # images and labels, every step


def test_the_device_path_gives_the_cpu_path_batches(packed):
    """resident=True is the GPU's code path (data and plan on the device), run on the CPU."""
    for train, split in ((True, "train"), (False, "test")):
        host, device = (
            TensorLoader(
                *load_packed(packed, split),
                batch_size=8,
                rank=1,
                world_size=2,
                seed=3,
                train=train,
                resident=resident,
            )
            for resident in (False, True)
        )
        for start_step in (0, 3):
            pairs = zip(host.epoch(2, start_step), device.epoch(2, start_step), strict=True)
            for (x, y), (dx, dy) in pairs:
                assert torch.equal(x, dx) and torch.equal(y, dy)


# Operators that synchronise with the host on CUDA or build a tensor from Python data
HOST_SYNC_OPS = {
    "aten::_local_scalar_dense",
    "aten::item",
    "aten::nonzero",
    "aten::masked_select",
    "aten::lift_fresh",
    "aten::lift_fresh_copy",
    "aten::_pin_memory",
    "aten::is_pinned",
}


def test_a_device_step_neither_synchronises_nor_builds_tensors_from_python(packed):
    with OpLog() as control:
        torch.tensor([1, 2]).sum().item()
    assert {"aten::lift_fresh", "aten::_local_scalar_dense"} <= set(control.ops)  # the log sees them
    data = _train_loader(packed, 0, 2, resident=True)
    batches = data.epoch(1)
    steps = 0
    while True:
        with OpLog() as log:
            batch = next(batches, None)
        if batch is None:
            break
        steps += 1
        assert log.ops and not HOST_SYNC_OPS & set(log.ops), sorted(HOST_SYNC_OPS & set(log.ops))
    assert steps == data.steps_per_epoch


def test_resident_false_is_for_the_cpu_only(packed):
    with pytest.raises(ValueError, match="for device cpu only, not meta"):
        _train_loader(packed, 0, 1, device="meta", resident=False)
