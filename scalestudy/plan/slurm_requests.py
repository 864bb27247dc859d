"""Every grid point's Slurm request, as the Slurm executor plugin would submit it (a preview).

`python -m scalestudy.plan.slurm_requests --configfile config/config.yaml` prints, for each grid
point, its layout and resources (scalestudy.plan.cluster) and the sbatch options the plugin makes of
them: check a site's settings before a long run (docs/guide/cluster.md); then the partition, account and QOS
against the cluster's own sinfo/sacctmgr (scalestudy.plan.slurm_names; exit 1 for a name it does
not know). Not imported by the Snakefile: it
uses the executor plugin.
"""

from __future__ import annotations

import argparse
import shlex
from typing import Any

from snakemake_executor_plugin_slurm.submit_string import get_submit_command
from snakemake_executor_plugin_slurm.utils import set_gres_string
from snakemake_executor_plugin_slurm.validation import validate_slurm_extra

from scalestudy.plan import cluster, grid, slurm_names, studyconfig


class _PreviewJob:
    """Just enough of a Snakemake job for the plugin's sbatch-command builder."""

    def __init__(self, name: str, resources: dict[str, Any], threads: int) -> None:
        self.name = name
        self.threads = threads
        self.resources = _Resources({key: value for key, value in resources.items() if value is not None})

    def is_group(self) -> bool:
        return False


class _Resources(dict):
    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError as missing:
            raise AttributeError(name) from missing


def sbatch_command(resources: dict[str, Any], threads: int = 1, rule: str = "scaling_run") -> str:
    """The sbatch call the Slurm executor plugin makes for these resources."""
    job = _PreviewJob(rule, resources, threads)
    validate_slurm_extra(job)
    account = resources.get("slurm_account")
    partition = resources.get("slurm_partition")
    params = {
        "run_uuid": "<run-uuid>",
        "slurm_logfile": f".snakemake/slurm_logs/rule_{rule}/%j.log",
        "comment_str": f"rule_{rule}",
        "account": f" -A {shlex.quote(account)}" if account else "",
        "partition": f" -p {shlex.quote(partition)}" if partition else "",
        "workdir": None,
    }
    return get_submit_command(job, params) + set_gres_string(job)


def main(argv: list[str] | None = None) -> int:
    """Print every grid point's Slurm request: what `snakemake --profile profiles/slurm` submits."""
    prog = "python -m scalestudy.plan.slurm_requests"
    parser = argparse.ArgumentParser(prog=prog, description=main.__doc__)
    parser.add_argument("--configfile", default="config/config.yaml")
    parser.add_argument("--attempt", type=int, default=1)
    args = parser.parse_args(argv)
    config = studyconfig.load(args.configfile)
    for point in grid.all_points(config):
        resources = cluster.train_resources(config, point.world_size, args.attempt)
        print(describe(config, point.world_size, resources, f"{point.stage} {point.name}"))
        command = sbatch_command(resources, threads=point.world_size, rule=f"{point.stage}_run")
        print(f"    sbatch {command.split(' --comment ', 1)[1].split(' ', 1)[1].strip()}")
    return check_names(config)


def check_names(config: dict) -> int:
    """The partition, account and QOS against this cluster (what the workflow checks before it
    submits anything); 1 when the cluster does not know one, with the names it has."""
    findings = slurm_names.check(config)
    if findings.errors or findings.warnings:
        print(slurm_names.report(findings))
    return 1 if findings.errors else 0


def describe(config: dict, world_size: int, resources: dict[str, Any], name: str) -> str:
    """One line a user can check: 'scaling strong/w8_r0: world 8 = 2 nodes x 4 ranks, ...'."""
    nodes, per_node = cluster.layout(config, world_size)
    gpus = f", --gres={resources['gres']} per node" if resources["gres"] else ", CPU only"
    return (
        f"{name}: world {world_size} = {nodes} node(s) x {per_node} rank(s){gpus}, "
        f"{resources['cpus_per_task']} CPUs/rank, {resources['mem_mb']} MB/node, {resources['runtime']} min"
    )


if __name__ == "__main__":
    raise SystemExit(main())
