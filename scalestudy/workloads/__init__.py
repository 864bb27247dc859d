"""What a study trains: one package per workload, each with a `spec` module (its SPEC, a
scalestudy.plan.workload_spec.WorkloadSpec, standard library) and the code that builds its model
and data (the spec's runtime module, imported by the trainer; it may import torch). The registry
of the specs is scalestudy.plan.workloads."""

from __future__ import annotations

import importlib
from types import ModuleType


def runtime(name: str) -> ModuleType:
    """The module with the workload's build_data and build_model (imports torch)."""
    from scalestudy.plan import workloads

    return importlib.import_module(workloads.get(name).runtime)
