"""The study config's schema in several files (scalestudy/plan/schema.yaml, the top document, and the
sections' schema/*.yaml it $refs): each file short, every $ref leading somewhere, and Snakemake's
validate() -- following the $refs itself -- filling in exactly the defaults scalestudy.plan.schema reads.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import yaml

from scalestudy.plan import schema
from tests.conftest import REPO

TOP = Path(schema.PATH)
PARTS = sorted((TOP.parent / "schema").glob("*.yaml"))
MAX_LINES = 500  # docs: modules and data files under ~500 lines


def refs(value) -> list[str]:
    """Every $ref in a parsed schema file, in order."""
    if isinstance(value, list):
        return [ref for item in value for ref in refs(item)]
    if not isinstance(value, dict):
        return []
    own = [value["$ref"]] if isinstance(value.get("$ref"), str) else []
    return own + [ref for item in value.values() for ref in refs(item)]


def validated(config: dict, schema_file: str | Path) -> dict:
    from snakemake.utils import validate

    config = copy.deepcopy(config)
    validate(config, str(schema_file))
    return config


def with_defaults(given: dict, properties: dict) -> dict:
    """`given` with each missing key's default, then the defaults inside each object, recursively."""
    filled = copy.deepcopy(given)
    for key, spec in properties.items():
        if "default" in spec:
            filled.setdefault(key, copy.deepcopy(spec["default"]))
        if isinstance(filled.get(key), dict) and "properties" in spec:
            filled[key] = with_defaults(filled[key], spec["properties"])
    return filled


def least_config() -> dict:
    """The required sections, each as empty as the schema allows; every other section left out."""
    given = {"study": {"name": "least"}, "data": {"source": "synthetic"}}
    return {name: copy.deepcopy(given.get(name, {})) for name in schema.load()["required"]}


def test_no_schema_file_is_longer_than_the_limit():
    assert len(PARTS) >= 2, "the sections' files (scalestudy/plan/schema/*.yaml) were not found"
    lengths = {str(path.relative_to(REPO)): len(path.read_text().splitlines()) for path in [TOP, *PARTS]}
    assert not {name: n for name, n in lengths.items() if n > MAX_LINES}, lengths


def test_the_repository_link_and_the_package_data_reach_every_part():
    import tomllib

    assert (REPO / "config/schema.yaml").is_symlink() and (REPO / "config/schema").is_symlink()
    assert (REPO / "config/schema.yaml").resolve() == TOP.resolve()
    assert (REPO / "config/schema").resolve() == (
        TOP.parent / "schema"
    ).resolve()  # for tools that keep links
    shipped = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    globs = shipped["scalestudy.plan"]
    unshipped = [
        path.name for path in [TOP, *PARTS] if not any(path.relative_to(TOP.parent).match(g) for g in globs)
    ]
    assert not unshipped, f"pyproject.toml's package-data leaves out {unshipped}"


def test_every_ref_leads_somewhere_and_every_part_is_used():
    named = set()
    for path in [TOP, *PARTS]:
        document = yaml.safe_load(path.read_text())
        # referencing (what validate() resolves with) needs $schema to read a file a $ref names
        assert document["$schema"] == "https://json-schema.org/draft/2020-12/schema", path
        for ref in refs(document):
            name = ref.partition("#")[0]
            assert name or path == TOP, (
                f"{path}: {ref} looks in this part; ../schema.yaml#/$defs/... is shared"
            )
            named |= {(path.parent / name).resolve()} if name else set()
    assert named - {TOP.resolve()} == {path.resolve() for path in PARTS}
    whole = schema.read(TOP)
    left = refs(whole)
    assert left and all(re.fullmatch(r"#/\$defs/\w+", ref) for ref in left), left
    assert all(ref.rpartition("/")[2] in whole["$defs"] for ref in left)
    assert schema.read(REPO / "config/schema.yaml") == whole == schema.load()


def test_the_top_document_gives_a_sections_default_the_part_does_not():
    top = yaml.safe_load(TOP.read_text())["properties"]
    with_default = {name for name, entry in top.items() if "default" in entry}
    assert {"cluster", "analysis", "tracking"} <= with_default
    for name, entry in top.items():
        assert set(entry) <= {"$ref"} | schema.BESIDE_REF, name
        part, _, pointer = entry["$ref"].partition("#")
        target = yaml.safe_load((TOP.parent / part).read_text())["$defs"][pointer.rpartition("/")[2]]
        assert "default" not in target, f"{part}: {name} gives its own default; the top document does"
        assert schema.node(name).get("default", "none") == entry.get("default", "none")


@pytest.mark.parametrize("config_file", ["demo.yaml", "config.yaml", "demo-gpt.yaml", None])
def test_snakemakes_validate_follows_the_refs_as_load_inlines_them(config_file):
    config = yaml.safe_load((REPO / "config" / config_file).read_text()) if config_file else least_config()
    through_refs = validated(config, REPO / "config/schema.yaml")  # the link, its $refs followed
    with schema.as_json_file() as inlined:  # what the Snakefile hands validate()
        assert validated(config, inlined) == through_refs
    # the defaults as schema.load() gives them, filled in as JSON Schema's FAQ does it (validate's way)
    assert through_refs == with_defaults(config, schema.load()["properties"])


