"""What a study trains, as code: each workload's package builds its model and data (build_data,
build_model), imported by the trainer. Which workloads exist, their units and data, is the
registry scalestudy.plan.workloads (standard library, read when the workflow is parsed)."""

from __future__ import annotations

import importlib
from types import ModuleType

RUNTIME_MODULES = {
    "resnet18-cifar10": "scalestudy.workloads.resnet_cifar.workload",
    "gpt": "scalestudy.workloads.gpt.workload",
}


def runtime(name: str) -> ModuleType:
    """The module with the workload's build_data and build_model (imports torch)."""
    return importlib.import_module(RUNTIME_MODULES[name])
