"""The constructed GPU study with foreign processes on some of its GPUs that the contention and tracking
tests share (tests/test_contention.py, tests/test_tracking.py): the study config and its contended points."""

from __future__ import annotations

from scalestudy.plan import studyconfig
from tests.conftest import REPO

STRONG_2 = "results/runs/scaling/strong/w2_r0"  # a foreign process inside its window
STRONG_4 = "results/runs/scaling/strong/w4_r0"  # one before its window opened: not contended
SWEEP_FASTEST = "results/runs/sensitivity/bf16/bs256_bucket25"  # contended, and the fastest point


def small_study() -> dict:
    config = studyconfig.load(REPO / "config/config.yaml")
    config["scaling"].update(world_sizes=[1, 2, 4], repeats=1)
    config["sensitivity"]["axes"] = {
        "precision": ["fp32", "bf16"],
        "per_gpu_batch": [256],
        "bucket_cap_mb": [25],
    }
    return config
