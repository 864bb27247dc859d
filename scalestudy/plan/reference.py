"""The config reference, docs/reference/config.md, written from the schema's own descriptions.

Every setting of the study config (scalestudy/plan/schema.yaml and schema/*.yaml, read whole by
`schema.read`) is one row: its dotted key, its default, what values it takes (type, range, choices)
and its description, section by section in the schema's order. The page is never edited by hand, so
it cannot drift from what the Snakefile validates:

    python -m scalestudy.plan.reference            write docs/reference/config.md
    python -m scalestudy.plan.reference --check    exit 1 if that page is not what the schema gives

Both exit 1, naming the keys, while a setting has no `description:`. Standard library only (the
schema's YAML is read through `schema.read`, which imports PyYAML when called).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scalestudy import atomic
from scalestudy.plan import schema

OUT = "docs/reference/config.md"
COMMAND = "python -m scalestudy.plan.reference"
# Defaults longer than this are written out below their section's table instead of in its cell.
INLINE_DEFAULT_CHARS = 60


@dataclass(frozen=True)
class Setting:
    """One key of the config: its dotted path, its schema entry ($refs followed) and whether its
    parent requires it."""

    path: str
    entry: dict[str, Any]
    required: bool = False


def resolve(entry: dict[str, Any], doc: dict[str, Any]) -> dict[str, Any]:
    """`entry` with local $refs ("#/$defs/positive_int") followed and `allOf` parts merged: the
    referenced keys first, the entry's own (default, description) over them."""
    while isinstance(entry.get("$ref"), str):
        name = entry["$ref"].removeprefix("#/$defs/")
        own = {key: value for key, value in entry.items() if key != "$ref"}
        entry = {**doc["$defs"][name], **own}
    if "allOf" in entry:
        merged: dict[str, Any] = {}
        for part in entry["allOf"]:
            merged.update(resolve(part, doc))
        entry = {**merged, **{key: value for key, value in entry.items() if key != "allOf"}}
    if isinstance(entry.get("items"), dict):
        entry = {**entry, "items": resolve(entry["items"], doc)}
    return entry


def settings(doc: dict[str, Any]) -> Iterator[Setting]:
    """Every setting of the config, sections first, each followed by the keys inside it: those of
    an object (`train.measure.steps`), of every list item (`...interconnects[].name`) and of every
    entry of a map (`analysis.peak_tflops.<name>.bf16`)."""
    yield from _children(doc, "", doc)


def _children(entry: dict[str, Any], prefix: str, doc: dict[str, Any]) -> Iterator[Setting]:
    required = set(entry.get("required", ()))
    for key, child in (entry.get("properties") or {}).items():
        child = resolve(child, doc)
        path = f"{prefix}{key}"
        yield Setting(path, child, key in required)
        yield from _inside(child, path, doc)


def _inside(entry: dict[str, Any], path: str, doc: dict[str, Any]) -> Iterator[Setting]:
    yield from _children(entry, f"{path}.", doc)
    items = entry.get("items")
    if isinstance(items, dict):
        yield from _children(items, f"{path}[].", doc)
    values = entry.get("additionalProperties")
    if isinstance(values, dict):
        yield from _children(resolve(values, doc), f"{path}.<name>.", doc)


def sections(doc: dict[str, Any]) -> list[str]:
    return list(doc.get("properties") or {})


def undescribed(doc: dict[str, Any]) -> list[str]:
    """The settings whose schema entry has no description (or an empty one)."""
    return [s.path for s in settings(doc) if not str(s.entry.get("description") or "").strip()]


# --- one row -------------------------------------------------------------------------------------
def _value(value: Any) -> str:
    """A value as the config file would spell it, compactly (JSON's flow style, bare strings)."""
    if isinstance(value, str):
        return value if value and value.strip() == value else json.dumps(value)
    return json.dumps(value, ensure_ascii=False)


def _code(text: str) -> str:
    """Inline code for a table cell: `|` escaped (GFM's tables split on it, even inside code)."""
    text = text.replace("|", "\\|")
    ticks = "``" if "`" in text else "`"
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


