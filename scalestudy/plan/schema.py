"""The study config's schema (schema.yaml, shipped with the package): its path and its defaults.

The one place every default of the study config lives. The Snakefile validates the config against
`PATH` (snakemake.utils.validate fills the defaults in); library code that is given a part of a
config fills the rest from `defaults(section)`. config/schema.yaml in the repository is a link to
this file. Read with importlib.resources, so an installed package finds it too.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib.resources
import json
import os
import tempfile
from collections.abc import Iterator
from typing import Any

# A real file in a source checkout and in an installed (unzipped) package, as the Snakefile needs it.
PATH = str(importlib.resources.files("scalestudy.plan").joinpath("schema.yaml"))


@functools.lru_cache(maxsize=1)
def _load() -> dict[str, Any]:
    # PyYAML imported here, not at module level: the Snakefile imports this module when it parses the
    # workflow, and the modules it imports import no third-party package at module level.
    import yaml

    # libyaml's loader where PyYAML has it: 13 ms for the schema where the pure-Python one takes 123 ms,
    # in every process that reads it (each Snakemake process, each Slurm job's included).
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return yaml.load(importlib.resources.files("scalestudy.plan").joinpath("schema.yaml").read_text(), loader)


@contextlib.contextmanager
def as_json_file() -> Iterator[str]:
    """The schema as a temporary JSON file, for Snakemake's validate(): it reads a JSON schema in
    under a millisecond, a YAML one with pure-Python YAML in ~120 ms (in every Snakemake process)."""
    handle, path = tempfile.mkstemp(prefix="scalestudy-schema-", suffix=".json")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            json.dump(_load(), file)
        yield path
    finally:
        os.unlink(path)


def load() -> dict[str, Any]:
    """The schema as a mapping (a copy: callers may change it)."""
    return copy.deepcopy(_load())


def node(*path: str) -> dict[str, Any]:
    """The schema of the setting at `path` ("train", "measure", "steps"), read-only: not a copy."""
    found = _load()
    for depth, part in enumerate(path):
        try:
            found = found["properties"][part]
        except KeyError:
            where = ".".join(path[:depth]) or "the top level"
            raise KeyError(f"{PATH}: no {part!r} under {where}'s properties") from None
    return found


def definition(name: str) -> dict[str, Any]:
    """The schema's $defs entry `name` ("positive_int", "run_config"), read-only: not a copy."""
    try:
        return _load()["$defs"][name]
    except KeyError:
        raise KeyError(f"{PATH}: no {name!r} under $defs") from None


def resolved(entry: dict[str, Any]) -> dict[str, Any]:
    """A setting's entry with a local $ref ("#/$defs/positive_int") followed: the definition's keys,
    then the entry's own (its default, description) over them."""
    while "$ref" in entry:
        name = entry["$ref"].removeprefix("#/$defs/")
        entry = {**definition(name), **{key: value for key, value in entry.items() if key != "$ref"}}
    return entry


def section(name: str) -> dict[str, Any]:
    """The schema of one top-level section of the config ("cluster", "analysis", ...), a copy."""
    return copy.deepcopy(node(name))


def defaults(name: str) -> dict[str, Any]:
    """{key: default} of a section's settings, as schema.yaml gives them (None where it gives none)."""
    return {key: copy.deepcopy(spec.get("default")) for key, spec in node(name)["properties"].items()}
