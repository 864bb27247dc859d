"""scalestudy.plan.cluster: Slurm resources per grid point, launch specs, container and site settings."""

from __future__ import annotations

import math
import shlex
import subprocess
import sys

import pytest
import yaml

from scalestudy.plan import cluster, schema, slurm_requests
from tests.conftest import REPO

SCHEMA = schema.read(REPO / "config/schema.yaml")  # its sections' $refs inlined


def gpu_config(**cluster_settings) -> dict:
    return {"cluster": {"gpus_per_node": 4, **cluster_settings}}


def study_config(path: str) -> dict:
    """A config file with the schema's defaults filled in, as the Snakefile validates it."""
    from snakemake.utils import validate

    config = yaml.safe_load((REPO / path).read_text())
    validate(config, str(REPO / "config/schema.yaml"))
    return config


@pytest.mark.parametrize(
    ("section", "settings_of"), [("cluster", cluster.settings), ("container", cluster.container_settings)]
)
def test_an_empty_section_gets_every_default_of_the_schema(section, settings_of):
    properties = SCHEMA["properties"][section]["properties"]
    filled = settings_of({})
    assert filled == {key: spec.get("default") for key, spec in properties.items()}
    undocumented = [key for key, spec in properties.items() if not spec.get("description")]
    assert not undocumented, f"{section} settings without a description: {undocumented}"


@pytest.mark.parametrize(
    ("world", "nodes", "per_node"), [(1, 1, 1), (2, 1, 2), (4, 1, 4), (8, 2, 4), (16, 4, 4), (6, 2, 3)]
)
def test_layout_uses_as_few_nodes_as_fit_one_rank_per_gpu(world, nodes, per_node):
    assert cluster.layout(gpu_config(), world) == (nodes, per_node)
    resources = cluster.train_resources(gpu_config(), world, 1)
    assert resources["nodes"] == nodes
    assert resources["tasks"] == world
    assert resources["gres"] == f"gpu:{per_node}"
    assert f"--ntasks-per-node={per_node}" in shlex.split(resources["slurm_extra"])


def test_a_world_that_does_not_split_evenly_is_refused_with_the_numbers():
    with pytest.raises(ValueError, match=r"world size 5 .* 2 nodes of at most 4"):
        cluster.layout(gpu_config(), 5)


def test_ranks_per_node_overrides_gpus_per_node_and_cpu_nodes_request_no_gpus():
    config = {"cluster": {"gpus_per_node": 0, "ranks_per_node": 1}}
    assert cluster.layout(config, 2) == (2, 1)
    assert cluster.train_resources(config, 2, 1)["gres"] is None
    with pytest.raises(ValueError, match="ranks_per_node must be set"):
        cluster.settings({"cluster": {"gpus_per_node": 0}})
    with pytest.raises(ValueError, match="exceeds cluster.gpus_per_node=4"):
        cluster.train_resources(gpu_config(ranks_per_node=8), 8, 1)


def test_gpu_type_goes_into_the_gres():
    assert cluster.train_resources(gpu_config(gpu_type="a100"), 8, 1)["gres"] == "gpu:a100:4"


def test_every_call_returns_every_key_with_plain_values():
    configs = [gpu_config(), {"cluster": {"gpus_per_node": 0, "ranks_per_node": 2}}, gpu_config(account="x")]
    for config in configs:
        for world in (1, 2, 8):
            for attempt in (1, 2, 5):
                resources = cluster.train_resources(config, world, attempt)
                assert tuple(resources) == cluster.TRAIN_RESOURCE_KEYS
                assert all(value is None or isinstance(value, int | str) for value in resources.values())
                light = cluster.light_resources(config, attempt)
                assert tuple(light) == cluster.LIGHT_RESOURCE_KEYS


