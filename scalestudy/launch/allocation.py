"""Run the study inside a Slurm allocation a user already holds (profiles/slurm-allocation).

`python -m scalestudy.launch.allocation -- <snakemake arguments>` runs Snakemake (the local
executor) in an allocation (`sbatch` of a driver script, `salloc`, a reservation) with its
resources bound to what the allocation holds, read from the SLURM_* variables:

- `--cores`: the allocation's CPUs, every node's (SLURM_JOB_CPUS_PER_NODE, e.g. "4(x2)");
- `--resources nodes=N tasks=T mem_mb=M`: N nodes; T rank slots (the GPUs where the nodes have
  GPUs, else the CPUs); M the memory of every node (SLURM_MEM_PER_NODE x N).

Every training point then starts its ranks with srun (scalestudy.launch.launcher picks srun in an
allocation's batch shell): one job step per point, packed side by side as the allocation allows,
with no queue wait. Steps get exactly the CPUs they ask for (`srun --cpus-per-task` implies
`--exact` since Slurm 22.05; SLURM_EXACT=1 is exported for older ones). docs/guide/cluster.md, "One
allocation", has the driver script. Pure standard library.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from collections.abc import Mapping, Sequence

from scalestudy import contract

# "4(x2),8": 4 CPUs on each of 2 nodes, then 8 on one (Slurm's compressed per-node lists)
_PER_NODE = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


class AllocationError(ValueError):
    """Not inside an allocation, or its SLURM_* variables are not what Slurm writes."""


def per_node_counts(text: str, name: str) -> list[int]:
    """'4(x2),8' -> [4, 4, 8]."""
    counts: list[int] = []
    for part in text.split(","):
        match = _PER_NODE.match(part.strip())
        if not match:
            raise AllocationError(f"{name}={text!r} is not a per-node list like '4(x2),8'")
        counts += [int(match[1])] * int(match[2] or 1)
    return counts


def _gpus_per_node(environ: Mapping[str, str]) -> int:
    """GPUs on each node of the allocation: SLURM_GPUS_ON_NODE, else SLURM_TRES_PER_NODE
    ('gres:gpu:4', 'gres/gpu:a100=4'), else SLURM_GPUS_PER_NODE; 0 without GPUs."""
    if environ.get("SLURM_GPUS_ON_NODE", "").isdigit():
        return int(environ["SLURM_GPUS_ON_NODE"])
    for name in ("SLURM_TRES_PER_NODE", "SLURM_GPUS_PER_NODE"):
        match = re.search(r"(?:^|gpu[:/=]?)(?:[A-Za-z0-9_.-]+[:=])?(\d+)$", environ.get(name, ""))
        if match:
            return int(match[1])
    return 0


def allocation(environ: Mapping[str, str] = os.environ) -> dict[str, int]:
    """What the allocation holds: nodes, cpus (all nodes), gpus (all nodes), mem_mb (all nodes)."""
    job_id = environ.get("SLURM_JOB_ID")
    if not job_id:
        raise AllocationError(
            "not inside a Slurm allocation (no SLURM_JOB_ID): run this in an `sbatch` driver script or "
            "an `salloc` shell (docs/guide/cluster.md, 'One allocation')"
        )
    nodes_text = environ.get("SLURM_JOB_NUM_NODES") or environ.get("SLURM_NNODES") or ""
    if not nodes_text.isdigit():
        raise AllocationError(f"SLURM_JOB_NUM_NODES={nodes_text!r} in job {job_id}: not a node count")
    nodes = int(nodes_text)
    cpus_text = environ.get("SLURM_JOB_CPUS_PER_NODE", "")
    cpus = per_node_counts(cpus_text, "SLURM_JOB_CPUS_PER_NODE") if cpus_text else []
    if len(cpus) != nodes:
        raise AllocationError(
            f"SLURM_JOB_CPUS_PER_NODE={cpus_text!r} names {len(cpus)} node(s), job {job_id} has {nodes}"
        )
    mem_text = environ.get("SLURM_MEM_PER_NODE", "")
    mem_per_node = int(mem_text) if mem_text.isdigit() else None
    return {
        "nodes": nodes,
        "cpus": sum(cpus),
        "gpus": _gpus_per_node(environ) * nodes,
        "mem_mb": mem_per_node * nodes if mem_per_node else 0,
    }


def snakemake_args(held: Mapping[str, int]) -> list[str]:
    """Snakemake's --cores and --resources bound to the allocation (no mem_mb bound where Slurm set
    none: the job may then use the nodes' memory)."""
    bound = [f"nodes={held['nodes']}", f"tasks={held['gpus'] or held['cpus']}"]
    if held["mem_mb"]:
        bound.append(f"mem_mb={held['mem_mb']}")
    return ["--cores", str(held["cpus"]), "--resources", *bound]


def command(argv: Sequence[str], environ: Mapping[str, str] = os.environ) -> list[str]:
    """The Snakemake command line: the given arguments, then the allocation's bounds (which win)."""
    snakemake = shutil.which("snakemake") or "snakemake"
    if argv and argv[0] in ("snakemake", snakemake):
        argv = argv[1:]
    return [snakemake, *argv, *snakemake_args(allocation(environ))]


def main(argv: list[str] | None = None) -> int:
    """`python -m scalestudy.launch.allocation [--print] -- <snakemake arguments>`."""
    args = list(sys.argv[1:] if argv is None else argv)
    show = bool(args) and args[0] == "--print"
    args = args[1:] if show else args
    if args[:1] == ["--"]:
        args = args[1:]
    try:
        argv_out = command(args)
    except AllocationError as error:
        print(f"scalestudy.launch.allocation: {error}", file=sys.stderr)
        return contract.EXIT_BAD_CONFIG
    if show:
        print(" ".join(argv_out))
        return 0
    print(f"scalestudy.launch.allocation: {' '.join(argv_out[-6:])}", file=sys.stderr, flush=True)
    os.environ.setdefault("SLURM_EXACT", "1")
    os.execvp(argv_out[0], argv_out)
    return 0  # not reached


if __name__ == "__main__":
    raise SystemExit(main())
