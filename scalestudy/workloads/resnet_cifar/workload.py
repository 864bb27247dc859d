"""The reference workload: ResNet-18 (CIFAR stem, no max-pool) on CIFAR-10, counted in images."""

from __future__ import annotations

from typing import Any

import torch

from scalestudy.data.preprocess import load_packed
from scalestudy.plan.runconfig import RunConfigError
from scalestudy.workloads.built import Built
from scalestudy.workloads.resnet_cifar import loader, model


def build_data(config: dict[str, Any], rank: int, world_size: int, device: torch.device):
    """(train loader, test loader): augmented shuffled shards, and the test split."""
    common = {"batch_size": config["per_gpu_batch"], "rank": rank, "world_size": world_size}
    common |= {"seed": config["seed"], "device": device, "channels_last": config["channels_last"]}
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
    net = model.build_model(config["width"], norm=config["norm"], channels_last=config["channels_last"])
    net.to(device)
    parameters = model.count_parameters(net)
    forward = model.count_flops(net, 1)
    description = (
        f"ResNet-18 CIFAR, width {config['width']}, {parameters:,} parameters, "
        f"{forward / 1e9:.3f} GFLOP forward per image"
    )
    return Built(net, parameters, forward, 3 * forward, description, shard_units=[])
