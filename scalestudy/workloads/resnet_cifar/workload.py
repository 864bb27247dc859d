"""The reference workload: ResNet-18 (CIFAR stem, no max-pool) on CIFAR-10, counted in images."""

from __future__ import annotations

import logging
from typing import Any

import torch

from scalestudy.data.preprocess import load_packed
from scalestudy.plan.runconfig import RunConfigError
from scalestudy.train.built import Built
from scalestudy.workloads.resnet_cifar import loader, model

log = logging.getLogger("scalestudy.train")

# oneDNN's backward of a strided 1x1 convolution (the shortcut of a downsampling block) with fewer
# than 8 input channels in channels_last corrupts the heap on some x86 CPUs ("double free or
# corruption", or a hang; torch 2.14.1, seen on an AMD EPYC guest without AVX-512): a narrower model
# trains on the CPU in the contiguous layout.
CPU_CHANNELS_LAST_MIN_WIDTH = 8


def channels_last(config: dict[str, Any], device: torch.device) -> bool:
    """The run config's channels_last, unless the CPU cannot train this width in that layout."""
    return config["channels_last"] and not (
        device.type == "cpu" and config["width"] < CPU_CHANNELS_LAST_MIN_WIDTH
    )


def build_data(config: dict[str, Any], rank: int, world_size: int, device: torch.device):
    """(train loader, test loader): augmented shuffled shards, and the test split."""
    common = {"batch_size": config["per_gpu_batch"], "rank": rank, "world_size": world_size}
    common |= {"seed": config["seed"], "device": device, "channels_last": channels_last(config, device)}
    if config["loader"] == "tensor":
        images, labels = load_packed(config["data_dir"], "train")
        train = loader.TensorLoader(
            images, labels, train=True, max_steps=config["max_steps_per_epoch"], **common
        )
    else:
        train = loader.ClassicLoader(
            config["data_dir"],
            num_workers=config["num_workers"],
            max_steps=config["max_steps_per_epoch"],
            **common,
        )
    images, labels = load_packed(config["data_dir"], "test")
    test = loader.TensorLoader(images, labels, train=False, max_steps=config["eval_max_batches"], **common)
    return train, test


def build_model(config: dict[str, Any], device: torch.device) -> Built:
    if config["norm"] == "sync" and device.type != "cuda":
        raise RunConfigError(f"norm='sync' (SyncBatchNorm) needs CUDA devices, this rank runs on {device}")
    if config["parallelism"] == "fsdp":
        raise RunConfigError("parallelism='fsdp' is for the gpt workload; ResNet-18 trains with ddp")
    layout = channels_last(config, device)
    if config["channels_last"] and not layout:
        log.warning(
            "channels_last is off for width %d on the CPU: oneDNN's strided 1x1 convolution backward with "
            "fewer than %d input channels corrupts memory on some CPUs (contiguous layout instead)",
            config["width"],
            CPU_CHANNELS_LAST_MIN_WIDTH,
        )
    net = model.build_model(config["width"], norm=config["norm"], channels_last=layout)
    net.to(device)
    parameters = model.count_parameters(net)
    forward = model.count_flops_per_image(config["width"])  # on the meta device
    description = (
        f"ResNet-18 CIFAR, width {config['width']}, {parameters:,} parameters, "
        f"{forward / 1e9:.3f} GFLOP forward per image"
    )
    return Built(net, parameters, forward, 3 * forward, description, shard_units=[])


def batch_capacity(config: dict[str, Any]) -> tuple[int, str, int, str]:
    """(training images per rank, words, one batch, words): a rank's shard of the training images
    (the loaders' count; scalestudy.train.datafit)."""
    batch, ranks = config["per_gpu_batch"], config["world_size"]
    images = len(load_packed(config["data_dir"], "train")[0])
    have, unit = images // ranks, f"training images per rank ({images} over {ranks} ranks)"
    return have, unit, batch, f"one batch of per_gpu_batch={batch}"
