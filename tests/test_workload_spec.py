"""Workloads as specs (issues 44 and 52): each workload package's spec module says what the rest of the
project needs (unit, metric, its data kind with its fetch and preprocess, samples per epoch, its
model's closed form, model keys, optimizer, the paper's words, its runtime), the registry collects
them and checks the schema's enum against them, and adding a workload is one new folder plus its enum
value: the toy workload of tests/fixtures/toyrows/ (rows of numbers, an MLP with a `width` key, a
data kind of its own) is found, planned and checked here, and run through Snakemake in a workflow
copy that differs from this one by that folder and that enum value only."""

from __future__ import annotations

import copy
import difflib
import hashlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from scalestudy.plan import configcheck, grid, runconfig, schema, workloads
from scalestudy.plan.workload_spec import NO_DATA, PaperWords, WorkloadSpec
from tests.conftest import REPO, run_snakemake, write_config

TOY = REPO / "tests/fixtures/toyrows"  # the toy workload's folder, as a user would write it
TOY_FILES = sorted(path.name for path in TOY.glob("*.py"))
SCHEMA_FILE = "scalestudy/plan/schema/workload.yaml"  # where the workload.name enum is


@pytest.fixture
def toy(tmp_path, monkeypatch) -> WorkloadSpec:
    """The toy's folder as a package outside the project (toyworkloads/toyrows/), found by the
    registry's discovery and registered for this test only."""
    package = tmp_path / "toyworkloads"
    shutil.copytree(TOY, package / "toyrows", ignore=shutil.ignore_patterns("__pycache__"))
    (package / "__init__.py").write_text("")
    (package / "notes").mkdir()  # a folder without a spec module is no workload
    (package / "notes" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    found = workloads.discover("toyworkloads")
    assert [spec.name for spec in found] == ["toy-rows"]
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
        "workload 'toy-rows' (scalestudy/workloads/) is missing from the schema's workload.name enum"
    ]
    with_toy = yaml.safe_load(_schema_with_enum(tmp_path, list(workloads.WORKLOADS)).read_text())
    assert workloads.schema_problems(with_toy) == []  # its enum line added
    config = copy.deepcopy(demo_config)
    config["workload"] = {"name": "toy-rows"}
    assert workloads.of_config(config) is toy
    points = grid.scaling_points(config)
    assert points
    runs = [grid.run_config(config, point) for point in points]
    assert {run["workload"] for run in runs} == {"toy-rows"}
    for run in runs:  # its model keys, nobody else's
        assert run["width"] == config["model"]["width"]
        assert "channels_last" not in run and "gpt" not in run and "command" not in run
    assert grid.samples_per_epoch(config) == 3 * 160  # its data kind's count: 3 classes x train_per_class
    assert toy.data.fetch_command(config) == ("synthetic", ["--rows", str(3 * 200), "--seed", "1234"])
    assert toy.data.preprocess_command(config) == {"test_rows": 3 * 40}


def test_the_toy_workloads_spec_reaches_the_checks_the_optimizer_and_the_paper(demo_config, toy, tmp_path):
    from scalestudy.paper import sections
    from scalestudy.train import datafit, optim

    config = copy.deepcopy(demo_config)
    config["workload"] = {"name": "toy-rows"}
    config["train"]["parallelism"] = "fsdp"
    problems = configcheck.workload_problems(config, schema.node())
    assert problems == ["train.parallelism = fsdp is for the gpt workload: toy-rows trains with ddp"]
    config["train"]["parallelism"], config["data"]["source"] = "ddp", "cifar10"
    assert configcheck.workload_problems(config, schema.node()) == [
        "data.source = 'cifar10' does not fit workload.name = 'toy-rows': use synthetic"
    ]

    assert optim.optimizer_name({"workload": "toy-rows", "optimizer": None}) == "adamw"
    (tmp_path / "manifest.json").write_text(json.dumps({"rows": {"train": 3, "test": 1}}))
    run = {"workload": "toy-rows", "per_gpu_batch": 4, "world_size": 1, "data_dir": str(tmp_path)}
    with pytest.raises(
        runconfig.RunConfigError, match="per_gpu_batch=4 does not fit the data: .* 3 training rows per rank"
    ):
        datafit.check_batch_fits(run)
    datafit.check_batch_fits({**run, "per_gpu_batch": 3})

    context = {"workload": "toy-rows", "sample_unit": "rows", "device": "cpu", "data_source": "synthetic"}
    data = sections.Data({}, context)
    assert (data.batch_items, data.metric, data.default_optimizer) == ("rows", "accuracy", "adamw")
    assert sections._loader_words("tensor", data) == "the toy loader"


