"""Workloads as specs (issue 44, item 1): each workload package's spec module says what the rest of the
project needs (unit, metric, data, model keys, optimizer, the paper's words, its runtime), the registry
collects them and checks the schema's enum against them, and adding a workload is one new folder (plus
its enum line): a toy workload in a temporary package is found, planned and checked here."""

from __future__ import annotations

import copy
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from scalestudy.plan import configcheck, grid, runconfig, schema, workloads
from scalestudy.plan.workload_spec import NO_DATA, PaperWords, WorkloadSpec
from tests.conftest import REPO

TOY_SPEC = """
from scalestudy.plan.workload_spec import NO_DATA, PaperWords, WorkloadSpec

SPEC = WorkloadSpec(
    name="toy-mlp",
    sample_unit="rows",
    metric="none",
    data=NO_DATA,
    model_keys=("width", "compile"),
    reshardable=False,
    runtime="toyworkloads.toy.workload",
    default_optimizer="adamw",
    parallelisms=("ddp",),
    batch_fit="toyworkloads.toy.workload:batch_capacity",
    paper=PaperWords(
        dataset="the toy rows",
        data_real="rows from a file",
        data_synthetic="rows made up on the spot",
        subject="anything",
        model="a toy MLP",
        model_details=" (width {width})",
        model_columns=(("width", "config.width"),),
        batch_items="rows",
        loader="the toy loader",
    ),
)
"""
TOY_RUNTIME = """
def batch_capacity(config):
    return 3, "toy rows", config["per_gpu_batch"], f"per_gpu_batch={config['per_gpu_batch']}"
"""


