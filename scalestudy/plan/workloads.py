"""The workload registry: what a study can train. Each workload is a package under
scalestudy/workloads/ whose `spec` module holds its `SPEC` (scalestudy.plan.workload_spec.WorkloadSpec:
unit, metric, data, model keys, default optimizer, the paper's words, its runtime module); the
registry collects them, pure standard library (the Snakefile imports this when it parses the
workflow), and checks the schema's `workload.name` enum against them (`schema_problems`).

Every rank runs `python -m scalestudy.train` whatever the workload (one with an `entry`, the command
workload, hands its run config to that).

    resnet18-cifar10  the reference study: ResNet-18 (CIFAR stem) on CIFAR-10, images
    gpt               a GPT-style decoder LM on a byte-tokenised text corpus, tokens
    command           the user's own training script (scalestudy.workloads.command.runner), in its unit
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from collections.abc import Mapping
from typing import Any

from scalestudy.plan.workload_spec import WorkloadSpec

DEFAULT = "resnet18-cifar10"


def discover(packages: str = "scalestudy.workloads") -> list[WorkloadSpec]:
    """The SPEC of every sub-package of the package `packages` with a `spec` module."""
    parent = importlib.import_module(packages)
    specs = []
    for info in pkgutil.iter_modules(parent.__path__):
        name = f"{packages}.{info.name}.spec"
        if info.ispkg and importlib.util.find_spec(name) is not None:
            specs.append(importlib.import_module(name).SPEC)
    return specs


def collect(specs: list[WorkloadSpec]) -> dict[str, WorkloadSpec]:
    """Name -> spec, the default first, then by name; two specs of one name are an error."""
    found: dict[str, WorkloadSpec] = {}
    for spec in sorted(specs, key=lambda s: (s.name != DEFAULT, s.name)):
        if spec.name in found:
            raise ValueError(f"two workload packages name the workload {spec.name!r}")
        found[spec.name] = spec
    return found


WORKLOADS: dict[str, WorkloadSpec] = collect(discover())


def register(spec: WorkloadSpec) -> None:
    """Add a workload that lives outside scalestudy/workloads/ (a plugin, a test's toy)."""
    WORKLOADS.update(collect([*WORKLOADS.values(), spec]))


def unregister(name: str) -> None:
    WORKLOADS.pop(name, None)


def get(name: str) -> WorkloadSpec:
    try:
        return WORKLOADS[name]
    except KeyError:
        raise ValueError(f"unknown workload {name!r}: one of {', '.join(WORKLOADS)}") from None


def of_config(config: Mapping[str, Any]) -> WorkloadSpec:
    """The study config's workload (`workload.name`, default resnet18-cifar10); a workload whose
    section goes into its run configs counts in the unit that section names (`workload.command.
    sample_unit`), if it names one."""
    section = config.get("workload") or {}
    workload = get(section.get("name", DEFAULT))
    if workload.run_section:
        unit = (section.get(workload.name) or {}).get("sample_unit", workload.sample_unit)
        workload = workload.with_unit(unit)
    return workload


def model_keys() -> tuple[str, ...]:
    """The config["model"] keys that hold one value (not a section), over every workload."""
    keys = [key for spec in WORKLOADS.values() for key in spec.model_keys if key not in spec.model_sections]
    return tuple(dict.fromkeys(keys))


def run_sections() -> tuple[str, ...]:
    """The run config's keys that hold a workload's section: a model section (gpt), a workload's own."""
    keys = [key for spec in WORKLOADS.values() for key in spec.model_sections]
    keys += [spec.name for spec in WORKLOADS.values() if spec.run_section]
    return tuple(dict.fromkeys(keys))


def default_optimizer(name: str | None) -> str | None:
    """The optimizer of a run config whose `optimizer` is null: its workload's (the default
    workload's for a name the registry lacks; None: a workload whose script chooses)."""
    return WORKLOADS.get(name or DEFAULT, WORKLOADS[DEFAULT]).default_optimizer


def schema_problems(node: Mapping[str, Any]) -> list[str]:
    """The schema's workload.name enum against the registry: a name without a package, or a package
    the schema does not list (add its name to the enum in scalestudy/plan/schema/workload.yaml)."""
    name = node.get("properties", {}).get("workload", {}).get("properties", {}).get("name", {})
    enum = list(name.get("enum") or [])
    problems = [
        f"schema workload.name enum lists {n!r}, which no workload package defines"
        for n in enum
        if n not in WORKLOADS
    ]
    problems += [
        f"workload {n!r} (scalestudy/workloads/) is missing from the schema's workload.name enum"
        for n in WORKLOADS
        if n not in enum
    ]
    return problems