def test_the_analysis_asks_the_spec_for_a_models_size_never_a_width_column(toy):
    """The toy has a `width` key as the ResNet has: its MFU and gradient bytes come from its own closed
    form (its spec's model_size), the ResNet's from the ResNet's, a catalog without a workload column
    is the ResNet study's, and a workload without a closed form has none (its trainer counts)."""
    from scalestudy.analysis import commmodel, mfu, modelsize

    def row(workload, **columns):
        return pd.Series({"config.width": 8, **({"workload": workload} if workload else {}), **columns})

    toy_size = (6 * 8 + 8 + 8 * 3 + 3, 2.0 * (6 * 8 + 8 * 3))  # Linear(6, 8) -> ReLU -> Linear(8, 3)
    resnet_size = (modelsize.parameters(8), modelsize.forward_flops_per_image(8))
    assert mfu.closed_form(row("toy-rows")) == toy_size
    assert mfu.closed_form(row("resnet18-cifar10")) == mfu.closed_form(row(None)) == resnet_size
    assert mfu.closed_form(row("gpt")) is None and mfu.closed_form(row("command")) is None
    runs = pd.DataFrame([row("toy-rows", point="a"), row("resnet18-cifar10", point="b")])
    assert commmodel.gradient_bytes(runs) == [4 * toy_size[0], 4 * resnet_size[0]]
    assert list(mfu.closed_form_flops(runs)) == [toy_size[1], resnet_size[1]]


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


# --- the toy through Snakemake: its folder and its enum value, nothing else -------------------------


def snapshot(root: Path) -> dict[str, str]:
    """{path relative to root: sha256} of every file (byte code left out)."""
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.rglob("*"))
        if path.is_file() and "__pycache__" not in path.parts
    }


def add_toy_workload(workdir: Path) -> None:
    """The recipe of docs/architecture.md ("how a workload is added"): the workload's folder under
    scalestudy/workloads/, and its name in the schema's workload.name enum."""
    shutil.copytree(
        TOY, workdir / "scalestudy/workloads/toyrows", ignore=shutil.ignore_patterns("__pycache__")
    )
    path = workdir / SCHEMA_FILE
    text = path.read_text()
    enum = "enum: [resnet18-cifar10, gpt, command]"
    assert text.count(enum) == 1
    path.write_text(text.replace(enum, "enum: [resnet18-cifar10, gpt, command, toy-rows]"))


def toy_study(config: dict) -> None:
    """The demo as a tiny toy study: one training point at world size 1, one epoch of 4 steps; no
    site check, no tracking."""
    config["workload"] = {"name": "toy-rows"}
    config["data"] = {
        "source": "synthetic",
        "synthetic": {"train_per_class": 16, "test_per_class": 4, "seed": 3},
    }
    config["model"]["width"] = 8
    config["train"].update(epochs=1, max_steps_per_epoch=4, checkpoint_every_steps=2)
    config["train"]["measure"] = {"warmup_steps": 1, "steps": 2, "intervals": 1}
    config["baseline"]["per_gpu_batch"] = 8
    config["scaling"].update(world_sizes=[1], modes=["strong"], strong_global_batch=8)
    config["sensitivity"] = {"world_size": 1, "axes": {"per_gpu_batch": [8]}, "epochs": 1}
    config["profiling"]["world_sizes"] = [1]
    config["smoke"].update(train_steps=1, loader_batches=2, checkpoint_repeats=1)
    config["site_check"] = {"enabled": False}
    config["tracking"] = {"enabled": False}


@pytest.mark.slow
def test_a_toy_workload_with_its_own_data_runs_through_snakemake_from_its_folder_and_enum_value(
    workflow_copy,
):
    before = snapshot(workflow_copy)
    add_toy_workload(workflow_copy)
    after = snapshot(workflow_copy)
    changed = sorted(path for path in after if before.get(path) != after[path])
    assert changed == sorted([SCHEMA_FILE, *(f"scalestudy/workloads/toyrows/{name}" for name in TOY_FILES)])
    schema_diff = [
        line
        for line in difflib.unified_diff(
            (REPO / SCHEMA_FILE).read_text().splitlines(),
            (workflow_copy / SCHEMA_FILE).read_text().splitlines(),
        )
        if line[:1] in "+-" and line[:3] not in ("+++", "---")
    ]
    assert [line[0] + line[1:].strip() for line in schema_diff] == [
        "-enum: [resnet18-cifar10, gpt, command]",
        "+enum: [resnet18-cifar10, gpt, command, toy-rows]",
    ]

    configfile = write_config(workflow_copy, "toy.yaml", toy_study)
    target = "results/runs/scaling/strong/w1_r0/summary.json"
    result = run_snakemake(workflow_copy, target, "--configfile", configfile, "--printshellcmds")
    # its own data kind: its fetch and pack modules made its files
    commands = re.findall(r"python -m (\S+)", result.stdout + result.stderr)
    assert {"scalestudy.workloads.toyrows.fetch", "scalestudy.workloads.toyrows.pack"} <= set(commands)
    rows = (workflow_copy / "results/data/rows.csv").read_text().splitlines()
    assert len(rows) == 3 * (16 + 4)
    manifest = json.loads((workflow_copy / "results/data/packed/manifest.json").read_text())
    assert manifest["rows"] == {"train": 48, "test": 12}
    # trained as the toy, in its unit, with its own FLOP count (its closed form: width 8)
    summary = json.loads((workflow_copy / target).read_text())
    results = summary["results"]
    assert (summary["run"]["workload"], results["sample_unit"], results["metric"]) == (
        "toy-rows",
        "rows",
        "accuracy",
    )
    assert results["steps"] == 4 and results["optimizer"] == "adamw"
    assert (results["parameters"], results["forward_flops_per_image"]) == (
        6 * 8 + 8 + 8 * 3 + 3,
        2 * (6 * 8 + 8 * 3),
    )
    assert results["train_flops_per_image"] == 3 * results["forward_flops_per_image"]
