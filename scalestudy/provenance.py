"""Provenance attached to every result: where, when, with what code and software it was made."""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import platform
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

# The Snakefile exports these once per workflow run, so that jobs inside a container (no git) or
# on a compute node still record the commit and the image that the study was launched from.
GIT_COMMIT_ENV = "SCALESTUDY_GIT_COMMIT"
GIT_DIRTY_ENV = "SCALESTUDY_GIT_DIRTY"
IMAGE_ENV = "SCALESTUDY_IMAGE"
IMAGE_SHA256_ENV = "SCALESTUDY_IMAGE_SHA256"

SLURM_VARIABLES = (
    "SLURM_JOB_ID",
    "SLURM_JOB_NAME",
    "SLURM_JOB_NODELIST",
    "SLURM_JOB_NUM_NODES",
    "SLURM_NTASKS",
    "SLURM_JOB_PARTITION",
    "SLURM_JOB_ACCOUNT",
    "SLURM_CLUSTER_NAME",
    "SLURM_RESTART_COUNT",
)


def config_hash(config: Any) -> str:
    """A stable short hash of a JSON-able configuration (key order does not matter)."""
    canonical = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def git_state(repo: str | os.PathLike | None = None) -> dict[str, Any]:
    """Commit and dirty flag: from the environment if the Snakefile set them, else from git."""
    if os.environ.get(GIT_COMMIT_ENV):
        return {
            "git_commit": os.environ[GIT_COMMIT_ENV],
            "git_dirty": os.environ.get(GIT_DIRTY_ENV, "unknown") == "1",
        }
    repo = Path(repo or Path(__file__).resolve().parent.parent)
    try:
        commit = _git(repo, "rev-parse", "HEAD")
        dirty = bool(_git(repo, "status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.CalledProcessError):
        return {"git_commit": "unknown", "git_dirty": None}
    return {"git_commit": commit, "git_dirty": dirty}


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, timeout=10
    ).stdout.strip()


def slurm_state() -> dict[str, Any]:
    """The Slurm job this process belongs to (None outside Slurm)."""
    state = {name.lower().removeprefix("slurm_"): os.environ.get(name) for name in SLURM_VARIABLES}
    state["job_id"] = state.get("job_id")
    return state


def software_versions() -> dict[str, Any]:
    """Python, torch, CUDA, cuDNN, NCCL and library versions; torch is imported only here."""
    versions: dict[str, Any] = {"python": platform.python_version()}
    for module in ("torch", "torchvision", "numpy", "pandas", "matplotlib", "snakemake", "pynvml"):
        mod = sys.modules.get(module)
        if mod is None:
            try:
                mod = __import__(module)
            except Exception:  # noqa: BLE001 - a missing optional library is recorded, not fatal
                versions[module] = None
                continue
        versions[module] = getattr(mod, "__version__", None)
    torch = sys.modules.get("torch")
    if torch is not None:
        versions["cuda"] = torch.version.cuda
        versions["cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
        try:
            nccl = torch.cuda.nccl.version() if torch.cuda.is_available() else None
            versions["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else nccl
        except Exception:  # noqa: BLE001
            versions["nccl"] = None
    return versions


def collect(
    config: Any = None, seed: int | None = None, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Everything a result row needs to be traced back to how it was made."""
    record: dict[str, Any] = {
        "timestamp": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "command": sys.argv,
        "seed": seed,
        "config_hash": config_hash(config) if config is not None else None,
        "image": os.environ.get(IMAGE_ENV),
        "image_sha256": os.environ.get(IMAGE_SHA256_ENV),
        "scalestudy_version": __import__("scalestudy").__version__,
        **git_state(),
        "slurm": slurm_state(),
        "versions": software_versions(),
    }
    if extra:
        record.update(extra)
    return record


def flatten(record: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts to dotted columns, for one CSV row per result."""
    flat: dict[str, Any] = {}
    for key, value in record.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, f"{name}."))
        elif isinstance(value, list | tuple):
            flat[name] = json.dumps(value, default=str)
        else:
            flat[name] = value
    return flat


def export_git_state(repo: str | os.PathLike) -> None:
    """Put the workflow's commit in the environment once, for jobs that cannot run git."""
    if os.environ.get(GIT_COMMIT_ENV):
        return
    state = git_state(repo)
    os.environ[GIT_COMMIT_ENV] = state["git_commit"]
    os.environ[GIT_DIRTY_ENV] = {True: "1", False: "0"}.get(state["git_dirty"], "unknown")