@pytest.fixture
def toy(tmp_path, monkeypatch) -> WorkloadSpec:
    """A workload package outside the project (toyworkloads/toy/: spec.py, workload.py), found by
    the registry's discovery and registered for this test only."""
    package = tmp_path / "toyworkloads"
    (package / "toy").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "toy" / "__init__.py").write_text("")
    (package / "toy" / "spec.py").write_text(textwrap.dedent(TOY_SPEC))
    (package / "toy" / "workload.py").write_text(textwrap.dedent(TOY_RUNTIME))
    (package / "notes").mkdir()  # a folder without a spec module is no workload
    (package / "notes" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    found = workloads.discover("toyworkloads")
    assert [spec.name for spec in found] == ["toy-mlp"]
    monkeypatch.setattr(workloads, "WORKLOADS", dict(workloads.WORKLOADS))
    workloads.register(found[0])
    yield found[0]
    for name in [name for name in sys.modules if name.startswith("toyworkloads")]:
        del sys.modules[name]


def test_the_registry_holds_one_spec_per_workload_package_and_the_schema_lists_them():
    folders = sorted(p.parent.name for p in (REPO / "scalestudy/workloads").glob("*/spec.py"))
    assert len(folders) == len(workloads.WORKLOADS) == 3
    assert list(workloads.WORKLOADS)[0] == workloads.DEFAULT
    assert set(workloads.WORKLOADS) == {"resnet18-cifar10", "gpt", "command"}
    assert workloads.schema_problems(schema.node()) == []


def test_the_specs_and_the_registry_import_no_third_party_package():
    code = (
        "import sys; import scalestudy.plan.workloads as w; "
        "print(len(w.WORKLOADS), sorted(m for m in ('torch', 'numpy', 'pandas', 'yaml') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["3", "[]"]


def _schema_with_enum(tmp_path: Path, enum: list[str]) -> Path:
    node = copy.deepcopy(schema.node())
    node["properties"]["workload"]["properties"]["name"]["enum"] = enum
    path = tmp_path / "schema.yaml"
    path.write_text(yaml.safe_dump(node))
    return path


def test_a_schema_enum_that_disagrees_with_the_packages_is_one_clear_line(tmp_path, demo_config):
    path = _schema_with_enum(tmp_path, ["resnet18-cifar10", "gpt", "transformer-xl"])
    with pytest.raises(configcheck.ConfigError) as error:
        configcheck.check(demo_config, path)
    message = str(error.value)
    assert "'transformer-xl', which no workload package defines" in message
    assert (
        "workload 'command' (scalestudy/workloads/) is missing from the schema's workload.name enum"
        in message
    )
    assert "\n" not in message
    configcheck.check(demo_config, _schema_with_enum(tmp_path, list(workloads.WORKLOADS)))  # agrees: fine


def test_a_toy_workload_is_one_folder_plus_its_enum_line(demo_config, toy, tmp_path):
    assert workloads.schema_problems(schema.node()) == [
        "workload 'toy-mlp' (scalestudy/workloads/) is missing from the schema's workload.name enum"
    ]
    with_toy = yaml.safe_load(_schema_with_enum(tmp_path, list(workloads.WORKLOADS)).read_text())
    assert workloads.schema_problems(with_toy) == []  # its enum line added
    config = copy.deepcopy(demo_config)
    config["workload"] = {"name": "toy-mlp"}
    assert workloads.of_config(config) is toy
    points = grid.scaling_points(config)
    assert points
    runs = [grid.run_config(config, point) for point in points]
    assert {run["workload"] for run in runs} == {"toy-mlp"}
    for run in runs:  # its model keys, nobody else's
        assert run["width"] == config["model"]["width"]
        assert "channels_last" not in run and "gpt" not in run and "command" not in run
    assert grid.samples_per_epoch(config) is None  # no data kind the grid counts


def test_the_toy_workloads_spec_reaches_the_checks_the_optimizer_and_the_paper(demo_config, toy):
    from scalestudy.paper import sections
    from scalestudy.train import datafit, optim

    config = copy.deepcopy(demo_config)
    config["workload"] = {"name": "toy-mlp"}
    config["train"]["parallelism"] = "fsdp"
    problems = configcheck.workload_problems(config, schema.node())
    assert problems == ["train.parallelism = fsdp is for the gpt workload: toy-mlp trains with ddp"]

    assert optim.optimizer_name({"workload": "toy-mlp", "optimizer": None}) == "adamw"
    run = {"workload": "toy-mlp", "per_gpu_batch": 4, "world_size": 1, "data_dir": "rows"}
    with pytest.raises(
        runconfig.RunConfigError, match="per_gpu_batch=4 does not fit the data: .* 3 toy rows"
    ):
        datafit.check_batch_fits(run)
    datafit.check_batch_fits({**run, "per_gpu_batch": 3})

    context = {"workload": "toy-mlp", "sample_unit": "rows", "device": "cpu", "data_source": "synthetic"}
    data = sections.Data({}, context)
    assert (data.batch_items, data.metric, data.default_optimizer) == ("rows", "none", "adamw")
    assert sections._loader_words("tensor", data) == "the toy loader"


def test_two_packages_naming_one_workload_are_an_error():
    spec = WorkloadSpec(
        "twin", "rows", "none", NO_DATA, (), False, "twin.workload", paper=PaperWords(*"abcde")
    )
    with pytest.raises(ValueError, match="two workload packages name the workload 'twin'"):
        workloads.collect([spec, spec])


NAMES = "|".join(re.escape(name) for name in workloads.WORKLOADS)
COMPARED = re.compile(rf"""(==|!=|\bin\b)\s*\(?\s*["']({NAMES})["']|["']({NAMES})["']\s*(==|!=)""")


def test_no_module_outside_the_workloads_compares_a_workload_name():
    """Only scalestudy/workloads/ and the registry know the names; everything else asks a spec."""
    files = [
        *sorted((REPO / "scalestudy").rglob("*.py")),
        REPO / "Snakefile",
        *sorted((REPO / "rules").glob("*.smk")),
    ]
    found = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()}"
        for path in files
        if "workloads" not in path.relative_to(REPO).parts[:2] and path.name != "workloads.py"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if COMPARED.search(line)
    ]
    assert found == []
