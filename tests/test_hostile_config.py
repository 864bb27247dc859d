"""Hostile and malformed config values, refused or accepted before anything runs (issue 13;
docs/reference/robustness.md lists what the user sees).

Every string a user can set in the config -- found by walking config/schema.yaml
(tests/hostile_helpers.py), so a key added later is covered without touching this file -- is filled
in turn with shell metacharacters. Each value must be refused before any job is planned, by an error
naming its key, or be accepted; tests/test_hostile_snakemake.py checks that the accepted ones reach
their commands as one literal argument. Integer keys must refuse floats such as 2.0, which JSON Schema
counts as integers, and settings that do not fit the grid are refused naming key and value.
"""

from __future__ import annotations

import copy

import pytest

from scalestudy.plan import cluster, configcheck
from tests.hostile_helpers import (
    INTEGER_SLOTS,
    ITEM,
    PAYLOADS,
    SCHEMA,
    SCHEMA_PATH,
    STRING_SLOTS,
    classify,
    filled_demo,
    key_names,
    names_key,
    put,
    refusal,
    slot_id,
)

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
        ("data.url", "https://example.org/get?file=cifar-10-python.tar.gz&part=a;b"),
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
        ("data.source", "text", "data.source = 'text' does not fit workload.name = 'resnet18-cifar10'"),
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


@pytest.mark.parametrize(
    ("key", "value"), [("train.micro_batch", 4), ("sensitivity.axes.micro_batch", [4, 8])]
)
def test_a_setting_the_command_workload_ignores_is_refused_naming_it(key, value):
    """Gradient accumulation is the trainer's: a script runs its own steps, so a command study with
    train.micro_batch (or a sweep over it) is refused in one line naming it; the ResNet takes it."""
    config = filled_demo()
    put(config, tuple(key.split(".")), value)
    assert refusal(config) is None  # the ResNet accumulates: 4 and 8 divide the demo's batches
    config["workload"] = {**config.get("workload", {}), "name": "command", "command": {"script": "x.py"}}
    message = refusal(config)
    assert message is not None and "\n" not in message, message
    assert f"{key} is ignored by workload.name = 'command' (gradient accumulation" in message, message


def test_a_text_corpus_is_not_looked_for_under_cifar10s_address():
    config = filled_demo()
    config["workload"]["name"], config["data"]["source"] = "gpt", "text"
    message = refusal(config)
    assert "data.url = 'https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz' is CIFAR-10's" in message
    assert (
        "data.size_bytes = 170498071 is CIFAR-10's archive's (the default): give the text corpus's" in message
    )
    config["data"].update(url="https://example.org/corpus.txt", md5="0" * 32, size_bytes=1000)
    assert refusal(config) is None


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