def test_runtime_and_memory_grow_with_the_attempt_up_to_the_cap():
    config = gpu_config(runtime_minutes=60, runtime_growth=2.0, max_runtime_minutes=200, mem_growth=1.5)
    runtimes = [cluster.train_resources(config, 4, attempt)["runtime"] for attempt in (1, 2, 3)]
    memory = [cluster.train_resources(config, 4, attempt)["mem_mb"] for attempt in (1, 2, 3)]
    assert runtimes == [60, 120, 200]
    per_node = SCHEMA["properties"]["cluster"]["properties"]["mem_mb_per_rank"]["default"] * 4
    assert memory == [per_node, math.ceil(per_node * 1.5), math.ceil(per_node * 2.25)]
    with pytest.raises(ValueError, match="attempt must be an integer >= 1"):
        cluster.train_resources(config, 4, 0)


def test_one_rank_jobs_still_run_the_shell_in_the_batch_step():
    # The jobstep plugin checks that the key exists; the submit plugin refuses a truthy mpi with one task.
    assert cluster.train_resources(gpu_config(), 1, 1)["mpi"] == ""
    assert cluster.train_resources(gpu_config(), 2, 1)["mpi"] == "srun"


def test_slurm_extra_signals_the_ranks_not_the_batch_shell_and_quotes_user_options():
    hostile = "--comment=x; touch /tmp/pwned 'q'"
    config = gpu_config(signal_lead_s=120, exclusive=True, sbatch_extra=[hostile, "--mail-type=FAIL"])
    options = shlex.split(cluster.train_resources(config, 8, 1)["slurm_extra"])
    assert options == ["--ntasks-per-node=4", "--signal=USR1@120", "--exclusive", hostile, "--mail-type=FAIL"]
    without = shlex.split(cluster.train_resources(gpu_config(signal_lead_s=0), 8, 1)["slurm_extra"])
    assert not any(option.startswith("--signal") for option in without)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"gpus_per_node": "4"}, "cluster.gpus_per_node must be an integer >= 0, got '4'"),
        ({"partition": "gpu; rm -rf /"}, "cluster.partition must be null or a name"),
        ({"runtime_minutes": 2, "signal_lead_s": 120}, "signal_lead_s=120 must be shorter"),
        ({"launcher": "mpirun"}, "cluster.launcher must be one of"),
        ({"partiton": "gpu"}, r"unknown cluster setting\(s\) \['partiton'\]"),
        ({"runtime_growth": 0.5}, "cluster.runtime_growth must be a number >= 1"),
        ({"sbatch_extra": "--exclusive"}, "sbatch_extra must be a list"),
    ],
)
def test_bad_settings_are_refused_naming_the_key_and_value(settings, message):
    with pytest.raises(ValueError, match=message):
        cluster.settings({"cluster": settings})


def test_light_jobs_use_the_cpu_partition_else_the_gpu_one():
    assert cluster.light_resources(gpu_config(partition="gpu"), 1)["slurm_partition"] == "gpu"
    config = gpu_config(partition="gpu", cpu_partition="cpu", account="proj")
    light = cluster.light_resources(config, 1)
    assert (light["slurm_partition"], light["slurm_account"]) == ("cpu", "proj")
    train = cluster.train_resources(config, 2, 1)
    assert (train["slurm_partition"], train["slurm_account"]) == ("gpu", "proj")


def test_submit_host_rules_are_glob_patterns():
    config = {"cluster": {}}
    assert cluster.on_submit_host(config, "fetch")
    assert cluster.on_submit_host(config, "profile_figure_breakdown")
    assert not cluster.on_submit_host(config, "preprocess")
    assert not cluster.on_submit_host(config, "scaling_run")
    assert cluster.on_submit_host(config, "track") and cluster.on_submit_host(config, "training_gate")
    assert cluster.on_submit_host({"cluster": {"submit_host_rules": ["pre*"]}}, "preprocess")


