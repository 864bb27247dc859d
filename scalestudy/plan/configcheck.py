"""The checks of a config that JSON Schema validation lets through, run before any job is planned.

The Snakefile calls `check(config)` right after snakemake.utils.validate (the schema:
scalestudy.plan.schema). It walks the config along the schema, so a key added to the schema later
is covered without a change here, and refuses, in one line naming every offending key:

- an integer key holding a float or a boolean: JSON Schema counts 2.0 as an integer, and a world
  size of 2.0 would otherwise surface as a MissingInputException on `w2.0` that names no key;
- a string that does not match its key's `pattern`. The patterns (scalestudy.plan.patterns) keep
  values that reach a shell unquoted to characters no shell treats specially: Snakemake puts the
  container image path as it is into its `apptainer exec` command line, and a path with braces
  would be taken for a wildcard. Values the project quotes (`{params.x:q}`, shlex.quote) or passes
  as one argv item need no pattern: they may hold any character (data.url, cluster.sbatch_extra,
  study.title, ...);
- settings that are each valid but do not fit together or the grid: a sensitivity axis that is no
  run-config key the sweep may set, or a value that key refuses or a run folder cannot be named
  by; what the workload's spec refuses (scalestudy.plan.workload_spec: a data source it cannot read, a
  parallelism it does not train with, a command workload without its script, a setting its runs
  would ignore: the command workload's train.micro_batch); a strong scaling
  global batch that a world size does not divide, a train.micro_batch that does not divide a grid
  point's per-GPU batch, or any other grid point the grid
  (scalestudy.plan.grid) refuses to make;
- a schema whose workload.name enum and the workload packages disagree (scalestudy.plan.workloads);
- first and alone, a credential in any value (scalestudy.plan.credentials).

Pure standard library at import (PyYAML is imported only when a schema is read).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from typing import Any

from scalestudy.plan import credentials, grid, runconfig, schema, workloads
from scalestudy.plan.patterns import MEANINGS
from scalestudy.plan.workload_spec import GENERATED_SOURCE


class ConfigError(ValueError):
    """A config value the workflow must not start with; the message names each key."""


def check(config: Mapping[str, Any], given: Mapping[str, Any] | str | os.PathLike | None = None) -> None:
    """Raise ConfigError naming every key whose value the schema's types or patterns refuse (the
    package's schema unless another is given, as a mapping or a path)."""
    if refused := credentials.refusal(config):  # alone: the other messages quote values
        raise ConfigError(refused)
    if given is None:
        given = schema.node()
    elif not isinstance(given, Mapping):
        given = load_schema(given)
    # the schema's workload.name enum and the workload packages agree (a package's schema only: a
    # test's own schema may leave the workload out)
    problems = workloads.schema_problems(given) if _names_workloads(given) else []
    problems += problems_of(config, given)
    if not problems:  # the checks across keys assume the values have their types
        problems = [*axes_problems(config), *workload_problems(config, given), *grid_problems(config)]
    if problems:
        raise ConfigError("invalid config: " + "; ".join(problems))


def _names_workloads(given: Mapping[str, Any]) -> bool:
    return "name" in given.get("properties", {}).get("workload", {}).get("properties", {})


def load_schema(path: str | os.PathLike) -> dict:
    """A schema file other than the package's, its $refs to other files inlined (schema.read)."""
    return schema.read(path)


def problems_of(
    value: Any, node: Mapping[str, Any], root: Mapping | None = None, key: str = ""
) -> Iterator[str]:
    """One line per value under `node` that is not what the schema means (walks the config)."""
    root = node if root is None else root
    node = resolve(node, root)
    for part in node.get("allOf", []):
        yield from problems_of(value, part, root, key)
    yield from _leaf_problems(value, node, key)
    if isinstance(value, Mapping):
        properties, extra = node.get("properties", {}), node.get("additionalProperties")
        for name, item in value.items():
            sub = properties.get(name, extra if isinstance(extra, Mapping) else None)
            if sub is not None:
                yield from problems_of(item, sub, root, f"{key}.{name}" if key else str(name))
    elif isinstance(value, list) and isinstance(node.get("items"), Mapping):
        for index, item in enumerate(value):
            yield from problems_of(item, node["items"], root, f"{key}[{index}]")


