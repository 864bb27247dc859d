"""Which training rules may be submitted as Slurm job arrays, computed from the config.

snakemake-executor-plugin-slurm 2.8.0 submits a rule's ready jobs as ONE array when the rule is
named in `--slurm-array-jobs` (profile key `slurm-array-jobs`), and builds that array's sbatch
call from the FIRST job's resources: every task gets its nodes, CPUs, memory, GPUs and time. An
array is therefore only right for a rule whose every job has the same shape. For the training
rules (`<stage>_run`) the shape follows from the point's world size alone (scalestudy.plan.cluster
.train_resources), so a rule is safe when all its points have one world size: the sensitivity sweep
(one `sensitivity.world_size`), the repeats of one scaling point, the baseline.

Measured on the test cluster with the plugin 2.8.0 and snakemake-executor-plugin-slurm-jobstep
0.6.1: a job with an `mpi` resource (every training job here, so that its shell runs once in the
batch step and srun starts the ranks) runs the FIRST task's command in EVERY task of an array (the
jobstep plugin checks `mpi` before the array index): the other tasks' outputs never appear. Arrays
of training points therefore use `array_train_resources`: no `mpi` key, one task holding all the
node's CPUs. The jobstep plugin runs an array task's command in the batch step, so the launcher
still starts the ranks with srun (`--signal` reaches them), inside the task's CPUs (measured: the
demo's 8 sensitivity points, one array, each task its own point). This limits arrays to points on
ONE node; multi-node shapes stay one job per point.

`python -m scalestudy.plan.arrays --configfile config/config.yaml` prints the rules that are safe
and the `--slurm-array-jobs` value; `--check RULES` refuses (exit 2) a setting that would put points
of different shapes into one array. Pure standard library.
"""

from __future__ import annotations

from typing import Any

from scalestudy import contract
from scalestudy.plan import cluster, grid

# Training rules and the stage whose points they run (rules/<stage>.smk).
TRAIN_RULES = {f"{stage}_run": stage for stage in ("baseline", "scaling", "sensitivity", "profile")}


class ArrayError(ValueError):
    """A `slurm-array-jobs` setting that would give some array task the wrong resources."""


def rule_world_sizes(config: dict) -> dict[str, dict[int, int]]:
    """{training rule: {world size: number of its points}} for the config's grid."""
    sizes: dict[str, dict[int, int]] = {rule: {} for rule in TRAIN_RULES}
    for point in grid.all_points(config):
        rule = f"{point.stage}_run"
        if rule in sizes:
            sizes[rule][point.world_size] = sizes[rule].get(point.world_size, 0) + 1
    return sizes


def shape(config: dict, world_size: int) -> str:
    """'world 8: 2 node(s) x 4 rank(s), gpu:4 per node, 8 CPUs/rank, 64000 MB/node, 60 min'."""
    resources = cluster.train_resources(config, world_size, 1)
    nodes, per_node = cluster.layout(config, world_size)
    return (
        f"world {world_size}: {nodes} node(s) x {per_node} rank(s), "
        f"{resources['gres'] or 'no GPU'} per node, "
        f"{resources['cpus_per_task']} CPUs/rank, {resources['mem_mb']} MB/node, {resources['runtime']} min"
    )


def why_not(config: dict, rule: str, sizes: dict[int, int]) -> str | None:
    """Why `rule`'s jobs may not be one array (None: they may)."""
    if not sizes:
        return "it has no points in this config"
    if len(sizes) > 1:
        shapes = "; ".join(shape(config, world) for world in sorted(sizes))
        return (
            f"its points have {len(sizes)} different shapes ({shapes}): the plugin would give every task "
            "the first job's resources"
        )
    ((world, count),) = sizes.items()
    nodes, _ = cluster.layout(config, world)
    if nodes > 1:
        return (
            f"its points span {nodes} nodes (world {world}): an array task runs in a one-task step "
            "(plugin 2.8.0 runs the first task's command in every task of an `mpi` job)"
        )
    if count < 2:
        return "it has a single point (nothing to gain)"
    return None


def array_rules(config: dict) -> dict[str, str | None]:
    """{training rule: None if it may be an array, else why not}."""
    return {rule: why_not(config, rule, sizes) for rule, sizes in rule_world_sizes(config).items()}


def parse_setting(setting: str | None) -> set[str]:
    """The plugin's `slurm-array-jobs` value ("rule1, rule2", ";" also separates) as a set."""
    return {name.strip() for name in (setting or "").replace(";", ",").split(",") if name.strip()}