def test_a_copy_of_config_that_follows_the_links_still_reads_whole(tmp_path):
    """tests/conftest.py copies config/ with shutil.copytree, which copies what the links point at."""
    import shutil

    copied = shutil.copytree(REPO / "config", tmp_path / "config")
    assert not (copied / "schema.yaml").is_symlink()
    assert schema.read(copied / "schema.yaml") == schema.load()
    config = yaml.safe_load((REPO / "config/demo.yaml").read_text())
    assert validated(config, copied / "schema.yaml") == validated(config, REPO / "config/schema.yaml")


def test_a_section_left_out_gets_the_defaults_of_its_part():
    """Optional sections left out of the config: their keys' defaults are only in their part."""
    config = least_config()
    for name in ("tracking", "comm_bench", "smoke", "compare"):
        config.pop(name, None)
    filled = validated(config, REPO / "config/schema.yaml")
    for name in ("tracking", "comm_bench", "smoke", "compare"):
        assert filled[name] == schema.defaults(name), name
    part = yaml.safe_load((TOP.parent / "schema/preflight.yaml").read_text())["$defs"]["comm_bench"]
    assert filled["comm_bench"]["iters"] == part["properties"]["iters"]["default"]


def write(root: Path, files: dict[str, object]) -> Path:
    for name, content in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(yaml.safe_dump(content))
    return root / "top.yaml"


TOP_OF = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$defs": {"positive_int": {"type": "integer", "minimum": 1}},
    "type": "object",
}


def part_of(**sections) -> dict:
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$defs": sections}


def test_refs_are_followed_from_the_file_that_holds_them_and_through_a_link(tmp_path):
    section = {
        "type": "object",
        "properties": {"n": {"$ref": "../top.yaml#/$defs/positive_int", "default": 3}},
    }
    top = write(
        tmp_path / "real",
        {
            "top.yaml": {**TOP_OF, "properties": {"s": {"$ref": "parts/a.yaml#/$defs/s", "default": {}}}},
            "parts/a.yaml": part_of(s=section),
        },
    )
    (tmp_path / "link.yaml").symlink_to(top)
    whole = schema.read(tmp_path / "link.yaml")
    assert whole["properties"]["s"] == {
        "type": "object",
        "properties": {"n": {"$ref": "#/$defs/positive_int", "default": 3}},
        "default": {},
    }
    assert validated({}, tmp_path / "link.yaml") == {"s": {"n": 3}}  # Snakemake resolves the link too
    with pytest.raises(Exception, match="less than the minimum"):
        validated({"s": {"n": 0}}, tmp_path / "link.yaml")


@pytest.mark.parametrize(
    ("entry", "part", "says"),
    [
        ({"$ref": "parts/gone.yaml#/$defs/s"}, part_of(s={}), r"cannot read .*parts/gone\.yaml"),
        ({"$ref": "parts/a.yaml#/$defs/t"}, part_of(s={}), r"no 't' there"),
        ({"$ref": "parts/a.yaml#s"}, part_of(s={}), r"only JSON-pointer fragments"),
        ({"$ref": "parts/a.yaml#/$defs/s", "default": 1}, part_of(s={"default": 2}), r"default beside it"),
        ({"$ref": "parts/a.yaml#/$defs/s", "type": "object"}, part_of(s={}), r"type beside it"),
        ({"$ref": "parts/a.yaml#/$defs/s"}, part_of(s={"$ref": "#/$defs/s"}), r"leads back to itself"),
        ({"$ref": "parts/a.yaml#/$defs/s"}, part_of(s={"$ref": "../top.yaml"}), r"whole top document"),
    ],
)
def test_a_ref_that_leads_nowhere_is_one_line_naming_the_file(tmp_path, entry, part, says):
    top = write(tmp_path, {"top.yaml": {**TOP_OF, "properties": {"s": entry}}, "parts/a.yaml": part})
    with pytest.raises(schema.SchemaError, match=says) as error:
        schema.read(top)
    assert str(error.value).startswith(str(tmp_path.resolve())) and "\n" not in str(error.value)


def test_a_part_that_is_not_yaml_is_named(tmp_path):
    top = write(tmp_path, {"top.yaml": {**TOP_OF, "properties": {"s": {"$ref": "parts/a.yaml#/$defs/s"}}}})
    (tmp_path / "parts").mkdir()
    (tmp_path / "parts/a.yaml").write_text("$defs: [unclosed\n")
    with pytest.raises(schema.SchemaError, match=r"parts/a\.yaml: not YAML") as error:
        schema.read(top)
    assert "\n" not in str(error.value)
