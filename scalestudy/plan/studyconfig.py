"""A study config file read as the Snakefile reads it: validated against the schema with every
default filled in (scalestudy/plan/schema.yaml, the one home of every default), then the checks JSON
Schema lets through (scalestudy.plan.configcheck).

The Snakefile itself uses Snakemake's `validate()`; everything that reads a config outside Snakemake
(the Slurm preview, the benchmark, the constructed studies, the tests) calls `load()`, which needs
no Snakemake: the benchmark runs it on GPU nodes that have none. tests/test_benchmark.py checks that
both give the same config. Standard library at module level (PyYAML and jsonschema inside).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from scalestudy.plan import configcheck, credentials, schema


def _default_filling_validator():
    from jsonschema import Draft202012Validator, validators

    def set_defaults(validator, properties, instance, spec):
        if isinstance(instance, dict):
            for name, sub in properties.items():
                if "default" in sub and name not in instance:
                    instance[name] = copy.deepcopy(sub["default"])
        yield from Draft202012Validator.VALIDATORS["properties"](validator, properties, instance, spec)

    return validators.extend(Draft202012Validator, {"properties": set_defaults})


def fill_defaults(instance: Any, spec: dict, where: str) -> Any:
    """Validate `instance` against `spec` (the schema or a part of it) and fill every default in
    place; ValueError naming the key."""
    from jsonschema import ValidationError

    try:
        _default_filling_validator()(spec).validate(instance)
    except ValidationError as err:
        path = ".".join(str(p) for p in err.absolute_path)
        raise ValueError(f"config {where}{'.' + path if path else ''}: {err.message}") from err
    return instance


def load(path: str | Path) -> dict[str, Any]:
    """The study config file at `path`, validated, every default filled in, checked."""
    import yaml

    given = yaml.safe_load(Path(path).read_text()) or {}
    if refused := credentials.refusal(given, [path]):  # before the schema's messages, which quote values
        raise configcheck.ConfigError(refused)
    config = fill_defaults(given, schema.node(), str(path))
    configcheck.check(config)
    return config
