"""A machine with GPUs for CPU tests: the fake NVML (tests/fakenvml/pynvml.py) and its state file,
a private GPU lock folder, and the environment that puts both in front of a process and its
children (Snakemake, the launcher, the ranks)."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from types import ModuleType

from tests.conftest import REPO

FAKE_NVML_DIR = REPO / "tests" / "fakenvml"
STATE_ENV = "SCALESTUDY_FAKE_NVML"
LOCK_DIR_ENV = "SCALESTUDY_GPU_LOCK_DIR"


def uuids(count: int) -> list[str]:
    return [f"GPU-{index:08x}-0000-4000-8000-{index:012x}" for index in range(count)]


def write_state(path: Path, count: int, **extra) -> Path:
    """A state file of `count` GPUs (fake H200s, no processes); `extra` goes to the top level."""
    gpus = [{"uuid": uuid, "name": "NVIDIA H200 (fake)", "processes": []} for uuid in uuids(count)]
    path.write_text(json.dumps({"gpus": gpus, **extra}))
    return path


def machine_env(state: Path, locks: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """`base` (this process's environment) with the fake NVML first on PYTHONPATH, its state file
    and the lock folder; CUDA_VISIBLE_DEVICES dropped (the tests' machine decides)."""
    env = dict(os.environ if base is None else base)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env.pop("SLURM_JOB_ID", None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(FAKE_NVML_DIR), env.get("PYTHONPATH")]))
    env[STATE_ENV] = str(state)
    env[LOCK_DIR_ENV] = str(locks)
    return env


def fake_nvml() -> ModuleType:
    """The fake pynvml as a module object (this process keeps the real one as `pynvml`)."""
    spec = importlib.util.spec_from_file_location("fake_pynvml", FAKE_NVML_DIR / "pynvml.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
