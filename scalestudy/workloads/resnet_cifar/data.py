"""What the workflow asks of CIFAR-10 (the ResNet's data kind): the fetch job's arguments and the
images of an epoch. Standard library: the Snakefile calls these when it parses the workflow."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from scalestudy.data.fetch import download_args
from scalestudy.plan import schema
from scalestudy.plan.workload_spec import GENERATED_SOURCE

CLASSES = 10  # scalestudy.data.cifar_format.NUM_CLASSES (which imports numpy)
TRAIN_IMAGES = 50_000  # the official archive's training split


def fetch_args(config: Mapping[str, Any]) -> tuple[str, list[Any]]:
    """The synthetic archive (scalestudy.data.synthetic_cifar; its sizes and seed as the config
    gives them), or the official archive from the mirrors and data.url."""
    data = config["data"]
    if data["source"] == GENERATED_SOURCE:
        synthetic = data["synthetic"]
        sizes = ("train_per_class", "test_per_class", "seed")
        return data["source"], [
            item for key in sizes for item in (f"--{key.replace('_', '-')}", synthetic[key])
        ]
    return data["source"], download_args(data)


def samples_per_epoch(config: Mapping[str, Any]) -> int:
    """CIFAR-10's 50,000 training images, or the synthetic archive's."""
    if config["data"]["source"] == GENERATED_SOURCE:
        return CLASSES * schema.setting(config, "data", "synthetic", "train_per_class")
    return TRAIN_IMAGES
