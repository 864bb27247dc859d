"""The study config's schema (schema.yaml and schema/*.yaml, shipped with the package): its path, the
one loader that reads it whole, and its defaults.

The one place every default of the study config lives. schema.yaml is the top document: the sections,
which are required and which default to {}, the shared $defs; each section's keys live in the
schema/<file>.yaml its $ref names. The Snakefile validates the config against `PATH` (as the JSON of
`load()`; snakemake.utils.validate fills the defaults in and follows the $refs itself when handed the
file); library code that is given a part of a config fills the rest from `defaults(section)`.
config/schema.yaml in the repository is a link to the top document. Found with importlib.resources,
so an installed package finds it too.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib.resources
import json
import math
import os
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# A real file in a source checkout and in an installed (unzipped) package, as the Snakefile needs it.
PATH = str(importlib.resources.files("scalestudy.plan").joinpath("schema.yaml"))

# What a $ref into another file may have beside it: annotations, and the section's default, which
# snakemake.utils.validate fills in only where it stands beside the $ref (it never follows one for it).
BESIDE_REF = frozenset({"default", "description", "title", "$comment"})


class SchemaError(ValueError):
    """A schema file that cannot be read whole (a $ref that leads nowhere): one line naming the file."""


def read(path: str | os.PathLike, loader: Any = None) -> dict[str, Any]:
    """The schema file at `path` as one document: each $ref into another file -- relative to the file
    that holds it, symlinks resolved, as snakemake.utils.validate follows it -- replaced by what it
    points at (with the keys beside the $ref, BESIDE_REF only, none the target gives too), each $ref
    into `path` itself made local ("#/$defs/positive_int"). `loader`: PyYAML's, libyaml's if unset.
    Raises SchemaError naming the file."""
    root = Path(path).resolve()
    inliner = _Inliner(root, loader)
    return inliner.walk(inliner.document(root), root)


class _Inliner:
    def __init__(self, root: Path, loader: Any) -> None:
        self.root, self.loader, self.files, self.following = root, loader, {}, []

    def document(self, path: Path, where: str = "") -> Any:
        if path not in self.files:
            # PyYAML imported here, not at module level: the Snakefile imports this module when it
            # parses the workflow, and the modules it imports import no third-party package then.
            import yaml

            # libyaml's loader where PyYAML has it: 12 ms for the schema's files where the pure-Python
            # one takes 73 ms, in every process that reads it (each Snakemake process, each Slurm job's).
            loader = self.loader or getattr(yaml, "CSafeLoader", yaml.SafeLoader)
            try:
                self.files[path] = yaml.load(path.read_text(encoding="utf-8"), loader)
            except OSError as error:
                raise SchemaError(f"{where or path}: cannot read {path} ({error.strerror})") from None
            except yaml.YAMLError as error:
                raise SchemaError(f"{path}: not YAML: {' '.join(str(error).split())}") from None
        return self.files[path]

    def walk(self, value: Any, here: Path) -> Any:
        if isinstance(value, list):
            return [self.walk(item, here) for item in value]
        if not isinstance(value, dict):
            return value
        if isinstance(value.get("$ref"), str):
            return self.follow(value, here)
        return {key: self.walk(item, here) for key, item in value.items()}

    def follow(self, node: dict[str, Any], here: Path) -> dict[str, Any]:
        ref = node["$ref"]
        where = f"{here}: $ref {ref!r}"
        name, _, fragment = ref.partition("#")
        target = (here.parent / name).resolve() if name else here
        beside = {key: self.walk(value, here) for key, value in node.items() if key != "$ref"}
        found = _pointer(self.document(target, where), fragment, where)
        if target == self.root:  # the top document's own $defs: stays a $ref, made local
            if not fragment.strip("/"):
                raise SchemaError(f"{where}: names the whole top document, not a part of it")
            return {"$ref": f"#{fragment}", **beside}
        if (target, fragment) in self.following:
            raise SchemaError(f"{where}: leads back to itself")
        self.following.append((target, fragment))
        found = self.walk(found, target)
        self.following.pop()
        if not isinstance(found, dict):
            raise SchemaError(f"{where}: points at {type(found).__name__}, not a schema")
        found = {key: value for key, value in found.items() if key not in ("$schema", "$id")}
        clash = sorted((set(beside) - BESIDE_REF) | (set(beside) & set(found)))
        if clash:
            allowed = ", ".join(sorted(BESIDE_REF))
            raise SchemaError(f"{where}: {', '.join(clash)} beside it (only {allowed}; none the target has)")
        return {**found, **beside}


def _pointer(document: Any, fragment: str, where: str) -> Any:
    """The part of `document` a $ref's fragment ("/$defs/train", a JSON pointer) names."""
    if fragment and not fragment.startswith("/"):
        raise SchemaError(f"{where}: only JSON-pointer fragments (#/...) are followed")
    found = document
    for part in fragment.split("/")[1:]:
        part = part.replace("~1", "/").replace("~0", "~")
        try:
            found = found[int(part)] if isinstance(found, list) else found[part]
        except (KeyError, IndexError, TypeError, ValueError):
            raise SchemaError(f"{where}: no {part!r} there") from None
    return found


