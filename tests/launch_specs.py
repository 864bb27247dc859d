"""The launch specs the launcher tests build (tests/test_launch.py, tests/test_startup.py): a 4-GPU
cluster's spec of a world size, the trainer's arguments, the environments outside and inside a Slurm job."""

from __future__ import annotations

from scalestudy.plan import cluster

TRAIN = ["--run-config-json", '{"a": 1}', "--out-dir", "results/runs/x"]
NO_SLURM: dict[str, str] = {}
IN_JOB = {"SLURM_JOB_ID": "42"}  # the rule's shell in the batch step: the jobstep plugin keeps only this


def spec(world: int = 1, **changes) -> dict:
    config = {"cluster": {"gpus_per_node": 4, "cpus_per_rank": 6}, "container": {"binds": ["/data:/data:ro"]}}
    return {
        **cluster.launch_spec(config, world, containerized=changes.pop("containerized", False)),
        **changes,
    }
