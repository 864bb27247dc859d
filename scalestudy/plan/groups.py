"""The short Slurm jobs grouped: a few allocations for the checks and summaries that take seconds.

On Slurm (profiles/slurm, profiles/slurm-noapptainer) the preflight jobs -- data preparation, the
site check, the system description, the smoke tests and the collective benchmark per world size --
are ONE Snakemake group, i.e. one sbatch; the profiling summaries (nsys stats, summary and combine
per profiled world size) another. Inside a group job the jobstep plugin runs one Snakemake with
`--jobs 1`: the members run one after another, each starting its own ranks with srun as it would
in a job of its own. The group therefore asks for its LARGEST member's shape (the grid's largest
world size for the preflight; one light CPU job for the summaries) and the sum of its members'
wall times:

- every member of a group declares the group's shape (`preflight_resources`,
  `summary_resources`): Snakemake requires the string resources (`mpi`, `gres`, `slurm_extra`,
  the partition) of a group's members to be equal, and the preflight's mix 1-rank and n-rank
  shapes. Each member still starts only its own ranks (its launch spec), inside the allocation;
- every member holds one `grouped` slot and the profile provides one (`resources: [grouped=1]`):
  Snakemake then puts each member in a layer of its own when it sizes the group, so the group is
  max(shape) x sum(wall time), not the sum of the shapes of members that could run side by side;
- the group's Snakemake runs in the job's batch step (the plugin's `--wrap`), and it runs each
  member as it would run that member's own job: a member with the `mpi` key (every preflight
  member, as every training job) in the batch step, where its srun starts the ranks as a step of
  the allocation; a light member as `srun -n1` (the summaries). No srun is ever nested in another
  step. Inside the job Snakemake gets no `grouped` slot: each member has its own shape there.

Groups are active only where jobs are submitted (not the local executor, not a dry run) and the
profile provides the `grouped` slot: `--resources grouped=0` submits every job on its own (what
tests/test_slurm.py does to count the sbatch calls before). Pure standard library (the Snakefile
imports it). `python -m scalestudy.plan.groups --configfile <config>` prints the groups.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

from scalestudy.plan import cluster, grid

SLOT = "grouped"  # the resource that makes Snakemake size a group as its largest member
PREFLIGHT = "preflight"
SUMMARIES = "profile_summaries"
GROUPS: dict[str, tuple[str, ...]] = {
    PREFLIGHT: ("preprocess", "site_check", "system", "smoke_io", "smoke_step", "comm_bench"),
    SUMMARIES: ("profile_nsys_stats", "profile_summary", "profile_combine"),
}
RESOURCE_KEYS: tuple[str, ...] = (*cluster.TRAIN_RESOURCE_KEYS, SLOT)


def slots(global_resources: Mapping[str, Any]) -> int:
    """The `grouped` slots Snakemake was given (`--resources grouped=N`, the profile's resources)."""
    value = global_resources.get(SLOT)
    value = getattr(value, "value", value)  # Snakemake 9 keeps Resource objects
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def active(submits_jobs: bool, global_resources: Mapping[str, Any]) -> bool:
    """Whether the short jobs go into groups: jobs are submitted and a `grouped` slot is given."""
    return submits_jobs and slots(global_resources) >= 1


def group_of(rule_name: str) -> str:
    """The group a rule belongs to (KeyError: none)."""
    for group, rules in GROUPS.items():
        if rule_name in rules:
            return group
    raise KeyError(f"rule {rule_name!r} is in no group of short jobs (scalestudy.plan.groups.GROUPS)")


def preflight_world(config: dict) -> int:
    """The preflight group's shape: the grid's largest world size (that of the system description,
    which spans every node a training job can; every other preflight member needs no more)."""
    return grid.largest_world_size(config)


def preflight_resources(config: dict, runtime_minutes: int, attempt: int) -> dict[str, Any]:
    """A preflight member's resources in the group: a training job of `preflight_world` ranks
    without the training jobs' --signal (nothing in the preflight checkpoints), its own wall time."""
    resources = cluster.train_resources(config, preflight_world(config), attempt)
    extra = [option for option in shlex.split(resources["slurm_extra"]) if not option.startswith("--signal")]
    resources.update(
        runtime=runtime_minutes,
        slurm_extra=" ".join(shlex.quote(option) for option in extra),
        **{SLOT: 1},
    )
    return resources


def summary_resources(config: dict, attempt: int) -> dict[str, Any]:
    """A profiling summary's resources in the group: a light CPU job."""
    return {**cluster.light_resources(config, attempt), SLOT: 1}


def plan(config: dict) -> dict[str, str]:
    """{group: 'rules -> one sbatch of <shape>'} for a config (what `main` prints)."""
    world = preflight_world(config)
    nodes, per_node = cluster.layout(config, world)
    light = cluster.light_resources(config, 1)
    return {
        PREFLIGHT: f"{', '.join(GROUPS[PREFLIGHT])} -> one job of {nodes} node(s) x {per_node} rank(s) "
        f"(world {world}), the members one after another",
        SUMMARIES: f"{', '.join(GROUPS[SUMMARIES])} -> one job of {light['cpus_per_task']} CPU(s), "
        f"{light['mem_mb']} MB, the members one after another",
    }


def main(argv: list[str] | None = None) -> int:
    """Print the groups of short Slurm jobs for a config."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m scalestudy.plan.groups", description=main.__doc__)
    parser.add_argument("--configfile", default="config/config.yaml")
    args = parser.parse_args(argv)
    # (imported here: slurm_requests uses PyYAML and Snakemake; the Snakefile imports this module)
    from scalestudy.plan import studyconfig

    config = studyconfig.load(args.configfile)
    for group, text in plan(config).items():
        print(f"{group}: {text}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