@functools.lru_cache(maxsize=1)
def _load() -> dict[str, Any]:
    return read(PATH)


@contextlib.contextmanager
def as_json_file() -> Iterator[str]:
    """The schema as a temporary JSON file, one document (load()'s, its $refs inlined), for Snakemake's
    validate(): it reads a JSON schema in under a millisecond, the YAML files with pure-Python YAML in
    ~120 ms (in every Snakemake process)."""
    handle, path = tempfile.mkstemp(prefix="scalestudy-schema-", suffix=".json")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            json.dump(_load(), file)
        yield path
    finally:
        os.unlink(path)


def load() -> dict[str, Any]:
    """The schema as a mapping, its sections' $refs inlined (a copy: callers may change it)."""
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


def setting(config: Mapping[str, Any], *path: str) -> Any:
    """The config's value at `path` ("data", "synthetic", "seed"), else the schema's default there
    (for a config, or a part of one, that the schema's defaults were not filled into)."""
    found: Any = config
    for part in path:
        if not isinstance(found, Mapping) or part not in found:
            return copy.deepcopy(node(*path).get("default"))
        found = found[part]
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


@dataclass(frozen=True)
class Rule:
    """What one key accepts: a kind ("integer", "number", "boolean", "string", "choice", "object"),
    an inclusive range (`above` and `below` are exclusive bounds), the choices, and whether null is
    allowed."""

    kind: str
    minimum: float | None = None
    maximum: float | None = None
    above: float | None = None
    below: float | None = None
    choices: tuple[str, ...] = ()
    nullable: bool = False

    def accepts(self, value: Any) -> bool:
        if value is None:
            return self.nullable
        if self.kind == "choice":
            return isinstance(value, str) and value in self.choices
        if self.kind == "boolean":
            return isinstance(value, bool)
        if self.kind == "string":
            return isinstance(value, str) and bool(value)
        if self.kind == "object":
            return isinstance(value, dict)
        numeric = isinstance(value, int | float) and not isinstance(value, bool)
        if not numeric or (self.kind == "integer" and not isinstance(value, int)) or not math.isfinite(value):
            return False
        return (
            (self.minimum is None or value >= self.minimum)
            and (self.maximum is None or value <= self.maximum)
            and (self.above is None or value > self.above)
            and (self.below is None or value < self.below)
        )

    def describe(self) -> str:
        if self.kind == "choice":
            text = f"one of {', '.join(self.choices)}"
        else:
            limits = ((">=", self.minimum), (">", self.above), ("<=", self.maximum), ("<", self.below))
            bounds = " and ".join(f"{sign} {limit}" for sign, limit in limits if limit is not None)
            text = f"{KIND_NAMES[self.kind]} {bounds}".strip()
        return f"{text} or null" if self.nullable else text


KIND_NAMES = {
    "integer": "an integer",
    "number": "a number",
    "boolean": "true or false",
    "string": "a non-empty string",
    "object": "a JSON object",
}


def rule_of(node: Mapping[str, Any]) -> Rule:
    """The Rule of a schema entry (its type, enum, minimum, maximum and their exclusive forms; a local
    $ref followed): the schema says what a key accepts, the code only checks it."""
    node = resolved(node)
    types = node.get("type", "object")
    types = [types] if isinstance(types, str) else list(types)
    nullable, kinds = "null" in types, [kind for kind in types if kind != "null"]
    unknown = set(node) & {"pattern", "maxLength", "multipleOf"}
    if kinds == ["string"] and "enum" not in node and node.get("minLength") != 1:
        unknown.add("minLength")  # Rule's "string" is a non-empty one
    if len(kinds) != 1 or kinds[0] not in KIND_NAMES or unknown:
        raise ValueError(f"{PATH}: a Rule cannot check {dict(node)}")
    if "enum" in node:
        return Rule("choice", choices=tuple(c for c in node["enum"] if c is not None), nullable=nullable)
    return Rule(
        kinds[0],
        minimum=node.get("minimum"),
        maximum=node.get("maximum"),
        above=node.get("exclusiveMinimum"),
        below=node.get("exclusiveMaximum"),
        nullable=nullable,
    )


def value_problems(section: str, values: Mapping[str, Any]) -> list[str]:
    """One line, `<section>.<key> must be <what>, got <value>`, for each of a section's values that
    its schema entry refuses, over the entries a Rule can check (a pattern, a list: the caller's
    own check)."""
    problems = []
    for key, entry in node(section)["properties"].items():
        try:
            rule = rule_of(entry)
        except ValueError:
            continue
        if key in values and not rule.accepts(values[key]):
            problems.append(f"{section}.{key} must be {rule.describe()}, got {values[key]!r}")
    return problems


def section(name: str) -> dict[str, Any]:
    """The schema of one top-level section of the config ("cluster", "analysis", ...), a copy."""
    return copy.deepcopy(node(name))


def defaults(*path: str) -> dict[str, Any]:
    """{key: default} of a section's settings ("cluster"; or a section inside one: "data",
    "synthetic"), as its schema/*.yaml gives them (None where it gives none)."""
    return {key: copy.deepcopy(spec.get("default")) for key, spec in node(*path)["properties"].items()}