def test_the_submit_host_rules_are_one_list_checked_against_the_rules_that_exist():
    rules = ["fetch", "preprocess", "table_runs", "figure_x", "paper_draft", "scaling_run", "training_gate"]
    chosen = cluster.submit_host_rules({"cluster": {}}, rules, ["training_gate"], optional=["build_image"])
    # the defaults: fetch, build_image (left out by this config), *figure*, table_*, paper*
    assert chosen == ["fetch", "figure_x", "paper_draft", "table_runs", "training_gate"]
    typo = {"cluster": {"submit_host_rules": ["tabel_*"]}}
    with pytest.raises(ValueError, match=r"cluster.submit_host_rules: 'tabel_\*' matches no rule"):
        cluster.submit_host_rules(typo, rules, [])
    with pytest.raises(ValueError, match=r"\['traning_gate'\] are no rules of the workflow"):
        cluster.submit_host_rules({"cluster": {}}, rules, always=["traning_gate"], optional=["build_image"])


def test_the_image_is_built_unless_a_prebuilt_one_is_named():
    assert cluster.container_image({}) == "containers/scalestudy.sif"
    assert cluster.image_build_target({}) == "containers/scalestudy.sif"
    prebuilt = {"container": {"prebuilt": "/sw/images/scalestudy-0.1.sif"}}
    assert cluster.container_image(prebuilt) == "/sw/images/scalestudy-0.1.sif"
    assert cluster.image_build_target(prebuilt) is None
    for bad in ("my image.sif", "docker://pytorch/pytorch"):
        with pytest.raises(ValueError, match="container.prebuilt must be a local path"):
            cluster.container_image({"container": {"prebuilt": bad}})


@pytest.mark.parametrize(
    "bad", ["x;touch$IFS/tmp/f;", "$(touch$IFS/tmp/f)", "a`id`.sif", "containers/{name}.sif", "-x.sif", "a'b"]
)
@pytest.mark.parametrize("key", ["sif", "prebuilt", "definition", "python"])
def test_container_paths_with_shell_syntax_are_refused_naming_the_key(key, bad):
    """Issue 13: Snakemake puts the image path unquoted into its `apptainer exec` command."""
    with pytest.raises(ValueError, match=f"container.{key} must be a local path of letters") as caught:
        cluster.container_settings({"container": {key: bad}})
    assert repr(bad) in str(caught.value)


@pytest.mark.parametrize("bad", ["$(id)", "a;b", "eth0 eth1", "`id`", "x\ny"])
def test_nccl_values_with_shell_syntax_are_refused_naming_the_variable(bad):
    with pytest.raises(ValueError, match="nccl.NCCL_SOCKET_IFNAME must be an environment value"):
        cluster.nccl_env({"nccl": {"NCCL_SOCKET_IFNAME": bad}})


def test_nccl_list_and_exclusion_syntax_passes():
    values = {
        "NCCL_SOCKET_IFNAME": "^docker0,lo",
        "NCCL_IB_HCA": "=mlx5_0:1",
        "NCCL_DEBUG_FILE": "/t/n.%h.%p",
    }
    assert cluster.nccl_env({"nccl": {**values, "NCCL_IB_DISABLE": True}}) == {
        **values,
        "NCCL_IB_DISABLE": "1",
    }


def test_the_schema_carries_the_patterns_the_code_checks():
    from scalestudy.plan import patterns

    container, site = (
        SCHEMA["properties"]["container"]["properties"],
        SCHEMA["properties"]["cluster"]["properties"],
    )
    for key in ("sif", "prebuilt", "definition", "python"):
        assert container[key]["pattern"] == patterns.SAFE_PATH, key
    for key in ("partition", "cpu_partition", "account", "qos", "gpu_type"):
        assert site[key]["pattern"] == patterns.SLURM_NAME, key
    assert site["constraint"]["pattern"] == patterns.SLURM_CONSTRAINT
    assert site["submit_host_rules"]["items"]["pattern"] == patterns.RULE_GLOB
    assert SCHEMA["properties"]["nccl"]["additionalProperties"]["pattern"] == patterns.ENV_VALUE