def _prose(text: str) -> str:
    """Description text for a table cell: one line; outside code spans `|`, `*` and `<` escaped
    (a `<name>` would be read as an HTML tag and vanish)."""
    text = " ".join(str(text).split())
    parts = re.split(r"(`[^`]*`)", text)
    for index in range(0, len(parts), 2):
        parts[index] = parts[index].replace("|", "\\|").replace("*", "\\*").replace("<", "&lt;")
    for index in range(1, len(parts), 2):
        parts[index] = parts[index].replace("|", "\\|")
    return "".join(parts)


TYPE_WORDS = {"integer": "integer", "number": "number", "string": "text", "boolean": "true or false"}


def _types(entry: dict[str, Any]) -> tuple[list[str], bool]:
    kinds = entry.get("type", [])
    kinds = [kinds] if isinstance(kinds, str) else list(kinds)
    return [kind for kind in kinds if kind != "null"], "null" in kinds


def _range(entry: dict[str, Any]) -> str:
    """A number's range: `>= 1`, `> 0`, `0 to 1`, `> 0 and < 1`."""
    low = ("", None)
    if "minimum" in entry:
        low = (">=", entry["minimum"])
    if "exclusiveMinimum" in entry:
        low = (">", entry["exclusiveMinimum"])
    high = ("", None)
    if "maximum" in entry:
        high = ("<=", entry["maximum"])
    if "exclusiveMaximum" in entry:
        high = ("<", entry["exclusiveMaximum"])
    if low[0] == ">=" and high[0] == "<=":
        return f"{_value(low[1])} to {_value(high[1])}"
    bounds = [f"{sign} {_value(bound)}" for sign, bound in (low, high) if sign]
    return " and ".join(bounds)


def allowed(entry: dict[str, Any]) -> str:
    """What values a setting takes, in words: its type, range, choices, pattern or items."""
    if "enum" in entry:
        return "one of " + ", ".join(_code(_value(choice)) for choice in entry["enum"])
    kinds, nullable = _types(entry)
    if not kinds and not nullable:
        return "none (a removed setting: refused)"
    words = []
    for kind in kinds:
        if kind == "array":
            words.append(_list_words(entry))
        elif kind == "object" and "properties" in entry:
            words.append("a section")
        elif kind == "object":
            values = entry.get("additionalProperties")
            inner = isinstance(values, dict) and "properties" in values
            words.append("a map, each entry's keys below" if inner else "a map of names to values")
        else:
            words.append(TYPE_WORDS.get(kind, kind))
    qualities = [" or ".join(words) + (f" {_range(entry)}" if _range(entry) else "")]
    if entry.get("minLength"):
        qualities.append("not empty")
    if "pattern" in entry:
        qualities.append(f"matching {_code(entry['pattern'])}")
    if isinstance(entry.get("propertyNames"), dict) and "pattern" in entry["propertyNames"]:
        qualities.append(f"names matching {_code(entry['propertyNames']['pattern'])}")
    return ", ".join(qualities) + (f"; or {_code('null')}" if nullable else "")


def _list_words(entry: dict[str, Any]) -> str:
    items = entry.get("items") or {}
    item = "values"
    if isinstance(items, dict) and items:
        if "enum" in items:
            item = "values among " + ", ".join(_code(_value(choice)) for choice in items["enum"])
        elif "properties" in items:
            item = "entries, each with the keys below"
        else:
            kinds, _ = _types(items)
            item = " or ".join(TYPE_WORDS.get(kind, kind) + "s" for kind in kinds) or "values"
            if _range(items):
                item += f" {_range(items)}"
    qualities = []
    if entry.get("minItems"):
        qualities.append(f"at least {entry['minItems']}")
    if entry.get("uniqueItems"):
        qualities.append("no repeats")
    return f"a list of {item}" + (f" ({', '.join(qualities)})" if qualities else "")


def default(setting: Setting) -> str:
    if "default" in setting.entry:
        return _code(_value(setting.entry["default"]))
    return "required" if setting.required else "none"


