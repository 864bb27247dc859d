"""Hostile and malformed config values through Snakemake (issue 13; docs/reference/robustness.md).

The values tests/test_hostile_config.py finds accepted must reach their commands as one literal
argument: no marker file may appear, in `snakemake -n` with both profiles nor in a real containerized
run of the fetch job (a stub `apptainer` records its argv and runs the command on the host). The
refused ones, a float world size, a missing config file and a config the schema refuses must stop
Snakemake before it plans, naming the key in one line. All tests here share one copy of the workflow
(the module fixture `workdir`).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from scalestudy.data import synthetic_cifar as synthetic
from scalestudy.plan import cluster, slurm_requests
from tests.conftest import REPO, copy_workflow, recorded_calls, snakemake_env, stub_apptainer
from tests.hostile_helpers import (
    PAYLOADS,
    classify,
    filled_demo,
    hostile,
    names_key,
    put,
    refusal,
)


def accepting_config(payload: str, marker: Path, archive: Path) -> dict:
    """Every accepting slot set to the payload at once; data from a local mirror (cifar10 source),
    so that data.url and data.mirrors reach the fetch command."""
    _, accepted = classify(payload, marker)
    config = filled_demo()
    config["data"].update(
        source="cifar10",
        md5=synthetic_digest(archive),
        size_bytes=archive.stat().st_size,
        sha256=None,
        mirrors=[],
    )
    for slot in accepted:
        put(config, slot, hostile(payload, marker))
    config["data"]["mirrors"].append(str(archive))  # after the hostile one: fetch falls through to it
    assert refusal(config) is None, refusal(config)
    return config


def synthetic_digest(path: Path) -> str:
    import hashlib

    return hashlib.md5(path.read_bytes()).hexdigest()


def run_workflow(workdir: Path, config: dict, *args: str, profile: str = "local", record: Path | None = None):
    (workdir / "hostile.yaml").write_text(yaml.safe_dump(config))
    env = snakemake_env()
    record = record or workdir / "apptainer-calls.jsonl"
    env["PATH"] = f"{stub_apptainer(workdir / '.stub-bin', record)}{os.pathsep}{env['PATH']}"
    command = [sys.executable, "-m", "snakemake", *args, "--profile", f"profiles/{profile}"]
    command += ["--configfile", "hostile.yaml"]
    return subprocess.run(command, cwd=workdir, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return copy_workflow(tmp_path_factory.mktemp("hostile") / "scalestudy")


@pytest.fixture(scope="module")
def archive(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("mirror") / "cifar-10-python.tar.gz"
    synthetic.write_archive(path, train_per_class=4, test_per_class=2, seed=0)
    return path


@pytest.mark.parametrize(
    ("key", "value", "named"),
    [
        (("scaling", "world_sizes"), [1, 2.0], "scaling.world_sizes[1] must be an integer, got 2.0"),
        (("sensitivity", "world_size"), 2.0, "sensitivity.world_size must be an integer, got 2.0"),
    ],
)
def test_snakemake_stops_on_a_float_world_size_naming_the_key(workdir, key, value, named):
    config = filled_demo()
    config[key[0]][key[1]] = value
    result = run_workflow(workdir, config, "-n")
    output = result.stdout + result.stderr
    assert result.returncode != 0 and named in output, output[-3000:]
    assert "MissingInputException" not in output and "Building DAG" not in output


def test_a_world_size_the_strong_batch_does_not_divide_stops_snakemake_in_one_line(workdir):
    """Issue 43: the sentence came before a traceback into grid.py; now the config check says it."""
    config = yaml.safe_load((REPO / "config/demo.yaml").read_text())
    config["scaling"]["world_sizes"] = [1, 3]
    result = run_workflow(workdir, config, "-n")
    output = result.stdout + result.stderr
    named = "scaling.world_sizes[1] = 3: scaling.strong_global_batch=64 does not split evenly over 3 ranks"
    assert result.returncode != 0 and named in output, output[-3000:]
    assert "grid.py" not in output and "Traceback" not in output and len(output.splitlines()) < 8, output


def test_a_missing_configfile_is_named_by_snakemake_before_the_workflow_is_read(workdir):
    """Snakemake 9 reads every --configfile itself, before the Snakefile or anything of this project
    runs, and its loader opens the file outside the handler meant to turn FileNotFoundError into its
    one-line "Config file ... not found." (snakemake/common/configfile.py, _load_configfile): the
    traceback is Snakemake's, and no profile or Snakefile code can shorten it. What it must still do:
    name the file and plan nothing."""
    env = snakemake_env()
    command = [sys.executable, "-m", "snakemake", "-n", "--profile", "profiles/local"]
    result = subprocess.run(
        [*command, "--configfile", "no-such-study.yaml"],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    output = result.stdout + result.stderr
    error = [line for line in output.splitlines() if "Error" in line][-1]  # (on stdout, oddly)
    assert result.returncode != 0 and "no-such-study.yaml" in error, output[-3000:]
    assert "Building DAG" not in output and "Job stats" not in output


@pytest.mark.parametrize(
    ("change", "line"),
    [
        (lambda config: config.pop("train"), "train: a required section or key is missing"),
        (lambda config: config["train"].update(lr="fast"), "train.lr: 'fast' is not of type 'number'"),
    ],
)
def test_a_config_the_schema_refuses_is_named_in_one_line_not_the_whole_schema(workdir, change, line):
    config = yaml.safe_load((REPO / "config/demo.yaml").read_text())
    change(config)
    result = run_workflow(workdir, config, "-n")
    output = result.stdout + result.stderr
    assert result.returncode != 0 and f"hostile.yaml): {line}" in output, output[-3000:]
    assert "Failed validating" not in output and len(output.splitlines()) < 20, output[-3000:]


def shell_commands(output: str) -> list[list[str]]:
    """The words of every `Shell command:` a dry run prints (single-line commands only)."""
    return [
        shlex.split(line.split(": ", 1)[1])
        for line in output.splitlines()
        if line.startswith("Shell command: ")
    ]


def literal_everywhere(words: list[str], value: str) -> bool:
    """Every word holding `value` is the value itself, --option=value, or a JSON document holding it."""
    for word in words:
        if value not in word and json.dumps(value)[1:-1] not in word:
            continue
        if word == value or word.split("=", 1)[-1] == value:
            continue
        try:
            if _holds(json.loads(word), value):
                continue
        except ValueError:
            pass
        return False
    return True


def _holds(document, value: str) -> bool:
    if isinstance(document, dict):
        return any(_holds(key, value) or _holds(item, value) for key, item in document.items())
    if isinstance(document, list):
        return any(_holds(item, value) for item in document)
    return document == value


@pytest.mark.slow
@pytest.mark.parametrize("payload", PAYLOADS)
def test_refused_values_stop_snakemake_before_planning(workdir, payload, tmp_path):
    marker = tmp_path / "marker"
    refused, _ = classify(payload, marker)
    config = filled_demo()
    for slot in refused:
        put(config, slot, hostile(payload, marker))
    result = run_workflow(workdir, config, "-n", profile="slurm")
    output = result.stdout + result.stderr
    assert result.returncode != 0 and "Building DAG" not in output, output[-3000:]
    assert any(names_key(output, concrete, slot) for slot, (_, concrete) in refused.items()), output[-3000:]
    assert not marker.exists()


@pytest.mark.slow
@pytest.mark.parametrize("profile", ["local", "slurm"])
@pytest.mark.parametrize("payload", PAYLOADS)
def test_accepted_values_reach_their_commands_as_one_argument(workdir, archive, payload, profile, tmp_path):
    marker = tmp_path / "marker"
    value = hostile(payload, marker)
    config = accepting_config(payload, marker, archive)
    result = run_workflow(workdir, config, "-n", "--printshellcmds", profile=profile)  # the profiles don't
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-5000:]
    assert not marker.exists()
    if "\n" not in value:  # a multi-line command cannot be told from the next line of the log
        commands = shell_commands(output)
        assert any(value in word for words in commands for word in words), "no command carries the value"
        for words in commands:
            assert literal_everywhere(words, value), words
    # What the Slurm executor plugin would submit for a training job of this config.
    words = shlex.split(slurm_requests.sbatch_command(cluster.train_resources(config, 2, 1), threads=2))
    assert literal_everywhere(words, value), words


@pytest.mark.slow
@pytest.mark.parametrize("payload", PAYLOADS)
def test_a_containerized_fetch_runs_with_every_accepted_value_as_one_argument(
    workdir, archive, payload, tmp_path
):
    marker = tmp_path / "marker"
    value = hostile(payload, marker)
    config = accepting_config(payload, marker, archive)
    record = tmp_path / "apptainer-calls.jsonl"
    (workdir / "containers/scalestudy.sif").write_bytes(b"image")  # newer than its sources: no build
    target = "results/data/cifar-10-python.tar.gz"
    (workdir / target).unlink(missing_ok=True)
    result = run_workflow(workdir, config, target, "--sdm", "apptainer", "--cores", "1", record=record)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-5000:]
    assert not marker.exists()
    (call,) = recorded_calls(record)
    assert call[0] == "exec" and call[-4] == "containers/scalestudy.sif" and call[-2] == "-c", call
    words = shlex.split(call[-1])
    assert words[words.index("--url") + 1] == value
    assert words[words.index("--mirror") + 1] == value
    assert literal_everywhere(words, value), words
    assert (workdir / target).read_bytes() == archive.read_bytes()


@pytest.mark.slow
def test_a_hostile_image_path_runs_nothing_on_the_host(workdir, tmp_path):
    """The defect of issue 13: the image path went unquoted into Snakemake's apptainer command."""
    marker = tmp_path / "marker"
    config = filled_demo()
    config["container"]["prebuilt"] = f"x;touch$IFS{marker};"
    target = "results/data/cifar-10-python.tar.gz"
    (workdir / target).unlink(missing_ok=True)
    result = run_workflow(
        workdir, config, target, "--sdm", "apptainer", "--cores", "1", record=tmp_path / "r"
    )
    output = result.stdout + result.stderr
    assert not marker.exists(), output[-3000:]
    assert result.returncode != 0 and names_key(output, ["container", "prebuilt"], ()), output[-3000:]
