"""Walking config/schema.yaml for every key that takes a string or an integer, and configs with a
hostile value put at such a key: what tests/test_hostile_config.py and tests/test_hostile_snakemake.py
share. PAYLOADS are the shell metacharacters; MARKER in them is replaced by a file that must never
exist."""

from __future__ import annotations

import copy
import functools
from pathlib import Path

import yaml

from scalestudy.plan import configcheck, schema
from tests.conftest import REPO

SCHEMA_PATH = REPO / "config/schema.yaml"
SCHEMA = schema.read(SCHEMA_PATH)  # its sections' $refs inlined

# Steps of a path into the config besides plain keys.
ITEM = "[]"  # an element of a list
ANY = "<value>"  # the value under some key of a free-form map (additionalProperties)
KEY = "<key>"  # a key of a free-form map

# MARKER is replaced by a file that must never exist.
PAYLOADS = {
    "semicolon": "x;touch$IFS/MARKER;",
    "command-substitution": "$(touch$IFS/MARKER)",
    "backticks": "`touch$IFS/MARKER`",
    "single-quote": "x'$(touch$IFS/MARKER)'",
    "double-quote": 'x"$(touch$IFS/MARKER)"',
    "newline": "x\ntouch$IFS/MARKER\n",
    "pipe": "x|touch$IFS/MARKER",
    "braces": "regex:.*gemm.{0,4}",
}


# --------------------------------------------------------------------------- walking the schema


def _types(node: dict) -> list[str]:
    kind = node.get("type", [])
    return [kind] if isinstance(kind, str) else list(kind)


def string_slots(node: dict, path: tuple = ()) -> list[tuple]:
    """Every place in a config where the schema allows a string: values, list items, map keys."""
    node = configcheck.resolve(node, SCHEMA)
    slots = [path] if "string" in _types(node) else []
    for sub in node.get("allOf", []):
        slots += [slot for slot in string_slots(sub, path) if slot != path or path not in slots]
    for key, sub in node.get("properties", {}).items():
        slots += string_slots(sub, (*path, key))
    extra = node.get("additionalProperties")
    if isinstance(extra, dict):
        slots += [(*path, KEY), *string_slots(extra, (*path, ANY))]
    if isinstance(node.get("items"), dict):
        slots += string_slots(node["items"], (*path, ITEM))
    return list(dict.fromkeys(slots))


def integer_slots(node: dict, path: tuple = ()) -> list[tuple]:
    """Every place where the schema wants an integer (and not any number)."""
    node = configcheck.resolve(node, SCHEMA)
    types = _types(node)
    slots = [path] if "integer" in types and "number" not in types else []
    for sub in node.get("allOf", []):
        slots += integer_slots(sub, path)
    for key, sub in node.get("properties", {}).items():
        slots += integer_slots(sub, (*path, key))
    if isinstance(node.get("items"), dict):
        slots += integer_slots(node["items"], (*path, ITEM))
    return list(dict.fromkeys(slots))


STRING_SLOTS = string_slots(SCHEMA)
INTEGER_SLOTS = integer_slots(SCHEMA)


def slot_id(slot: tuple) -> str:
    return ".".join(slot)


# --------------------------------------------------------------------------- building configs


def filled_demo() -> dict:
    """config/demo.yaml with the schema's defaults filled in, as the Snakefile sees it."""
    return copy.deepcopy(_filled_demo())


@functools.cache
def _filled_demo() -> dict:
    from snakemake.utils import validate

    config = yaml.safe_load((REPO / "config/demo.yaml").read_text())
    validate(config, str(SCHEMA_PATH))
    return config


@functools.cache
def schema_validator():
    """What snakemake.utils.validate checks with (JSON Schema 2020-12), built once: the walk
    validates hundreds of configs, and validate() reads the schema file for each."""
    from jsonschema import validators

    return validators.validator_for(SCHEMA)(SCHEMA)


def put(config: dict, slot: tuple, value) -> list:
    """Set `value` at `slot` (creating what is missing); returns the concrete path it went to."""
    node, concrete = config, []
    for position, step in enumerate(slot):
        last = position == len(slot) - 1
        following = None if last else slot[position + 1]
        empty = [] if following == ITEM else {}
        if step == ITEM:
            if not node:
                node.append(value if last else empty)
            index = 0
        elif step == KEY:
            old = next(iter(node), None)
            node[value] = node.pop(old) if old is not None else "1"
            return [*concrete, value]
        elif step == ANY:
            index = next(iter(node), "SCALESTUDY_HOSTILE")
        else:
            index = step
        concrete.append(index)
        if last:
            node[index] = value
        else:
            if step != ITEM and (index not in node or node[index] is None):
                node[index] = empty
            node = node[index]
    return concrete


def key_names(concrete: list) -> tuple[str, str]:
    """The key as this project names it (cluster.partition, data.mirrors[0]) and as jsonschema does."""
    dotted = ""
    for step in concrete:
        dotted += f"[{step}]" if isinstance(step, int) else f".{step}" if dotted else str(step)
    bracketed = "".join(f"[{step}]" if isinstance(step, int) else f"[{step!r}]" for step in concrete)
    return dotted, bracketed


def refusal(config: dict) -> str | None:
    """The error the workflow stops with before planning (validate, then the project's check)."""
    try:
        schema_validator().validate(config)
        configcheck.check(config, SCHEMA)
    except Exception as error:  # jsonschema's ValidationError or configcheck's ConfigError
        return str(error)
    return None


def names_key(message: str, concrete: list, slot: tuple) -> bool:
    if slot and slot[-1] == KEY:  # a bad map key is named by its map (and itself)
        concrete = concrete[:-1]
    return any(name in message for name in key_names(concrete))


def hostile(payload: str, marker: Path) -> str:
    return PAYLOADS[payload].replace("/MARKER", str(marker))


def classify(payload: str, marker: Path) -> tuple[dict, dict]:
    """{slot: refusal message} and {slot: concrete path} of the slots that accept the payload."""
    base = filled_demo()
    refused, accepted = {}, {}
    for slot in STRING_SLOTS:
        config = copy.deepcopy(base)
        concrete = put(config, slot, hostile(payload, marker))
        message = refusal(config)
        if message is None:
            accepted[slot] = concrete
        else:
            refused[slot] = (message, concrete)
    return refused, accepted
