"""The study config's schema (schema.yaml, shipped with the package): its path and its defaults.

The one place every default of the study config lives. The Snakefile validates the config against
`PATH` (snakemake.utils.validate fills the defaults in); library code that is given a part of a
config fills the rest from `defaults(section)`. config/schema.yaml in the repository is a link to
this file. Read with importlib.resources, so an installed package finds it too.
"""

from __future__ import annotations

import copy
import functools
import importlib.resources
from typing import Any

# A real file in a source checkout and in an installed (unzipped) package, as the Snakefile needs it.
PATH = str(importlib.resources.files("scalestudy.plan").joinpath("schema.yaml"))


@functools.lru_cache(maxsize=1)
def _load() -> dict[str, Any]:
    # PyYAML imported here, not at module level: the Snakefile imports this module when it parses the
    # workflow, and the modules it imports import no third-party package at module level.
    import yaml

    return yaml.safe_load(importlib.resources.files("scalestudy.plan").joinpath("schema.yaml").read_text())


def load() -> dict[str, Any]:
    """The schema as a mapping (a copy: callers may change it)."""
    return copy.deepcopy(_load())


def section(name: str) -> dict[str, Any]:
    """The schema of one top-level section of the config ("cluster", "analysis", ...)."""
    try:
        return copy.deepcopy(_load()["properties"][name])
    except KeyError:
        raise KeyError(f"{PATH}: no section {name!r} under properties") from None


def defaults(name: str) -> dict[str, Any]:
    """{key: default} of a section's settings, as schema.yaml gives them (None where it gives none)."""
    properties = _load()["properties"][name]["properties"]
    return {key: copy.deepcopy(spec.get("default")) for key, spec in properties.items()}