def test_launch_spec_carries_the_layout_the_nccl_environment_and_the_image_when_containerized():
    config = gpu_config(cpus_per_rank=6)
    config["nccl"] = {"NCCL_SOCKET_IFNAME": "ib0", "NCCL_IB_DISABLE": False, "NCCL_BUFFSIZE": 4194304}
    spec = cluster.launch_spec(config, 8)
    assert spec["nodes"] == 2 and spec["tasks_per_node"] == 4 and spec["cpus_per_task"] == 6
    assert spec["gres"] == "gpu:4" and spec["image"] is None
    assert spec["env"] == {
        "OMP_NUM_THREADS": "6",
        "MKL_NUM_THREADS": "6",
        "OPENBLAS_NUM_THREADS": "6",
        "NCCL_SOCKET_IFNAME": "ib0",
        "NCCL_IB_DISABLE": "0",
        "NCCL_BUFFSIZE": "4194304",
    }
    assert cluster.launch_spec(config, 8, containerized=True)["image"] == "containers/scalestudy.sif"
    with pytest.raises(ValueError, match="not a valid environment variable name"):
        cluster.launch_spec({"nccl": {"NCCL X": "1"}}, 1)


@pytest.fixture(scope="module")
def real_study() -> dict:
    return study_config("config/config.yaml")


def test_the_real_study_requests_whole_gpu_nodes_per_grid_point(real_study):
    """config/config.yaml: 4 GPUs per node; world 8 = 2 nodes x 4 GPUs, 16 = 4 x 4."""
    for world in real_study["scaling"]["world_sizes"]:
        resources = cluster.train_resources(real_study, world, 1)
        per_node = min(world, 4)
        assert resources["nodes"] == math.ceil(world / 4)
        assert resources["gres"] == f"gpu:{per_node}"
        assert resources["mem_mb"] == per_node * real_study["cluster"]["mem_mb_per_rank"]


def plugin_sbatch(config: dict, world: int, attempt: int = 1) -> list[str]:
    pytest.importorskip("snakemake_executor_plugin_slurm")
    resources = cluster.train_resources(config, world, attempt)
    return shlex.split(slurm_requests.sbatch_command(resources, threads=world))


@pytest.mark.parametrize("world", [1, 2, 4, 8, 16])
def test_the_executor_plugin_turns_the_resources_into_the_expected_sbatch_options(real_study, world):
    """The plugin's own sbatch builder (2.8.0): the options a user expects, nothing it adds on top."""
    options = plugin_sbatch(real_study, world)
    nodes, per_node = math.ceil(world / 4), min(world, 4)
    for expected in (
        f"--nodes={nodes}",
        f"--ntasks-per-node={per_node}",
        f"--gres=gpu:{per_node}",
        f"--cpus-per-task={real_study['cluster']['cpus_per_rank']}",
        f"--signal=USR1@{real_study['cluster']['signal_lead_s']}",
    ):
        assert expected in options, (expected, options)
    assert (f"--ntasks={world}" in options) == (world > 1)  # one task is sbatch's default
    assert not any(option.startswith("--ntasks-per-gpu") for option in options)
    assert options[options.index("-t") + 1] == str(real_study["cluster"]["runtime_minutes"])


def test_the_plugin_refuses_nothing_of_ours_and_quotes_a_hostile_account(real_study):
    config = {**real_study, "cluster": {**real_study["cluster"], "account": "proj-1"}}
    options = plugin_sbatch(config, 8, attempt=2)
    assert options[options.index("-A") + 1] == "proj-1"
    assert options[options.index("-t") + 1] == str(2 * real_study["cluster"]["runtime_minutes"])


def test_the_preview_command_prints_every_grid_point(tmp_path):
    pytest.importorskip("snakemake_executor_plugin_slurm")
    result = subprocess.run(
        [sys.executable, "-m", "scalestudy.plan.slurm_requests", "--configfile", "config/config.yaml"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert "scaling strong/w8_r0: world 8 = 2 node(s) x 4 rank(s), --gres=gpu:4 per node" in result.stdout
    assert "scaling weak/w16_r2: world 16 = 4 node(s) x 4 rank(s)" in result.stdout


def test_the_controller_modules_import_no_heavy_library():
    code = (
        "import sys, scalestudy.plan.cluster, scalestudy.launch.launcher;"
        "heavy = [m for m in ('torch', 'numpy', 'pandas') if m in sys.modules];"
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
