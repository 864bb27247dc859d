"""docs/reference/config.md is generated from the schema (`python -m scalestudy.plan.reference`): every
setting has a description, and the committed page is the one the schema gives, with each key's
default and the values it takes."""

from __future__ import annotations

import copy
import re
import shutil

import pytest

from scalestudy.plan import reference, schema
from tests.conftest import REPO

PAGE = REPO / reference.OUT


@pytest.fixture(scope="module")
def doc() -> dict:
    return schema.read(schema.PATH)


def rows(text: str) -> dict[str, list[str]]:
    """The page's table rows by key: {`train.measure.steps`: [default, values, description]}."""
    found = {}
    for line in text.splitlines():
        if match := re.match(r"^\| `([^`]+)` \| (.*) \|$", line):
            found[match.group(1)] = re.split(r"(?<!\\)\| ", match.group(2) + " ")
    return {key: [cell.strip() for cell in cells] for key, cells in found.items()}


def test_every_setting_of_the_schema_has_a_description(doc):
    assert reference.undescribed(doc) == [], "add a description: to these keys of scalestudy/plan/schema*"


def test_the_committed_reference_is_what_the_schema_gives(doc):
    assert PAGE.is_file(), f"{reference.OUT} is missing: run `{reference.COMMAND}`"
    assert PAGE.read_text() == reference.render(doc), f"{reference.OUT} is stale: run `{reference.COMMAND}`"


def test_the_reference_lists_every_key_with_its_default_values_and_description(doc):
    text = PAGE.read_text()
    sections = reference.sections(doc)
    assert all(f"\n## {name}\n" in text for name in sections)
    settings = [setting for setting in reference.settings(doc) if setting.path not in sections]
    assert len(settings) > 200
    table = rows(text)
    assert sorted(table) == sorted(setting.path for setting in settings)
    for setting in settings:
        default, values, description = table[setting.path]
        assert default and values and description, setting.path
    assert table["train.measure.steps"][:2] == ["`200`", "integer >= 1"]
    assert table["cluster.launcher"][:2] == ["`auto`", "one of `auto`, `local`, `srun`"]
    assert table["data.test_fraction"][1] == "number > 0 and < 1"
    assert table["study.name"][0] == "required"
    assert table["train.grad_clip"][:2] == ["`null`", "number > 0; or `null`"]
    assert table["train.momentum"][1] == "number 0 to 1"
    assert table["analysis.peak_tflops.<name>.bf16"][0] == "required"
    assert table["analysis.comm_model.interconnects[].name"][2].startswith("The link's name")
    # a default too long for its cell follows the table, whole
    assert table["analysis.peak_tflops"][0] == "below"
    assert 'H100: {"fp32": 66.9, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4}' in text


def test_a_setting_without_a_description_is_named_and_fails_the_command(doc, tmp_path, capsys):
    changed = copy.deepcopy(doc)
    del changed["properties"]["train"]["properties"]["measure"]["properties"]["steps"]["description"]
    changed["properties"]["cluster"]["properties"]["partition"]["description"] = "  "
    assert reference.undescribed(changed) == ["train.measure.steps", "cluster.partition"]

    # the package's schema files, one key's description taken out
    top = tmp_path / "schema.yaml"
    shutil.copytree(REPO / "scalestudy/plan/schema", tmp_path / "schema")
    shutil.copy(schema.PATH, top)
    part = tmp_path / "schema/grid.yaml"
    part.write_text(part.read_text().replace(", description: Steps in the profiling window.}", "}", 1))
    assert reference.main(["--schema", str(top), "--out", str(tmp_path / "config.md")]) == 1
    assert "settings without a description: profiling.steps" in capsys.readouterr().err
    assert not (tmp_path / "config.md").exists()


def test_check_fails_on_a_stale_page_and_passes_on_a_fresh_one(tmp_path, capsys):
    out = tmp_path / "config.md"
    assert reference.main(["--check", "--out", str(out)]) == 1
    assert "is missing: run `python -m scalestudy.plan.reference`" in capsys.readouterr().err
    assert reference.main(["--out", str(out)]) == 0
    assert reference.main(["--check", "--out", str(out)]) == 0
    out.write_text(out.read_text().replace("Optimizer steps in the window.", "Steps."))
    assert reference.main(["--check", "--out", str(out)]) == 1
    assert "not what the schema gives" in capsys.readouterr().err


def test_prose_that_markdown_would_eat_is_escaped():
    assert reference._prose("results/site/<partition>.json, *figure*, a|b, `x|<y>`") == (
        "results/site/&lt;partition>.json, \\*figure\\*, a\\|b, `x\\|<y>`"
    )
