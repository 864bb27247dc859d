"""Job arrays computed from the config (scalestudy.plan.arrays) and the allocation's bounds
(scalestudy.launch.allocation): fast, no cluster (the cluster runs are tests/test_slurm_scale.py)."""

from __future__ import annotations

import copy

import pytest
import yaml

from scalestudy.launch import allocation
from scalestudy.plan import arrays
from tests.conftest import REPO


@pytest.fixture(scope="module")
def demo() -> dict:
    return yaml.safe_load((REPO / "config/demo.yaml").read_text())


def test_only_a_rule_whose_points_share_one_shape_is_an_array(demo):
    verdicts = arrays.array_rules(demo)
    assert verdicts["sensitivity_run"] is None  # 8 points, all at sensitivity.world_size 2
    assert "2 different shapes" in verdicts["scaling_run"] and "world 1:" in verdicts["scaling_run"]
    assert "single point" in verdicts["baseline_run"]
    assert arrays.check_setting(demo, "sensitivity_run, table_runs") == {"sensitivity_run"}
    assert arrays.check_setting(demo, "baseline_run") == set()  # one job: the plugin submits it plainly


@pytest.mark.parametrize("setting", ["all", "scaling_run", "sensitivity_run;profile_run"])
def test_a_setting_that_mixes_shapes_is_refused_naming_the_rule_and_its_shapes(demo, setting):
    with pytest.raises(arrays.ArrayError) as refused:
        arrays.check_setting(demo, setting)
    message = str(refused.value)
    assert "different shapes" in message and "Safe for this config: sensitivity_run" in message
    offending = {"all": ["scaling_run", "profile_run"], "scaling_run": ["scaling_run"]}
    for rule in offending.get(setting, ["profile_run"]):
        assert f"  {rule}: its points have 2 different shapes (world 1: 1 node(s)" in message


def test_points_on_two_nodes_are_never_an_array(demo):
    config = copy.deepcopy(demo)
    config["cluster"]["ranks_per_node"] = 1  # sensitivity's world 2 now spans two nodes
    assert "span 2 nodes" in arrays.array_rules(config)["sensitivity_run"]
    with pytest.raises(arrays.ArrayError, match="sensitivity_run: its points span 2 nodes"):
        arrays.check_setting(config, "sensitivity_run")
    with pytest.raises(arrays.ArrayError, match="needs 2 nodes"):
        arrays.array_train_resources(config, 2, 1)


def test_an_array_rule_with_more_points_than_snakemake_hands_over_at_once_is_refused(demo):
    """The plugin 2.8.0 never submits an array rule's jobs handed over while others still wait: a
    sweep larger than --jobs, or than twice --max-jobs-per-timespan, would hang, so it is refused
    with the settings it needs."""
    assert arrays.check_setting(demo, "sensitivity_run", jobs=8, per_timespan=4) == {"sensitivity_run"}
    with pytest.raises(arrays.ArrayError, match=r"sensitivity_run has 8 points, .*--jobs=7.* at least 8 "):
        arrays.check_setting(demo, "sensitivity_run", jobs=7, per_timespan=100)
    with pytest.raises(arrays.ArrayError, match=r"--max-jobs-per-timespan to at least 4/1s"):
        arrays.check_setting(demo, "sensitivity_run", jobs=200, per_timespan=3)
    # chunks of at most --max-jobs-per-timespan (slurm-array-limit): every hand-over is submitted
    assert arrays.check_setting(demo, "sensitivity_run", jobs=8, per_timespan=3, chunk=3) == {
        "sensitivity_run"
    }
    assert arrays.check_setting(demo, "", jobs=1, per_timespan=1) == set()  # no arrays: any limits


def test_an_array_task_holds_its_nodes_cpus_in_one_task_without_the_mpi_key(demo):
    config = copy.deepcopy(demo)
    config["cluster"].update(cpus_per_rank=3, sbatch_extra=["--reservation=big one"])
    resources = arrays.array_train_resources(config, 2, attempt=2)
    assert "mpi" not in resources and resources["tasks"] == 1 and resources["nodes"] == 1
    assert resources["cpus_per_task"] == 6  # 2 ranks x 3 CPUs
    assert resources["slurm_extra"] == "--signal=USR1@120 '--reservation=big one'"
    assert resources["runtime"] == 20 and resources["mem_mb"] == 3000  # grown with the attempt


ENV = {"SLURM_JOB_ID": "18", "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_CPUS_PER_NODE": "4(x2)"}


def test_snakemake_is_bound_to_what_the_allocation_holds():
    held = allocation.allocation({**ENV, "SLURM_MEM_PER_NODE": "7000", "SLURM_GPUS_ON_NODE": "4"})
    assert held == {"nodes": 2, "cpus": 8, "gpus": 8, "mem_mb": 14000}
    assert allocation.snakemake_args(held) == [
        "--cores", "8", "--resources", "nodes=2", "tasks=8", "mem_mb=14000",
    ]  # fmt: skip
    cpu_only = allocation.allocation({**ENV, "SLURM_JOB_CPUS_PER_NODE": "4,2", "SLURM_TRES_PER_NODE": ""})
    assert allocation.snakemake_args(cpu_only) == ["--cores", "6", "--resources", "nodes=2", "tasks=6"]
    assert allocation.allocation({**ENV, "SLURM_TRES_PER_NODE": "gres/gpu:a100=4"})["gpus"] == 8
    command = allocation.command(["snakemake", "--profile", "profiles/slurm-allocation"], ENV)
    assert command[1:3] == ["--profile", "profiles/slurm-allocation"]
    assert command[-2:] == ["nodes=2", "tasks=8"]


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({}, "not inside a Slurm allocation"),
        ({**ENV, "SLURM_JOB_CPUS_PER_NODE": "4"}, r"names 1 node\(s\), job 18 has 2"),
        ({**ENV, "SLURM_JOB_CPUS_PER_NODE": "four"}, "not a per-node list"),
    ],
)
def test_outside_an_allocation_or_with_odd_variables_it_says_why(environ, message, monkeypatch, capsys):
    with pytest.raises(allocation.AllocationError, match=message):
        allocation.allocation(environ)
    for name in list(ENV) + ["SLURM_NNODES"]:
        monkeypatch.delenv(name, raising=False)
    assert allocation.main(["--print", "--", "--profile", "profiles/slurm-allocation"]) == 2
    assert "not inside a Slurm allocation" in capsys.readouterr().err
