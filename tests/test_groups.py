"""The short Slurm jobs grouped (scalestudy/plan/groups.py): the shape each group asks for, as
Snakemake's own group sizing computes it, and the profiles that turn the groups on. Fast: no
workflow run (tests/test_slurm.py runs the groups on the real test cluster)."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
import yaml

from scalestudy.plan import cluster, grid, groups
from tests.conftest import REPO

CONFIGS = ("config/demo.yaml", "config/config.yaml")
PROFILES = ("profiles/slurm", "profiles/slurm-noapptainer")


def load(name: str) -> dict:
    return yaml.safe_load((REPO / name).read_text())


def member_worlds(config: dict) -> list[int]:
    """The world sizes of the preflight's training-shaped members (site check, system, smoke, comm)."""
    worlds = {point.world_size for point in grid.all_points(config)}
    scaling = config["scaling"]["world_sizes"]
    return sorted({min(2, max(worlds)), max(worlds), 1, max(scaling), *(w for w in scaling if w > 1)})


def group_shape(members: list[dict], constraints: dict) -> dict:
    """Snakemake's size of a group whose members all depend on the first (the site check)."""
    from snakemake.resources import GroupResources, Resources

    jobs = [SimpleNamespace(resources=resources, pipe_group=None) for resources in members]
    levels = [jobs[:1], jobs[1:]]
    return GroupResources.basic_layered(levels, Resources.from_mapping(constraints), run_local=False)


@pytest.mark.parametrize("name", CONFIGS)
def test_the_preflight_group_is_its_largest_member_for_the_sum_of_their_wall_times(name):
    pytest.importorskip("snakemake")
    config = load(name)
    runtimes = [15, 60, 60, 60, 60, 60]
    members = [
        {k: v for k, v in groups.preflight_resources(config, runtime, 1).items() if v is not None}
        for runtime in runtimes
    ]
    # Snakemake refuses a group whose members' string resources differ: one shape for all
    strings = {key for key, value in members[0].items() if isinstance(value, str)}
    assert all(
        {key: member[key] for key in strings} == {key: members[0][key] for key in strings}
        for member in members
    )
    shape = group_shape(members, {groups.SLOT: 1})
    world = groups.preflight_world(config)
    nodes, per_node = cluster.layout(config, world)
    assert (shape["nodes"], shape["tasks"], shape["runtime"]) == (nodes, world, sum(runtimes)), shape
    assert shape["mem_mb"] == cluster.train_resources(config, world, 1)["mem_mb"]
    assert "--signal" not in shape.get("slurm_extra", "")  # nothing in the preflight checkpoints
    # without the one slot, members that could run side by side would be summed: wrong
    assert group_shape(members, {})["nodes"] == nodes * (len(members) - 1)
    for member_world in member_worlds(config):  # every member's ranks fit in the allocation
        member_nodes, member_per_node = cluster.layout(config, member_world)
        assert member_nodes <= nodes and member_per_node <= per_node, (member_world, world)


def test_the_summaries_group_is_one_light_job():
    pytest.importorskip("snakemake")
    config = load("config/config.yaml")
    members = [groups.summary_resources(config, 1) for _ in range(5)]
    shape = group_shape(members, {groups.SLOT: 1})
    light = cluster.light_resources(config, 1)
    assert (shape["cpus_per_task"], shape["mem_mb"]) == (light["cpus_per_task"], light["mem_mb"])
    assert shape["runtime"] == 5 * light["runtime"]


def test_groups_are_active_only_where_jobs_are_submitted_with_the_slot():
    assert groups.active(True, {groups.SLOT: 1})
    assert not groups.active(False, {groups.SLOT: 1})  # the local executor, a dry run
    assert not groups.active(True, {groups.SLOT: 0}) and not groups.active(True, {})
    assert groups.group_of("smoke_step") == groups.PREFLIGHT
    assert groups.group_of("profile_nsys_stats") == groups.SUMMARIES
    with pytest.raises(KeyError, match="scaling_run"):
        groups.group_of("scaling_run")  # training points are never grouped


@pytest.mark.parametrize("profile", PROFILES)
def test_the_slurm_profiles_turn_the_groups_on(profile):
    settings = load(f"{profile}/config.yaml")
    assert f"{groups.SLOT}=1" in settings["resources"]
    assert {item.split("=")[0] for item in settings["group-components"]} == set(groups.GROUPS)


def test_every_group_member_is_a_rule_of_the_workflow():
    rules = (REPO / "rules").glob("*.smk")
    text = "\n".join(path.read_text() for path in rules)
    for group, members in groups.GROUPS.items():
        for rule in members:
            # one line, or two as snakefmt writes a directive
            assert re.search(rf'group:\s+short_job_group\("{rule}"\)', text), (group, rule)