def check_jobs(
    config: dict, rules: set[str], jobs: int | None, per_timespan: int | None = None, chunk: int | None = None
) -> None:
    """ArrayError where an array rule has more points than Snakemake hands over safely. Read from the
    plugin 2.8.0 (run_jobs): it submits an array rule's jobs only when no other job of the rule is
    still ready (or a full `slurm-array-limit` chunk is there); jobs handed over while
    others still wait are never submitted, and Snakemake waits for them forever. Snakemake hands
    over at most `jobs` (`--jobs`, the profile's `jobs:`) in flight and `per_timespan`
    (`--max-jobs-per-timespan`, default 100/1s) at a time, so N points are safe when N <= jobs and
    N <= 2 x per_timespan (measured: 200 points went as two arrays of 100), or, where a hand-over
    always holds a full chunk (`chunk`: `slurm-array-limit` <= per_timespan), when N <= jobs."""
    paced = per_timespan and not (chunk and chunk <= per_timespan)
    limits = [limit for limit in (jobs, 2 * per_timespan if paced else None) if limit]
    if not limits:
        return
    sizes = rule_world_sizes(config)
    over = {
        rule: sum(sizes[rule].values()) for rule in sorted(rules) if sum(sizes[rule].values()) > min(limits)
    }
    if over:
        named = ", ".join(f"{rule} has {count} points" for rule, count in over.items())
        most = max(over.values())
        raise ArrayError(
            f"slurm-array-jobs: {named}, more than Snakemake hands over at once (--jobs={jobs}, "
            f"--max-jobs-per-timespan={per_timespan}/...): the plugin would leave some points unsubmitted "
            f"and the run would hang. Raise --jobs (the profile's jobs:) to at least {most} and "
            f"--max-jobs-per-timespan to at least {-(-most // 2)}/1s, or run those points as separate jobs."
        )


def check_setting(
    config: dict,
    setting: str | None,
    jobs: int | None = None,
    per_timespan: int | None = None,
    chunk: int | None = None,
) -> set[str]:
    """The training rules `setting` makes arrays; ArrayError names every rule it must not, and
    every array rule with more points than `jobs` (check_jobs)."""
    chosen = parse_setting(setting)
    verdicts = array_rules(config)
    named = set(verdicts) if "all" in chosen else chosen & set(verdicts)
    refused = {rule: verdicts[rule] for rule in sorted(named) if verdicts[rule]}
    hard = {rule: reason for rule, reason in refused.items() if "single point" not in reason}
    if hard:
        lines = "\n".join(f"  {rule}: {reason}" for rule, reason in hard.items())
        safe = ",".join(rule for rule, reason in verdicts.items() if reason is None) or "(none)"
        raise ArrayError(
            f"slurm-array-jobs={setting!r} would put points of different shapes into one array:\n{lines}\n"
            f"Safe for this config: {safe} (python -m scalestudy.plan.arrays --configfile ...)"
        )
    safe = {rule for rule in named if verdicts[rule] is None}
    check_jobs(config, safe, jobs, per_timespan, chunk)
    return safe


def array_train_resources(config: dict, world_size: int, attempt: int) -> dict[str, Any]:
    """The resources of a training job that runs as an array task (one node): the job's one task
    holds the node's CPUs for all its ranks, no `mpi` key (see the module docstring)."""
    resources = cluster.train_resources(config, world_size, attempt)
    nodes, per_node = cluster.layout(config, world_size)
    if nodes != 1:
        raise ArrayError(f"world size {world_size} needs {nodes} nodes: not an array task (one node)")
    extra = [option for option in resources["slurm_extra"].split() if "--ntasks-per-node" not in option]
    resources.update(
        tasks=1,
        cpus_per_task=per_node * resources["cpus_per_task"],
        slurm_extra=" ".join(extra),
    )
    resources.pop("mpi")
    return resources


def main(argv: list[str] | None = None) -> int:
    """Print which training rules may be job arrays for a config (or check a setting)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m scalestudy.plan.arrays", description=main.__doc__)
    parser.add_argument("--configfile", default="config/config.yaml")
    # (imported here: slurm_requests uses PyYAML and Snakemake; the Snakefile imports this module)
    from scalestudy.plan import studyconfig

    parser.add_argument("--check", metavar="RULES", help="a slurm-array-jobs value to check")
    args = parser.parse_args(argv)
    config = studyconfig.load(args.configfile)
    try:
        if args.check is not None:
            print(",".join(sorted(check_setting(config, args.check))))
            return 0
    except ArrayError as error:
        print(f"{args.configfile}: {error}")
        return contract.EXIT_BAD_CONFIG
    verdicts = array_rules(config)
    for rule, reason in verdicts.items():
        print(f"{rule}: {'array' if reason is None else 'one job per point: ' + reason}")
    print(
        "slurm-array-jobs: " + (",".join(rule for rule, reason in verdicts.items() if reason is None) or "''")
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