# --- the page ------------------------------------------------------------------------------------
HEADER = f"""\
# Config reference

Every setting of the study config, with its default, the values it takes and what it does. A
study config (`config/config.yaml`, `config/demo.yaml`, or your own:
[config/README.md](../../config/README.md)) sets only what differs from these defaults; the
Snakefile validates it against the schema before any job is planned and fills the defaults in.

This page is generated from the schema's own descriptions (`scalestudy/plan/schema.yaml`, whose
sections' keys live in `scalestudy/plan/schema/*.yaml`); do not edit it by hand. After changing the
schema, write it again with `{COMMAND}` (the tests fail while it is stale or a key has no
description). A key `a.b.c` is `c` inside `b` inside section `a`; `[]` is every item of a list and
`<name>` every entry of a map.
"""


def render(doc: dict[str, Any]) -> str:
    """The whole page for the schema document `doc` (as `schema.read` returns it)."""
    names = sections(doc)
    lines = [HEADER, "Sections: " + ", ".join(f"[`{name}`](#{name})" for name in names) + ".", ""]
    every = list(settings(doc))
    for name in names:
        keys = [setting for setting in every if setting.path.startswith(f"{name}.")]
        lines += _section(name, resolve(doc["properties"][name], doc), name in doc.get("required", ()), keys)
    return "\n".join(lines).rstrip("\n") + "\n"


def _section(name: str, entry: dict[str, Any], required: bool, keys: list[Setting]) -> list[str]:
    """One section: its heading, its description, a row per key, and the defaults too long for a cell."""
    status = "Required in every study config." if required else "Optional."
    lines = [f"## {name}", "", f"{_prose(entry.get('description', ''))} {status}", ""]
    if keys:
        lines += ["| key | default | values | description |", "|---|---|---|---|"]
        lines += [_row(setting) for setting in keys]
        lines.append("")
    elif isinstance(entry.get("additionalProperties"), dict):
        lines += [f"Its entries: {allowed(entry)}; each value {allowed(entry['additionalProperties'])}.", ""]
    for setting in keys:
        if len(default(setting)) > INLINE_DEFAULT_CHARS:
            lines += [f"Default of `{setting.path}`:", "", "```yaml"]
            lines += [*_yaml_lines(setting.entry["default"]), "```", ""]
    return lines


def _row(setting: Setting) -> str:
    shown = default(setting)
    if len(shown) > INLINE_DEFAULT_CHARS:
        shown = "below"
    description = _prose(setting.entry.get("description", ""))
    return f"| `{setting.path}` | {shown} | {allowed(setting.entry)} | {description} |"


def _yaml_lines(value: Any) -> list[str]:
    """A default as block YAML: a map's entries or a list's items, one per line, each in flow style."""
    if isinstance(value, dict):
        return [f"{_value(key)}: {_value(item)}" for key, item in value.items()]
    if isinstance(value, list):
        return [f"- {_value(item)}" for item in value]
    return [_value(value)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--out", default=OUT, help=f"the page to write or check (default {OUT})")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if the page is stale")
    parser.add_argument("--schema", default=schema.PATH, help="the schema's top document")
    args = parser.parse_args(argv)
    try:
        doc = schema.read(args.schema)
    except schema.SchemaError as error:
        print(f"{COMMAND}: {error}", file=sys.stderr)
        return 1
    missing = undescribed(doc)
    if missing:
        names = ", ".join(missing)
        print(f"{COMMAND}: {args.schema}: settings without a description: {names}", file=sys.stderr)
        return 1
    text = render(doc)
    out = Path(args.out)
    if args.check:
        current = out.read_text(encoding="utf-8") if out.is_file() else None
        if current != text:
            why = "missing" if current is None else "not what the schema gives"
            print(f"{COMMAND}: {out} is {why}: run `{COMMAND}` and commit it", file=sys.stderr)
            return 1
        print(f"{out}: up to date ({len(list(settings(doc)))} settings)")
        return 0
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_text(out, text)
    print(f"wrote {out} ({len(list(settings(doc)))} settings)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