def resolve(node: Mapping[str, Any], root: Mapping[str, Any]) -> Mapping[str, Any]:
    """Follow a local $ref ("#/$defs/positive_int"); other nodes as they are."""
    while "$ref" in node:
        target: Any = root
        for part in node["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        node = target
    return node


def _leaf_problems(value: Any, node: Mapping[str, Any], key: str) -> Iterator[str]:
    types = node.get("type", [])
    types = [types] if isinstance(types, str) else list(types)
    if "integer" in types and "number" not in types:
        wrong_kind = isinstance(value, bool) and "boolean" not in types
        if wrong_kind or isinstance(value, float):
            yield f"{key} must be an integer, got {value!r}"
    pattern = node.get("pattern")
    if pattern and isinstance(value, str) and not re.search(pattern, value):
        meaning = MEANINGS.get(pattern, f"a string matching {pattern}")
        yield f"{key} = {value!r} is not allowed: it must be {meaning}"


def axes_problems(config: Mapping[str, Any]) -> list[str]:
    """sensitivity.axes: each key a run-config key the sweep may set, each value one that key takes
    (scalestudy.plan.runconfig.RULES) and that can name a run folder; per_gpu_batch among them."""
    axes = (config.get("sensitivity") or {}).get("axes") or {}
    problems = []
    for key, values in axes.items():
        where = f"sensitivity.axes.{key}" if re.fullmatch(r"\w+", key) else f"sensitivity.axes[{key!r}]"
        rule = runconfig.RULES.get(key)
        if rule is None:
            problems.append(
                f"{where}: no run-config key is called {key!r} (see scalestudy/plan/runconfig.py)"
            )
        elif key in grid.NOT_AXES or rule.kind == "object":
            problems.append(f"{where}: {key} is set by the grid or the workload, not by a sweep axis")
        else:
            problems += [
                f"{where}[{index}] = {value!r} {problem}"
                for index, value in enumerate(values)
                if (problem := _axis_value_problem(rule, value))
            ]
    if axes and "per_gpu_batch" not in axes:
        problems.append(
            "sensitivity.axes needs per_gpu_batch: the per-GPU batch sizes of the sweep (one is enough)"
        )
    return problems


def _axis_value_problem(rule: Any, value: Any) -> str | None:
    if not rule.accepts(value):
        return f"must be {rule.describe()}"
    if not grid.is_name_part(grid.format_value(value)):
        return "cannot name a run folder: letters, digits and _ . = + - only"
    return None


def workload_problems(config: Mapping[str, Any], given: Mapping[str, Any]) -> list[str]:
    """What the workload's spec asks of the config (_spec_problems); a file fetched from a URL is not
    looked for under the defaults of data.url, md5 and size_bytes unless they name it (CIFAR-10's
    archive: a text corpus must be given its own)."""
    name = (config.get("workload") or {}).get("name", workloads.DEFAULT)
    if name not in workloads.WORKLOADS:
        return []
    spec = workloads.get(name)
    data = config.get("data") or {}
    problems = _spec_problems(config, spec)
    kind, source = spec.data, data.get("source")
    fetched = kind.raw_file and source != GENERATED_SOURCE and source in (kind.sources or (source,))
    if fetched and not kind.default_download:
        defaults = given.get("properties", {}).get("data", {}).get("properties", {})
        problems += [
            f"data.{key} = {data[key]!r} is CIFAR-10's archive's (the default): give {spec.paper.dataset}'s"
            for key in ("url", "md5", "size_bytes")
            if key in data and data[key] == defaults.get(key, {}).get("default")
        ]
    return problems


def grid_problems(config: Mapping[str, Any]) -> list[str]:
    """Strong scaling's global batch divides every world size; then every grid point can be made
    (a ValueError of scalestudy.plan.grid, as one line, rather than a traceback when a rule file
    asks for the points)."""
    scaling = config.get("scaling") or {}
    if "strong" in (scaling.get("modes") or []):
        batch = scaling.get("strong_global_batch")
        uneven = [
            f"scaling.world_sizes[{index}] = {world}: scaling.strong_global_batch={batch} does not split "
            f"evenly over {world} ranks (use a multiple of {world})"
            for index, world in enumerate(scaling.get("world_sizes") or [])
            if isinstance(batch, int) and isinstance(world, int) and world > 0 and batch % world
        ]
        if uneven:
            return uneven
    try:
        points = grid.all_points(dict(config))
    except ValueError as error:
        return [f"the grid cannot be made from this config: {error}"]
    return micro_batch_problems(config, points)


def micro_batch_problems(config: Mapping[str, Any], points: list[grid.Point]) -> list[str]:
    """train.micro_batch (or a sweep's) divides every grid point's per-GPU batch (the trainer
    refuses it otherwise: scalestudy.plan.runconfig.micro_batch_problems)."""
    default = (config.get("train") or {}).get("micro_batch")
    problems = {}
    for point in points:
        values = dict(point.overrides)
        micro_batch, per_gpu = values.get("micro_batch", default), values.get("per_gpu_batch")
        if isinstance(per_gpu, int):
            for problem in runconfig.micro_batch_problems(micro_batch, per_gpu):
                problems.setdefault(f"train.{problem}", f"{point.stage}/{point.name}")
    return [f"{problem} (grid point {where})" for problem, where in problems.items()]


def _spec_problems(config: Mapping[str, Any], spec: workloads.WorkloadSpec) -> list[str]:
    """What the workload's spec asks of the config: a data source it reads, the keys of its own
    section it needs, a parallelism it trains with."""
    source = (config.get("data") or {}).get("source")
    problems = []
    if spec.data.sources and source not in spec.data.sources:
        problems.append(
            f"data.source = {source!r} does not fit workload.name = {spec.name!r}: use"
            f" {' or '.join(spec.data.sources)}"
        )
    own = (config.get("workload") or {}).get(spec.name) or {}
    problems += [
        f"workload.{spec.name}.{key} is required with workload.name = {spec.name!r}: {meaning}"
        for key, meaning in spec.section_required
        if not own.get(key)
    ]
    return problems + _parallelism_problems(config, spec) + _ignored_problems(config, spec)


def _ignored_problems(config: Mapping[str, Any], spec: workloads.WorkloadSpec) -> list[str]:
    """A train setting the workload's runs would ignore (its spec's `ignores`), set in train: or swept."""
    axes = ((config.get("sensitivity") or {}).get("axes")) or {}
    return [
        f"{where}.{key} is ignored by workload.name = {spec.name!r} ({why}): remove it"
        for key, why in spec.ignores
        for where, value in (
            ("train", (config.get("train") or {}).get(key)),
            ("sensitivity.axes", axes.get(key)),
        )
        if value is not None
    ]


def _parallelism_problems(config: Mapping[str, Any], spec: workloads.WorkloadSpec) -> list[str]:
    """A parallelism the workload's trainer refuses, said before any job: FSDP2 shards the LM's
    transformer blocks; the ResNet trains with DDP only (its spec's parallelisms; none listed: any,
    a script's own)."""
    if not spec.parallelisms:
        return []
    places = {
        "train.parallelism": [(config.get("train") or {}).get("parallelism")],
        "scaling.parallelism": (config.get("scaling") or {}).get("parallelism") or [],
        "sensitivity.axes.parallelism": ((config.get("sensitivity") or {}).get("axes") or {}).get(
            "parallelism"
        )
        or [],
    }
    allowed = " or ".join(spec.parallelisms)
    return [
        f"{where} = {value} is for the {_workloads_with(value)} workload: {spec.name} trains with {allowed}"
        for where, values in places.items()
        for value in dict.fromkeys(values)
        if value is not None and value not in spec.parallelisms
    ]


def _workloads_with(parallelism: str) -> str:
    names = [s.name for s in workloads.WORKLOADS.values() if parallelism in s.parallelisms]
    return " or ".join(names) or "no"


def schema_error_message(error: BaseException, configfiles=()) -> str | None:
    """One line for the JSON Schema error behind `error` (Snakemake's "Error validating config file."
    is raised while handling jsonschema's ValidationError, whose text prints the whole schema:
    hundreds of lines before the one that matters); None when there is none.

    "config (my.yaml): train: a required section or key is missing ('train' is a required property)"
    """
    found = error
    while found is not None and not hasattr(found, "validator"):  # raised while handling it
        found = found.__cause__ or found.__context__
    if found is None:
        return None
    where = ".".join(str(part) for part in found.absolute_path) or "(top level)"
    files = f" ({', '.join(map(str, configfiles))})" if configfiles else ""
    if found.validator == "required":
        missing = re.match(r"'([^']+)' is a required property", found.message)
        key = where
        if missing:
            key = f"{where}.{missing[1]}" if found.absolute_path else missing[1]
        return f"config{files}: {key}: a required section or key is missing ({found.message})"
    return f"config{files}: {where}: {found.message}"
