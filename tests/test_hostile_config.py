"""Hostile and malformed config values (issue 13; docs/robustness.md lists what the user sees).

Every string a user can set in the config -- found by walking config/schema.yaml, so a key added
later is covered without touching this file -- is filled in turn with shell metacharacters. Each
value must be refused before any job is planned, by an error naming its key, or reach its command
as one literal argument: no marker file may appear, in `snakemake -n` with both profiles nor in a
real containerized run of the fetch job (a stub `apptainer` records its argv and runs the command
on the host). Integer keys must refuse floats such as 2.0, which JSON Schema counts as integers.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from scalestudy.data import synthetic_cifar as synthetic
from scalestudy.plan import cluster, configcheck, slurm_requests
from tests.conftest import REPO, copy_workflow, recorded_calls, snakemake_env, stub_apptainer

SCHEMA_PATH = REPO / "config/schema.yaml"
SCHEMA = yaml.safe_load(SCHEMA_PATH.read_text())

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


# --------------------------------------------------------------------------- the walk itself


def test_the_walk_finds_the_keys_that_reach_a_shell():
    slots = {slot_id(slot) for slot in STRING_SLOTS}
    expected = {
        "container.sif", "container.prebuilt", "container.definition", "container.python",
        "container.binds.[]", "container.build_args.[]", "data.url", "data.mirrors.[]",
        "cluster.partition", "cluster.constraint", "cluster.sbatch_extra.[]", "nccl.<value>", "nccl.<key>",
        "analysis.comm_model.interconnects.[].name", "analysis.comm_model.intra_node.name",
        "analysis.peak_tflops.<key>", "study.title", "profiling.ncu.kernel_regex",
    }  # fmt: skip
    assert expected <= slots, expected - slots
    integers = {slot_id(slot) for slot in INTEGER_SLOTS}
    assert {"scaling.world_sizes.[]", "sensitivity.world_size", "train.max_steps_per_epoch"} <= integers


def test_the_schema_uses_only_what_the_walks_follow():
    """configcheck and the walks above follow properties, additionalProperties, items, allOf and
    $ref; a schema keyword that nests values another way would hide keys from them."""

    def keywords(node):
        if isinstance(node, dict):
            yield from node
            for value in node.values():
                yield from keywords(value)
        elif isinstance(node, list):
            for value in node:
                yield from keywords(value)

    unfollowed = {"anyOf", "oneOf", "not", "if", "patternProperties", "prefixItems", "dependentSchemas"}
    assert not unfollowed & set(keywords(SCHEMA)), "extend configcheck.problems_of and the walks here"


# --------------------------------------------------------------------------- refused or accepted


@pytest.mark.parametrize("payload", PAYLOADS)
def test_every_string_key_refuses_the_payload_naming_the_key_or_accepts_it(payload, tmp_path):
    marker = tmp_path / "marker"
    refused, accepted = classify(payload, marker)
    for slot, (message, concrete) in refused.items():
        assert names_key(message, concrete, slot), (slot, message)
    # Snakemake puts these into a shell command unquoted: they must never pass.
    for key in ("container.sif", "container.prebuilt", "container.definition"):
        assert tuple(key.split(".")) in refused, (key, payload)
    assert not marker.exists()


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("container.sif", "x;touch$IFS/tmp/f;"),
        ("container.prebuilt", "$(touch$IFS/tmp/f)"),
        ("container.definition", "containers/{x}.def"),
        ("container.python", "python;id"),
        ("nccl.NCCL_DEBUG", "$(id)"),
        ("cluster.partition", "gpu;id"),
    ],
)
def test_the_project_check_names_the_key_in_one_line(key, value):
    config = filled_demo()
    put(config, tuple(key.split(".")), value)
    with pytest.raises(configcheck.ConfigError) as caught:
        configcheck.check(config, SCHEMA_PATH)
    message = str(caught.value)
    assert key in message and repr(value) in message and "\n" not in message


@pytest.mark.parametrize(
    "value", ["containers/scalestudy.sif", "/sw/images/scalestudy-0.1+cu130.sif", "../images/a_b.sif"]
)
def test_ordinary_image_paths_pass(value):
    config = filled_demo()
    config["container"]["prebuilt"] = value
    assert refusal(config) is None
    assert cluster.container_image(config) == value


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("cluster.constraint", "a100&ib"),
        ("cluster.constraint", "[rack1|rack2]*2"),
        ("study.title", "ResNet-18 on 8x H100: 'strong' & weak {scaling}"),
        ("data.url", "https://example.org/get?file=cifar-10-python.tar.gz&token=a;b"),
        ("nccl.NCCL_SOCKET_IFNAME", "^docker0,lo"),
        ("nccl.NCCL_IB_HCA", "=mlx5_0:1,mlx5_1:1"),
        ("nccl.NCCL_DEBUG_FILE", "/tmp/nccl.%h.%p.log"),
        ("cluster.sbatch_extra", ["--mail-type=FAIL", "--comment=two words; and more"]),
    ],
)
def test_legitimate_values_with_special_characters_pass(key, value):
    config = filled_demo()
    put(config, tuple(key.split(".")), value)
    assert refusal(config) is None


# --------------------------------------------------------------------------- integers


def current(config: dict, slot: tuple):
    """The value at a slot (the first element for a list step), or None."""
    node = config
    for step in slot:
        if step == ITEM:
            node = node[0] if isinstance(node, list) and node else None
        else:
            node = node.get(step) if isinstance(node, dict) else None
    return node


def test_every_integer_key_refuses_a_float_naming_the_key():
    base = filled_demo()
    for slot in INTEGER_SLOTS:
        config = copy.deepcopy(base)
        value = current(config, slot)
        value = float(value) if isinstance(value, int) and not isinstance(value, bool) else 2.0
        concrete = put(config, slot, value)
        message = refusal(config)
        assert message is not None, slot
        assert f"{key_names(concrete)[0]} must be an integer, got {value!r}" in message, (slot, message)


@pytest.mark.parametrize("value", [True, "2"])
def test_integer_keys_refuse_booleans_and_strings(value):
    config = filled_demo()
    config["scaling"]["world_sizes"] = [1, value]
    message = refusal(config)
    assert message is not None and "world_sizes" in message


def test_the_project_check_refuses_booleans_itself():
    config = filled_demo()
    config["sensitivity"]["world_size"] = True  # what validate refuses too: the check must not rely on it
    with pytest.raises(
        configcheck.ConfigError, match=r"sensitivity\.world_size must be an integer, got True"
    ):
        configcheck.check(config, SCHEMA_PATH)


# --------------------------------------------------------------------------- settings across keys


@pytest.mark.parametrize(
    ("key", "value", "named"),
    [
        ("sensitivity.axes.world_size", [1, 2], "sensitivity.axes.world_size: world_size is set by the grid"),
        ("sensitivity.axes.data_dir", ["x"], "sensitivity.axes.data_dir: data_dir is set by the grid"),
        ("sensitivity.axes.gpt", [None], "sensitivity.axes.gpt: gpt is set by the grid or the workload"),
        ("sensitivity.axes.lerning_rate", [0.1], "sensitivity.axes.lerning_rate: no run-config key"),
        ("sensitivity.axes.precision", ["fp32", "fp8"], "sensitivity.axes.precision[1] = 'fp8' must be"),
        ("sensitivity.axes.per_gpu_batch", [16, 2.0], "sensitivity.axes.per_gpu_batch[1] = 2.0 must be"),
        ("sensitivity.axes.nesterov", [1], "sensitivity.axes.nesterov[0] = 1 must be true or false"),
        ("sensitivity.axes.lr", [0.1, -0.1], "sensitivity.axes.lr[1] = -0.1 must be a number > 0"),
        ("workload.name", "gpt", "data.source = 'cifar10' does not fit workload.name = 'gpt'"),
        ("workload.name", "command", "workload.command.script is required"),
        ("data.source", "text", "data.url = 'https://www.cs.toronto.edu/~kriz/cifar-10-py"),
        ("scaling.parallelism", ["ddp", "fsdp"], "scaling.parallelism = fsdp is for the gpt workload"),
        ("train.parallelism", "fsdp", "train.parallelism = fsdp is for the gpt workload"),
        ("sensitivity.axes.parallelism", ["fsdp"], "sensitivity.axes.parallelism = fsdp is for the gpt"),
        (
            "scaling.world_sizes",
            [1, 3],
            "scaling.world_sizes[1] = 3: scaling.strong_global_batch=64 does not split evenly over 3 ranks",
        ),
    ],
)
def test_settings_that_do_not_fit_the_grid_are_refused_naming_key_and_value(key, value, named):
    config = filled_demo()
    put(config, tuple(key.split(".")), value)
    if key == "workload.name" and value == "gpt":
        config["data"]["source"] = "cifar10"
    message = refusal(config)
    assert message is not None and named in message and "\n" not in message, message


def test_a_sweep_without_per_gpu_batch_is_refused():
    config = filled_demo()
    del config["sensitivity"]["axes"]["per_gpu_batch"]
    assert "sensitivity.axes needs per_gpu_batch" in refusal(config)


@pytest.mark.parametrize(
    "axes",
    [
        {"optimizer": ["sgd", "adamw"], "per_gpu_batch": [16], "grad_clip": [None, 1.0]},
        {"per_gpu_batch": [16, 32], "comm_hook": ["none", "fp16"], "channels_last": [True, False]},
    ],
)
def test_sweeps_over_other_run_config_keys_pass(axes):
    config = filled_demo()
    config["sensitivity"]["axes"] = axes
    assert refusal(config) is None


# --------------------------------------------------------------------------- through Snakemake


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
    result = run_workflow(workdir, config, "-n", profile=profile)
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
